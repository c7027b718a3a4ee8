"""Evaluation semantics: every operator, SQL three-valued logic, conversions, JMS fields."""

from __future__ import annotations

import pytest

from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.selector import compile_selector, message_lookup
from meshmq.core.selector.compiler import like_matcher

Props = dict[str, PropertyValue]

PROPS: Props = {
    "a": 5, "f": 2.5, "s": "abc", "t": True, "n": False, "zero": 0, "neg": -7,
    "big": 2**62, "huge": 10**400, "q": "it's", "price": "10", "nine": "9",
    "word": "abc", "flag": "true", "FLAG": "TRUE",
}


def truth(text: str, props: Props = PROPS, *, convert_strings: bool = True) -> bool | None:
    """The three-valued result: a selector and its negation both fail only if unknown."""
    pos = compile_selector(text, convert_strings=convert_strings).matches(props.get)
    neg = compile_selector(f"NOT ({text})", convert_strings=convert_strings).matches(props.get)
    assert not (pos and neg), text
    return True if pos else False if neg else None


def check(cases: list[tuple[str, bool | None]]) -> None:
    failures = [(text, want, got) for text, want in cases if (got := truth(text)) is not want]
    assert not failures


@pytest.mark.parametrize(("text", "want"), [
    # numbers, mixed int/float
    ("a = 5", True), ("a <> 5", False), ("a < 6", True), ("a <= 5", True),
    ("a > 5", False), ("a >= 5", True), ("a = 5.0", True), ("a < 5.5", True),
    ("f = 2.5", True), ("f > a", False), ("5 = a", True), ("6 > a", True), ("4 >= a", False),
    ("a = -5", False), ("neg = -7", True), ("neg < -6.5", True),
    # strings: only = and <>
    ("s = 'abc'", True), ("s <> 'abc'", False), ("s = 'ABC'", False), ("s = word", True),
    ("s < 'b'", None), ("s >= 'abc'", None), ("'a' < 'b'", None),
    ("q = 'it''s'", True),
    # booleans: only = and <>
    ("t = TRUE", True), ("t <> FALSE", True), ("t = n", False), ("n = FALSE", True),
    ("t < n", None), ("TRUE = TRUE", True), ("(a = 5) = TRUE", True), ("(a = 5) <> t", False),
    # incompatible types are unknown, not false
    ("a = 'abc'", None), ("a <> 'abc'", None), ("a = t", None), ("s = 5", None),
    ("s > 5", None), ("t = 'yes'", None),
    # NULL (missing) propagates
    ("m = 1", None), ("m <> 1", None), ("m > 1", None), ("m = m", None), ("m = 'x'", None),
    ("m IS NULL", True), ("m IS NOT NULL", False), ("a IS NULL", False),
    ("a IS NOT NULL", True), ("m + 1 IS NULL", True), ("(m = 1) IS NULL", True),
    ("(a = 1) IS NULL", False),
])
def test_comparisons(text: str, want: bool | None) -> None:
    assert truth(text) is want


@pytest.mark.parametrize(("text", "want"), [
    ("a + 1 = 6", True), ("a - 1 = 4", True), ("a * 2 = 10", True), ("a / 2 = 2", True),
    ("neg / 2 = -3", True), ("7 / -2 = -3", True), ("a / 2.0 = 2.5", True),
    ("a % 3 = 2", True), ("neg % 3 = -1", True), ("7 % -3 = 1", True), ("f % 1 = 0.5", True),
    ("-a = -5", True), ("+a = 5", True), ("- -a = 5", True), ("-(a + 1) = -6", True),
    ("1 + 2 * 3 = 7", True), ("(1 + 2) * 3 = 9", True), ("10 - 2 - 3 = 5", True),
    ("12 / 2 / 3 = 2", True), ("a + f = 7.5", True), ("0.1 + 0.2 > 0.3", True),
    ("a / 0 = 0", None), ("a / zero IS NULL", True), ("f / 0.0 IS NULL", True),
    ("a % 0 IS NULL", True), ("m + 1 = 1", None), ("-m IS NULL", True), ("a * m IS NULL", True),
    ("a + s IS NULL", True), ("a + t IS NULL", True), ("-s IS NULL", True),
    ("big * big > 0", True),  # past Java's long: promoted to float, not wrapped
    ("huge * 1.5 IS NULL", True),  # too big even for a float: unknown, no exception
    # A huge int compares fine, but arithmetic needing it as a float is unknown.
    ("huge > 1", True), ("huge + 1 IS NULL", True),
    ("9223372036854775807 + 1 > 0", True),
])
def test_arithmetic(text: str, want: bool | None) -> None:
    assert truth(text) is want


