"""What a restarted core rebuilds from its store (core/recovery.py) and the dispatch
marks that make the redelivered flag survive a crash (core/queue.py ``_cover``)."""

from __future__ import annotations

from tests.support.core_restart import restart
from tests.unit.core.test_broker_core import (
    Clock,
    bodies,
    connect,
    make_broker,
    pump,
    send,
    sub,
)

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message
from meshmq.store.base import AddMessage, MarkDispatched
from meshmq.store.memory import MemoryStore

CI = AckMode.CLIENT_INDIVIDUAL


def test_unacknowledged_persistent_messages_come_back_in_order_and_others_do_not() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    for i in range(4):
        send(broker, conn, "q", f"p{i}", persistent=True)
    send(broker, conn, "q", "volatile", persistent=False)
    out = pump(broker, store)
    broker.ack(conn, c, out[1].tag, cumulative=False)
    store.write(broker.take_ops())
    again = restart(broker.config, store, Clock())
    assert again.queues[dst.queue("q")].depth == 3
    sub(again, connect(again), "c", "q")
    got = pump(again, store)
    assert [(d.message.body, d.redelivered) for d in got] == [
        (b"p0", True), (b"p2", True), (b"p3", True)]


def test_a_recovered_queue_pages_its_backlog_in_from_the_store() -> None:
    config_changes = {"policies": (DestinationPolicy(page_size=10),)}
    broker, _, store = make_broker(**config_changes)
    conn = connect(broker)
    for i in range(35):
        send(broker, conn, "q", f"m{i:02d}", persistent=True)
    store.write(broker.take_ops())
    again = restart(broker.config, store, Clock())
    queue = again.queues[dst.queue("q")]
    assert queue.depth == 35 and queue.in_memory_bytes == 0
    sub(again, connect(again), "c", "q")
    got: list[str] = []
    for _ in range(20):
        got += bodies(pump(again, store))
    assert got == [f"m{i:02d}" for i in range(35)]


def test_new_messages_after_a_restart_continue_the_sequence() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q")
    for i in range(3):
        send(broker, conn, "q", f"old{i}", persistent=True)
    pump(broker, store)  # all consumed: the queue is empty but its seqs were used
    broker.unsubscribe(conn, c)
    store.write(broker.take_ops())
    again = restart(broker.config, store, Clock())
    send(again, connect(again), "q", "new", persistent=True)
    (add,) = [op for op in again.take_ops() if isinstance(op, AddMessage)]
    assert add.refs == (("queue://q", 4),)


def test_a_store_key_that_names_no_destination_is_ignored() -> None:
    broker, _, store = make_broker()
    store.write([AddMessage(Message("x", dst.queue("q"), b"?"), (("garbage", 1),))])
    again = restart(broker.config, store, Clock())
    assert again.take_ops() == [] and again.queues == {}


def test_deliveries_wait_for_their_dispatch_mark_to_be_durable() -> None:
    broker, _, _store = make_broker()
    broker.dispatch_marks = True
    conn = connect(broker)
    sub(broker, conn, "c", "q", ack_mode=CI, prefetch=4)
    send(broker, conn, "q", "m0", persistent=True)
    broker.dispatch_dirty()
    ops = broker.take_ops()
    marks, hold = broker.take_dispatch_marks()
    assert hold and [op for op in ops if isinstance(op, MarkDispatched)] == [
        MarkDispatched("queue://q", 1 + 32)]
    assert marks == [(broker.queues[dst.queue("q")], 33)]
    broker.dispatch_marks_durable(marks)
    send(broker, conn, "q", "m1", persistent=True)
    broker.dispatch_dirty()
    assert not any(isinstance(op, MarkDispatched) for op in broker.take_ops())
    assert broker.take_dispatch_marks() == ([], False)  # covered by the durable mark


def test_the_messages_a_dispatch_mark_covers_come_back_flagged_redelivered() -> None:
    """A crash lost the acknowledgements and delivery counts of auto-ack deliveries, but
    not the mark written before they left: those references, and only those, may have
    been delivered."""
    store = MemoryStore()
    q = dst.queue("q")
    store.write([AddMessage(Message(f"id{i}", q, f"m{i}".encode(), persistent=True),
                            (("queue://q", i),)) for i in range(1, 5)])
    store.write([MarkDispatched("queue://q", 2)])
    again = restart(BrokerConfig(broker_name="unit"), store, Clock())
    sub(again, connect(again), "c", "q")
    got = [(d.message.body, d.redelivered) for d in pump(again, store)]
    assert got == [(b"m1", True), (b"m2", True), (b"m3", False), (b"m4", False)]


def test_a_dispatch_mark_beyond_the_last_stored_message_flags_nothing_new() -> None:
    store = MemoryStore()
    q = dst.queue("q")
    store.write([AddMessage(Message("id1", q, b"m1", persistent=True), (("queue://q", 1),)),
                 MarkDispatched("queue://q", 100)])
    broker = restart(BrokerConfig(broker_name="unit"), store, Clock())
    conn = connect(broker)
    sub(broker, conn, "c", "q")
    send(broker, conn, "q", "after-restart", persistent=True)
    got = [(d.message.body, d.redelivered) for d in pump(broker, store)]
    assert got == [(b"m1", True), (b"after-restart", False)]
