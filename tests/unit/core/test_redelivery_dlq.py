"""Redelivery counts and dead-letter policies (core/queue.py ``release``,
core/dead_letters.py): how many attempts a message gets, which DLQ it lands in, what
the DLQ copy carries, and which messages are dropped instead."""

from __future__ import annotations

import json

import pytest
from tests.support.core_restart import restart
from tests.unit.core.test_broker_core import (
    bodies,
    connect,
    make_broker,
    pump,
    send,
    sub,
)

from meshmq.config.model import DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker, Connection
from meshmq.core.consumer import AckMode, Consumer
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.store.base import AddMessage, RemoveRef
from meshmq.store.memory import MemoryStore

CI = AckMode.CLIENT_INDIVIDUAL
DLQ = dst.queue("ActiveMQ.DLQ")


def reject_until_gone(broker: Broker, store: MemoryStore, conn: Connection, c: Consumer,
                      limit: int = 50) -> list[int]:
    """NACK every delivery to ``c``; the delivery counts seen until none comes."""
    counts = []
    for _ in range(limit):
        out = [d for d in pump(broker, store) if d.consumer is c]
        if not out:
            break
        counts.append(out[0].delivery_count)
        broker.nack(conn, c, out[0].tag, cumulative=False)
    return counts


def dlq_messages(broker: Broker, name: str = "ActiveMQ.DLQ") -> list[Message]:
    queue = broker.queues.get(dst.queue(name))
    return [] if queue is None else [m for m, _ in queue.browse()]


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_a_message_gets_one_delivery_plus_max_redeliveries(limit: int) -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=limit),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "poison", persistent=True)
    assert reject_until_gone(broker, store, conn, c) == list(range(1, limit + 2))
    assert len(dlq_messages(broker)) == 1


def test_a_negative_max_redeliveries_redelivers_forever() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=-1),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    assert reject_until_gone(broker, store, conn, c, limit=30) == list(range(1, 31))
    assert DLQ not in broker.queues


def test_closing_a_consumer_with_the_message_unacked_counts_as_an_attempt() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=1),))
    conn = connect(broker)
    send(broker, conn, "q", "m", persistent=True)
    for i in range(2):
        c = sub(broker, conn, f"c{i}", "q", ack_mode=CI)
        assert bodies(pump(broker, store)) == ["m"]
        broker.unsubscribe(conn, c)
    (copy,) = dlq_messages(broker)
    assert copy.properties["dlqDeliveryFailureCause"] == ("consumer closed with the "
                                                         "message unacknowledged")


def test_a_bridge_consumer_going_away_does_not_count_an_attempt() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    send(broker, conn, "q", "m", persistent=True)
    bridge = sub(broker, conn, "bridge", "q", ack_mode=CI, network_path=("remote",))
    assert bodies(pump(broker, store)) == ["m"]
    broker.unsubscribe(conn, bridge)
    local = sub(broker, conn, "local", "q", ack_mode=CI)
    (d,) = pump(broker, store)
    assert d.consumer is local and d.delivery_count == 1 and not d.redelivered


def test_the_nack_cause_names_the_limit_that_was_passed() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=2),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    reject_until_gone(broker, store, conn, c)
    (copy,) = dlq_messages(broker)
    assert copy.properties["dlqDeliveryFailureCause"] == (
        "message was rejected (NACK) too many times")


def test_the_dlq_copy_keeps_the_message_and_says_where_it_came_from() -> None:
    broker, clock, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "orders", ack_mode=CI)
    send(broker, conn, "orders", "payload", persistent=True, properties={"n": 7},
         correlation_id="corr", expiration=clock.now + 60_000, priority=8)
    (d,) = pump(broker, store)
    broker.nack(conn, c, d.tag, cumulative=False)
    (copy,) = dlq_messages(broker)
    assert copy.message_id == d.message.message_id
    assert copy.body == b"payload" and copy.correlation_id == "corr"
    assert copy.priority == 8 and copy.persistent
    assert copy.properties["n"] == 7
    assert copy.destination == DLQ
    assert copy.original_destination == dst.queue("orders")
    assert copy.expiration == 0
    assert "dlqDeliveryFailureCause" not in d.message.properties  # the original is untouched


def test_a_selector_on_the_dlq_matches_the_original_destination() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    for name in ("orders", "billing"):
        c = sub(broker, conn, name, name, ack_mode=CI)
        send(broker, conn, name, name, persistent=True)
        (d,) = pump(broker, store)
        broker.nack(conn, c, d.tag, cumulative=False)
    pump(broker, store)
    sub(broker, conn, "dlq", "ActiveMQ.DLQ", selector="JMSDestination = 'queue://orders'")
    assert bodies(pump(broker, store)) == ["orders"]


def test_a_custom_shared_dlq_name_is_used() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(max_redeliveries=0, dead_letter_queue="Errors.All"),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    reject_until_gone(broker, store, conn, c)
    assert len(dlq_messages(broker, "Errors.All")) == 1 and DLQ not in broker.queues


