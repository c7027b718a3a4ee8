"""An MQTT 5 session resumed with clean start 0 and no Session Expiry Interval: the
reconnect resumes the existing session (the messages queued while the client was away
are delivered) and the new interval, 0, applies when this connection ends. And a burst
of pipelined packets larger than one event-loop turn keeps its order."""

from __future__ import annotations

import pytest
from tests.support.memory_mqtt import MemoryMqtt, MqttEnv, uid

from meshmq.protocol.mqtt import Properties, Puback, Publish, encode


def _leave(raw: MemoryMqtt) -> None:
    raw.disconnect()
    assert raw.until_closed() == []


@pytest.mark.parametrize("qos", [1, 2])
def test_resumed_without_expiry_gets_the_queued_messages(env: MqttEnv, qos: int) -> None:
    client_id, topic = uid("resume"), f"resume/{uid('t')}"
    first = env.raw(5)
    first.connect(client_id, clean=False, properties=Properties(session_expiry_interval=300))
    first.subscribe(topic, qos=qos)
    _leave(first)
    publisher = env.raw_connected(5)
    for i in range(3):
        publisher.publish(topic, f"m{i}".encode(), qos=qos)
    again = env.raw(5)
    assert again.connect(client_id, clean=False).session_present  # no expiry interval
    queued = again.publishes(3)
    assert [m.payload for m in queued] == [b"m0", b"m1", b"m2"]
    for m in queued:
        again.ack(m)
    # New messages flow too, on the same subscription.
    publisher.publish(topic, b"live", qos=qos)
    live = again.expect(Publish)
    assert live.payload == b"live"
    again.ack(live)
    _leave(again)
    # The interval of the last connection (0) ended the session with it.
    last = env.raw(5)
    assert not last.connect(client_id, clean=False).session_present


def test_message_expiry_still_applies_to_a_resumed_session(env: MqttEnv) -> None:
    client_id, topic = uid("resume"), f"resume/{uid('x')}"
    first = env.raw(5)
    first.connect(client_id, clean=False, properties=Properties(session_expiry_interval=300))
    first.subscribe(topic, qos=1)
    _leave(first)
    publisher = env.raw_connected(5)
    publisher.publish(topic, b"kept", qos=1,
                      properties=Properties(message_expiry_interval=300))
    again = env.raw(5)
    again.connect(client_id, clean=False)
    message = again.expect(Publish)
    assert message.payload == b"kept"
    expiry = message.properties.message_expiry_interval
    assert expiry is not None and 0 < expiry <= 300


def test_a_burst_larger_than_one_turn_keeps_its_order(env: MqttEnv) -> None:
    """More pipelined packets than one event-loop turn handles: served over several
    turns, in order, every one acknowledged."""
    topic = f"burst/{uid('b')}"
    sub = env.raw(4)
    sub.connect(uid("bsub"))
    sub.subscribe((topic, 1))
    pub = env.raw(4)
    pub.connect(uid("bpub"))
    count = 1000
    pub.send_bytes(b"".join(encode(Publish(topic=topic, payload=str(i).encode(), qos=1,
                                           packet_id=i + 1), 4) for i in range(count)))
    acks = [pub.expect(Puback).packet_id for _ in range(count)]
    assert acks == list(range(1, count + 1))
    got = []
    for _ in range(count):
        packet = sub.expect(Publish)
        got.append(int(packet.payload))
        sub.ack(packet)
    assert got == list(range(count))
