"""What ActiveMQ's advisory topics carry (core/advisories.py, routed by
core/routing.py and core/connections.py): monitors read these fields by name."""

from __future__ import annotations

import json

from tests.unit.core.test_broker_core import connect, make_broker, pump, send, sub

from meshmq.core import destinations as dst
from meshmq.core.auth import Principal
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, Consumer
from meshmq.core.destinations import DestKind
from meshmq.core.queue import Delivery
from meshmq.store.memory import MemoryStore


def advisories(broker: Broker, store: MemoryStore, watcher: Consumer) -> list[dict[str, object]]:
    out: list[Delivery] = [d for d in pump(broker, store) if d.consumer is watcher]
    return [json.loads(d.message.body) for d in out]


def test_consumer_added_and_removed_describe_the_subscription() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.Consumer.Queue.orders")
    conn = connect(broker, client_id="app")
    c = sub(broker, conn, "s1", "orders", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=7,
            priority=3, exclusive=True, selector="n > 1")
    broker.unsubscribe(conn, c)
    added, removed = advisories(broker, store, w)
    assert added == {
        "advisoryType": "ConsumerAdded", "originBrokerName": "unit",
        "consumerId": c.id, "connectionId": conn.id, "clientId": "app",
        "destination": "queue://orders", "consumerCount": 1, "selector": "n > 1",
        "prefetchSize": 7, "priority": 3, "exclusive": True, "noLocal": False,
        "ackMode": "client-individual"}
    assert removed["advisoryType"] == "ConsumerRemoved" and removed["consumerCount"] == 0


def test_an_advisory_is_a_json_message_with_the_same_fields_as_properties() -> None:
    broker, clock, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.Consumer.Topic.news")
    sub(broker, watch, "s", "topic:news")
    (d,) = [o for o in pump(broker, store) if o.consumer is w]
    msg = d.message
    assert msg.type == "Advisory" and msg.content_type == "application/json"
    assert msg.timestamp == clock.now and not msg.persistent
    assert json.loads(msg.body) == msg.properties
    assert "clientId" not in msg.properties  # fields without a value are left out


def test_producer_added_once_per_destination_and_removed_at_close() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.Producer.Queue.q")
    producer = connect(broker)
    for i in range(3):
        send(broker, producer, "q", f"m{i}")
    broker.close_connection(producer)
    got = advisories(broker, store, w)
    assert [(a["advisoryType"], a.get("producerCount")) for a in got] == [
        ("ProducerAdded", 1), ("ProducerRemoved", None)]
    assert got[1]["connectionId"] == producer.id


def test_connection_advisories_name_the_user_address_and_protocol() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.Connection")
    conn = broker.open_connection(Principal("alice", frozenset()), client_id="app",
                                  remote="10.0.0.5:4242", protocol="mqtt")
    broker.close_connection(conn)
    added, removed = advisories(broker, store, w)
    assert added == {"advisoryType": "ConnectionAdded", "originBrokerName": "unit",
                     "connectionId": conn.id, "clientId": "app", "userName": "alice",
                     "remoteAddress": "10.0.0.5:4242", "protocol": "mqtt"}
    assert removed == {"advisoryType": "ConnectionRemoved", "originBrokerName": "unit",
                       "connectionId": conn.id, "clientId": "app"}


def test_temporary_queues_are_announced_when_made_and_when_gone() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.TempQueue")
    owner = connect(broker)
    temp = broker.create_temp(owner, DestKind.TEMP_QUEUE)
    broker.close_connection(owner)
    got = advisories(broker, store, w)
    assert [(a["advisoryType"], a["destination"]) for a in got] == [
        ("TempDestinationAdded", str(temp)), ("TempDestinationRemoved", str(temp))]


def test_a_wildcard_advisory_subscription_hears_every_queue() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.Consumer.Queue.>")
    conn = connect(broker)
    sub(broker, conn, "a", "a")
    sub(broker, conn, "b", "b.c")
    sub(broker, conn, "t", "topic:t")
    got = advisories(broker, store, w)
    assert [a["destination"] for a in got] == ["queue://a", "queue://b.c"]


def test_subscribing_to_advisories_raises_no_advisory_about_itself() -> None:
    broker, _, store = make_broker()
    watch = connect(broker)
    w = sub(broker, watch, "w", "topic:ActiveMQ.Advisory.>")
    sub(broker, watch, "w2", "topic:ActiveMQ.Advisory.Consumer.Queue.q")
    assert advisories(broker, store, w) == []


def test_the_master_broker_advisory_is_kept_for_later_subscribers() -> None:
    broker, _, _ = make_broker()
    broker.advise_master_broker({"brokerName": "unit", "takeoverMs": 120,
                                 "notSent": object()})
    (msg,) = broker.retained_for([dst.topic("ActiveMQ.Advisory.MasterBroker")])
    body = json.loads(msg.body)
    assert body == {"advisoryType": "MasterBroker", "originBrokerName": "unit",
                    "brokerName": "unit", "takeoverMs": 120}


def test_a_composite_consumer_is_counted_once_per_destination() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "a,b")
    sub(broker, conn, "d", "a")
    assert (broker.consumer_count(dst.queue("a")), broker.consumer_count(dst.queue("b"))) == (
        2, 1)
    broker.unsubscribe(conn, c)
    broker.unsubscribe(conn, c)  # a second unsubscribe changes nothing
    assert (broker.consumer_count(dst.queue("a")), broker.consumer_count(dst.queue("b"))) == (
        1, 0)
