"""Operators' requests on live destinations (core/admin.py) as decisions of the core:
what each request may touch, what it refuses, and the store operations it leaves."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.config.model import StreamPolicy
from meshmq.core import admin
from meshmq.core import destinations as dst
from meshmq.core.admin import ConflictError, NotFoundError
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message
from meshmq.errors import DestinationError
from meshmq.store.base import DropKey, RemoveRef

Q = dst.queue("q")


@pytest.mark.parametrize(("kind", "name"), [("queues", "q"), ("queue", "a.*"),
                                            ("topic", "a.>"), ("queue", "a..b")])
def test_a_bad_destination_in_a_request_is_refused(kind: str, name: str) -> None:
    with pytest.raises(DestinationError):
        admin.destination(kind, name)


@pytest.mark.parametrize("uri", ["q", "queue:/q", "topic://ActiveMQ.Advisory.X"])
def test_a_bad_move_target_is_refused(uri: str) -> None:
    with pytest.raises(DestinationError):
        admin.target(uri)


def test_listing_hides_the_brokers_own_topics_and_filters_by_kind_and_text() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    for name in ("orders.eu", "billing", "topic:orders.news"):
        send(broker, conn, name, "m")
    broker.publish_internal(Message("s", dst.topic("$SYS.broker.uptime"), b"1"))
    sub(broker, conn, "w", "topic:ActiveMQ.Advisory.Consumer.Queue.q")
    sub(broker, conn, "c", "q")  # an advisory is routed to its topic
    assert dst.topic("ActiveMQ.Advisory.Consumer.Queue.q") in broker.topics
    assert dst.topic("$SYS.broker.uptime") in broker.topics
    names = [(d["type"], d["name"]) for d in admin.list_destinations(broker)]
    assert names == [("queue", "billing"), ("queue", "orders.eu"), ("queue", "q"),
                     ("topic", "orders.news")]
    assert [d["name"] for d in admin.list_destinations(broker, "queue", "orders")] == [
        "orders.eu"]


def test_describe_reports_depth_flight_consumers_and_producers() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    for i in range(3):
        send(broker, conn, "q", f"m{i}", persistent=True)
    store.write(broker.take_ops())
    (d,) = pump(broker, store)
    broker.ack(conn, c, d.tag, cumulative=False)
    pump(broker, store)
    store.write(broker.take_ops())
    view = admin.describe(broker, Q)
    assert {k: view[k] for k in ("depth", "enqueued", "dequeued", "dispatched", "in_flight",
                                 "consumers", "producers")} == {
        "depth": 2, "enqueued": 3, "dequeued": 1, "dispatched": 2, "in_flight": 1,
        "consumers": 1, "producers": 1}
    assert view["store_bytes"] == 4  # the bodies of the two stored messages


@pytest.mark.parametrize("dest", [dst.queue("missing"), dst.topic("missing")])
def test_describing_an_unknown_destination_is_not_found(dest: dst.Destination) -> None:
    broker, _, _ = make_broker()
    with pytest.raises(NotFoundError):
        admin.describe(broker, dest)


def test_creating_an_existing_destination_conflicts() -> None:
    broker, _, _ = make_broker()
    admin.create_destination(broker, Q)
    admin.create_destination(broker, dst.topic("t"))
    assert admin.exists(broker, Q) and admin.exists(broker, dst.topic("t"))
    with pytest.raises(ConflictError):
        admin.create_destination(broker, Q)


def test_a_queue_with_consumers_cannot_be_deleted() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q")
    with pytest.raises(ConflictError):
        admin.delete_destination(broker, Q)
    assert Q in broker.queues


def test_deleting_a_queue_drops_its_messages_and_its_store_key() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    for i in range(3):
        send(broker, conn, "q", f"m{i}", persistent=True)
    store.write(broker.take_ops())
    assert admin.delete_destination(broker, Q) == 3
    ops = broker.take_ops()
    assert ops[-1] == DropKey("queue://q") and Q not in broker.queues
    store.write(ops)
    assert store.key_info("queue://q").count == 0


def test_a_topic_is_deleted_only_without_subscribers() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    s = sub(broker, conn, "s", "topic:t")
    send(broker, conn, "topic:t", "m")
    with pytest.raises(ConflictError):
        admin.delete_destination(broker, dst.topic("t"))
    broker.unsubscribe(conn, s)
    assert admin.delete_destination(broker, dst.topic("t")) == 0
    assert dst.topic("t") not in broker.topics
    with pytest.raises(NotFoundError):
        admin.delete_destination(broker, dst.topic("t"))


def test_a_purge_keeps_the_messages_a_consumer_holds() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    for i in range(4):
        send(broker, conn, "q", f"m{i}")
    (d,) = pump(broker, store)
    assert admin.purge(broker, Q) == 3
    assert broker.queues[Q].depth == 1
    broker.ack(conn, c, d.tag, cumulative=False)
    assert pump(broker, store) == [] and broker.queues[Q].depth == 0
    with pytest.raises(DestinationError):
        admin.purge(broker, dst.topic("t"))


def test_browse_pages_through_matches_and_counts_them_all() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    for i in range(10):
        send(broker, conn, "q", f"m{i}", properties={"n": i})
    total, page = admin.browse(broker, Q, 2, 3, "n >= 4")
    assert total == 6
    assert [item.message.body for item in page] == [b"m6", b"m7", b"m8"]
    total, page = admin.browse(broker, Q, 8, 5, None)
    assert total == 10 and [item.message.body for item in page] == [b"m8", b"m9"]


def test_a_message_is_deleted_by_id_unless_a_consumer_holds_it() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    for i in range(2):
        send(broker, conn, "q", f"m{i}", persistent=True)
    store.write(broker.take_ops())
    held, waiting = [item.message.message_id for item in admin.queued(broker, Q)][::-1]
    pump(broker, store)
    with pytest.raises(ConflictError):
        admin.delete_message(broker, Q, held)
    broker.take_ops()
    admin.delete_message(broker, Q, waiting)
    assert broker.take_ops() == [RemoveRef("queue://q", 2)]
    with pytest.raises(NotFoundError):
        admin.delete_message(broker, Q, waiting)


def test_moving_a_queue_into_itself_is_refused() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "m")
    with pytest.raises(DestinationError):
        admin.transfer(broker, Q, to=Q)


def test_a_move_leaves_held_messages_and_starts_the_delivery_count_again() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    first, _second = pump(broker, store)
    broker.nack(conn, c, first.tag, cumulative=False)  # m0 is back, delivered once
    broker.unsubscribe(conn, c)  # so is m1
    c2 = sub(broker, conn, "c2", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    (held,) = pump(broker, store)
    moved = admin.transfer(broker, Q, to=dst.queue("other"))
    assert moved.done == 2 and held.consumer is c2
    out_ids = {item.message.message_id for item in admin.queued(broker, dst.queue("other"))}
    assert held.message.message_id not in out_ids
    sub(broker, conn, "o", "other")
    again = pump(broker, store)
    assert all(d.delivery_count == 1 for d in again) and len(again) == 2


def test_a_copy_to_a_topic_reaches_its_subscribers_and_leaves_the_source() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    s = sub(broker, conn, "s", "topic:audit")
    send(broker, conn, "q", "m")
    result = admin.transfer(broker, Q, to=dst.topic("audit"), copy=True)
    assert result.done == 1
    out = pump(broker, store)
    assert [(d.consumer, d.message.body) for d in out] == [(s, b"m")]
    assert broker.queues[Q].depth == 1


def test_a_stream_is_not_managed_like_a_queue() -> None:
    broker, _, _ = make_broker(streams=(StreamPolicy(match="queue://log.>"),))
    conn = connect(broker)
    send(broker, conn, "log.a", "m")
    with pytest.raises(ConflictError):
        admin.purge(broker, dst.queue("log.a"))


def test_an_operator_cannot_send_to_a_broker_owned_topic() -> None:
    broker, _, _ = make_broker()
    with pytest.raises(DestinationError):
        admin.send(broker, dst.topic("ActiveMQ.Advisory.Connection"), b"x", {},
                   persistent=False)


def test_an_operators_test_message_is_delivered_with_its_properties() -> None:
    broker, clock, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q")
    sent = admin.send(broker, Q, b"hello", {"k": "v"}, persistent=True)
    (d,) = pump(broker, store)
    assert d.message is sent and sent.properties == {"k": "v"}
    assert sent.timestamp == clock.now and sent.message_id.startswith("ID:unit-")
    assert bodies([d]) == ["hello"]
