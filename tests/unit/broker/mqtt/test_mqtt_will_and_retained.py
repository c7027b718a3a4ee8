"""Retained messages to a late subscriber and will messages (abrupt close, normal
DISCONNECT, v5 DISCONNECT with will, v5 will delay and a reconnect that cancels it),
through a broker driven in memory.
"""

from __future__ import annotations

import time

import pytest
from tests.support.memory_mqtt import LEVELS, MqttEnv, received, uid, watched

from meshmq.protocol.mqtt import Properties, ReasonCode, Will

# ---------------------------------------------------------------------------- retained


@pytest.mark.parametrize("level", LEVELS)
def test_new_subscriber_gets_retained_message_with_retain_flag(env: MqttEnv,
                                                                level: int) -> None:
    topic = uid("ret/")
    live = env.raw_connected(level)
    live.subscribe(topic, qos=1)
    pub = env.raw_connected(level)
    pub.publish(topic, b"retained!", qos=1, retain=True)
    # an existing subscriber gets it as a normal message: retain flag 0
    [got] = received(live, 1)
    assert (got.payload, got.retain) == (b"retained!", False)
    late = env.raw_connected(level)
    late.subscribe(topic, qos=1)
    [msg] = received(late, 1)
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == (topic, b"retained!", True, 1)
    assert late.ping() == [] and live.ping() == []


# ---------------------------------------------------------------------------- wills


@pytest.mark.parametrize("level", LEVELS)
def test_will_published_on_abrupt_close(env: MqttEnv, level: int) -> None:
    topic, watcher = watched(env, level, qos=1)
    dying = env.raw(level)
    dying.connect(uid("dying"), keep_alive=60,
                  will=Will(topic, b"gone", qos=1, retain=True))
    assert dying.ping() == []
    assert watcher.ping() == []  # no will while the connection lives
    dying.abort()  # the connection breaks without DISCONNECT
    [msg] = received(watcher, 1)
    assert (msg.topic, msg.payload, msg.qos) == (topic, b"gone", 1)
    late = env.raw_connected(level)  # the will was retained
    late.subscribe(topic, qos=1)
    [retained] = received(late, 1)
    assert (retained.payload, retained.retain) == (b"gone", True)


@pytest.mark.parametrize("level", LEVELS)
def test_no_will_after_normal_disconnect(env: MqttEnv, level: int) -> None:
    topic, watcher = watched(env, level, qos=1, prefix="nowill/")
    polite = env.raw(level)
    polite.connect(uid("polite"), will=Will(topic, b"should not appear", qos=1))
    polite.disconnect()
    assert polite.until_closed() == []  # the broker has processed the close by now
    pub = env.raw_connected(level)
    pub.publish(topic, b"marker", qos=1)
    assert [p.payload for p in received(watcher, 1)] == [b"marker"]  # the marker came first
    assert watcher.ping() == []


def test_v5_disconnect_with_will_message_publishes_the_will(env: MqttEnv) -> None:
    topic, watcher = watched(env, 5, qos=1, prefix="willrc/")
    raw = env.raw(5)
    raw.connect(uid("rc4"), will=Will(topic, b"asked for", qos=1))
    raw.disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE)
    raw.until_closed()
    assert [p.payload for p in received(watcher, 1)] == [b"asked for"]


def test_v5_will_delay_and_reconnect_within_it_cancels(env: MqttEnv) -> None:
    cancelled_topic = uid("willc/")
    delayed_topic = uid("willd/")
    watcher = env.raw_connected(5)
    watcher.subscribe(cancelled_topic, delayed_topic, qos=1)
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
    msgs = received(watcher, 1)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.9, f"will delay of 1 s not honoured: published after {elapsed:.2f}s"
    assert [m.payload for m in msgs] == [b"delayed will"]
    env.raw_connected(5).publish(cancelled_topic, b"marker", qos=1)
    assert [m.payload for m in received(watcher, 1)] == [b"marker"]
    assert watcher.ping() == []
