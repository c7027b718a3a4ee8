"""Retained messages to a late paho subscriber, will messages (abrupt close, normal
DISCONNECT, v5 will delay) over sockets, and the $SYS statistics topics (published only
while an MQTT listener exists). Retain handling, keep-alive and broker-only topics are
tested without sockets in tests/unit/broker/mqtt/test_mqtt_retain_and_sys.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import (
    Properties,
    Publish,
    ReasonCode,
    Will,
)
from tests.interop.mqtt_helpers import LEVELS, MqttEnv, uid


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data", mqtt=MqttConfig(sys_interval_ms=100))
    try:
        yield e
    finally:
        e.close()


# ---------------------------------------------------------------------------- retained


@pytest.mark.parametrize("level", LEVELS)
def test_new_subscriber_gets_retained_message_with_retain_flag(env: MqttEnv,
                                                                level: int) -> None:
    topic = uid("ret/")
    live = env.paho(level)
    live.subscribe(topic, 1)
    pub = env.paho(level)
    pub.publish(topic, b"retained!", qos=1, retain=True)
    # an existing subscriber gets it as a normal message: retain flag 0
    got = live.wait_messages(1)[0]
    assert (got.payload, got.retain) == (b"retained!", False)
    late = env.paho(level)
    late.subscribe(topic, 1)
    msg = late.wait_messages(1)[0]
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == (topic, b"retained!", True, 1)


# ---------------------------------------------------------------------------- wills


@pytest.mark.parametrize("level", LEVELS)
def test_will_published_on_abrupt_close(env: MqttEnv, level: int) -> None:
    topic = uid("will/")
    watcher = env.paho(level)
    watcher.subscribe(topic, 1)
    dying = env.raw(level)
    dying.connect(uid("dying"), keep_alive=60,
                  will=Will(topic, b"gone", qos=1, retain=True))
    assert dying.ping() == []
    dying.abort()  # socket closed without DISCONNECT
    msg = watcher.wait_messages(1)[0]
    assert (msg.topic, msg.payload, msg.qos) == (topic, b"gone", 1)
    late = env.paho(level)  # the will was retained
    late.subscribe(topic, 1)
    retained = late.wait_messages(1)[0]
    assert (retained.payload, retained.retain) == (b"gone", True)


@pytest.mark.parametrize("level", LEVELS)
def test_no_will_after_normal_disconnect(env: MqttEnv, level: int) -> None:
    topic = uid("nowill/")
    watcher = env.paho(level)
    watcher.subscribe(topic, 1)
    polite = env.raw(level)
    polite.connect(uid("polite"), will=Will(topic, b"should not appear", qos=1))
    polite.disconnect()
    assert polite.until_closed() == []  # the broker has processed the close by now
    pub = env.paho(level)
    pub.publish(topic, b"marker", qos=1)
    assert watcher.wait_for(b"marker")[0].payload == b"marker"  # the marker came first


def test_v5_disconnect_with_will_message_publishes_the_will(env: MqttEnv) -> None:
    topic = uid("willrc/")
    watcher = env.paho(5)
    watcher.subscribe(topic, 1)
    raw = env.raw(5)
    raw.connect(uid("rc4"), will=Will(topic, b"asked for", qos=1))
    raw.disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE)
    raw.until_closed()
    assert watcher.wait_messages(1)[0].payload == b"asked for"


def test_v5_will_delay_and_reconnect_within_it_cancels(env: MqttEnv) -> None:
    cancelled_topic = uid("willc/")
    delayed_topic = uid("willd/")
    watcher = env.paho(5)
    watcher.subscribe(cancelled_topic, 1)
    watcher.subscribe(delayed_topic, 1)
    session = Properties(session_expiry_interval=60)
    will_props = Properties(will_delay_interval=1)
    cid = uid("comesback")
    back = env.raw(5)
    back.connect(cid, clean=False, properties=session,
                 will=Will(cancelled_topic, b"cancelled will", qos=1, properties=will_props))
    control = env.raw(5)
    control.connect(uid("staysaway"), clean=False, properties=session,
                    will=Will(delayed_topic, b"delayed will", qos=1, properties=will_props))
    back.abort()
    t0 = time.monotonic()
    control.abort()  # its will timer is scheduled after the other one, same delay
    again = env.raw(5)
    assert again.connect(cid, clean=False, properties=session).session_present is True
    msgs = watcher.wait_for(b"delayed will")
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.9, f"will delay of 1 s not honoured: published after {elapsed:.2f}s"
    assert [m.payload for m in msgs] == [b"delayed will"]
    watcher.client.publish(cancelled_topic, b"marker", 1).wait_for_publish(10)
    assert [m.payload for m in watcher.wait_for(b"marker")] == [b"delayed will", b"marker"]


# ---------------------------------------------------------------------------- keep-alive


# ---------------------------------------------------------------------------- $SYS


@pytest.mark.parametrize("level", LEVELS)
def test_sys_topics_and_hash_does_not_match_them(env: MqttEnv, level: int) -> None:
    sys_sub = env.raw_connected(level)
    sys_sub.subscribe("$SYS/#", qos=0)
    retained = sys_sub.ping()
    topics = {p.topic: p.payload for p in retained}  # type: ignore[union-attr]
    assert "$SYS/broker/clients/connected" in topics, sorted(topics)
    assert "$SYS/broker/version" in topics
    assert topics["$SYS/broker/version"].startswith(b"meshmq")

    everything = env.raw_connected(level)
    everything.subscribe("#", qos=0)
    plus = env.raw_connected(level)
    plus.subscribe("+/broker/#", qos=0)
    assert [p for p in everything.ping() if p.topic.startswith("$")] == []  # type: ignore[union-attr]
    assert plus.ping() == []
    # wait for a live $SYS update (interval 100 ms) that counts us, then a marker:
    # "#" saw no $ topics meanwhile
    while True:
        p = sys_sub.expect(Publish)
        if not p.retain and p.topic == "$SYS/broker/clients/connected":
            assert int(p.payload) >= 3  # sys_sub, everything and plus at least
            break
    marker = uid("sysmarker/")
    pub = env.raw_connected(level)
    pub.publish(marker, b"m", qos=0)
    seen = []
    while True:
        p = everything.expect(Publish)
        seen.append(p.topic)
        if p.topic == marker:
            break
    assert [t for t in seen if t.startswith("$")] == [], seen
    assert plus.ping() == []


# ------------------------------------------------ $SYS and advisories: only the broker writes
# A client's PUBLISH or SEND there is refused (MQTT 5: Not authorized, 0x87; MQTT 3.1.1 has
# no refusal, so the message is dropped; STOMP: an ERROR frame), nothing is routed or
# retained, and the client stays connected.

CONNECTED = "$SYS/broker/clients/connected"


def denied(env: MqttEnv) -> int:
    return int(env.broker.run(lambda: env.runtime.broker.denied_publishes))


def test_stomp_send_to_a_broker_topic_gets_an_error(env: MqttEnv) -> None:
    c = env.stomp()
    c.send("/topic/$SYS.broker.clients.connected", "999999", receipt=False)
    err = c.listener.wait_error()
    assert "written only by the broker" in err.headers.get("message", "")
