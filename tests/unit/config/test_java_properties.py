"""Java .properties syntax, as users.properties and groups.properties use it."""

from __future__ import annotations

import pytest

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
