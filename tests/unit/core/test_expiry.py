"""Message expiry (core/queue.py, core/dead_letters.py): expired messages are never
delivered, whether the periodic sweep or a dispatch finds them, and the policy decides
whether they go to the DLQ."""

from __future__ import annotations

import json

from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.config.model import DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.consumer import AckMode
from meshmq.store.base import RemoveRef

DLQ = dst.queue("ActiveMQ.DLQ")


def test_the_sweep_removes_expired_messages_no_consumer_asked_for() -> None:
    broker, clock, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "soon", expiration=clock.now + 10)
    send(broker, conn, "q", "later", expiration=clock.now + 1000)
    send(broker, conn, "q", "never")
    clock.now += 10  # exactly at the expiration time: expired
    broker.tick()
    q = broker.queues[dst.queue("q")]
    assert q.depth == 2 and q.stats.expired == 1
    clock.now += 5000
    broker.tick()
    assert q.depth == 1 and q.stats.expired == 2


def test_a_message_expiring_a_millisecond_later_is_still_delivered() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "m", expiration=clock.now + 10)
    clock.now += 9
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["m"]


def test_an_in_flight_message_is_not_expired_until_it_comes_back() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "m", persistent=True, expiration=clock.now + 10)
    (d,) = pump(broker, store)
    clock.now += 100
    broker.tick()
    assert d.tag in c.dispatched  # the consumer still holds it and may ack it
    broker.nack(conn, c, d.tag, cumulative=False)
    assert pump(broker, store) == []
    assert broker.queues[DLQ].depth == 1
    assert broker.queues[dst.queue("q")].stats.expired == 1


def test_expired_non_persistent_messages_are_dropped_not_dead_lettered() -> None:
    broker, clock, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "m", persistent=False, expiration=clock.now + 1)
    clock.now += 2
    broker.tick()
    assert broker.queues[dst.queue("q")].depth == 0 and DLQ not in broker.queues


def test_without_expired_to_dlq_persistent_messages_are_dropped_too() -> None:
    broker, clock, _ = make_broker(policies=(DestinationPolicy(expired_to_dlq=False),))
    conn = connect(broker)
    send(broker, conn, "q", "m", persistent=True, expiration=clock.now + 1)
    broker.take_ops()
    clock.now += 2
    broker.tick()
    assert DLQ not in broker.queues
    assert broker.take_ops() == [RemoveRef("queue://q", 1)]


def test_expiry_refunds_the_memory_the_message_held() -> None:
    broker, clock, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "x" * 500, expiration=clock.now + 1)
    assert broker.usage.used > 500
    clock.now += 2
    broker.tick()
    assert broker.usage.used == 0 and broker.queues[dst.queue("q")].in_memory_bytes == 0


def test_a_message_expired_advisory_names_the_message() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    watcher = sub(broker, conn, "w", "topic:ActiveMQ.Advisory.Expired.Queue.q")
    send(broker, conn, "q", "m", expiration=clock.now + 1)
    clock.now += 2
    broker.tick()
    (adv,) = pump(broker, store)
    assert adv.consumer is watcher
    body = json.loads(adv.message.body)
    assert body["advisoryType"] == "MessageExpired"
    assert body["destination"] == "queue://q" and body["messageId"]


def test_an_offline_durable_subscriptions_messages_expire_into_the_dlq() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:news", subscription_name="s"))
    send(broker, conn, "topic:news", "stale", persistent=True, expiration=clock.now + 5)
    send(broker, conn, "topic:news", "fresh", persistent=True)
    clock.now += 10
    broker.tick()
    assert broker.durables[("app", "s")].queue.depth == 1
    assert [m.body for m, _ in broker.queues[DLQ].browse()] == [b"stale"]
    sub(broker, conn, "d", "topic:news", subscription_name="s")
    assert bodies(pump(broker, store)) == ["fresh"]


def test_a_paused_topic_subscribers_expired_messages_are_swept() -> None:
    broker, clock, store = make_broker()
    conn, producer = connect(broker), connect(broker)
    s = sub(broker, conn, "s", "topic:t")
    broker.set_paused(conn, True)
    send(broker, producer, "topic:t", "old", expiration=clock.now + 1)
    send(broker, producer, "topic:t", "new")
    clock.now += 2
    broker.tick()
    assert s.sub_queue is not None and s.sub_queue.depth == 1
    broker.set_paused(conn, False)
    assert bodies(pump(broker, store)) == ["new"]


def test_expired_messages_are_skipped_at_dispatch_without_a_sweep() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    for i in range(3):
        send(broker, conn, "q", f"old{i}", persistent=True, expiration=clock.now + 1)
    send(broker, conn, "q", "live", persistent=True)
    clock.now += 2
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["live"]
    assert broker.queues[DLQ].depth == 3
    assert broker.queues[dst.queue("q")].stats.expired == 3
