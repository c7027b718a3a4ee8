"""The in-memory harness drives the real runtime: a message goes from a SEND/PUBLISH
through the core to a subscriber, with no socket."""

from __future__ import annotations

from tests.support.memory_broker import memory_broker

from meshmq.protocol.mqtt.packets import Publish, Suback, Subscribe, SubscriptionOptions


def test_stomp_send_reaches_a_subscriber_and_receipts_come_back() -> None:
    with memory_broker() as broker:
        consumer, producer = broker.stomp(), broker.stomp()
        assert consumer.connect().command == "CONNECTED"
        assert producer.connect().command == "CONNECTED"
        consumer.send("SUBSCRIBE", {"id": "1", "destination": "/queue/q", "receipt": "s"})
        assert consumer.expect("RECEIPT").get("receipt-id") == "s"
        producer.send("SEND", {"destination": "/queue/q", "receipt": "r1"}, b"hello")
        assert producer.expect("RECEIPT").get("receipt-id") == "r1"
        message = consumer.expect("MESSAGE")
        assert message.body == b"hello"
        assert message.get("destination") == "/queue/q"


def test_a_dropped_stomp_connection_returns_its_unacked_message() -> None:
    with memory_broker() as broker:
        first = broker.stomp()
        first.connect()
        first.send("SUBSCRIBE", {"id": "1", "destination": "/queue/q", "ack": "client"})
        producer = broker.stomp()
        producer.connect()
        producer.send("SEND", {"destination": "/queue/q"}, b"m")
        assert first.expect("MESSAGE").body == b"m"
        first.drop()
        second = broker.stomp()
        second.connect()
        second.send("SUBSCRIBE", {"id": "1", "destination": "/queue/q"})
        again = second.expect("MESSAGE")
        assert again.body == b"m"
        assert again.get("redelivered") == "true"


def test_mqtt_publish_reaches_a_subscriber() -> None:
    with memory_broker() as broker:
        sub, pub = broker.mqtt(), broker.mqtt(level=5)
        assert sub.connect("sub").reason_code == 0
        assert pub.connect("pub").reason_code == 0
        sub.send(Subscribe(packet_id=1, subscriptions=[("a/b", SubscriptionOptions(qos=0))]))
        assert sub.expect(Suback).packet_id == 1
        pub.send(Publish(topic="a/b", payload=b"x"))
        got = sub.expect(Publish)
        assert (got.topic, got.payload) == ("a/b", b"x")
