"""MQTT 5 topic aliases a client sets (rebinding, scope, surviving a QoS 2 exchange) and
keep-alive with the clock passed in (``check_timeouts(now)``), through a broker driven
in memory."""

from __future__ import annotations

import time

import pytest
from tests.support.memory_mqtt import LEVELS, MemoryMqtt, MqttEnv, received, uid

from meshmq.protocol.mqtt import Disconnect, Properties, Publish, ReasonCode


def alias(n: int) -> Properties:
    return Properties(topic_alias=n)


# ---------------------------------------------------------------------------- aliases


def test_setting_an_alias_again_rebinds_it(env: MqttEnv) -> None:
    base = uid("rebind")
    sub = env.raw_connected(5)
    sub.subscribe(f"{base}/#", qos=1)
    pub = env.raw_connected(5)
    pub.publish(f"{base}/first", b"1", qos=1, properties=alias(3))
    pub.publish(f"{base}/second", b"2", qos=1, properties=alias(3))
    pub.publish("", b"3", qos=1, properties=alias(3))
    got = received(sub, 3)
    assert [(p.topic, p.payload) for p in got] == [
        (f"{base}/first", b"1"), (f"{base}/second", b"2"), (f"{base}/second", b"3")]


def test_several_aliases_are_kept_side_by_side(env: MqttEnv) -> None:
    base = uid("side")
    sub = env.raw_connected(5)
    sub.subscribe(f"{base}/#", qos=1)
    pub = env.raw_connected(5)
    pub.publish(f"{base}/a", b"a1", qos=1, properties=alias(1))
    pub.publish(f"{base}/b", b"b1", qos=1, properties=alias(2))
    pub.publish("", b"a2", qos=1, properties=alias(1))
    pub.publish("", b"b2", qos=1, properties=alias(2))
    got = received(sub, 4)
    assert [(p.topic.rsplit("/", 1)[1], p.payload) for p in got] == [
        ("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("b", b"b2")]


def test_a_topic_with_an_alias_is_used_as_given(env: MqttEnv) -> None:
    """A PUBLISH naming both a topic and an alias goes to the topic it names."""
    base = uid("both")
    sub = env.raw_connected(5)
    sub.subscribe(f"{base}/#", qos=1)
    pub = env.raw_connected(5)
    pub.publish(f"{base}/x", b"1", qos=1, properties=alias(1))
    pub.publish(f"{base}/y", b"2", qos=0, properties=alias(1))
    assert [p.topic for p in received(sub, 2)] == [f"{base}/x", f"{base}/y"]


def test_aliases_belong_to_one_connection(env: MqttEnv) -> None:
    topic = uid("scope/")
    env.raw_connected(5).publish(topic, b"set elsewhere", qos=1, properties=alias(1))
    other = env.raw_connected(5)
    other.send(Publish("", b"unknown here", qos=0, properties=alias(1)))
    got = other.until_closed()
    assert len(got) == 1 and isinstance(got[0], Disconnect), got
    assert got[0].reason_code == ReasonCode.PROTOCOL_ERROR


def test_aliases_do_not_survive_a_reconnect(env: MqttEnv) -> None:
    cid = uid("again")
    first = env.raw(5)
    first.connect(cid, clean=False, properties=Properties(session_expiry_interval=60))
    first.publish(uid("gone/"), b"x", qos=1, properties=alias(1))
    first.disconnect()
    first.until_closed()
    second = env.raw(5)
    second.connect(cid, clean=False, properties=Properties(session_expiry_interval=60))
    second.send(Publish("", b"old alias", qos=0, properties=alias(1)))
    got = second.until_closed()
    assert len(got) == 1 and got[0].reason_code == ReasonCode.PROTOCOL_ERROR  # type: ignore[union-attr]


def test_an_alias_only_qos2_publish_is_delivered_once(env: MqttEnv) -> None:
    topic = uid("q2alias/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=2)
    pub = env.raw_connected(5)
    pub.publish(topic, b"set", qos=2, properties=alias(5))
    pub.publish("", b"via alias", qos=2, properties=alias(5))
    got = received(sub, 2)
    assert [(p.topic, p.payload, p.qos) for p in got] == [(topic, b"set", 2),
                                                           (topic, b"via alias", 2)]
    assert sub.ping() == []


# ---------------------------------------------------------------------------- keep-alive


def check(raw: MemoryMqtt, now: float) -> None:
    session = raw.session
    raw.broker.call(lambda: session.check_timeouts(now))


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_zero_never_times_out(env: MqttEnv, level: int) -> None:
    raw = env.raw(level)
    raw.connect(uid("forever"), keep_alive=0)
    check(raw, time.monotonic() + 10**6)
    assert not raw.eof
    assert raw.ping() == []


@pytest.mark.parametrize("level", LEVELS)
def test_each_packet_from_the_client_restarts_keep_alive(env: MqttEnv, level: int) -> None:
    raw = env.raw(level)
    raw.connect(uid("busy"), keep_alive=10)
    topic = uid("ka/")
    for _ in range(3):
        raw.publish(topic, b"tick", qos=1)
        check(raw, time.monotonic() + 14)
        assert not raw.eof
    check(raw, time.monotonic() + 16)
    got = raw.until_closed()
    if level == 5:
        assert [p.reason_code for p in got] == [ReasonCode.KEEP_ALIVE_TIMEOUT]  # type: ignore[union-attr]
    else:
        assert got == []
