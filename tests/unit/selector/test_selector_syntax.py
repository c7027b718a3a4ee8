"""Lexer and parser: literal forms, keywords, precedence, limits, and error messages."""

from __future__ import annotations

import pytest

from meshmq.core.selector import MAX_DEPTH, MAX_SELECTOR_LENGTH, compile_selector
from meshmq.core.selector.lexer import TokenKind, tokenize
from meshmq.core.selector.parser import (
    Arith,
    Compare,
    Ident,
    Literal,
    Logic,
    Not,
    parse,
)
from meshmq.errors import SelectorError


def literal(text: str) -> object:
    """The value of a single literal token."""
    tokens = tokenize(text)
    assert len(tokens) == 2, tokens
    assert tokens[1].kind is TokenKind.EOF
    return tokens[0].value


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0),
    ("42", 42),
    ("42L", 42),
    ("42l", 42),
    ("0x1F", 31),
    ("0X1f", 31),
    ("0xFFl", 255),
    ("010", 8),
    ("0777L", 511),
    ("00", 0),
    ("9223372036854775807", 2**63 - 1),
    ("0x7FFFFFFFFFFFFFFF", 2**63 - 1),
    ("1.5", 1.5),
    ("1e3", 1000.0),
    ("1E+3", 1000.0),
    ("2.5e-1", 0.25),
    (".5", 0.5),
    ("7.", 7.0),
    ("7.e2", 700.0),
    ("1.5F", 1.5),
    ("1.5d", 1.5),
    ("5f", 5.0),
    ("5D", 5.0),
    ("09.5", 9.5),
    ("123456789012345678901234", 1.2345678901234568e23),  # beyond long: approximate
])
def test_numeric_literals(text: str, value: float) -> None:
    got = literal(text)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(("text", "value"), [
    ("'abc'", "abc"),
    ("''", ""),
    ("'it''s'", "it's"),
    ("''''", "'"),
    ("'a''''b'", "a''b"),
    ("'%_\\'", "%_\\"),
    ("'multi\nline'", "multi\nline"),
    ("'ünïcödé'", "ünïcödé"),
])
def test_string_literals(text: str, value: str) -> None:
    assert literal(text) == value


@pytest.mark.parametrize("word", ["TRUE", "true", "True", "tRuE"])
def test_boolean_keywords_are_case_insensitive(word: str) -> None:
    assert parse(word) == Literal(True, 1)


@pytest.mark.parametrize("text", [
    "a = 1 and b = 2", "a = 1 AnD b = 2", "a = 1 or b = 2", "not a = 1",
    "a between 1 and 2", "a Not Between 1 AND 2", "a in ('x')", "a not in ('x')",
    "a like 'x'", "a like 'x' escape '!'", "a is null", "a IS not NULL",
])
def test_keywords_are_case_insensitive(text: str) -> None:
    compile_selector(text)


@pytest.mark.parametrize("name", [
    "a", "_a", "$a", "a1", "a_b$c", "JMSType", "ünï", "NULLABLE", "TRUEish", "Android",
    "notx", "XPATH",
])
def test_identifiers(name: str) -> None:
    assert parse(name) == Ident(name, 1)


def test_identifiers_are_case_sensitive() -> None:
    sel = compile_selector("Color = 'red'")
    assert sel.identifiers == frozenset({"Color"})
    assert sel.matches({"Color": "red"}.get)
    assert not sel.matches({"color": "red"}.get)


def test_identifiers_collects_every_name() -> None:
    sel = compile_selector("a = 1 AND (b + c > 2 OR d LIKE 'x' OR e IS NULL) AND f IN ('y')")
    assert sel.identifiers == frozenset("abcdef")


def test_precedence() -> None:
    # * binds tighter than +, which binds tighter than comparison, then NOT, AND, OR.
    tree = parse("a = 1 + 2 * 3 OR NOT b = 4 AND c")
    assert isinstance(tree, Logic) and tree.op == "OR"
    left, right = tree.operands
    assert isinstance(left, Compare) and isinstance(left.right, Arith)
    assert left.right.op == "+" and isinstance(left.right.right, Arith)
    assert isinstance(right, Logic) and right.op == "AND"
    assert isinstance(right.operands[0], Not)
    assert isinstance(right.operands[0].operand, Compare)  # SQL: NOT (b = 4)


