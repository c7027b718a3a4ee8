"""Compile a selector tree into nested closures, once, for fast evaluation.

Every node becomes a closure ``f(lookup) -> value``; boolean nodes return
``True``/``False``/``None`` where ``None`` is SQL's *unknown*. All dispatch on
node type and operator happens here, at compile time, so evaluating a message
is only the closures calling each other. Constant subtrees are folded.

Typing rules (JMS 1.1 section 3.8.1): NULL/unknown propagates through arithmetic
and comparisons; comparing incompatible types is unknown; strings and booleans
support only = and <>. With ``convert_strings`` (meshmq's default, because STOMP
headers are always strings) a string meeting a number is parsed as a number, a
string meeting a boolean (or used as a condition) is parsed as 'true'/'false',
and strings are parsed as numbers in arithmetic and in <, <=, >, >=, BETWEEN.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable

from meshmq.core.message import PropertyValue
from meshmq.core.selector.parser import (
    Arith,
    Between,
    Compare,
    Ident,
    InList,
    IsNull,
    Like,
    Literal,
    Logic,
    Node,
    Not,
    Unary,
    identifiers,
    parse,
)
from meshmq.errors import SelectorError

Lookup = Callable[[str], PropertyValue]
Fn = Callable[[Lookup], PropertyValue]
Truth = bool | None
TruthFn = Callable[[Lookup], Truth]
Number = int | float

MAX_SELECTOR_LENGTH = 64 * 1024
CACHE_SIZE = 1024

_LONG_MIN = -(2**63)
_LONG_MAX = 2**63 - 1
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class Selector:
    """A compiled selector; immutable and shared (compile_selector caches it)."""

    __slots__ = ("_test", "convert_strings", "identifiers", "text")

    def __init__(self, text: str, test: TruthFn, names: frozenset[str],
                 convert_strings: bool) -> None:
        self.text = text
        self.identifiers = names
        self.convert_strings = convert_strings
        self._test = test

    def matches(self, lookup: Lookup) -> bool:
        """True only if the selector is TRUE; FALSE and unknown both reject."""
        return self._test(lookup) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str, *, convert_strings: bool = True) -> Selector:
    """Parse and compile ``text``; raises SelectorError (and nothing else)."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector too long: {len(text)} characters "
                            f"(limit {MAX_SELECTOR_LENGTH})")
    if not text.strip():
        raise SelectorError("selector is empty")
    return _compile_cached(text, convert_strings)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compile_cached(text: str, convert_strings: bool) -> Selector:
    try:
        root = parse(text)
        test = _Compiler(convert_strings).truth(root)
    except RecursionError:  # pragma: no cover - depth limits make this unreachable
        raise SelectorError("selector nested too deeply") from None
    return Selector(text, test, identifiers(root), convert_strings)


# -- value helpers (run per message: keep them lean) ---------------------------


def _is_num(v: object) -> bool:
    t = type(v)
    if t is int or t is float:
        return True
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fit(r: Number) -> Number | None:
    # Integers stay within Java's long like ActiveMQ's; beyond it we go approximate
    # rather than wrap, which also keeps big-number arithmetic cheap.
    if type(r) is int and not _LONG_MIN <= r <= _LONG_MAX:
        try:
            return float(r)
        except OverflowError:
            return None
    return r


def parse_number(text: str) -> Number | None:
    """A string property as a number, if it is one (Java-style decimal syntax)."""
    if len(text) > 64:
        return None
    if _INT_TEXT.fullmatch(text):
        return _fit(int(text))
    if _FLOAT_TEXT.fullmatch(text):
        return float(text)
    return None


def _parse_bool(text: str) -> bool | None:
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    return None


def _to_number(v: PropertyValue, conv: bool) -> Number | None:
    t = type(v)
    if t is int or t is float:
        return v  # type: ignore[return-value]
    if isinstance(v, str):
        return parse_number(v) if conv else None
    if isinstance(v, bool) or v is None:
        return None
    return v if isinstance(v, int | float) else None


def _to_truth(v: PropertyValue, conv: bool) -> Truth:
    if v is True or v is False:
        return v
    if conv and isinstance(v, str):
        return _parse_bool(v)
    return None


