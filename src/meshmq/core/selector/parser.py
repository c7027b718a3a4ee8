"""Selector syntax tree and a precedence-climbing parser.

Precedence, loosest first: OR, AND, NOT, equality (= <> IS), relational
(< <= > >= [NOT] LIKE/BETWEEN/IN), additive, multiplicative, unary +/-.
Unlike ActiveMQ's JavaCC grammar, where NOT is a unary operator binding tighter
than comparisons (``NOT a = 1`` means ``(NOT a) = 1`` there), NOT follows SQL and
the JMS spec and applies to the whole comparison.

Type errors that are visible without any message (``1 AND x``, ``TRUE + 1``,
``TRUE = 1``) are rejected here, with a column, as ActiveMQ rejects them at parse
time; everything else is decided per message at evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal as Lit
from typing import cast

from meshmq.core.selector.lexer import Token, TokenKind, tokenize
from meshmq.errors import SelectorError

MAX_DEPTH = 256

LiteralValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class Literal:
    value: LiteralValue
    column: int


@dataclass(frozen=True, slots=True)
class Ident:
    name: str
    column: int


ArithOp = Lit["+", "-", "*", "/", "%"]
CompareOp = Lit["=", "<>", "<", "<=", ">", ">="]


@dataclass(frozen=True, slots=True)
class Unary:
    op: Lit["-", "+"]
    operand: Node
    column: int


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    column: int


@dataclass(frozen=True, slots=True)
class Logic:
    op: Lit["AND", "OR"]
    operands: tuple[Node, ...]  # n-ary so long OR chains stay shallow
    column: int


@dataclass(frozen=True, slots=True)
class Arith:
    op: ArithOp
    left: Node
    right: Node
    column: int


@dataclass(frozen=True, slots=True)
class Compare:
    op: CompareOp
    left: Node
    right: Node
    column: int


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool
    column: int


@dataclass(frozen=True, slots=True)
class InList:
    operand: Node
    values: tuple[str, ...]
    negated: bool
    column: int


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: str
    escape: str | None
    negated: bool
    column: int


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool
    column: int


Node = Literal | Ident | Unary | Not | Logic | Arith | Compare | Between | InList | Like | IsNull

# Static kinds: what a node can evaluate to, "any" being an identifier's value.
Kind = Lit["bool", "num", "str", "any"]

_BP_OR = 1
_BP_AND = 2
_BP_NOT = 2  # NOT's operand takes everything binding tighter than AND
_BP_EQ = 4
_BP_REL = 5
_BP_ADD = 6
_BP_MUL = 7
_BP_UNARY = 8

_INFIX: dict[str, int] = {
    "OR": _BP_OR, "AND": _BP_AND,
    "=": _BP_EQ, "<>": _BP_EQ, "IS": _BP_EQ,
    "<": _BP_REL, "<=": _BP_REL, ">": _BP_REL, ">=": _BP_REL,
    "LIKE": _BP_REL, "BETWEEN": _BP_REL, "IN": _BP_REL,
    "+": _BP_ADD, "-": _BP_ADD,
    "*": _BP_MUL, "/": _BP_MUL, "%": _BP_MUL,
}
_NEGATABLE = frozenset({"LIKE", "BETWEEN", "IN"})


def kind_of(node: Node) -> Kind:
    if isinstance(node, Literal):
        v = node.value
        if isinstance(v, bool):
            return "bool"
        return "str" if isinstance(v, str) else "num"
    if isinstance(node, Ident):
        return "any"
    if isinstance(node, Unary | Arith):
        return "num"
    return "bool"


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Literal | Ident):
        return ()
    if isinstance(node, Logic):
        return node.operands
    if isinstance(node, Arith | Compare):
        return (node.left, node.right)
    if isinstance(node, Between):
        return (node.operand, node.low, node.high)
    return (node.operand,)


def identifiers(root: Node) -> frozenset[str]:
    names: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Ident):
            names.add(node.name)
        stack.extend(children(node))
    return frozenset(names)


def parse(text: str) -> Node:
    """Parse a selector into a syntax tree; raises SelectorError."""
    root = _Parser(tokenize(text)).parse()
    _check_depth(root)
    return root


def _check_depth(root: Node) -> None:
    # Left-associative chains (a+a+a+...) build deep trees without deep parser
    # recursion; the compiler and the evaluator recurse over the tree, so bound it
    # here, iteratively.
    stack: list[tuple[Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SelectorError(f"selector nested too deeply at column {node.column} "
                                f"(limit {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in children(node))


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    # -- token helpers -------------------------------------------------------

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind is not TokenKind.EOF:
            self.pos += 1
        return tok

    def unexpected(self, tok: Token, expected: str | None = None) -> SelectorError:
        msg = f"unexpected {tok.describe()}"
        if expected:
            msg += f", expected {expected}"
        return SelectorError(msg)

    def expect_op(self, op: str) -> Token:
        tok = self.advance()
        if tok.kind is not TokenKind.OP or tok.value != op:
            raise self.unexpected(tok, f"'{op}'")
        return tok

    def expect_keyword(self, word: str) -> Token:
        tok = self.advance()
        if tok.kind is not TokenKind.KEYWORD or tok.value != word:
            raise self.unexpected(tok, word)
        return tok

    def expect_string(self) -> Token:
        tok = self.advance()
        if tok.kind is not TokenKind.STRING:
            raise self.unexpected(tok, "a string literal")
        return tok

    # -- grammar -------------------------------------------------------------

    def parse(self) -> Node:
        node = self.expr(0)
        tok = self.peek()
        if tok.kind is not TokenKind.EOF:
            raise self.unexpected(tok)
        _require_boolean(node)
        return node

    def infix_power(self, tok: Token) -> int:
        if tok.kind is TokenKind.OP or tok.kind is TokenKind.KEYWORD:
            key = str(tok.value)
            if key == "NOT":
                nxt = self.tokens[self.pos + 1]
                if nxt.kind is TokenKind.KEYWORD and nxt.value in _NEGATABLE:
                    return _BP_REL
                return 0
            return _INFIX.get(key, 0)
        return 0

    def expr(self, min_bp: int) -> Node:
        # One expr() frame per nesting level: the recursion limit is never near.
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"selector nested too deeply at column {self.peek().column} "
                                f"(limit {MAX_DEPTH} levels)")
        left = self.prefix(min_bp)
        while True:
            tok = self.peek()
            bp = self.infix_power(tok)
            if bp <= min_bp:
                break
            self.advance()
            left = self.infix(left, tok, bp)
        self.depth -= 1
        return left

    def prefix(self, min_bp: int) -> Node:
        tok = self.advance()
        kind = tok.kind
        col = tok.column
        if kind is TokenKind.IDENT:
            return Ident(str(tok.value), col)
        if kind is TokenKind.STRING:
            return Literal(str(tok.value), col)
        if kind is TokenKind.INTEGER or kind is TokenKind.FLOAT:
            assert isinstance(tok.value, int | float)
            return Literal(tok.value, col)
        if kind is TokenKind.OP:
            if tok.value == "(":
                inner = self.expr(0)
                self.expect_op(")")
                return inner
            if tok.value in ("-", "+"):
                operand = self.expr(_BP_UNARY)
                _forbid_boolean(operand, str(tok.value), col)
                if isinstance(operand, Literal) and not isinstance(operand.value, str):
                    value = operand.value
                    return Literal(-value if tok.value == "-" else value, col)
                return Unary("-" if tok.value == "-" else "+", operand, col)
        elif kind is TokenKind.KEYWORD:
            word = tok.value
            if word in {"TRUE", "FALSE"}:
                return Literal(word == "TRUE", col)
            if word == "NOT" and min_bp <= _BP_NOT:
                operand = self.expr(_BP_NOT)
                _require_boolean(operand)
                return Not(operand, col)
            if word == "NULL":
                raise SelectorError(f"unexpected token {tok.text!r} at column {col}, "
                                    "NULL is only allowed in IS [NOT] NULL")
        raise self.unexpected(tok)

    def infix(self, left: Node, tok: Token, bp: int) -> Node:
        op = str(tok.value)
        col = tok.column
        if op in {"AND", "OR"}:
            _require_boolean(left)
            operands = [left]
            while True:
                right = self.expr(bp)
                _require_boolean(right)
                operands.append(right)
                nxt = self.peek()
                if nxt.kind is not TokenKind.KEYWORD or nxt.value != op:
                    break
                self.advance()
            return Logic("AND" if op == "AND" else "OR", tuple(operands), col)
        if op == "IS":
            negated = self.peek().kind is TokenKind.KEYWORD and self.peek().value == "NOT"
            if negated:
                self.advance()
            self.expect_keyword("NULL")
            return IsNull(left, negated, col)
        negated = op == "NOT"
        if negated:
            op = str(self.advance().value)
        if op == "LIKE":
            return self.like(left, negated, col)
        if op == "IN":
            return self.in_list(left, negated, col)
        if op == "BETWEEN":
            low = self.expr(_BP_REL)
            self.expect_keyword("AND")
            high = self.expr(_BP_REL)
            for operand in (left, low, high):
                _forbid_boolean(operand, "BETWEEN", col)
            return Between(left, low, high, negated, col)
        right = self.expr(bp)
        if op in {"=", "<>"}:
            kinds = {kind_of(left), kind_of(right)}
            if kinds == {"bool", "num"}:
                raise SelectorError(f"operator '{op}' at column {col} compares a boolean "
                                    "with a number")
            return Compare(cast(CompareOp, op), left, right, col)
        _forbid_boolean(left, op, col)
        _forbid_boolean(right, op, col)
        if op in ("<", "<=", ">", ">="):
            return Compare(cast(CompareOp, op), left, right, col)
        return Arith(cast(ArithOp, op), left, right, col)

    def like(self, left: Node, negated: bool, col: int) -> Like:
        pattern_tok = self.expect_string()
        pattern = str(pattern_tok.value)
        escape: str | None = None
        nxt = self.peek()
        if nxt.kind is TokenKind.KEYWORD and nxt.value == "ESCAPE":
            self.advance()
            esc_tok = self.expect_string()
            escape = str(esc_tok.value)
            if len(escape) != 1:
                raise SelectorError(f"ESCAPE string at column {esc_tok.column} must be "
                                    f"exactly one character, got {esc_tok.text}")
            # An escape must precede a character: 'ab\' would silently drop it.
            i = 0
            while i < len(pattern):
                if pattern[i] == escape:
                    if i + 1 == len(pattern):
                        raise SelectorError(f"LIKE pattern at column {pattern_tok.column} "
                                            "ends with its ESCAPE character")
                    i += 1
                i += 1
        return Like(left, pattern, escape, negated, col)

    def in_list(self, left: Node, negated: bool, col: int) -> InList:
        self.expect_op("(")
        values: list[str] = []
        while True:
            values.append(str(self.expect_string().value))
            tok = self.advance()
            if tok.kind is TokenKind.OP and tok.value == ")":
                return InList(left, tuple(values), negated, col)
            if tok.kind is not TokenKind.OP or tok.value != ",":
                raise self.unexpected(tok, "',' or ')'")


def _require_boolean(node: Node) -> None:
    if kind_of(node) in ("num", "str"):
        raise SelectorError(f"expression at column {node.column} is not a boolean condition")


def _forbid_boolean(node: Node, op: str, col: int) -> None:
    if kind_of(node) == "bool":
        raise SelectorError(f"operator '{op}' at column {col} cannot be applied to a "
                            "boolean value")
