"""An MQTT 5 session resumed with clean start 0 and no Session Expiry Interval: the
reconnect resumes the existing session (the messages queued while the client was away
are delivered) and the new interval, 0, applies when this connection ends."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.interop.mqtt_helpers import MqttEnv, paho_props, uid


@pytest.mark.parametrize("qos", [1, 2])
def test_resumed_without_expiry_gets_the_queued_messages(mqtt_env: MqttEnv, qos: int) -> None:
    client_id, topic = uid("resume"), f"resume/{uid('t')}"
    first = mqtt_env.paho(5, client_id=client_id, clean=False, session_expiry=300)
    first.subscribe(topic, qos=qos)
    first.disconnect()
    publisher = mqtt_env.paho(5)
    for i in range(3):
        publisher.publish(topic, f"m{i}".encode(), qos=qos)
    publisher.disconnect()
    again = mqtt_env.paho(5, client_id=client_id, clean=False)  # no Session Expiry Interval
    assert again.session_present
    assert [m.payload for m in again.wait_messages(3)] == [b"m0", b"m1", b"m2"]
    # New messages flow too, on the same subscription.
    publisher = mqtt_env.paho(5)
    publisher.publish(topic, b"live", qos=qos)
    again.wait_for(b"live")
    publisher.disconnect()
    again.disconnect()
    # The interval of the last connection (0) ended the session with it.
    last = mqtt_env.paho(5, client_id=client_id, clean=False)
    assert not last.session_present
    last.disconnect()


def test_message_expiry_still_applies_to_a_resumed_session(mqtt_env: MqttEnv) -> None:
    client_id, topic = uid("resume"), f"resume/{uid('x')}"
    first = mqtt_env.paho(5, client_id=client_id, clean=False, session_expiry=300)
    first.subscribe(topic, qos=1)
    first.disconnect()
    publisher = mqtt_env.paho(5)
    publisher.publish(topic, b"kept", qos=1,
                      properties=paho_props(PacketTypes.PUBLISH, MessageExpiryInterval=300))
    publisher.disconnect()
    again = mqtt_env.paho(5, client_id=client_id, clean=False)
    [message] = again.wait_messages(1)
    assert message.payload == b"kept"
    expiry = getattr(message.properties, "MessageExpiryInterval", None)
    assert expiry is not None and 0 < expiry <= 300
    again.disconnect()


def test_a_burst_larger_than_one_turn_keeps_its_order(mqtt_env: MqttEnv) -> None:
    """More pipelined packets than one event-loop turn handles: served over several
    turns, in order, every one acknowledged."""
    from meshmq.protocol.mqtt import Puback, Publish, encode

    topic = f"burst/{uid('b')}"
    sub = mqtt_env.raw(4)
    sub.connect(uid("bsub"))
    sub.subscribe((topic, 1))
    pub = mqtt_env.raw(4)
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
