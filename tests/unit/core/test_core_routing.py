"""core/routing.py: where a sent message goes, as store ops and queue entries."""

from __future__ import annotations

from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, sub

from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.store.base import AddMessage, RemoveRef


def test_a_composite_send_stores_one_copy_per_queue_and_fans_out_to_topics() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    t = sub(broker, conn, "t", "topic:news")
    msg = Message(message_id="m1", destination=dst.queue("a"), body=b"x", persistent=True)
    assert broker.send(conn, (dst.queue("a"), dst.queue("b"), dst.topic("news")), msg)
    ops = [op for op in broker.take_ops() if isinstance(op, AddMessage)]
    assert [op.refs[0][0] for op in ops] == ["queue://a", "queue://b"]
    assert ops[0].message is msg  # the first part keeps the message itself
    assert ops[1].message.destination == dst.queue("b")
    out = pump(broker, store)
    assert [d.consumer for d in out] == [t]  # the topic part: no store reference
    assert broker.topics[dst.topic("news")].enqueued == 1


def test_no_local_subscriber_misses_its_own_messages() -> None:
    broker, _, store = make_broker()
    conn, other = connect(broker), connect(broker)
    mine = sub(broker, conn, "s", "topic:t", no_local=True)
    theirs = sub(broker, other, "s", "topic:t")
    msg = Message(message_id="m", destination=dst.topic("t"), body=b"1", producer_id=conn.id)
    broker.send(conn, (dst.topic("t"),), msg)
    assert [d.consumer for d in pump(broker, store)] == [theirs]
    assert mine.dispatched == {}


def test_a_dedup_id_seen_before_is_confirmed_and_not_routed_again() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    for body in ("first", "again"):
        msg = Message(message_id=body, destination=dst.queue("q"), body=body.encode(),
                      properties={"dedup-id": "k1"})
        assert broker.send(conn, (dst.queue("q"),), msg) is (body == "again")
    c = sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["first"]
    assert c.dispatched == {}  # auto ack


def test_retained_message_keeps_one_stored_reference() -> None:
    broker, _, _ = make_broker()
    topic = dst.topic("sensors.a")
    broker.retain(Message(message_id="r1", destination=topic, body=b"1"))
    broker.retain(Message(message_id="r2", destination=topic, body=b"2"))
    ops = broker.take_ops()
    assert ops[0] == AddMessage(ops[0].message, (("retained://sensors.a", 1),))  # type: ignore[attr-defined]
    assert ops[1] == RemoveRef("retained://sensors.a", 1)
    assert [m.message_id for m in broker.retained_for((dst.topic("sensors.>"),))] == ["r2"]
    broker.retain(Message(message_id="r3", destination=topic, body=b""))  # clears it
    assert broker.retained_for((topic,)) == []
    assert broker.take_ops() == [RemoveRef("retained://sensors.a", 2)]


def test_records_are_replaced_and_dropped() -> None:
    broker, _, _ = make_broker()
    broker.put_record("session-a", b"1")
    broker.put_record("session-a", b"2")
    assert broker.records["session-a"] == (2, b"2")
    broker.drop_record("session-a")
    assert "session-a" not in broker.records
    assert [type(op).__name__ for op in broker.take_ops()] == [
        "AddMessage", "RemoveRef", "AddMessage", "RemoveRef"]