def test_arithmetic_is_left_associative() -> None:
    tree = parse("a - b - c = 0")
    assert isinstance(tree, Compare)
    outer = tree.left
    assert isinstance(outer, Arith) and isinstance(outer.left, Arith)
    assert isinstance(outer.right, Ident) and outer.right.name == "c"


def test_long_or_chain_is_flat() -> None:
    text = " OR ".join(f"id = {i}" for i in range(5000))
    tree = parse(text)
    assert isinstance(tree, Logic) and len(tree.operands) == 5000
    sel = compile_selector(text)
    assert sel.matches({"id": 4999}.get)
    assert not sel.matches({"id": 5000}.get)


def test_negative_literals_fold() -> None:
    assert parse("a = -5") == Compare("=", Ident("a", 1), Literal(-5, 5), 3)
    assert parse("a = -9223372036854775808").right == Literal(-(2**63), 5)  # type: ignore[union-attr]


def test_comments() -> None:
    # ActiveMQ's grammar accepts SQL comments; so "a--1" is "a" plus a comment.
    assert compile_selector("a--1").identifiers == {"a"}
    assert compile_selector("a = 1 -- trailing\n AND b = 2").identifiers == {"a", "b"}
    assert compile_selector("a /* inline */ = 1").matches({"a": 1}.get)


