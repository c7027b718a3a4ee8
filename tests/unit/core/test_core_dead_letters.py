"""core/dead_letters.py: where expired and undeliverable messages go."""

from __future__ import annotations

from tests.unit.core.test_broker_core import connect, make_broker, pump, sub

from meshmq.config.model import DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message


def _send(broker: object, conn: object, name: str, body: str, **fields: object) -> None:
    msg = Message(message_id=body, destination=dst.queue(name), body=body.encode(),
                  **fields)  # type: ignore[arg-type]
    broker.send(conn, (dst.queue(name),), msg)  # type: ignore[attr-defined]


def test_an_expired_persistent_message_goes_to_the_dlq_with_its_cause() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    _send(broker, conn, "q", "old", persistent=True, expiration=clock.now + 10)
    clock.now += 20
    broker.tick()
    dlq = broker.queues[dst.queue("ActiveMQ.DLQ")]
    assert dlq.depth == 1 and broker.queues[dst.queue("q")].depth == 0
    c = sub(broker, conn, "c", "ActiveMQ.DLQ")
    out = pump(broker, store)
    assert out[0].consumer is c
    assert out[0].message.properties["dlqDeliveryFailureCause"] == "message expired"
    assert out[0].message.expiration == 0  # the copy does not expire again


def test_an_individual_dlq_prefix_names_the_dlq_after_the_queue() -> None:
    policy = DestinationPolicy(match="queue://>", individual_dlq_prefix="DLQ.",
                               max_redeliveries=0)
    broker, _, store = make_broker(policies=(policy,))
    conn = connect(broker)
    _send(broker, conn, "orders", "m", persistent=True)
    c = sub(broker, conn, "c", "orders", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    broker.nack(conn, c, pump(broker, store)[0].tag, cumulative=False)
    pump(broker, store)
    assert broker.queues[dst.queue("DLQ.orders")].depth == 1
    assert broker.queues[dst.queue("orders")].stats.dead_lettered == 1
    assert dst.queue("ActiveMQ.DLQ") not in broker.queues


def test_a_message_failing_in_the_dlq_itself_is_dropped() -> None:
    broker, _, store = make_broker(policies=(DestinationPolicy(match="queue://>",
                                                               max_redeliveries=0),))
    conn = connect(broker)
    _send(broker, conn, "q", "m", persistent=True)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    broker.nack(conn, c, pump(broker, store)[0].tag, cumulative=False)
    pump(broker, store)
    dlq = broker.queues[dst.queue("ActiveMQ.DLQ")]
    d = sub(broker, conn, "d", "ActiveMQ.DLQ", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    broker.nack(conn, d, pump(broker, store)[0].tag, cumulative=False)
    pump(broker, store)
    assert dlq.depth == 0 and dlq.stats.dead_lettered == 0
    assert pump(broker, store) == []


def test_a_non_persistent_message_is_dropped_when_the_policy_says_so() -> None:
    policy = DestinationPolicy(match="queue://>", non_persistent_to_dlq=False,
                               max_redeliveries=0)
    broker, _, store = make_broker(policies=(policy,))
    conn = connect(broker)
    _send(broker, conn, "q", "m", persistent=False)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    broker.nack(conn, c, pump(broker, store)[0].tag, cumulative=False)
    pump(broker, store)
    assert dst.queue("ActiveMQ.DLQ") not in broker.queues
