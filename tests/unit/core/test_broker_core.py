"""The broker core without sockets: decisions are data, time is injected."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, DestinationPolicy, UsageConfig
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker, Connection
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.errors import DestinationError, ProtocolError, ResourceLimitError
from meshmq.store.base import AddMessage, RemoveRef, SetDeliveryCount
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def make_broker(**changes: object) -> tuple[Broker, Clock, MemoryStore]:
    clock = Clock()
    store = MemoryStore()
    config = dataclasses.replace(BrokerConfig(broker_name="unit"), **changes)  # type: ignore[arg-type]
    broker = Broker(config, store, clock=clock)
    broker.recover(store.open())
    return broker, clock, store


def pump(broker: Broker, store: MemoryStore) -> list[Delivery]:
    """What the runtime's pump does, with pages of stored messages read at once."""
    broker.dispatch_dirty()
    store.write(broker.take_ops())
    loads = broker.take_page_loads()
    if loads:
        for load in loads:
            broker.page_loaded(load, store.load(load.key, load.after_seq, load.count))
        broker.dispatch_dirty()
        store.write(broker.take_ops())
    return [o for o in broker.take_outcomes() if isinstance(o, Delivery)]


def connect(broker: Broker, client_id: str | None = None) -> Connection:
    return broker.open_connection(broker.authenticate(None, None), client_id=client_id)


def send(broker: Broker, conn: Connection, name: str, body: str, **fields: object) -> None:
    dest = dst.queue(name) if not name.startswith("topic:") else dst.topic(name[6:])
    msg = Message(message_id=broker.new_message_id(conn.id), destination=dest,
                  body=body.encode(), producer_id=conn.id, **fields)  # type: ignore[arg-type]
    broker.send(conn, (dest,), msg)


def sub(broker: Broker, conn: Connection, sid: str, name: str, **spec: object) -> Consumer:
    dests = tuple(dst.queue(n) if not n.startswith("topic:") else dst.topic(n[6:])
                  for n in name.split(","))
    return broker.subscribe(conn, sid, ConsumerSpec(destinations=dests, **spec))  # type: ignore[arg-type]


def bodies(deliveries: list[Delivery]) -> list[str]:
    return [d.message.body.decode() for d in deliveries]


def test_round_robin_between_competing_consumers() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q")
    b = sub(broker, conn, "b", "q")
    for i in range(6):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [a, b, a, b, a, b]
    assert bodies(out) == [f"m{i}" for i in range(6)]


def test_highest_consumer_priority_wins_until_its_window_is_full() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    low = sub(broker, conn, "low", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=10)
    high = sub(broker, conn, "high", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2,
               priority=5)
    for i in range(4):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [high, high, low, low]


def test_prefetch_window_limits_unacked_and_ack_opens_it() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=3)
    for i in range(5):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    assert bodies(out) == ["m0", "m1", "m2"]
    broker.ack(conn, c, out[1].tag, cumulative=False)
    assert bodies(pump(broker, store)) == ["m3"]


def test_client_ack_is_cumulative() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    broker.ack(conn, c, out[1].tag, cumulative=True)
    assert list(c.dispatched) == [out[2].tag]


def test_nack_redelivers_then_dead_letters_after_max_redeliveries() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(match="queue://>",
                                                               max_redeliveries=2),))
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "poison", persistent=True)
    counts = []
    for _ in range(3):
        (d,) = pump(broker, store)
        counts.append((d.delivery_count, d.redelivered))
        broker.nack(conn, c, d.tag, cumulative=False)
    assert counts == [(1, False), (2, True), (3, True)]
    assert pump(broker, store) == []
    dlq = broker.queues[dst.queue("ActiveMQ.DLQ")]
    assert dlq.depth == 1
    (msg, _), = dlq.browse()
    assert msg.original_destination == dst.queue("q")
    assert "dlqDeliveryFailureCause" in msg.properties
    # The queue's store reference is gone and the DLQ holds one.
    assert store.key_info("queue://q").count == 0
    assert store.key_info("queue://ActiveMQ.DLQ").count == 1


def test_consumer_close_returns_unacked_messages_flagged_redelivered() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "m0")
    pump(broker, store)
    broker.unsubscribe(conn, c)
    c2 = sub(broker, conn, "c2", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    (d,) = pump(broker, store)
    assert d.consumer is c2 and d.redelivered


def test_message_groups_stick_to_one_consumer_and_move_when_it_leaves() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "q")
    b = sub(broker, conn, "b", "q")
    for i in range(4):
        send(broker, conn, "q", f"g{i}", group_id="G")
    out = pump(broker, store)
    assert {d.consumer for d in out} == {a}
    broker.unsubscribe(conn, a)
    send(broker, conn, "q", "after", group_id="G")
    (d,) = pump(broker, store)
    assert d.consumer is b


