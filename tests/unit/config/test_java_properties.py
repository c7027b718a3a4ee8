"""Java .properties syntax, as users.properties and groups.properties use it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.java_properties import PropertiesError, parse_properties


def test_comments_separators_continuations_and_escapes() -> None:
    text = ("# a comment\n"
            "! another\n"
            "\n"
            "alice=one\n"
            "bob : two\n"
            "carol three\n"
            "  dave=four=five\n"
            "admins=alice,\\\n"
            "        bob\n"
            "key\\ with\\ spaces=v\\tx\\u0041\\\\\n"
            "empty=\n"
            "colon\\:key=1\n")
    got = [(e.key, e.value, e.line) for e in parse_properties(text)]
    assert got == [("alice", "one", 4), ("bob", "two", 5), ("carol", "three", 6),
                   ("dave", "four=five", 7), ("admins", "alice,bob", 8),
                   ("key with spaces", "v\txA\\", 10), ("empty", "", 11),
                   ("colon:key", "1", 12)]


def test_bad_unicode_escape_names_its_line() -> None:
    with pytest.raises(PropertiesError) as err:
        parse_properties("a=1\nb=\\u12x4\n")
    assert err.value.line == 2


def store_escape(text: str, *, key: bool) -> str:
    """``text`` as java.util.Properties.store writes a key or a value (ASCII only:
    other characters as \\uXXXX, UTF-16 code units)."""
    out: list[str] = []
    for i, c in enumerate(text):
        if c == "\\":
            out.append("\\\\")
        elif c == " ":
            out.append("\\ " if key or i == 0 else " ")
        elif c in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[c])
        elif c in "=:#!":
            out.append("\\" + c)
        elif " " < c < "\x7f":
            out.append(c)
        else:
            units = c.encode("utf-16-be")
            out += [f"\\u{int.from_bytes(units[j:j + 2], 'big'):04X}"
                    for j in range(0, len(units), 2)]
    return "".join(out)


@given(st.lists(st.tuples(st.text(), st.text()), max_size=5))
def test_what_java_stores_is_read_back(pairs: list[tuple[str, str]]) -> None:
    text = "#comment\n" + "".join(
        f"{store_escape(k, key=True)}={store_escape(v, key=False)}\n" for k, v in pairs)
    assert [(e.key, e.value) for e in parse_properties(text)] == pairs


@pytest.mark.parametrize(("text", "entries"), [
    # Java ends lines only at \n, \r and \r\n: NEL (a UTF-8 "Å" read as ISO-8859-1 ends
    # in it), form feed and the other separators Python's splitlines knows are text.
    pytest.param("password=\xc3\x85sa\nnext=1\n", [("password", "\xc3\x85sa", 1),
                                                    ("next", "1", 2)], id="nel"),
    pytest.param("a=x\x0by\x1cz\u2028w\nb=2\n", [("a", "x\x0by\x1cz\u2028w", 1),
                                                  ("b", "2", 2)], id="separators"),
    pytest.param("a=1\rb=2\r\nc=3", [("a", "1", 1), ("b", "2", 2), ("c", "3", 3)],
                 id="cr-and-crlf"),
    pytest.param("a=\\uD83D\\uDE00\n", [("a", "\U0001F600", 1)], id="surrogate-pair"),
    pytest.param("a=one\\\n", [("a", "one", 1)], id="continuation-at-the-end"),
    pytest.param("\f  a = 1\n", [("a", "1", 1)], id="leading-form-feed"),
])
def test_lines_and_characters_as_java_reads_them(text: str,
                                                 entries: list[tuple[str, str, int]]) -> None:
    assert [(e.key, e.value, e.line) for e in parse_properties(text)] == entries