@pytest.mark.parametrize(("text", "message"), [
    ("a = 1)", "unexpected token ')' at column 6"),
    ("(a = 1))", "unexpected token ')' at column 8"),
    ("a = (1 + 2))", "unexpected token ')' at column 12"),
    ("a =", "unexpected end of selector at column 4"),
    ("a = 1 AND", "unexpected end of selector at column 10"),
    ("(a = 1", "unexpected end of selector at column 7, expected ')'"),
    ("a = = 1", "unexpected token '=' at column 5"),
    ("a b", "unexpected token 'b' at column 3"),
    ("a NOT b", "unexpected token 'NOT' at column 3"),
    ("a = NOT b", "unexpected token 'NOT' at column 5"),
    ("a = 1 OR OR b", "unexpected token 'OR' at column 10"),
    ("AND a", "unexpected token 'AND' at column 1"),
    ("a = NULL", "unexpected token 'NULL' at column 5, NULL is only allowed in IS [NOT] NULL"),
    ("a IS 1", "unexpected token '1' at column 6, expected NULL"),
    ("a IS NOT", "unexpected end of selector at column 9, expected NULL"),
    ("a BETWEEN 1 OR 2", "unexpected token 'OR' at column 13, expected AND"),
    ("a IN 'x'", "unexpected token \"'x'\" at column 6, expected '('"),
    ("a IN ()", "unexpected token ')' at column 7, expected a string literal"),
    ("a IN (1, 2)", "unexpected token '1' at column 7, expected a string literal"),
    ("a IN ('x' 'y')", "unexpected token \"'y'\" at column 11, expected ',' or ')'"),
    ("a IN ('x',)", "unexpected token ')' at column 11, expected a string literal"),
    ("a LIKE b", "unexpected token 'b' at column 8, expected a string literal"),
    ("a LIKE 'x' ESCAPE", "unexpected end of selector at column 18, expected a string literal"),
    ("a LIKE 'x' ESCAPE ''", "ESCAPE string at column 19 must be exactly one character"),
    ("a LIKE 'x' ESCAPE '!!'", "ESCAPE string at column 19 must be exactly one character"),
    ("a LIKE 'x!' ESCAPE '!'", "LIKE pattern at column 8 ends with its ESCAPE character"),
    ("'abc", "unterminated string literal at column 1"),
    ("a = 'it''s", "unterminated string literal at column 5"),
    ("a = 1 /* x", "unterminated comment at column 7"),
    ("a ! b", "unexpected character '!' at column 3"),
    ("a != 1", "unexpected character '!' at column 3"),
    ("a == 1", "unexpected token '=' at column 4"),
    ("a = \"x\"", "unexpected character '\"' at column 5"),
    ("a = 1.2.3", "invalid numeric literal '1.2.3' at column 5"),
    ("a = 12abc", "invalid numeric literal '12abc' at column 5"),
    ("a = 0x", "invalid numeric literal '0x' at column 5"),
    ("a = 1e", "invalid numeric literal '1e' at column 5"),
    ("a = 09", "invalid octal literal '09' at column 5"),
    ("a = 0x8000000000000000", "numeric literal '0x8000000000000000' out of range at column 5"),
    ("a = 01000000000000000000000", "out of range at column 5"),
    ("1", "expression at column 1 is not a boolean condition"),
    ("'x'", "expression at column 1 is not a boolean condition"),
    ("a + 1", "expression at column 3 is not a boolean condition"),
    ("1 AND a", "expression at column 1 is not a boolean condition"),
    ("a OR 'x'", "expression at column 6 is not a boolean condition"),
    ("NOT 5", "expression at column 5 is not a boolean condition"),
    ("TRUE + 1", "operator '+' at column 6 cannot be applied to a boolean value"),
    ("-TRUE", "operator '-' at column 1 cannot be applied to a boolean value"),
    ("(a = 1) < 2", "operator '<' at column 9 cannot be applied to a boolean value"),
    ("a BETWEEN FALSE AND 2", "operator 'BETWEEN' at column 3 cannot be applied to a boolean"),
    ("TRUE = 1", "operator '=' at column 6 compares a boolean with a number"),
    ("(a > 1) <> 2", "operator '<>' at column 9 compares a boolean with a number"),
    ("a = 1\n  AND )", "unexpected token ')' at column 13"),
])
def test_error_messages(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    assert message in str(info.value)
    assert info.value.code == "invalid-selector"


@pytest.mark.parametrize("text", ["", " ", "\t\n", "  \r\n "])
def test_empty_selector_is_an_error(text: str) -> None:
    with pytest.raises(SelectorError, match="selector is empty"):
        compile_selector(text)


def test_comment_only_selector_is_an_error() -> None:
    with pytest.raises(SelectorError, match="unexpected end of selector at column 9"):
        compile_selector("/* x */ ")


def test_length_limit() -> None:
    ok = "a = '" + "x" * (MAX_SELECTOR_LENGTH - 6) + "'"
    assert len(ok) == MAX_SELECTOR_LENGTH
    compile_selector(ok)
    with pytest.raises(SelectorError, match=r"selector too long: 65537 characters \(limit 65536\)"):
        compile_selector("a" * (MAX_SELECTOR_LENGTH + 1))


@pytest.mark.parametrize("text", [
    "(" * 10_000 + "a" + ")" * 10_000,
    "NOT " * 10_000 + "a",
    "a = " + "-(" * 10_000 + "1" + ")" * 10_000,
    "a = " + "- " * 10_000 + "1",
    "a" + " + a" * 10_000 + " > 0",
    "a" + " = a" * 10_000,
])
def test_deep_nesting_is_a_clean_error(text: str) -> None:
    with pytest.raises(SelectorError, match="selector nested too deeply at column"):
        compile_selector(text)


def test_nesting_up_to_the_limit_works() -> None:
    depth = MAX_DEPTH - 10
    sel = compile_selector("(" * depth + "a = 1" + ")" * depth)
    assert sel.matches({"a": 1}.get)
    sel = compile_selector("NOT " * (depth // 2 * 2) + "a = 1")
    assert sel.matches({"a": 1}.get)
    sel = compile_selector("a" + " + a" * (depth - 5) + " > 0")
    assert sel.matches({"a": 1}.get)


def test_huge_numeric_literal_is_not_a_crash() -> None:
    sel = compile_selector("a < " + "9" * 10_000)
    assert sel.matches({"a": 1}.get)


def test_compile_is_cached() -> None:
    a = compile_selector("cache_me = 1")
    assert compile_selector("cache_me = 1") is a
    assert compile_selector("cache_me = 1", convert_strings=False) is not a
    assert a.text == "cache_me = 1"
    assert repr(a) == "Selector('cache_me = 1')"