def _equal(a: PropertyValue, b: PropertyValue, conv: bool) -> Truth:
    if a is None or b is None:
        return None
    if type(a) is type(b):
        return a == b
    a_num = _is_num(a)
    b_num = _is_num(b)
    if a_num and b_num:
        return a == b
    if isinstance(a, bool) and isinstance(b, bool):
        return a == b
    if not conv:
        return None
    if isinstance(a, str) and not isinstance(b, str):
        a, b = b, a
    if not isinstance(b, str) or isinstance(a, str):
        return None
    # Now ``b`` is the string and ``a`` a number or a boolean.
    other = parse_number(b) if a_num or b_num else _parse_bool(b)
    return None if other is None else a == other


def _order(op: Callable[[Number, Number], bool], a: PropertyValue, b: PropertyValue,
           conv: bool) -> Truth:
    if a is None or b is None:
        return None
    x = _to_number(a, conv)
    if x is None:
        return None
    y = _to_number(b, conv)
    if y is None:
        return None
    return op(x, y)


def _div(x: Number, y: Number) -> Number | None:
    if y == 0:
        return None  # JMS leaves it undefined; unknown is the safe reading
    if isinstance(x, int) and isinstance(y, int):
        q = abs(x) // abs(y)  # Java truncates toward zero
        return q if (x < 0) == (y < 0) else -q
    return x / y


def _mod(x: Number, y: Number) -> Number | None:
    if y == 0:
        return None
    if isinstance(x, int) and isinstance(y, int):
        r = abs(x) % abs(y)  # Java's remainder takes the dividend's sign
        return -r if x < 0 else r
    return math.fmod(x, y)