@pytest.mark.parametrize(("text", "want"), [
    ("a BETWEEN 1 AND 10", True), ("a BETWEEN 5 AND 5", True), ("a BETWEEN 6 AND 10", False),
    ("a BETWEEN 10 AND 1", False), ("a NOT BETWEEN 6 AND 10", True),
    ("a NOT BETWEEN 1 AND 10", False), ("a BETWEEN 1.5 AND 5.5", True),
    ("a + 1 BETWEEN 6 AND 2 * 3", True), ("f BETWEEN a - 3 AND a", True),
    ("m BETWEEN 1 AND 2", None), ("m NOT BETWEEN 1 AND 2", None),
    ("a BETWEEN m AND 10", None), ("a NOT BETWEEN m AND 10", None),
    ("a BETWEEN m AND 4", False), ("a NOT BETWEEN m AND 4", True),  # unknown AND false
    ("a BETWEEN 6 AND m", False), ("s BETWEEN 'a' AND 'z'", None), ("t BETWEEN 0 AND 1", None),
])
def test_between(text: str, want: bool | None) -> None:
    assert truth(text) is want


@pytest.mark.parametrize(("text", "want"), [
    ("s IN ('abc', 'def')", True), ("s IN ('x')", False), ("s IN ('ABC')", False),
    ("s NOT IN ('x', 'y')", True), ("s NOT IN ('abc')", False),
    ("q IN ('it''s')", True), ("m IN ('x')", None), ("m NOT IN ('x')", None),
    ("a IN ('5')", None), ("a NOT IN ('5')", None), ("t IN ('true')", None),
    ("s IN ('abc', 'abc')", True), ("'x' IN ('x')", True),
])
def test_in(text: str, want: bool | None) -> None:
    assert truth(text) is want


@pytest.mark.parametrize(("pattern", "escape", "value", "want"), [
    ("abc", None, "abc", True), ("abc", None, "abcd", False), ("abc", None, "ABC", False),
    ("", None, "", True), ("", None, "a", False),
    ("%", None, "", True), ("%", None, "anything", True), ("%%", None, "x", True),
    ("_", None, "a", True), ("_", None, "", False), ("_", None, "ab", False),
    ("a%", None, "abc", True), ("a%", None, "ba", False), ("%c", None, "abc", True),
    ("%c", None, "cb", False), ("%b%", None, "abc", True), ("%b%", None, "ac", False),
    ("a_c", None, "abc", True), ("a_c", None, "ac", False), ("a_c", None, "abbc", False),
    ("a%c", None, "ac", True), ("a%c", None, "abbbc", True), ("a%c", None, "abcd", False),
    ("%a%b%", None, "xaybz", True), ("%a%b%", None, "xbya", False),
    ("%ab%ab%", None, "abab", True), ("%ab%ab%", None, "aba", False),
    ("a%b%c", None, "abc", True), ("a%b%c", None, "ac", False), ("a%bc%c", None, "abcc", True),
    ("a%bc%c", None, "abc", False),
    ("_%_", None, "ab", True), ("_%_", None, "a", False), ("%_b_%", None, "aabaa", True),
    ("%_b_%", None, "ab", False), ("%_b_%", None, "abc", True),
    ("%a_c%", None, "xxabcxx", True), ("%a_c%", None, "xxacxx", False),
    ("a.c", None, "abc", False), ("a.c", None, "a.c", True), ("(x)*[y]", None, "(x)*[y]", True),
    ("a%", None, "a\nb", True), ("a_b", None, "a\nb", True),  # DOTALL: newlines are characters
    # ESCAPE, including escaped % and _
    ("100!%", "!", "100%", True), ("100!%", "!", "1000", False),
    ("a!_b", "!", "a_b", True), ("a!_b", "!", "axb", False),
    ("%!%%", "!", "50% off", True), ("%!%%", "!", "50 off", False),
    ("!!", "!", "!", True), ("a!!%", "!", "a!x", True), ("a!!%", "!", "ax", False),
    ("a\\%", "\\", "a%", True), ("a\\%", "\\", "ab", False),
    ("%\\_%", "\\", "snake_case", True), ("%\\_%", "\\", "camelCase", False),
    ("!a", "!", "a", True),  # escaping an ordinary character is harmless
    ("%%", "%", "%", True), ("%%", "%", "x", False),  # the escape wins over the wildcard
    ("x__", "_", "x_", True),
])
def test_like(pattern: str, escape: str | None, value: str, want: bool) -> None:
    assert like_matcher(pattern, escape)(value) is want
    pat = pattern.replace("'", "''")
    esc = "" if escape is None else f" ESCAPE '{escape}'"
    props: Props = {"v": value}
    assert truth(f"v LIKE '{pat}'{esc}", props) is want
    assert truth(f"v NOT LIKE '{pat}'{esc}", props) is (not want)