def test_the_first_matching_policy_decides_the_redelivery_limit() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(match="queue://critical.>", max_redeliveries=0),
        DestinationPolicy(match="queue://>", max_redeliveries=2)))
    conn = connect(broker)
    crit = sub(broker, conn, "crit", "critical.pay", ack_mode=CI)
    plain = sub(broker, conn, "plain", "plain", ack_mode=CI)
    send(broker, conn, "critical.pay", "c", persistent=True)
    assert reject_until_gone(broker, store, conn, crit) == [1]
    send(broker, conn, "plain", "p", persistent=True)
    assert reject_until_gone(broker, store, conn, plain) == [1, 2, 3]


def test_each_queue_gets_its_own_individual_dlq() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(max_redeliveries=0, individual_dlq_prefix="DLQ."),))
    conn = connect(broker)
    for name in ("a", "b.c"):
        c = sub(broker, conn, name, name, ack_mode=CI)
        send(broker, conn, name, name, persistent=True)
        reject_until_gone(broker, store, conn, c)
    assert [m.body for m in dlq_messages(broker, "DLQ.a")] == [b"a"]
    assert [m.body for m in dlq_messages(broker, "DLQ.b.c")] == [b"b.c"]


def test_a_durable_subscribers_poison_message_is_dead_lettered_from_the_topic() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(match="topic://>", max_redeliveries=1),))
    conn = connect(broker, client_id="app")
    d = sub(broker, conn, "d", "topic:news", subscription_name="s", ack_mode=CI)
    send(broker, conn, "topic:news", "bad", persistent=True)
    assert reject_until_gone(broker, store, conn, d) == [1, 2]
    (copy,) = dlq_messages(broker)
    assert copy.original_destination == dst.topic("news")
    assert broker.durables[("app", "s")].queue.depth == 0


def test_non_persistent_messages_are_dead_lettered_by_default_but_not_stored() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=False)
    (d,) = pump(broker, store)
    broker.take_ops()
    broker.nack(conn, c, d.tag, cumulative=False)
    assert [m.body for m in dlq_messages(broker)] == [b"m"]
    assert not [op for op in broker.take_ops() if isinstance(op, AddMessage)]


def test_without_non_persistent_to_dlq_only_persistent_messages_are_kept() -> None:
    broker, _, store = make_broker(policies=(
        DestinationPolicy(max_redeliveries=0, non_persistent_to_dlq=False),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "volatile", persistent=False)
    send(broker, conn, "q", "durable", persistent=True)
    for d in pump(broker, store):
        broker.nack(conn, c, d.tag, cumulative=False)
    pump(broker, store)
    assert [m.body for m in dlq_messages(broker)] == [b"durable"]
    assert broker.queues[dst.queue("q")].depth == 0


def test_dead_lettering_moves_the_store_reference_in_one_batch() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    (d,) = pump(broker, store)
    broker.nack(conn, c, d.tag, cumulative=False)
    ops = broker.take_ops()
    assert [type(op) for op in ops] == [RemoveRef, AddMessage]
    assert ops[0] == RemoveRef("queue://q", 1)
    assert ops[1].refs == (("queue://ActiveMQ.DLQ", 1),)


def test_a_message_dlqd_advisory_carries_the_cause() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=0),))
    conn = connect(broker)
    watcher = sub(broker, conn, "w", "topic:ActiveMQ.Advisory.MessageDLQd.Queue.q")
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    d = next(o for o in pump(broker, store) if o.consumer is c)
    broker.nack(conn, c, d.tag, cumulative=False)
    (adv,) = [o for o in pump(broker, store) if o.consumer is watcher]
    body = json.loads(adv.message.body)
    assert body["advisoryType"] == "MessageDLQd"
    assert body["messageId"] == d.message.message_id
    assert body["cause"] == "message was rejected (NACK) too many times"


def test_a_cumulative_nack_returns_every_earlier_message_too() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT)
    for i in range(4):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    broker.nack(conn, c, out[2].tag, cumulative=True)
    assert [d.message.body for d in c.dispatched.values()] == [b"m3"]
    again = pump(broker, store)
    assert [(d.message.body, d.redelivered) for d in again] == [
        (b"m0", True), (b"m1", True), (b"m2", True)]


def test_the_delivery_count_of_a_client_ack_message_survives_a_restart() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(max_redeliveries=2),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    reject_counts = []
    for _ in range(2):
        (d,) = pump(broker, store)
        reject_counts.append(d.delivery_count)
        broker.nack(conn, c, d.tag, cumulative=False)
    pump(broker, store)  # the third delivery is written, then the broker stops
    again = restart(broker.config, store)
    conn2 = connect(again)
    c2 = sub(again, conn2, "c", "q", ack_mode=CI)
    (d,) = pump(again, store)
    assert d.delivery_count == 4 and d.redelivered
    again.nack(conn2, c2, d.tag, cumulative=False)
    assert again.queues[DLQ].depth == 1  # the limit held across the restart
    assert reject_counts == [1, 2]


def test_an_auto_ack_delivery_is_never_returned() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q")
    send(broker, conn, "q", "m", persistent=True)
    (d,) = pump(broker, store)
    assert isinstance(d, Delivery) and c.dispatched == {}
    broker.unsubscribe(conn, c)
    sub(broker, conn, "c2", "q")
    assert pump(broker, store) == []
    assert store.key_info("queue://q").count == 0