def test_exclusive_consumer_gets_everything_and_fails_over() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "plain", "q")
    ex = sub(broker, conn, "ex", "q", exclusive=True)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    assert {d.consumer for d in pump(broker, store)} == {ex}
    broker.unsubscribe(conn, ex)
    send(broker, conn, "q", "next")
    (d,) = pump(broker, store)
    assert d.consumer.subscription_id == "plain"


def test_expired_messages_are_never_delivered() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "old", expiration=clock.now + 10)
    send(broker, conn, "q", "fresh")
    clock.now += 11
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["fresh"]


def test_priority_ordering_only_with_prioritized_messages() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(match="queue://>",
                                                               prioritized_messages=True),))
    conn = connect(broker)
    for p in (1, 9, 4):
        send(broker, conn, "q", f"p{p}", priority=p)
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["p9", "p4", "p1"]


def test_selector_consumers_skip_non_matching_messages() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    red = sub(broker, conn, "red", "q", selector="color = 'red'")
    for color in ("blue", "red", "blue", "red"):
        send(broker, conn, "q", color, properties={"color": color})
    out = pump(broker, store)
    assert bodies(out) == ["red", "red"]
    assert all(d.consumer is red for d in out)
    assert broker.queues[dst.queue("q")].depth == 2


def test_topic_fan_out_with_wildcards_and_durable_kept_offline() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="C1")
    s1 = sub(broker, conn, "s1", "topic:prices.*")
    durable = sub(broker, conn, "d", "topic:prices.>", subscription_name="dur")
    send(broker, conn, "topic:prices.ibm", "ibm", persistent=True)
    out = pump(broker, store)
    assert {d.consumer for d in out} == {s1, durable}
    broker.unsubscribe(conn, durable)
    send(broker, conn, "topic:prices.ibm.nyse", "kept", persistent=True)
    out = pump(broker, store)
    assert out == []  # s1's '*' does not match two segments; durable is offline
    again = sub(broker, conn, "d2", "topic:prices.>", subscription_name="dur")
    assert bodies(pump(broker, store)) == ["kept"]
    assert again.sub_queue is not None


def test_persistent_topic_message_is_stored_once_for_many_durables() -> None:
    broker, _, _store = make_broker()
    conn = connect(broker, client_id="C1")
    for i in range(3):
        broker.unsubscribe(conn, sub(broker, conn, f"d{i}", "topic:t", subscription_name=f"n{i}"))
    broker.take_ops()
    send(broker, conn, "topic:t", "x", persistent=True)
    adds = [op for op in broker.take_ops() if isinstance(op, AddMessage)]
    assert len(adds) == 1 and len(adds[0].refs) == 3


def test_client_ack_dispatch_records_delivery_count_and_ack_removes() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "m", persistent=True)
    broker.dispatch_dirty()
    ops = broker.take_ops()
    assert [type(op) for op in ops] == [AddMessage, SetDeliveryCount]
    store.write(ops)
    (d,) = [o for o in broker.take_outcomes() if isinstance(o, Delivery)]
    broker.ack(conn, c, d.tag, cumulative=False)
    assert [type(op) for op in broker.take_ops()] == [RemoveRef]


def test_transaction_applies_sends_and_acks_only_on_commit() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    broker.begin(conn, "tx")
    dest = dst.queue("q")
    broker.send(conn, (dest,), Message("m1", dest, b"a"), txn="tx")
    assert pump(broker, store) == []
    assert broker.commit(conn, "tx") is False
    (d,) = pump(broker, store)
    broker.begin(conn, "tx2")
    broker.ack(conn, c, d.tag, cumulative=False, txn="tx2")
    broker.abort(conn, "tx2")
    assert d.tag in c.dispatched  # abort undid the ack


