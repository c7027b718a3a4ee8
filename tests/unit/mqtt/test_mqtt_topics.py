"""MQTT topic validation, shared subscriptions, and the destination-name mapping.

The mapping is checked against the broker core's own grammar
(:mod:`meshmq.core.destinations`): every MQTT topic maps to a valid concrete
name and back, every name maps to a valid MQTT topic and back, and MQTT filter
matching agrees with core pattern matching plus the parent/``$`` rules.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshmq.core.destinations import name_matches, validate_name
from meshmq.errors import DestinationError
from meshmq.protocol.mqtt import (
    DestinationFilter,
    ReasonCode,
    TopicError,
    destination_name_to_mqtt_topic,
    destination_pattern_to_mqtt_filter,
    is_shared,
    mqtt_filter_to_destination,
    mqtt_topic_to_destination_name,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=500,
                    suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------------- validation

@pytest.mark.parametrize("topic", ["a", "a/b", "/", "//", "a//b", "$SYS/x", "a b", "é/😀",
                                   "*", ">", "a.b", "%"])
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize("topic", ["", "+", "#", "a/+", "a/#", "a+b", "a#", "a\x00b",
                                   "a" * 65536])
def test_invalid_topic_names(topic: str) -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_name(topic)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


@pytest.mark.parametrize("topic_filter", ["#", "+", "a/#", "a/+/b", "+/+", "/#", "a//+",
                                          "$share/g/a/#", "$SYS/#", "a/b", "+/", "$share/g/#"])
def test_valid_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(("topic_filter", "level"), [
    ("", 5), ("a/#/b", 5), ("#/a", 5), ("a#", 5), ("a/b#", 5), ("a+", 5), ("+a/b", 5),
    ("a/+b", 5), ("a\x00", 5), ("$share/", 5), ("$share/g", 5), ("$share/g/", 5),
    ("$share//a", 5), ("$share/+/a", 5), ("$share/#/a", 5), ("$share/a+b/c", 4),
])
def test_invalid_filters(topic_filter: str, level: int) -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_filter(topic_filter, protocol_level=level)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


def test_share_syntax_is_plain_text_in_311() -> None:
    validate_topic_filter("$share/+/a", protocol_level=4)
    validate_topic_filter("$share/g", protocol_level=4)


@pytest.mark.parametrize(("topic_filter", "expected"), [
    ("$share/g/a/b", ("g", "a/b")), ("$share/group/#", ("group", "#")),
    ("$share/g//x", ("g", "/x")), ("a/b", None), ("$share/g", None), ("$share//a", None),
    ("$share/+/a", None), ("$SHARE/g/a", None), ("$share/g/", None),
])
def test_is_shared(topic_filter: str, expected: tuple[str, str] | None) -> None:
    assert is_shared(topic_filter) == expected


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), [
    ("a/b", "a/b", True), ("a/+", "a/b", True), ("a/+", "a", False), ("a/+", "a/", True),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "a", True), ("#", "/", True),
    ("+", "a", True), ("+", "/a", False), ("+/+", "/a", True), ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/x", True), ("$SYS/#", "$SYS", True),
    ("a/b", "a/c", False), ("a/+/c", "a/b/c", True), ("a/+/c", "a/b/d", False),
])
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


# ---------------------------------------------------------------------------- mapping

MAPPING = [
    ("a", "a"), ("a/b/c", "a.b.c"), ("a.b/c", "a/b.c"), ("a//b", "a.%00.b"), ("/a", "%00.a"),
    ("a/", "a.%00"), ("/", "%00.%00"), ("$SYS/broker/load", "$SYS.broker.load"),
    ("x*y", "x%2Ay"), ("a/>", "a.%3E"), ("a,b", "a%2Cb"), ("100%", "100%"),
    ("50%off", "50%off"), ("%2A", "%252A"), ("%252A", "%25252A"), ("%2B", "+"),
    ("%23", "#"), ("%252B", "%2B"), ("price%2Btax", "price+tax"), ("%00", "%2500"),
    ("%2500", "%252500"), ("a/%00", "a.%2500"), ("%00x", "%00x"), ("%2a", "%2a"),
    ("%", "%"), ("%%2A", "%%252A"), ("a.%2A", "a/%252A"),
]


@pytest.mark.parametrize(("topic", "name"), MAPPING)
def test_mapping_table(topic: str, name: str) -> None:
    assert mqtt_topic_to_destination_name(topic) == name
    assert destination_name_to_mqtt_topic(name) == topic
    validate_name(name)


@pytest.mark.parametrize("name", ["", "%00", "a..b", ".a", "a.", "a.*", "a.>", "a*", "x,y",
                                  "a\x00"])
def test_names_without_topics(name: str) -> None:
    with pytest.raises(DestinationError):
        destination_name_to_mqtt_topic(name)


@pytest.mark.parametrize(("topic_filter", "expected"), [
    ("a/b", DestinationFilter("a.b", None, False)),
    ("a/+", DestinationFilter("a.*", None, False)),
    ("a/#", DestinationFilter("a.>", "a", False)),
    ("+/b/#", DestinationFilter("*.b.>", "*.b", True)),
    ("#", DestinationFilter(">", None, True)),
    ("+", DestinationFilter("*", None, True)),
    ("/#", DestinationFilter("%00.>", "%00", False)),
    ("a.b/*/#", DestinationFilter("a/b.%2A.>", "a/b.%2A", False)),
    ("$SYS/#", DestinationFilter("$SYS.>", "$SYS", False)),
])
def test_filter_mapping(topic_filter: str, expected: DestinationFilter) -> None:
    assert mqtt_filter_to_destination(topic_filter) == expected


@pytest.mark.parametrize(("pattern", "topic_filter"), [
    ("a.*", "a/+"), ("a.>", "a/#"), (">", "#"), ("a/b.*.c+d", "a.b/+/c%2Bd"),
    ("%00.*", "/+"),
])
def test_pattern_to_filter(pattern: str, topic_filter: str) -> None:
    assert destination_pattern_to_mqtt_filter(pattern) == topic_filter


@pytest.mark.parametrize("pattern", ["", "a..b", ">.a", "a*", "%00", "a\x00"])
def test_bad_patterns(pattern: str) -> None:
    with pytest.raises(DestinationError):
        destination_pattern_to_mqtt_filter(pattern)


# ------------------------------------------------------------------ mapping properties

# Small alphabets so escapes, lookalikes and matches all happen often.
PIECES = ["a", "b", ".", "*", ">", ",", "%", "2", "5", "A", "B", "3", "E", "C", "0", "%2A",
          "%25", "%2B", "%23", "%00", "$", "é", " "]
LEVEL = st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
TOPIC = st.lists(LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)
SEGMENT_PIECES = ["a", "b", "/", "+", "#", "%", "2", "5", "A", "B", "3", "E", "C", "0",
                  "%2A", "%25", "%2B", "%23", "%00", "00", "$", "é"]
SEGMENT = st.lists(st.sampled_from(SEGMENT_PIECES), min_size=1, max_size=5).map("".join)
NAME = st.lists(SEGMENT, min_size=1, max_size=4).map(".".join).filter(lambda n: n != "%00")
ANY_LEVEL = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00/+#"),
                    max_size=6)
ANY_TOPIC = st.lists(ANY_LEVEL, min_size=1, max_size=4).map("/".join).filter(bool)


@SETTINGS
@given(st.one_of(TOPIC, ANY_TOPIC))
def test_topic_round_trip(topic: str) -> None:
    validate_topic_name(topic)
    name = mqtt_topic_to_destination_name(topic)
    validate_name(name)
    assert "*" not in name and ">" not in name
    assert len(name.split(".")) == len(topic.split("/"))
    assert destination_name_to_mqtt_topic(name) == topic


@SETTINGS
@given(NAME)
def test_name_round_trip(name: str) -> None:
    validate_name(name)
    topic = destination_name_to_mqtt_topic(name)
    validate_topic_name(topic)
    assert mqtt_topic_to_destination_name(topic) == name


FILTER_LEVEL = st.one_of(st.sampled_from(["a", "b", "", "$x", "a.b", "*", "%2B"]),
                         st.just("+"))
FILTER = st.tuples(st.lists(FILTER_LEVEL, min_size=1, max_size=3), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] else t[0])).filter(bool)
MATCH_TOPIC = st.lists(st.sampled_from(["a", "b", "", "$x", "a.b", "*", "%2B"]), min_size=1,
                       max_size=4).map("/".join).filter(bool)


@SETTINGS
@given(FILTER, MATCH_TOPIC)
def test_filter_mapping_agrees_with_mqtt_matching(topic_filter: str, topic: str) -> None:
    validate_topic_filter(topic_filter)
    mapped = mqtt_filter_to_destination(topic_filter)
    validate_name(mapped.pattern)
    name = mqtt_topic_to_destination_name(topic)
    core = name_matches(mapped.pattern, name) or (
        mapped.parent_pattern is not None and name_matches(mapped.parent_pattern, name))
    if mapped.exclude_dollar_topics and name.startswith("$"):
        core = False
    assert core is topic_matches(topic_filter, topic)