@pytest.mark.parametrize(("text", "want"), [
    ("m LIKE 'a%'", None), ("m NOT LIKE 'a%'", None), ("a LIKE '5'", None),
    ("a NOT LIKE '5'", None), ("t LIKE 'true'", None), ("q LIKE 'it''_'", True),
])
def test_like_on_non_strings_is_unknown(text: str, want: bool | None) -> None:
    assert truth(text) is want


def test_like_does_not_backtrack_catastrophically() -> None:
    sel = compile_selector("v LIKE '%a%a%a%a%a%a%a%a%a%a%a%a%b'")
    assert not sel.matches({"v": "a" * 5000}.get)  # a naive '.*' regex never finishes


SQL_AND = {(True, True): True, (True, False): False, (True, None): None,
           (False, True): False, (False, False): False, (False, None): False,
           (None, True): None, (None, False): False, (None, None): None}
SQL_OR = {(True, True): True, (True, False): True, (True, None): True,
          (False, True): True, (False, False): False, (False, None): None,
          (None, True): True, (None, False): None, (None, None): None}
VALUES: dict[bool | None, PropertyValue] = {True: True, False: False, None: None}


@pytest.mark.parametrize("pair", list(SQL_AND))
@pytest.mark.parametrize("spelling", ["property", "comparison"])
def test_three_valued_logic(pair: tuple[bool | None, bool | None], spelling: str) -> None:
    x, y = pair
    if spelling == "property":
        props: Props = {"x": VALUES[x], "y": VALUES[y]}
        ex, ey = "x", "y"
    else:  # the same truth values produced by comparisons (None: comparing NULL)
        props = {"x": {True: 1, False: 0, None: None}[x], "y": {True: 1, False: 0, None: None}[y]}
        ex, ey = "x = 1", "y = 1"
    assert truth(f"{ex} AND {ey}", props) is SQL_AND[pair]
    assert truth(f"{ex} OR {ey}", props) is SQL_OR[pair]
    assert truth(f"{ex} AND {ey} AND {ex}", props) is SQL_AND[pair]  # n-ary path
    assert truth(f"{ex} OR {ey} OR {ex}", props) is SQL_OR[pair]
    assert truth(f"NOT ({ex})", props) is (None if x is None else not x)
    assert truth(f"NOT NOT ({ex})", props) is x


@pytest.mark.parametrize(("text", "want"), [
    ("TRUE", True), ("FALSE", False), ("NOT TRUE", False), ("TRUE AND m = 1", None),
    ("FALSE AND m = 1", False), ("TRUE OR m = 1", True), ("1 = 1", True), ("1 = 2", False),
    ("'a' = 'a'", True), ("1 / 0 = 1", None), ("1 + 1 BETWEEN 1 AND 3", True),
    ("'x' LIKE 'x%'", True), ("2 > 1 AND 3 > 2", True),
])
def test_constant_selectors(text: str, want: bool | None) -> None:
    assert truth(text, {}) is want


def test_non_boolean_property_as_condition_is_unknown() -> None:
    for value in (1, 0, 2.5, "yes", "", None):
        assert truth("x", {"x": value}) is None


@pytest.mark.parametrize(("text", "converted", "strict"), [
    ("price > 5", True, None), ("price = 10", True, None), ("price <> 10", False, None),
    ("price = 10.0", True, None), ("10 = price", True, None), ("price < 9.5", False, None),
    ("price = '10'", True, True), ("price + 1 = 11", True, None), ("-price = -10", True, None),
    ("price BETWEEN 5 AND 20", True, None), ("price * 2 = 20", True, None),
    ("price > nine", True, None),  # both numeric strings: compared as numbers
    ("price = nine", False, False),  # ... but = on two strings stays a string comparison
    ("'10' > 9", True, None), ("'1e1' = 10", True, None), ("'-2.5' < 0", True, None),
    ("word > 5", None, None), ("word = 5", None, None), ("word + 1 IS NULL", True, True),
    ("' 10' = 10", None, None), ("'0x10' = 16", None, None), ("'1_0' = 10", None, None),
    ("'nan' = 1", None, None), ("'' = 0", None, None),
    ("flag = TRUE", True, None), ("flag", True, None), ("FLAG", True, None),
    ("NOT flag", False, None), ("flag AND a = 5", True, None), ("FLAG = FALSE", False, None),
    ("'false' = FALSE", True, None), ("word = TRUE", None, None), ("word", None, None),
    ("flag = 'true'", True, True), ("t = 'true'", True, None), ("t", True, True),
])
def test_string_conversion(text: str, converted: bool | None, strict: bool | None) -> None:
    assert truth(text) is converted
    assert truth(text, convert_strings=False) is strict