def test_paging_keeps_a_bounded_window_in_memory() -> None:
    page = 50
    broker, _, store = make_broker(policies=(DestinationPolicy(match="queue://>",
                                                               page_size=page),))
    conn = connect(broker)
    for i in range(1000):
        send(broker, conn, "q", f"m{i:04d}", persistent=True)
    store.write(broker.take_ops())
    queue = broker.queues[dst.queue("q")]
    assert queue.depth == 1000
    assert queue.in_memory_bytes <= page * Message("x", dst.queue("q"), b"m0000").size
    sub(broker, conn, "c", "q")
    got: list[str] = []
    for _ in range(100):
        got += bodies(pump(broker, store))
        if len(got) == 1000:
            break
    assert got == [f"m{i:04d}" for i in range(1000)]


def test_memory_limit_rejects_when_configured_to_fail() -> None:
    broker, _, _store = make_broker(usage=UsageConfig(memory_limit=2000, on_limit="fail"))
    conn = connect(broker)
    with pytest.raises(ResourceLimitError):
        for i in range(100):
            send(broker, conn, "q", "x" * 100 + str(i))
    assert broker.usage.used >= 2000


def test_bad_requests_raise_documented_errors() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    dest = dst.queue("a.>")
    with pytest.raises(DestinationError):
        broker.send(conn, (dest,), Message("m", dest, b""))
    sub(broker, conn, "x", "q")
    with pytest.raises(ProtocolError):
        sub(broker, conn, "x", "q")
    with pytest.raises(ProtocolError):
        sub(broker, conn, "d", "topic:t", subscription_name="needs-client-id")


def test_retained_messages_replace_clear_and_survive_recovery(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j", fsync=False)
    broker = Broker(BrokerConfig(broker_name="unit"), store)
    broker.recover(store.open())
    t = dst.topic("sensors.temp")
    broker.retain(Message("m1", t, b"20"))
    broker.retain(Message("m2", t, b"21"))
    broker.retain(Message("m3", dst.topic("sensors.hum"), b"40"))
    store.write(broker.take_ops())
    assert [m.body for m in broker.retained_for([dst.topic("sensors.*")])] == [b"40", b"21"]
    asyncio.run(store.close())
    store = JournalStore(tmp_path / "j", fsync=False)
    again = Broker(BrokerConfig(broker_name="unit"), store)
    again.recover(store.open())
    assert [m.body for m in again.retained_for([dst.topic("sensors.temp")])] == [b"21"]
    again.retain(Message("m4", t, b""))  # an empty body clears
    assert again.retained_for([t]) == []
    store.write(again.take_ops())
    asyncio.run(store.close())


def test_shared_subscription_group_competes_for_topic_messages() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "topic:t", shared_group="g")
    b = sub(broker, conn, "b", "topic:t", shared_group="g")
    solo = sub(broker, conn, "solo", "topic:t")
    for i in range(4):
        send(broker, conn, "topic:t", f"m{i}")
    out = pump(broker, store)
    group = [d for d in out if d.consumer in (a, b)]
    assert bodies(group) == ["m0", "m1", "m2", "m3"]
    assert {d.consumer for d in group} == {a, b}
    assert bodies([d for d in out if d.consumer is solo]) == ["m0", "m1", "m2", "m3"]
    broker.unsubscribe(conn, a)
    broker.unsubscribe(conn, b)
    send(broker, conn, "topic:t", "after")
    assert [d.consumer for d in pump(broker, store)] == [solo]


def test_subscription_limit_per_connection() -> None:
    broker, _, _ = make_broker(max_subscriptions_per_connection=3)
    conn, other = connect(broker), connect(broker)
    for i in range(3):
        sub(broker, conn, str(i), f"topic:t{i}")
    with pytest.raises(ResourceLimitError, match=r"broker\.max_subscriptions_per_connection"):
        sub(broker, conn, "3", "topic:t3")
    sub(broker, other, "0", "topic:t0")  # the limit is per connection
    broker.unsubscribe(conn, conn.consumers["0"])
    sub(broker, conn, "3", "topic:t3")  # room again


def test_close_connection_in_steps() -> None:
    broker, _, store = make_broker()
    conn, producer = connect(broker), connect(broker)
    for i in range(25):
        sub(broker, conn, str(i), f"topic:t.{i}")
    sub(broker, conn, "q", "work")
    send(broker, producer, "work", "m")
    assert [d.consumer.subscription_id for d in pump(broker, store)] == ["q"]
    steps = 1
    while not broker.close_connection_step(conn, 10):
        steps += 1
        # Partly closed: nothing more is dispatched to the connection's consumers.
        send(broker, producer, "work", "during")
        send(broker, producer, "topic:t.24", "during")
        assert pump(broker, store) == []
    assert steps == 3
    assert conn.id not in broker.connections
    assert broker.consumer_count(dst.topic("t.0")) == 0
    assert broker.subs_for(dst.topic("t.24")) == []
    later = connect(broker)
    sub(broker, later, "q", "work")
    # The queue messages sent while the connection was being closed are all kept (the
    # first one was acknowledged on delivery: auto ack).
    assert bodies(pump(broker, store)) == ["during", "during"]
    assert broker.close_connection_step(conn, 10)  # closing twice is harmless


