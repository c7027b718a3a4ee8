"""core/queue.py: which consumer gets which message, in which order, and how many at a
time (prefetch windows, consumer priorities, exclusive consumers, message groups,
selectors, browsers, wildcard and composite subscriptions)."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.config.model import DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core import queue as queue_module
from meshmq.core.consumer import AckMode
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.errors import DestinationError

CI = AckMode.CLIENT_INDIVIDUAL


def test_without_prioritized_messages_a_queue_is_strictly_fifo() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    for p in (1, 9, 4, 0):
        send(broker, conn, "q", f"p{p}", priority=p)
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["p1", "p9", "p4", "p0"]


def test_prioritized_messages_keep_fifo_within_one_priority() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(prioritized_messages=True),))
    conn = connect(broker)
    for body, p in (("a5", 5), ("b9", 9), ("c5", 5), ("d9", 9), ("e0", 0)):
        send(broker, conn, "q", body, priority=p)
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["b9", "d9", "a5", "c5", "e0"]


def test_a_high_priority_message_overtakes_pending_ones_but_not_those_in_flight() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(prioritized_messages=True),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI, prefetch=1)
    send(broker, conn, "q", "low1", priority=1)
    send(broker, conn, "q", "low2", priority=1)
    (first,) = pump(broker, store)
    send(broker, conn, "q", "urgent", priority=9)
    broker.ack(conn, c, first.tag, cumulative=False)
    assert bodies(pump(broker, store)) == ["urgent"]
    assert bodies([first]) == ["low1"]


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_nacked_message_goes_back_to_its_original_place(prioritized: bool) -> None:
    broker, _, store = make_broker(
        policies=(DestinationPolicy(prioritized_messages=prioritized),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI, prefetch=1)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    (first,) = pump(broker, store)
    broker.nack(conn, c, first.tag, cumulative=False)
    got = []
    for _ in range(3):
        (d,) = pump(broker, store)
        got.append((d.message.body.decode(), d.redelivered))
        broker.ack(conn, c, d.tag, cumulative=False)
    assert got == [("m0", True), ("m1", False), ("m2", False)]


@pytest.mark.parametrize(("kind", "expected"), [
    ("queue", 1000), ("topic", 32767), ("durable", 100), ("browser", 500)])
def test_default_prefetch_per_consumer_kind_is_activemqs(kind: str, expected: int) -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    if kind == "queue":
        c = sub(broker, conn, "c", "q")
    elif kind == "topic":
        c = sub(broker, conn, "c", "topic:t")
    elif kind == "durable":
        c = sub(broker, conn, "c", "topic:t", subscription_name="d")
    else:
        c = sub(broker, conn, "c", "q", browser=True)
    assert c.prefetch == expected


def test_the_destination_policy_sets_the_prefetch_and_a_subscription_may_override_it() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(match="queue://slow.>", queue_prefetch=2),))
    conn = connect(broker)
    slow = sub(broker, conn, "slow", "slow.jobs", ack_mode=CI)
    asked = sub(broker, conn, "asked", "slow.other", ack_mode=CI, prefetch=3)
    fast = sub(broker, conn, "fast", "fast.jobs", ack_mode=CI)
    assert (slow.prefetch, asked.prefetch, fast.prefetch) == (2, 3, 1000)
    for i in range(5):
        send(broker, conn, "slow.jobs", f"m{i}")
    assert len(pump(broker, store)) == 2


def test_a_zero_prefetch_still_delivers_one_message_at_a_time() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI, prefetch=0)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    (d,) = pump(broker, store)
    assert pump(broker, store) == []
    broker.ack(conn, c, d.tag, cumulative=False)
    assert bodies(pump(broker, store)) == ["m1"]


def test_an_auto_ack_consumer_gets_at_most_its_prefetch_per_pump() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    for i in range(5):
        send(broker, conn, "q", f"m{i}")
    sub(broker, conn, "c", "q", prefetch=2)
    assert [bodies(pump(broker, store)) for _ in range(4)] == [
        ["m0", "m1"], ["m2", "m3"], ["m4"], []]
    assert broker.queues[dst.queue("q")].depth == 0


def test_round_robin_passes_over_a_consumer_whose_window_is_full() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q", ack_mode=CI, prefetch=1)
    b = sub(broker, conn, "b", "q", ack_mode=CI, prefetch=10)
    for i in range(4):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [a, b, b, b]


def test_messages_return_to_the_higher_priority_consumer_once_it_has_room() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    low = sub(broker, conn, "low", "q", ack_mode=CI, prefetch=10)
    high = sub(broker, conn, "high", "q", ack_mode=CI, prefetch=1, priority=9)
    send(broker, conn, "q", "m0")
    send(broker, conn, "q", "m1")
    first = pump(broker, store)
    assert [d.consumer for d in first] == [high, low]
    broker.ack(conn, high, first[0].tag, cumulative=False)
    send(broker, conn, "q", "m2")
    assert [d.consumer for d in pump(broker, store)] == [high]


def test_an_exclusive_consumer_with_a_full_window_holds_messages_back_from_others() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    other = sub(broker, conn, "other", "q", ack_mode=CI)
    ex = sub(broker, conn, "ex", "q", ack_mode=CI, prefetch=1, exclusive=True)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [ex]
    assert other.dispatched == {}
    assert broker.queues[dst.queue("q")].depth == 3


def test_of_two_exclusive_consumers_the_higher_priority_one_is_chosen() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    first = sub(broker, conn, "first", "q", exclusive=True)
    better = sub(broker, conn, "better", "q", exclusive=True, priority=5)
    send(broker, conn, "q", "m0")
    assert [d.consumer for d in pump(broker, store)] == [better]
    broker.unsubscribe(conn, better)
    send(broker, conn, "q", "m1")
    assert [d.consumer for d in pump(broker, store)] == [first]


def test_an_exclusive_consumers_selector_leaves_other_messages_pending() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "plain", "q")
    sub(broker, conn, "ex", "q", exclusive=True, selector="kind = 'a'")
    send(broker, conn, "q", "b", properties={"kind": "b"})
    send(broker, conn, "q", "a", properties={"kind": "a"})
    out = pump(broker, store)
    assert [(d.consumer.subscription_id, d.message.body) for d in out] == [("ex", b"a")]
    assert broker.queues[dst.queue("q")].depth == 1


def test_different_message_groups_spread_over_the_consumers() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q")
    b = sub(broker, conn, "b", "q")
    for i in range(3):
        send(broker, conn, "q", f"x{i}", group_id="X")
        send(broker, conn, "q", f"y{i}", group_id="Y")
    out = pump(broker, store)
    owners = {d.message.group_id: {o.consumer for o in out if o.message.group_id ==
                                   d.message.group_id} for d in out}
    assert owners == {"X": {a}, "Y": {b}}
    assert broker.queues[dst.queue("q")].groups == {"X": a, "Y": b}


def test_a_group_waits_for_its_owners_window_while_other_messages_flow() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q", ack_mode=CI, prefetch=1)
    b = sub(broker, conn, "b", "q", ack_mode=CI, prefetch=10)
    send(broker, conn, "q", "g0", group_id="G")
    send(broker, conn, "q", "g1", group_id="G")
    send(broker, conn, "q", "free")
    out = pump(broker, store)
    assert [(d.consumer, d.message.body) for d in out] == [(a, b"g0"), (b, b"free")]
    broker.ack(conn, a, out[0].tag, cumulative=False)
    assert [(d.consumer, d.message.body) for d in pump(broker, store)] == [(a, b"g1")]


def test_group_seq_minus_one_closes_the_group_so_it_may_move() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q")
    b = sub(broker, conn, "b", "q")
    send(broker, conn, "q", "open", group_id="G")
    send(broker, conn, "q", "close", group_id="G", group_seq=-1)
    assert [d.consumer for d in pump(broker, store)] == [a, a]
    assert "G" not in broker.queues[dst.queue("q")].groups
    send(broker, conn, "q", "again", group_id="G")
    assert [d.consumer for d in pump(broker, store)] == [b]


def test_a_group_owner_whose_selector_refuses_a_message_holds_it() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "owner", "q", selector="n < 10")
    sub(broker, conn, "other", "q")
    send(broker, conn, "q", "first", group_id="G", properties={"n": 1})
    assert [d.consumer.subscription_id for d in pump(broker, store)] == ["owner"]
    send(broker, conn, "q", "big", group_id="G", properties={"n": 50})
    assert pump(broker, store) == []
    assert broker.queues[dst.queue("q")].depth == 1


def test_a_selector_can_read_the_delivery_count_and_redelivered_flag() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    first = sub(broker, conn, "first", "q", ack_mode=CI, selector="JMSRedelivered = FALSE")
    send(broker, conn, "q", "m")
    (d,) = pump(broker, store)
    assert d.consumer is first
    retry = sub(broker, conn, "retry", "q", ack_mode=CI, selector="JMSXDeliveryCount >= 2")
    broker.nack(conn, first, d.tag, cumulative=False)
    (again,) = pump(broker, store)
    assert again.consumer is retry and again.delivery_count == 2


def test_a_selector_on_jms_headers_sees_priority_type_and_correlation() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q",
        selector="JMSPriority > 5 AND JMSType = 'order' AND JMSCorrelationID LIKE 'abc%'")
    send(broker, conn, "q", "no-prio", priority=4, type="order", correlation_id="abc1")
    send(broker, conn, "q", "no-type", priority=7, type="other", correlation_id="abc2")
    send(broker, conn, "q", "yes", priority=7, type="order", correlation_id="abc3")
    assert bodies(pump(broker, store)) == ["yes"]


def test_a_pass_steps_over_at_most_scan_limit_unwanted_messages(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "SCAN_LIMIT", 5)
    broker, _, store = make_broker()
    conn = connect(broker)
    for i in range(8):
        send(broker, conn, "q", f"skip{i}", properties={"want": False})
    send(broker, conn, "q", "wanted", properties={"want": True})
    sub(broker, conn, "c", "q", selector="want = TRUE")
    assert pump(broker, store) == []  # the pass gave up after five non-matching ones
    assert broker.queues[dst.queue("q")].depth == 9


def test_a_browser_lists_pending_and_in_flight_messages_and_consumes_nothing() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    worker = sub(broker, conn, "w", "q", ack_mode=CI, prefetch=1)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    pump(broker, store)
    browser = sub(broker, conn, "b", "q", browser=True)
    out = broker.take_outcomes()
    seen = [o.message.body.decode() for o in out if isinstance(o, Delivery)]
    assert sorted(seen) == ["m0", "m1", "m2"]
    assert all(o.consumer is browser for o in out)
    assert isinstance(out[-1], BrowseEnd)
    assert broker.queues[dst.queue("q")].depth == 3 and len(worker.dispatched) == 1


def test_a_browser_applies_its_selector_and_skips_expired_messages() -> None:
    broker, clock, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "red", properties={"color": "red"})
    send(broker, conn, "q", "blue", properties={"color": "blue"})
    send(broker, conn, "q", "red-old", properties={"color": "red"}, expiration=clock.now + 5)
    clock.now += 10
    sub(broker, conn, "b", "q", browser=True, selector="color = 'red'")
    out = broker.take_outcomes()
    assert [o.message.body for o in out if isinstance(o, Delivery)] == [b"red"]


def test_browsing_a_topic_is_refused() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    with pytest.raises(DestinationError):
        sub(broker, conn, "b", "topic:t", browser=True)


def test_a_wildcard_queue_consumer_drains_existing_and_later_queues() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    send(broker, conn, "orders.eu", "eu")
    send(broker, conn, "billing", "bill")
    c = sub(broker, conn, "c", "orders.>")
    assert bodies(pump(broker, store)) == ["eu"]
    send(broker, conn, "orders.us", "us")
    send(broker, conn, "orders", "parent")  # '>' needs at least one more segment
    out = pump(broker, store)
    assert bodies(out) == ["us"] and out[0].consumer is c
    broker.unsubscribe(conn, c)
    send(broker, conn, "orders.asia", "asia")
    assert pump(broker, store) == []


def test_a_composite_subscription_reads_every_queue_it_names() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "a,b")
    send(broker, conn, "a", "from-a")
    send(broker, conn, "b", "from-b")
    send(broker, conn, "c", "from-c")
    out = pump(broker, store)
    assert sorted(bodies(out)) == ["from-a", "from-b"]
    assert {d.consumer for d in out} == {c}


def test_a_paused_connections_consumers_are_passed_over_for_others() -> None:
    broker, _, store = make_broker()
    slow, fast = connect(broker), connect(broker)
    sub(broker, slow, "c", "q")
    f = sub(broker, fast, "c", "q")
    broker.set_paused(slow, True)
    for i in range(3):
        send(broker, fast, "q", f"m{i}")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [f, f, f]


def test_queue_statistics_count_each_stage() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    broker.ack(conn, c, out[0].tag, cumulative=False)
    broker.nack(conn, c, out[1].tag, cumulative=False)
    pump(broker, store)
    q = broker.queues[dst.queue("q")]
    assert (q.stats.enqueued, q.stats.dispatched, q.stats.dequeued, q.stats.redelivered) == (
        3, 4, 1, 1)
    assert (q.depth, q.inflight) == (2, 2)
    stats = {d["name"]: d for d in broker.statistics()["destinations"]}  # type: ignore[attr-defined]
    assert stats["q"]["inflight"] == 2 and stats["q"]["consumers"] == 1
