"""Property tests: any text compiles or raises SelectorError; random well-formed
selectors agree with a small, independent reference interpreter."""

from __future__ import annotations

import math
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshmq.core.message import PropertyValue
from meshmq.core.selector import compile_selector
from meshmq.errors import SelectorError

# -- arbitrary input never escapes as anything but SelectorError -----------------

SELECTOR_TOKENS = [
    "a", "b", "JMSType", "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "(", ")",
    ",", "AND", "or", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "false",
    "'x'", "'%'", "'!'", "''", "'", "1", "0x1F", "017", "09", "1.5", ".5", "7.", "1e3", "2F",
    "9223372036854775808", "--", "/*", "*/", "\n", "!",
]


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.text(),
    st.text(alphabet="ab01 .'()=<>+-*/%,eExXlLfFdD_$!\n"),
    st.lists(st.sampled_from(SELECTOR_TOKENS), max_size=30).map(" ".join),
), st.booleans())
def test_any_text_compiles_or_raises_selector_error(text: str, convert: bool) -> None:
    try:
        selector = compile_selector(text, convert_strings=convert)
    except SelectorError as exc:
        assert str(exc)
        return
    samples: list[dict[str, PropertyValue]] = [
        {}, {"a": 1, "b": "x"}, {"a": "1", "b": True, "JMSType": 2.5}]
    for props in samples:
        assert selector.matches(props.get) in (True, False)


# -- random well-formed selectors vs a reference interpreter ---------------------
# Expressions are tuples rendered fully parenthesized, so the parser's precedence
# is not what is under test here (test_selector_syntax covers it).

NAMES = ["a", "b", "c", "s"]
STRINGS = ["", "a", "ab", "a%b", "a_b", "it's", "10", "-3", "2.5", "true", "FALSE"]
NUMERIC_STRINGS: dict[str, int | float] = {"10": 10, "-3": -3, "2.5": 2.5}
FLOATS = [0.5, 2.5, -1.0, 1000.0]

prop_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(FLOATS),
    st.sampled_from(STRINGS),
)
props_strategy = st.dictionaries(st.sampled_from(NAMES), prop_values)

ident = st.sampled_from(NAMES).map(lambda n: ("id", n))
value_leaf = st.one_of(
    ident,
    st.integers(0, 5).map(lambda i: ("lit", i)),
    st.sampled_from(FLOATS).map(lambda f: ("lit", abs(f))),
    st.sampled_from(STRINGS).map(lambda s: ("lit", s)),
)


def _value_branches(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.tuples(st.just("arith"), st.sampled_from("+-*/%"), children, children),
        st.tuples(st.just("neg"), children),
    )


values = st.recursive(value_leaf, _value_branches, max_leaves=6)

like_pattern = st.lists(st.sampled_from(["a", "b", "%", "_", "!%", "!_", "!!", "'"]),
                        max_size=6).map("".join)

bool_leaf = st.one_of(
    st.booleans().map(lambda b: ("lit", b)),
    ident,
    st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), values, values),
    st.tuples(st.just("between"), st.booleans(), values, values, values),
    st.tuples(st.just("in"), st.booleans(), ident,
              st.lists(st.sampled_from(STRINGS), min_size=1, max_size=3)),
    st.tuples(st.just("like"), st.booleans(), ident, like_pattern, st.booleans()),
    st.tuples(st.just("isnull"), st.booleans(), values),
)


def _bool_branches(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.tuples(st.sampled_from(["AND", "OR"]), children, children),
        st.tuples(st.just("NOT"), children),
    )


conditions = st.recursive(bool_leaf, _bool_branches, max_leaves=8)


def quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def render(e: Any) -> str:
    tag = e[0]
    if tag == "lit":
        v = e[1]
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        return quote(v) if isinstance(v, str) else repr(v)
    if tag == "id":
        return str(e[1])
    if tag == "neg":
        return f"(- {render(e[1])})"
    if tag == "arith":
        return f"({render(e[2])} {e[1]} {render(e[3])})"
    if tag == "cmp":
        return f"({render(e[2])} {e[1]} {render(e[3])})"
    if tag == "between":
        neg = "NOT " if e[1] else ""
        return f"({render(e[2])} {neg}BETWEEN {render(e[3])} AND {render(e[4])})"
    if tag == "in":
        neg = "NOT " if e[1] else ""
        return f"({render(e[2])} {neg}IN ({', '.join(quote(s) for s in e[3])}))"
    if tag == "like":
        neg = "NOT " if e[1] else ""
        esc = " ESCAPE '!'" if e[4] else ""
        return f"({render(e[2])} {neg}LIKE {quote(e[3])}{esc})"
    if tag == "isnull":
        return f"({render(e[2])} IS {'NOT ' if e[1] else ''}NULL)"
    if tag == "NOT":
        return f"(NOT {render(e[1])})"
    return f"({render(e[1])} {tag} {render(e[2])})"


def kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    return "num" if isinstance(v, int | float) else "str"


def num(v: Any, conv: bool) -> Any:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        return NUMERIC_STRINGS.get(v) if conv else None
    return v


def boolean(v: Any, conv: bool) -> Any:
    if isinstance(v, bool):
        return v
    if conv and isinstance(v, str):
        return {"true": True, "false": False}.get(v.lower())
    return None


def and3(x: Any, y: Any) -> Any:
    if x is False or y is False:
        return False
    return None if x is None or y is None else True


def not3(x: Any) -> Any:
    return None if x is None else not x


def like_regex(pattern: str, escape: bool) -> re.Pattern[str]:
    out, chars = [], iter(pattern)
    for ch in chars:
        if escape and ch == "!":
            out.append(re.escape(next(chars)))
        else:
            out.append({"%": ".*", "_": "."}.get(ch, re.escape(ch)))
    return re.compile("".join(out), re.DOTALL)


def ev(e: Any, p: dict[str, Any], conv: bool) -> Any:
    tag = e[0]
    if tag == "lit":
        return e[1]
    if tag == "id":
        return p.get(e[1])
    if tag == "neg":
        x = num(ev(e[1], p, conv), conv)
        return None if x is None else -x
    if tag == "arith":
        x, y = num(ev(e[2], p, conv), conv), num(ev(e[3], p, conv), conv)
        if x is None or y is None or (e[1] in "/%" and y == 0):
            return None
        both_int = isinstance(x, int) and isinstance(y, int)
        if e[1] == "/":
            return int(x / y) if both_int else x / y  # Java truncates integer division
        if e[1] == "%":
            return int(math.fmod(x, y)) if both_int else math.fmod(x, y)
        return {"+": x + y, "-": x - y, "*": x * y}[e[1]]
    if tag == "cmp":
        x, y = ev(e[2], p, conv), ev(e[3], p, conv)
        return compare(e[1], x, y, conv)
    if tag == "between":
        x = ev(e[2], p, conv)
        r = and3(compare(">=", x, ev(e[3], p, conv), conv),
                 compare("<=", x, ev(e[4], p, conv), conv))
        return not3(r) if e[1] else r
    if tag in ("in", "like"):
        x = ev(e[2], p, conv)
        if not isinstance(x, str):
            return None
        r = x in e[3] if tag == "in" else bool(like_regex(e[3], e[4]).fullmatch(x))
        return not r if e[1] else r
    if tag == "isnull":
        return (ev(e[2], p, conv) is None) != e[1]
    if tag == "NOT":
        return not3(cond(e[1], p, conv))
    x, y = cond(e[1], p, conv), cond(e[2], p, conv)
    return and3(x, y) if tag == "AND" else not3(and3(not3(x), not3(y)))


def cond(e: Any, p: dict[str, Any], conv: bool) -> Any:
    return boolean(ev(e, p, conv), conv)


def compare(op: str, x: Any, y: Any, conv: bool) -> Any:
    if x is None or y is None:
        return None
    if op in ("=", "<>"):
        kx, ky = kind(x), kind(y)
        if kx != ky:
            if not conv or "str" not in (kx, ky):
                return None
            s, other = (x, y) if kx == "str" else (y, x)
            x, y = (num(s, conv) if kind(other) == "num" else boolean(s, conv)), other
            if x is None:
                return None
        return (x == y) == (op == "=")
    x, y = num(x, conv), num(y, conv)
    if x is None or y is None:
        return None
    return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(conditions, st.lists(props_strategy, min_size=1, max_size=4), st.booleans())
def test_compiled_selectors_agree_with_reference(expr: Any, props_list: list[dict[str, Any]],
                                                 conv: bool) -> None:
    text = render(expr)
    selector = compile_selector(text, convert_strings=conv)
    for props in props_list:
        want = cond(expr, props, conv) is True
        assert selector.matches(props.get) is want, (text, props)