def test_consumer_count_follows_subscribe_and_close() -> None:
    broker, _, _ = make_broker()
    a, b = connect(broker), connect(broker)
    sub(broker, a, "1", "q1")
    sub(broker, b, "1", "q1")
    sub(broker, b, "2", "topic:t")
    assert broker.consumer_count(dst.queue("q1")) == 2
    assert broker.consumer_count(dst.topic("t")) == 1
    broker.close_connection(b)
    assert broker.consumer_count(dst.queue("q1")) == 1
    assert broker.consumer_count(dst.topic("t")) == 0


def test_recovery_puts_the_newest_bridged_messages_in_the_duplicate_window(
        tmp_path: Path) -> None:
    """A bridge re-forwards after a restart what it never saw acknowledged: the stored
    copies must be in the window at once, not only once paging reaches them."""
    from meshmq.core.dedup import network_key

    store = JournalStore(tmp_path / "j", fsync=False)
    store.open()
    q = dst.queue("deep")
    msgs = [Message(f"ID:a-{i}", q, b"x", persistent=True, broker_path=("a",))
            for i in range(1, 3001)]
    local = Message("ID:local", q, b"x", persistent=True)
    store.write([AddMessage(m, (("queue://deep", i),)) for i, m in enumerate(msgs, 1)])
    store.write([AddMessage(local, (("queue://deep", 3001),))])
    asyncio.run(store.close())

    store = JournalStore(tmp_path / "j", fsync=False)
    config = dataclasses.replace(BrokerConfig(broker_name="b"), duplicate_window=1000,
                                 policies=(DestinationPolicy(match="queue://>", page_size=100),))
    broker = Broker(config, store)
    recovery = store.open()
    broker.recover(recovery)
    assert broker.remember_stored_sends(recovery) == 999
    assert network_key(msgs[-1]) in broker.dedup  # the newest, far beyond the first page
    assert network_key(msgs[2001]) in broker.dedup
    assert network_key(msgs[0]) not in broker.dedup  # bounded by the window's capacity
    assert len(broker.dedup) == 999
    asyncio.run(store.close())


def test_recovery_puts_stored_producer_dedup_ids_back_in_the_duplicate_window(
        tmp_path: Path) -> None:
    """A failover producer re-sends what the broker stored but never confirmed before
    it died: found in the window after the restart, the re-send is confirmed and not
    stored twice. Messages without a dedup-id add nothing."""
    from meshmq.core.dedup import DEDUP_PROPERTY

    store = JournalStore(tmp_path / "j", fsync=False)
    store.open()
    q = dst.queue("orders")
    sent = [Message(f"ID:p-{i}", q, b"x", persistent=True,
                    properties={DEDUP_PROPERTY: f"order-{i}"}) for i in range(1, 6)]
    plain = Message("ID:plain", q, b"x", persistent=True)
    store.write([AddMessage(m, (("queue://orders", i),)) for i, m in enumerate(sent, 1)])
    store.write([AddMessage(plain, (("queue://orders", 6),))])
    asyncio.run(store.close())

    store = JournalStore(tmp_path / "j", fsync=False)
    broker = Broker(BrokerConfig(broker_name="b"), store)
    recovery = store.open()
    broker.recover(recovery)
    assert broker.remember_stored_sends(recovery) == 5
    assert all(f"order-{i}" in broker.dedup for i in range(1, 6))
    assert len(broker.dedup) == 5
    depth = broker.queues[q].depth
    resend = Message("ID:p-again", q, b"x", persistent=True,
                     properties={DEDUP_PROPERTY: "order-3"})
    broker.send(connect(broker), (q,), resend)
    assert broker.queues[q].depth == depth  # confirmed again, not stored twice
    fresh = Message("ID:p-new", q, b"x", persistent=True,
                    properties={DEDUP_PROPERTY: "order-6"})
    broker.send(connect(broker), (q,), fresh)
    assert broker.queues[q].depth == depth + 1
    asyncio.run(store.close())
