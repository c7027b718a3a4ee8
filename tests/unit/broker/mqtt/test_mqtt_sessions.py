"""MQTT sessions: clean session / clean start and the session-present flag, queued QoS 1
messages for an offline persistent session, v5 session expiry, session takeover.
"""

from __future__ import annotations

import pytest
from tests.support.memory_mqtt import LEVELS, MemoryMqtt, MqttEnv, uid

from meshmq.protocol.mqtt import Disconnect, Properties, Publish, ReasonCode


def connect(raw: MemoryMqtt, cid: str, *, persistent: bool, expiry: int = 300) -> bool:
    props = None
    if raw.level == 5 and persistent:
        props = Properties(session_expiry_interval=expiry)
    return raw.connect(cid, clean=not persistent, properties=props).session_present


def leave(raw: MemoryMqtt) -> None:
    raw.disconnect()
    assert raw.until_closed() == []


@pytest.mark.parametrize("level", LEVELS)
def test_session_present_flag_and_clean_start_discards(env: MqttEnv, level: int) -> None:
    cid = uid("sess")
    topic = uid("sess/")
    a = env.raw(level)
    assert connect(a, cid, persistent=True) is False  # nothing stored yet
    a.subscribe(topic, qos=1)
    leave(a)
    assert env.durables(cid) == [f"mqtt1:{topic}"]

    b = env.raw(level)
    assert connect(b, cid, persistent=True) is True
    leave(b)

    c = env.raw(level)
    assert connect(c, cid, persistent=False) is False  # clean: the old session is gone
    assert env.durables(cid) == []
    marker = uid("marker/")
    c.subscribe(marker, qos=1)
    pub = env.raw_connected(level)
    pub.publish(topic, b"old subscription", qos=1)
    pub.publish(marker, b"marker", qos=1)
    got = c.expect(Publish)
    assert got.payload == b"marker"  # the discarded subscription delivered nothing
    c.ack(got)
    leave(c)

    d = env.raw(level)
    assert connect(d, cid, persistent=True) is False  # clean session end left nothing


@pytest.mark.parametrize("level", LEVELS)
def test_offline_persistent_session_gets_queued_qos1_on_return(env: MqttEnv,
                                                                level: int) -> None:
    cid = uid("offline")
    topic = uid("offline/")
    sub = env.raw(level)
    connect(sub, cid, persistent=True)
    assert sub.subscribe(topic, qos=1).reason_codes == [ReasonCode.GRANTED_QOS_1]
    leave(sub)
    pub = env.raw_connected(level)
    for i in range(3):
        pub.publish(topic, b"queued-%d" % i, qos=1)
    back = env.raw(level)
    assert connect(back, cid, persistent=True) is True
    got = back.publishes(3)
    assert [m.payload for m in got] == [b"queued-0", b"queued-1", b"queued-2"]
    assert [m.qos for m in got] == [1, 1, 1]
    assert [m.topic for m in got] == [topic] * 3


def test_v5_session_expires_after_its_interval(env: MqttEnv) -> None:
    cid = uid("expire")
    topic = uid("expire/")
    a = env.raw(5)
    connect(a, cid, persistent=True, expiry=1)
    a.subscribe(topic, qos=1)
    leave(a)
    assert env.durables(cid) == [f"mqtt1:{topic}"]  # still there right after leaving
    env.broker.wait_for(lambda: env.durables(cid) == [], 5, "the session to expire")
    b = env.raw(5)
    assert connect(b, cid, persistent=True) is False
    assert b.ping() == []


def test_v5_session_survives_within_its_expiry(env: MqttEnv) -> None:
    cid = uid("keep")
    topic = uid("keep/")
    a = env.raw(5)
    connect(a, cid, persistent=True, expiry=60)
    a.subscribe(topic, qos=1)
    leave(a)
    pub = env.raw_connected(5)
    pub.publish(topic, b"kept", qos=1)
    b = env.raw(5)
    assert connect(b, cid, persistent=True) is True
    assert b.expect(Publish).payload == b"kept"


def test_v5_zero_expiry_with_clean_start_false_ends_at_disconnect(env: MqttEnv) -> None:
    cid = uid("zero")
    a = env.raw(5)
    assert a.connect(cid, clean=False).session_present is False  # no expiry property = 0
    a.subscribe(uid("zero/"), qos=1)
    leave(a)
    assert env.durables(cid) == []
    b = env.raw(5)
    assert b.connect(cid, clean=False).session_present is False


def test_v5_disconnect_can_end_the_session(env: MqttEnv) -> None:
    cid = uid("discexp")
    a = env.raw(5)
    connect(a, cid, persistent=True, expiry=300)
    a.subscribe(uid("discexp/"), qos=1)
    a.disconnect(0, Properties(session_expiry_interval=0))
    assert a.until_closed() == []
    env.broker.wait_for(lambda: env.durables(cid) == [], 5, "the session to end")
    b = env.raw(5)
    assert connect(b, cid, persistent=True) is False


@pytest.mark.parametrize("level", LEVELS)
def test_session_takeover_closes_the_first_connection(env: MqttEnv, level: int) -> None:
    cid = uid("takeover")
    first = env.raw(level)
    connect(first, cid, persistent=True)
    topic = uid("takeover/")
    first.subscribe(topic, qos=1)
    second = env.raw(level)
    assert connect(second, cid, persistent=True) is True  # takes the session over
    before_close = first.until_closed()
    if level == 5:
        assert len(before_close) == 1 and isinstance(before_close[0], Disconnect), before_close
        assert before_close[0].reason_code == ReasonCode.SESSION_TAKEN_OVER
    else:
        assert before_close == []  # 3.1.1: the connection is simply closed
    # the new connection owns the session and its subscription
    pub = env.raw_connected(level)
    pub.publish(topic, b"to the new one", qos=1)
    got = second.expect(Publish)
    assert got.payload == b"to the new one"
    second.ack(got)
    assert second.ping() == []
