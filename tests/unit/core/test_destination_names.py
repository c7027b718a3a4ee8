"""core/destinations.py: the one destination grammar every protocol maps to, and
ActiveMQ's wildcard matching (``*`` one segment, ``>`` one or more trailing ones)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.core.test_broker_core import connect, make_broker

from meshmq.core import destinations as dst
from meshmq.core.destinations import MAX_NAME_LENGTH, Destination, DestKind
from meshmq.core.message import Message
from meshmq.errors import AuthorizationError, DestinationError


@pytest.mark.parametrize("name", [
    "",                            # nothing at all
    "orders..eu",                  # an empty segment in the middle
    ".orders",                     # a leading dot
    "orders.",                     # a trailing dot
    "orders,billing",              # a composite that was not split
    "orders\x00",                  # NUL
    "orders.>.eu",                 # '>' before the end
    "orders*",                     # a wildcard inside a segment
    "orders.eu>",                  # '>' glued to a segment
    "x" * (MAX_NAME_LENGTH + 1),   # too long
])
def test_names_an_operator_might_mistype_are_refused(name: str) -> None:
    with pytest.raises(DestinationError):
        dst.queue(name)


@pytest.mark.parametrize("name", ["orders", "orders.eu.de", "*", ">", "orders.*.de",
                                  "orders.>", "prices-€_1:2", "x" * MAX_NAME_LENGTH])
def test_valid_names_are_accepted_as_written(name: str) -> None:
    assert dst.topic(name).name == name


@pytest.mark.parametrize(("pattern", "name", "expected"), [
    ("a.*", "a.b", True),
    ("a.*", "a.b.c", False),       # '*' is exactly one segment
    ("a.*", "a", False),
    ("a.>", "a.b.c", True),
    ("a.>", "a", False),           # '>' needs at least one segment
    ("*.b", "a.b", True),
    (">", "a.b.c", True),
    ("a.*.c", "a.x.c", True),
    ("a.*.c", "a.x.d", False),
    ("a.b", "a.b", True),
    ("a.b", "a.bc", False),        # segments compare whole
])
def test_wildcards_follow_activemq(pattern: str, name: str, expected: bool) -> None:
    assert dst.name_matches(pattern, name) is expected


def _model(pattern: list[str], name: list[str]) -> bool:
    if not pattern:
        return not name
    head = pattern[0]
    if head == ">":
        return len(name) >= 1
    if not name:
        return False
    return (head in ("*", name[0])) and _model(pattern[1:], name[1:])


SEG = st.sampled_from(["a", "b", "c"])


@given(pattern=st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=4),
       descendants=st.booleans(), name=st.lists(SEG, min_size=1, max_size=6))
def test_matching_agrees_with_a_segment_by_segment_model(pattern: list[str],
                                                          descendants: bool,
                                                          name: list[str]) -> None:
    if descendants:
        pattern = [*pattern, ">"]
    assert dst.name_matches(".".join(pattern), ".".join(name)) is _model(pattern, name)


@pytest.mark.parametrize(("pattern", "dest", "expected"), [
    (dst.queue(">"), dst.queue("a"), True),
    (dst.queue(">"), dst.topic("a"), False),
    (dst.topic(">"), Destination(DestKind.TEMP_TOPIC, "a"), False),
    (Destination(DestKind.TEMP_QUEUE, ">"), Destination(DestKind.TEMP_QUEUE, "ID:x"), True),
])
def test_a_pattern_matches_only_its_own_family(pattern: Destination, dest: Destination,
                                               expected: bool) -> None:
    assert dst.matches(pattern, dest) is expected


NAMES = st.lists(st.text(st.characters(exclude_characters=".,>*\x00",
                                       exclude_categories=("Cs",)), min_size=1,
                         max_size=5), min_size=1, max_size=4).map(".".join)


@given(kind=st.sampled_from(list(DestKind)), name=NAMES)
def test_the_uri_form_round_trips(kind: DestKind, name: str) -> None:
    made = dst.make(kind, name)
    again = Destination.parse_uri(str(made))
    assert again == made and hash(again) == hash(made) and again.kind is kind


@pytest.mark.parametrize("text", ["queue:/a", "queues://a", "queue://", "a.b"])
def test_a_malformed_destination_uri_is_refused(text: str) -> None:
    with pytest.raises(DestinationError):
        Destination.parse_uri(text)


def test_a_queue_and_a_topic_of_the_same_name_are_different_destinations() -> None:
    assert dst.queue("a") != dst.topic("a")
    assert len({dst.queue("a"), dst.topic("a"), dst.queue("a")}) == 2


@pytest.mark.parametrize(("dest", "owned"), [
    (dst.topic("ActiveMQ.Advisory.Consumer.Queue.q"), True),
    (dst.topic("$SYS.broker.uptime"), True),
    (dst.queue("ActiveMQ.Advisory.x"), False),  # only topics are the broker's own
    (dst.topic("ActiveMQ.DLQ"), False),
])
def test_which_destinations_only_the_broker_writes(dest: Destination, owned: bool) -> None:
    assert dest.is_broker_owned is owned


def test_a_client_send_to_a_broker_owned_topic_is_refused_and_counted() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    for name in ("ActiveMQ.Advisory.Connection", "$SYS.broker.clients"):
        topic = dst.topic(name)
        with pytest.raises(AuthorizationError):
            broker.send(conn, (topic,), Message("m", topic, b"spoof"))
    assert broker.denied_publishes == 2
    assert broker.statistics()["denied_publishes"] == 2