# -- JMS header fields ---------------------------------------------------------

QUEUE = Destination(DestKind.QUEUE, "orders")


def make_message(**changes: object) -> Message:
    fields: dict[str, object] = {
        "message_id": "ID:broker-1:1", "destination": QUEUE, "body": b"payload",
        "properties": {"color": "red", "weight": 3, "JMSPriority": 0},
        "persistent": True, "priority": 7, "timestamp": 1_700_000_000_000,
        "expiration": 0, "correlation_id": "corr-9",
        "reply_to": Destination(DestKind.TOPIC, "replies"), "type": "order",
        "group_id": "g1", "group_seq": 3, "user_id": "alice",
    }
    fields.update(changes)
    return Message(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", [
    "JMSMessageID = 'ID:broker-1:1'",
    "JMSPriority = 7",  # the header wins over a property of the same name
    "JMSPriority > 4",
    "JMSTimestamp = 1700000000000",
    "JMSTimestamp BETWEEN 1600000000000 AND 1800000000000",
    "JMSCorrelationID = 'corr-9'",
    "JMSType = 'order'",
    "JMSDeliveryMode = 'PERSISTENT'",
    "JMSExpiration = 0",
    "JMSDestination = 'queue://orders'",
    "JMSReplyTo = 'topic://replies'",
    "JMSRedelivered = FALSE",
    "NOT JMSRedelivered",
    "JMSXGroupID = 'g1'",
    "JMSXGroupSeq = 3",
    "JMSXDeliveryCount = 1",
    "JMSXUserID = 'alice'",
    "color = 'red' AND weight * 2 = 6",
    "missing IS NULL",
    "JMSMessageID LIKE 'ID:%'",
])
def test_message_lookup_fields(text: str) -> None:
    assert compile_selector(text).matches(message_lookup(make_message()))


def test_message_lookup_delivery_state_and_variants() -> None:
    msg = make_message()
    lookup = message_lookup(msg, delivery_count=3, redelivered=True)
    assert compile_selector("JMSXDeliveryCount = 3 AND JMSRedelivered").matches(lookup)
    assert compile_selector("JMSRedelivered = TRUE").matches(lookup)

    plain = message_lookup(make_message(persistent=False, reply_to=None, correlation_id=None,
                                        type=None, group_id=None, user_id=None))
    assert compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'").matches(plain)
    for name in ("JMSReplyTo", "JMSCorrelationID", "JMSType", "JMSXGroupID", "JMSXUserID"):
        assert compile_selector(f"{name} IS NULL").matches(plain), name

    # Like ActiveMQ, JMSDestination is where the message was originally sent.
    moved = message_lookup(make_message(destination=Destination(DestKind.QUEUE, "DLQ"),
                                        original_destination=QUEUE))
    assert compile_selector("JMSDestination = 'queue://orders'").matches(moved)
    topic = message_lookup(make_message(destination=Destination(DestKind.TOPIC, "t.a")))
    assert compile_selector("JMSDestination = 'topic://t.a'").matches(topic)


def test_message_lookup_properties_only_for_other_names() -> None:
    lookup = message_lookup(make_message(properties={"JMSXCustom": "x", "jmspriority": 1}))
    assert lookup("JMSXCustom") == "x"
    assert lookup("jmspriority") == 1  # names are case-sensitive: not the header
    assert lookup("JMSPriority") == 7
    assert lookup("absent") is None


def test_stomp_style_headers_select_numerically() -> None:
    # STOMP headers arrive as strings; the default conversion makes them comparable.
    lookup = message_lookup(make_message(properties={"price": "10", "qty": "3"}))
    assert compile_selector("price > 5 AND price * qty = 30").matches(lookup)
    assert not compile_selector("price > 5", convert_strings=False).matches(lookup)
