"""The broker's idempotent-producer window on the MQTT 5 door, in memory: a PUBLISH whose
``dedup-id`` user property was seen before is acknowledged again but delivered (and
retained) once; another id is a new message."""

from __future__ import annotations

import pytest
from tests.support.memory_mqtt import MqttEnv, received, uid

from meshmq.protocol.mqtt import Properties, Puback, Pubcomp, ReasonCode


def dedup(value: str) -> Properties:
    return Properties(user_properties=[("dedup-id", value)])


@pytest.mark.parametrize(("qos", "ack_type"), [(1, Puback), (2, Pubcomp)])
def test_a_resent_dedup_id_is_acknowledged_and_delivered_once(env: MqttEnv, qos: int,
                                                              ack_type: type) -> None:
    topic = uid("idem/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=2)
    pub = env.raw_connected(5)
    for _ in range(2):
        ack = pub.publish(topic, b"once", qos=qos, properties=dedup("m-1"))
        assert isinstance(ack, ack_type) and ack.reason_code == ReasonCode.SUCCESS
    pub.publish(topic, b"next", qos=qos, properties=dedup("m-2"))
    got = received(sub, 2)
    assert [p.payload for p in got] == [b"once", b"next"]
    assert ("dedup-id", "m-1") in got[0].properties.user_properties
    assert sub.ping() == []


def test_the_window_is_the_brokers_not_the_connections(env: MqttEnv) -> None:
    """A producer that reconnects (say after a failover) and resends is deduplicated."""
    topic = uid("idem2/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=1)
    env.raw_connected(5).publish(topic, b"first try", qos=1, properties=dedup("x-9"))
    env.raw_connected(5).publish(topic, b"resent", qos=1, properties=dedup("x-9"))
    assert [p.payload for p in received(sub, 1)] == [b"first try"]
    assert sub.ping() == []