_ARITH: dict[str, Callable[[Number, Number], Number | None]] = {
    "+": lambda x, y: _fit(x + y),
    "-": lambda x, y: _fit(x - y),
    "*": lambda x, y: _fit(x * y),
    "/": _div,
    "%": _mod,
}
_ORDER: dict[str, Callable[[Number, Number], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>"}


def _no_lookup(name: str) -> PropertyValue:  # pragma: no cover - constants need none
    raise AssertionError(f"constant subtree looked up {name!r}")


# -- LIKE ---------------------------------------------------------------------

_Segment = tuple[str | None, re.Pattern[str] | None, int]  # literal or regex, length


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A matcher for a LIKE pattern, built once.

    The pattern is split at '%' into fixed-length segments (each a literal or a
    small DOTALL regex of re.escape'd characters and '.' for '_'), matched
    leftmost-first. That is exact for such patterns and, unlike one '.*' regex,
    cannot backtrack catastrophically on a pattern like '%a%a%a%a%b'.
    """
    chunks: list[list[str | None]] = [[]]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == escape and i + 1 < len(pattern):
            i += 1
            chunks[-1].append(pattern[i])
        elif ch == "%":
            chunks.append([])
        elif ch == "_":
            chunks[-1].append(None)  # any one character
        else:
            chunks[-1].append(ch)
        i += 1
    segs: list[_Segment] = []
    for chunk in chunks:
        if None in chunk:
            regex = "".join("." if c is None else re.escape(c) for c in chunk)
            segs.append((None, re.compile(regex, re.DOTALL), len(chunk)))
        else:
            segs.append(("".join(c for c in chunk if c is not None), None, len(chunk)))

    if len(segs) == 1:
        lit, rx, _ = segs[0]
        if lit is not None:
            return lambda s: s == lit
        assert rx is not None
        return lambda s: rx.fullmatch(s) is not None

    first, middle, last = segs[0], segs[1:-1], segs[-1]
    # Fast paths for the usual shapes: 'abc%', '%abc', '%abc%'.
    head, tail = first[0], last[0]
    if len(segs) == 2 and head is not None and tail is not None:
        if not tail:
            return lambda s: s.startswith(head)
        if not head:
            return lambda s: s.endswith(tail)
    if len(segs) == 3 and head == "" and tail == "" and middle[0][0] is not None:
        needle = middle[0][0]
        return lambda s: needle in s

    min_len = sum(seg[2] for seg in segs)
    first_len = first[2]
    last_len = last[2]

    def at(seg: _Segment, s: str, pos: int) -> bool:
        lit, rx, _ = seg
        if lit is not None:
            return s.startswith(lit, pos)
        assert rx is not None
        return rx.match(s, pos) is not None

    def match(s: str) -> bool:
        if len(s) < min_len:
            return False
        end = len(s) - last_len
        if not at(first, s, 0) or not at(last, s, end):
            return False
        pos = first_len
        for lit, rx, length in middle:
            if lit is not None:
                found = s.find(lit, pos, end)
                if found < 0:
                    return False
                pos = found + length
            else:
                assert rx is not None
                m = rx.search(s, pos, end)
                if m is None:
                    return False
                pos = m.end()
        return True

    return match


# -- the compiler -------------------------------------------------------------


class _Compiler:
    def __init__(self, convert_strings: bool) -> None:
        self.conv = convert_strings
        # Closures known to be constant, with their value (for folding).
        self.consts: dict[Fn, PropertyValue] = {}

    def const(self, value: PropertyValue) -> Fn:
        def constant(lk: Lookup) -> PropertyValue:
            return value

        self.consts[constant] = value
        return constant

    def fold(self, fn: Fn, *kids: Fn) -> Fn:
        if all(k in self.consts for k in kids):
            return self.const(fn(_no_lookup))
        return fn

    def truth(self, node: Node) -> TruthFn:
        """A closure returning True/False/None for a node used as a condition."""
        fn = self.value(node)
        if not isinstance(node, Ident):
            # Every other node allowed here (the parser checked) yields a Truth.
            return fn  # type: ignore[return-value]
        name = node.name
        conv = self.conv

        def ident_truth(lk: Lookup) -> Truth:
            return _to_truth(lk(name), conv)

        return ident_truth

    def value(self, node: Node) -> Fn:
        if isinstance(node, Literal):
            return self.const(node.value)
        if isinstance(node, Ident):
            name = node.name
            return lambda lk: lk(name)
        if isinstance(node, Logic):
            return self.logic(node)
        if isinstance(node, Not):
            return self.not_(node)
        if isinstance(node, Unary):
            return self.unary(node)
        if isinstance(node, Arith):
            return self.arith(node)
        if isinstance(node, Compare):
            return self.compare(node)
        if isinstance(node, Between):
            return self.between(node)
        if isinstance(node, InList):
            return self.in_list(node)
        if isinstance(node, Like):
            return self.like(node)
        return self.is_null(node)

    def logic(self, node: Logic) -> Fn:
        fns = [self.truth(n) for n in node.operands]
        if node.op == "AND":
            if len(fns) == 2:
                f1, f2 = fns

                def and2(lk: Lookup) -> Truth:
                    a = f1(lk)
                    if a is False:
                        return False
                    b = f2(lk)
                    if a is True:
                        return b
                    return False if b is False else None

                fn: Fn = and2
            else:
                def and_n(lk: Lookup) -> Truth:
                    unknown = False
                    for f in fns:
                        r = f(lk)
                        if r is False:
                            return False
                        if r is None:
                            unknown = True
                    return None if unknown else True

                fn = and_n
        elif len(fns) == 2:
            f1, f2 = fns

            def or2(lk: Lookup) -> Truth:
                a = f1(lk)
                if a is True:
                    return True
                b = f2(lk)
                if a is False:
                    return b
                return True if b is True else None

            fn = or2
        else:
            def or_n(lk: Lookup) -> Truth:
                unknown = False
                for f in fns:
                    r = f(lk)
                    if r is True:
                        return True
                    if r is None:
                        unknown = True
                return None if unknown else False

            fn = or_n
        return self.fold(fn, *fns)

    def not_(self, node: Not) -> Fn:
        f = self.truth(node.operand)

        def not_fn(lk: Lookup) -> Truth:
            r = f(lk)
            return None if r is None else not r

        return self.fold(not_fn, f)

    def unary(self, node: Unary) -> Fn:
        f = self.value(node.operand)
        conv = self.conv
        if node.op == "+":
            def plus(lk: Lookup) -> PropertyValue:
                return _to_number(f(lk), conv)

            return self.fold(plus, f)

        def minus(lk: Lookup) -> PropertyValue:
            x = _to_number(f(lk), conv)
            return None if x is None else _fit(-x)

        return self.fold(minus, f)

    def arith(self, node: Arith) -> Fn:
        lf = self.value(node.left)
        rf = self.value(node.right)
        op = _ARITH[node.op]
        conv = self.conv

        def arith(lk: Lookup) -> PropertyValue:
            x = _to_number(lf(lk), conv)
            if x is None:
                return None
            y = _to_number(rf(lk), conv)
            if y is None:
                return None
            try:
                return op(x, y)
            except (OverflowError, ValueError):  # int too big for float; fmod(inf, ..)
                return None

        return self.fold(arith, lf, rf)

    def compare(self, node: Compare) -> Fn:
        lf = self.value(node.left)
        rf = self.value(node.right)
        op: str = node.op
        # Hot path: a variable side against a constant; put the constant on the right.
        if lf in self.consts and rf not in self.consts:
            lf, rf, op = rf, lf, _MIRROR[op]
        if rf in self.consts and self.consts[rf] is None:
            return self.const(None)  # comparing with NULL (e.g. folded 1/0): unknown
        conv = self.conv
        if op in {"=", "<>"}:
            negate = op == "<>"
            if rf in self.consts and lf not in self.consts:
                c = self.consts[rf]
                ctype = type(c)

                def eq_const(lk: Lookup) -> Truth:
                    v = lf(lk)
                    if type(v) is ctype:
                        return (v == c) is not negate
                    r = _equal(v, c, conv)
                    return r if r is None else r is not negate

                return eq_const

            def eq(lk: Lookup) -> Truth:
                r = _equal(lf(lk), rf(lk), conv)
                return r if r is None else r is not negate

            return self.fold(eq, lf, rf)

        cmp = _ORDER[op]
        if rf in self.consts and lf not in self.consts:
            c = self.consts[rf]
            if _is_num(c):
                num = c

                def order_const(lk: Lookup) -> Truth:
                    v = lf(lk)
                    t = type(v)
                    if t is int or t is float:
                        return cmp(v, num)  # type: ignore[arg-type]
                    return _order(cmp, v, num, conv)

                return order_const

        def order(lk: Lookup) -> Truth:
            return _order(cmp, lf(lk), rf(lk), conv)

        return self.fold(order, lf, rf)

    def between(self, node: Between) -> Fn:
        vf = self.value(node.operand)
        lof = self.value(node.low)
        hif = self.value(node.high)
        negated = node.negated
        conv = self.conv
        ge, le = operator.ge, operator.le

        def between(lk: Lookup) -> Truth:
            v = vf(lk)
            if v is None:
                return None
            low = _order(ge, v, lof(lk), conv)
            if low is False:
                return negated
            high = _order(le, v, hif(lk), conv)
            if high is False:
                return negated
            if low is None or high is None:
                return None
            return not negated

        return self.fold(between, vf, lof, hif)

    def in_list(self, node: InList) -> Fn:
        f = self.value(node.operand)
        values = frozenset(node.values)
        negated = node.negated

        def in_fn(lk: Lookup) -> Truth:
            v = f(lk)
            if isinstance(v, str):
                return (v in values) is not negated
            return None  # NULL, or not a string: unknown

        return self.fold(in_fn, f)

    def like(self, node: Like) -> Fn:
        f = self.value(node.operand)
        matcher = like_matcher(node.pattern, node.escape)
        negated = node.negated

        def like_fn(lk: Lookup) -> Truth:
            v = f(lk)
            if isinstance(v, str):
                return matcher(v) is not negated
            return None

        return self.fold(like_fn, f)

    def is_null(self, node: IsNull) -> Fn:
        f = self.value(node.operand)
        negated = node.negated

        def is_null(lk: Lookup) -> Truth:
            return (f(lk) is None) is not negated

        return self.fold(is_null, f)
