"""Tokenizer for JMS selectors (JMS 1.1 section 3.8.1, ActiveMQ's token set).

Columns are 1-based character offsets into the whole selector text, so error
messages point at the exact spot even in multi-line selectors.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass

from meshmq.errors import SelectorError

KEYWORDS = frozenset({
    "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE", "NULL", "TRUE", "FALSE",
})

# Java long range: hex/octal literals outside it are errors (as Long.decode in ActiveMQ).
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1


class TokenKind(enum.Enum):
    IDENT = "identifier"
    KEYWORD = "keyword"
    STRING = "string"
    INTEGER = "integer"
    FLOAT = "float"
    OP = "operator"
    EOF = "end"


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    # Keyword (upper-cased), operator text, identifier name, string content or number.
    value: str | int | float
    column: int
    text: str  # the source text, for error messages

    def describe(self) -> str:
        if self.kind is TokenKind.EOF:
            return f"end of selector at column {self.column}"
        return f"token {self.text!r} at column {self.column}"


_WS = re.compile(r"[ \t\n\r\f]+")
# Alternation order matters: hex, then the float forms, then plain integers.
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F]+[lL]?"
    r"|(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?"
    r"|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+)[fFdD]?"
    r"|[0-9]+[fFdD]"
    r"|[0-9]+[lL]?"
)
_TWO_CHAR_OPS = frozenset({"<>", "<=", ">="})
_ONE_CHAR_OPS = frozenset("=<>+-*/%(),")
_ID_START_CATEGORIES = frozenset({"Nl", "Sc", "Pc"})
_ID_PART_CATEGORIES = _ID_START_CATEGORIES | {"Nd", "Mn", "Mc"}


def _is_id_start(ch: str) -> bool:
    # Approximates Character.isJavaIdentifierStart: letters, '$', '_', and friends.
    if ch.isascii():
        return ch.isalpha() or ch in {"_", "$"}
    return ch.isalpha() or unicodedata.category(ch) in _ID_START_CATEGORIES


def _is_id_part(ch: str) -> bool:
    if ch.isascii():
        return ch.isalnum() or ch in {"_", "$"}
    return ch.isalpha() or unicodedata.category(ch) in _ID_PART_CATEGORIES


def _error(message: str, index: int) -> SelectorError:
    return SelectorError(f"{message} at column {index + 1}")


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with an EOF token."""
    tokens: list[Token] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        m = _WS.match(text, i)
        if m:
            i = m.end()
            continue
        # Comments as in ActiveMQ's grammar; note that "a--1" is therefore "a".
        if text.startswith("--", i):
            end = text.find("\n", i)
            cr = text.find("\r", i)
            if end < 0 or 0 <= cr < end:
                end = cr
            i = n if end < 0 else end + 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise _error("unterminated comment", i)
            i = end + 2
            continue
        if ch == "'":
            i = _string(text, i, tokens)
            continue
        if ("0" <= ch <= "9") or (ch == "." and i + 1 < n and "0" <= text[i + 1] <= "9"):
            i = _number(text, i, tokens)
            continue
        if _is_id_start(ch):
            j = i + 1
            while j < n and _is_id_part(text[j]):
                j += 1
            word = text[i:j]
            upper = word.upper()
            if upper in KEYWORDS:
                tokens.append(Token(TokenKind.KEYWORD, upper, i + 1, word))
            else:
                tokens.append(Token(TokenKind.IDENT, word, i + 1, word))
            i = j
            continue
        two = text[i:i + 2]
        if two in _TWO_CHAR_OPS:
            tokens.append(Token(TokenKind.OP, two, i + 1, two))
            i += 2
            continue
        if ch in _ONE_CHAR_OPS:
            tokens.append(Token(TokenKind.OP, ch, i + 1, ch))
            i += 1
            continue
        raise _error(f"unexpected character {ch!r}", i)
    tokens.append(Token(TokenKind.EOF, "", n + 1, ""))
    return tokens


def _string(text: str, start: int, tokens: list[Token]) -> int:
    parts: list[str] = []
    j = start + 1
    while True:
        k = text.find("'", j)
        if k < 0:
            raise _error("unterminated string literal", start)
        parts.append(text[j:k])
        if text.startswith("'", k + 1):  # '' is an escaped quote
            parts.append("'")
            j = k + 2
            continue
        tokens.append(Token(TokenKind.STRING, "".join(parts), start + 1, text[start:k + 1]))
        return k + 1


def _number(text: str, start: int, tokens: list[Token]) -> int:
    m = _NUMBER.match(text, start)
    assert m is not None  # the caller saw a digit, or '.' then a digit
    end = m.end()
    if end < len(text) and (_is_id_part(text[end]) or text[end] == "."):
        # "12abc", "0x", "1.5e", "1.2.3": report the whole malformed run.
        j = end
        while j < len(text) and (_is_id_part(text[j]) or text[j] == "."):
            j += 1
        raise _error(f"invalid numeric literal {text[start:j]!r}", start)
    lexeme = m.group()
    body = lexeme.rstrip("lL")
    column = start + 1
    if body[:2] in ("0x", "0X"):
        value = int(body[2:], 16)
        if value > LONG_MAX:
            raise _error(f"numeric literal {lexeme!r} out of range", start)
        tokens.append(Token(TokenKind.INTEGER, value, column, lexeme))
    elif lexeme[-1] in "fFdD" or "." in lexeme or "e" in lexeme or "E" in lexeme:
        tokens.append(Token(TokenKind.FLOAT, float(lexeme.rstrip("fFdD")), column, lexeme))
    elif len(body) > 1 and body[0] == "0":
        if not all("0" <= c <= "7" for c in body):
            raise _error(f"invalid octal literal {lexeme!r}", start)
        value = int(body, 8)
        if value > LONG_MAX:
            raise _error(f"numeric literal {lexeme!r} out of range", start)
        tokens.append(Token(TokenKind.INTEGER, value, column, lexeme))
    elif len(body) > 19:
        # Beyond Java long ActiveMQ switches to BigDecimal; an approximate value is
        # the closest cheap equivalent (and int() refuses very long digit strings).
        tokens.append(Token(TokenKind.FLOAT, float(body), column, lexeme))
    else:
        # 2**63 itself is kept exact so that -9223372036854775808 folds to LONG_MIN.
        number = int(body)
        tokens.append(Token(TokenKind.INTEGER, number if number <= 2**63 else float(number),
                            column, lexeme))
    return end
