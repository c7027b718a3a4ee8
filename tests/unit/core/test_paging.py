"""Paging as a decision (core/paging.py): the queue asks for a page, the caller reads it
from the store and hands it back; these tests play that caller, choosing when (and
whether) each page arrives."""

from __future__ import annotations

import dataclasses

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import admin
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker, Connection
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.paging import PageLoad
from meshmq.core.queue import Delivery
from meshmq.store.memory import MemoryStore

Q = dst.queue("q")
PAGE = 4


def make_broker() -> tuple[Broker, MemoryStore, Connection]:
    store = MemoryStore()
    config = dataclasses.replace(BrokerConfig(broker_name="unit"), policies=(
        DestinationPolicy(match="queue://>", page_size=PAGE),))
    broker = Broker(config, store, clock=lambda: 1_000_000)
    broker.recover(store.open())
    return broker, store, broker.open_connection(broker.authenticate(None, None))


def send(broker: Broker, conn: Connection, body: str, *, persistent: bool = True) -> None:
    broker.send(conn, (Q,), Message(message_id=broker.new_message_id(conn.id), destination=Q,
                                    body=body.encode(), persistent=persistent,
                                    producer_id=conn.id))


def pump(broker: Broker, store: MemoryStore) -> tuple[list[str], list[PageLoad]]:
    """Dispatch and write, like the runtime's pump, but leave the pages unread: the
    bodies delivered and the pages asked for."""
    broker.dispatch_dirty()
    store.write(broker.take_ops())
    got = [o.message.body.decode() for o in broker.take_outcomes() if isinstance(o, Delivery)]
    return got, broker.take_page_loads()


def consumer(broker: Broker, conn: Connection, prefetch: int,
             mode: AckMode = AckMode.AUTO) -> Consumer:
    return broker.subscribe(conn, f"c{prefetch}{mode.name}", ConsumerSpec(
        destinations=(Q,), prefetch=prefetch, ack_mode=mode))


def drain(broker: Broker, store: MemoryStore) -> list[str]:
    """Pump, reading every page at once, until nothing more is delivered."""
    out: list[str] = []
    for _ in range(100):
        got, loads = pump(broker, store)
        out += got
        for load in loads:
            broker.page_loaded(load, store.load(load.key, load.after_seq, load.count))
        if not got and not loads:
            return out
    raise AssertionError("the queue never went quiet")


def test_the_queue_asks_for_a_page_instead_of_reading_the_store() -> None:
    broker, store, conn = make_broker()
    for i in range(10):
        send(broker, conn, f"m{i}")
    store.write(broker.take_ops())
    queue = broker.queues[Q]
    consumer(broker, conn, 100)
    got, loads = pump(broker, store)
    assert got == [f"m{i}" for i in range(PAGE)]  # the window in memory goes out
    (load,) = loads
    assert (load.queue, load.key, load.after_seq, load.count) == (queue, queue.key, PAGE, PAGE)
    assert queue.loading is load
    assert pump(broker, store) == ([], [])  # one load at a time; nothing meanwhile
    broker.page_loaded(load, store.load(load.key, load.after_seq, load.count))
    assert queue.loading is None
    assert drain(broker, store) == [f"m{i}" for i in range(PAGE, 10)]
    assert queue.depth == 0


def test_nothing_overtakes_a_page_being_read() -> None:
    broker, store, conn = make_broker()
    for i in range(10):
        send(broker, conn, f"m{i}")
    send(broker, conn, "late", persistent=False)  # in memory, after the stored ones
    store.write(broker.take_ops())
    c = consumer(broker, conn, 2, AckMode.CLIENT_INDIVIDUAL)
    got, loads = pump(broker, store)
    assert (got, loads) == (["m0", "m1"], [])
    broker.ack(conn, c, 1, cumulative=False)
    broker.ack(conn, c, 2, cumulative=False)
    got, loads = pump(broker, store)  # the window runs low: a page is asked for
    assert got == ["m2", "m3"] and len(loads) == 1
    broker.ack(conn, c, 3, cumulative=False)
    broker.ack(conn, c, 4, cumulative=False)
    # The consumer has room and "late" is in memory, but the page comes first.
    assert pump(broker, store) == ([], [])
    broker.page_loaded(loads[0], store.load(loads[0].key, loads[0].after_seq, loads[0].count))
    got, _ = pump(broker, store)
    assert got == ["m4", "m5"]


def test_a_failed_read_is_asked_again_on_the_next_tick() -> None:
    broker, store, conn = make_broker()
    for i in range(8):
        send(broker, conn, f"m{i}")
    store.write(broker.take_ops())
    consumer(broker, conn, 100)
    _, (load,) = pump(broker, store)
    broker.page_failed(load)
    queue = broker.queues[Q]
    assert queue.page_failures == 1 and queue.loading is None
    assert pump(broker, store) == ([], [])  # no retry in a tight loop
    broker.tick()
    _, (again,) = pump(broker, store)
    assert again is not load and again.after_seq == load.after_seq
    broker.page_loaded(load, store.load(load.key, load.after_seq, load.count))  # stale
    assert pump(broker, store) == ([], [])
    broker.page_loaded(again, store.load(again.key, again.after_seq, again.count))
    assert drain(broker, store) == [f"m{i}" for i in range(PAGE, 8)]


def test_a_message_removed_while_its_page_is_read_stays_removed() -> None:
    broker, store, conn = make_broker()
    for i in range(8):
        send(broker, conn, f"m{i}")
    store.write(broker.take_ops())
    consumer(broker, conn, 100)
    _, (load,) = pump(broker, store)
    page = store.load(load.key, load.after_seq, load.count)  # read before the delete
    victim = next(m for m, _ in broker.queues[Q].browse() if m.body == b"m5")
    admin.delete_message(broker, Q, victim.message_id)
    broker.page_loaded(load, page)
    assert drain(broker, store) == ["m4", "m6", "m7"]
    assert broker.queues[Q].depth == 0


def test_a_purge_while_a_page_is_read_discards_the_page() -> None:
    broker, store, conn = make_broker()
    for i in range(8):
        send(broker, conn, f"m{i}")
    store.write(broker.take_ops())
    consumer(broker, conn, 100)
    _, (load,) = pump(broker, store)
    page = store.load(load.key, load.after_seq, load.count)
    assert broker.queues[Q].purge() == 4
    broker.page_loaded(load, page)
    assert drain(broker, store) == []
    assert broker.queues[Q].depth == 0


def test_a_message_stored_after_the_page_was_read_is_not_forgotten() -> None:
    broker, store, conn = make_broker()
    for i in range(6):
        send(broker, conn, f"m{i}")
    store.write(broker.take_ops())
    consumer(broker, conn, 100)
    _, (load,) = pump(broker, store)
    page = store.load(load.key, load.after_seq, load.count)  # m4, m5: a short page
    send(broker, conn, "m6")  # stored only: the queue is paging
    store.write(broker.take_ops())
    broker.page_loaded(load, page)
    assert drain(broker, store) == ["m4", "m5", "m6"]
