"""Acknowledgements (core/acks.py): what a tag settles in each ack mode, what is
refused, and what an acknowledgement costs in store operations."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.core import destinations as dst
from meshmq.core.consumer import AckMode
from meshmq.errors import ProtocolError
from meshmq.store.base import RemoveRef

CI = AckMode.CLIENT_INDIVIDUAL


@pytest.mark.parametrize("mode", [AckMode.CLIENT, CI])
def test_acking_a_tag_that_is_not_in_the_window_is_refused(mode: AckMode) -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=mode)
    send(broker, conn, "q", "m")
    (d,) = pump(broker, store)
    broker.ack(conn, c, d.tag, cumulative=mode is AckMode.CLIENT)
    with pytest.raises(ProtocolError) as again:
        broker.ack(conn, c, d.tag, cumulative=mode is AckMode.CLIENT)
    assert again.value.code == "unknown-ack"
    with pytest.raises(ProtocolError):
        broker.nack(conn, c, 12345, cumulative=False)


def test_individual_acks_out_of_order_leave_the_others_in_flight() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    broker.ack(conn, c, out[2].tag, cumulative=False)
    assert [e.message.body for e in c.dispatched.values()] == [b"m0", b"m1"]
    broker.ack(conn, c, out[0].tag, cumulative=False)
    assert [e.message.body for e in c.dispatched.values()] == [b"m1"]


def test_a_cumulative_ack_settles_only_its_own_consumers_window() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q", ack_mode=AckMode.CLIENT)
    b = sub(broker, conn, "b", "q", ack_mode=AckMode.CLIENT)
    for i in range(4):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    last_of_a = [d for d in out if d.consumer is a][-1]
    broker.ack(conn, a, last_of_a.tag, cumulative=True)
    assert a.dispatched == {} and len(b.dispatched) == 2
    assert broker.queues[dst.queue("q")].depth == 2


def test_a_cumulative_ack_covers_every_queue_of_a_composite_consumer() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "a,b", ack_mode=AckMode.CLIENT)
    send(broker, conn, "a", "a0")
    send(broker, conn, "b", "b0")
    send(broker, conn, "a", "a1")
    out = pump(broker, store)
    broker.ack(conn, c, out[1].tag, cumulative=True)
    assert [e.message.body for e in c.dispatched.values()] == [b"a1"]
    assert broker.queues[dst.queue("a")].depth == 1
    assert broker.queues[dst.queue("b")].depth == 0


def test_an_ack_needs_a_store_sync_only_when_it_settles_a_persistent_message() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "volatile", persistent=False)
    send(broker, conn, "q", "durable", persistent=True)
    volatile, durable = pump(broker, store)
    broker.take_ops()
    assert broker.ack(conn, c, volatile.tag, cumulative=False) is False
    assert broker.take_ops() == []
    assert broker.ack(conn, c, durable.tag, cumulative=False) is True
    assert broker.take_ops() == [RemoveRef("queue://q", 2)]


def test_a_cumulative_ack_removes_only_the_stored_references() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT)
    for i, persistent in enumerate((True, False, True)):
        send(broker, conn, "q", f"m{i}", persistent=persistent)
    out = pump(broker, store)
    store.write(broker.take_ops())
    broker.ack(conn, c, out[-1].tag, cumulative=True)
    assert broker.take_ops() == [RemoveRef("queue://q", 1), RemoveRef("queue://q", 3)]


def test_a_closed_consumers_tags_are_unknown_and_its_messages_go_to_others() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m")
    (d,) = pump(broker, store)
    broker.unsubscribe(conn, c)
    with pytest.raises(ProtocolError):
        broker.ack(conn, c, d.tag, cumulative=False)
    sub(broker, conn, "next", "q")
    assert bodies(pump(broker, store)) == ["m"]


def test_the_message_id_index_follows_the_window() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m0")
    send(broker, conn, "q", "m1")
    first, second = pump(broker, store)
    assert c.by_message_id == {first.message.message_id: first.tag,
                               second.message.message_id: second.tag}
    broker.ack(conn, c, first.tag, cumulative=False)
    broker.nack(conn, c, second.tag, cumulative=False)
    assert c.by_message_id == {}
    (again,) = pump(broker, store)
    assert c.by_message_id == {again.message.message_id: again.tag}
    assert again.tag != second.tag  # a redelivery gets a new tag


def test_acks_refund_memory_and_count_per_consumer() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    for _ in range(3):
        send(broker, conn, "q", "x" * 100)
    out = pump(broker, store)
    held = broker.usage.used
    broker.ack(conn, c, out[0].tag, cumulative=False)
    assert broker.usage.used == held - out[0].message.size
    assert (c.dispatched_count, c.acked_count) == (3, 1)


def test_auto_ack_consumes_on_dispatch_and_removes_the_stored_reference() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q")
    send(broker, conn, "q", "m", persistent=True)
    pump(broker, store)
    assert c.dispatched == {} and broker.queues[dst.queue("q")].stats.dequeued == 1
    assert store.key_info("queue://q").count == 0
