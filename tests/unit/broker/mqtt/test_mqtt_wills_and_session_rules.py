"""MQTT wills and session rules through a broker driven in memory: when a will is
published (keep-alive timeout, a protocol violation, a session taken over) and what it
carries (QoS, retain, MQTT 5 properties); the session expiry a client may set at
DISCONNECT and the one the broker grants; packets acknowledging nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import LEVELS, MqttEnv, mqtt_env, received, uid, watched

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import (
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Will,
)


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(mqtt=MqttConfig(max_session_expiry_s=600))) as e:
        yield e


# ---------------------------------------------------------------------------- wills


@pytest.mark.parametrize("level", LEVELS)
def test_will_is_published_when_keep_alive_expires(env: MqttEnv, level: int) -> None:
    topic, watcher = watched(env, level)
    silent = env.raw(level)
    silent.connect(uid("silent"), keep_alive=1, will=Will(topic, b"timed out", qos=1))
    silent.session.check_timeouts(time.monotonic() + 2)
    silent.until_closed()
    assert [p.payload for p in received(watcher, 1)] == [b"timed out"]


@pytest.mark.parametrize("level", LEVELS)
def test_will_is_published_when_the_broker_closes_for_a_violation(env: MqttEnv,
                                                                  level: int) -> None:
    topic, watcher = watched(env, level)
    bad = env.raw(level)
    bad.connect(uid("bad"), will=Will(topic, b"violated", qos=1))
    bad.send(Publish("wild/+", b"x", qos=0))  # a wildcard in a topic name
    bad.until_closed()
    assert [p.payload for p in received(watcher, 1)] == [b"violated"]


@pytest.mark.parametrize("level", LEVELS)
def test_will_of_a_taken_over_connection_is_published(env: MqttEnv, level: int) -> None:
    topic, watcher = watched(env, level)
    cid = uid("twice")
    first = env.raw(level)
    first.connect(cid, will=Will(topic, b"first connection's will", qos=1))
    second = env.raw(level)
    second.connect(cid)
    first.until_closed()
    assert [p.payload for p in received(watcher, 1)] == [b"first connection's will"]
    assert second.ping() == []


@pytest.mark.parametrize(("will_qos", "sub_qos", "delivered"), [(0, 2, 0), (2, 1, 1), (2, 2, 2)])
def test_will_qos_is_kept_up_to_the_subscription(env: MqttEnv, will_qos: int, sub_qos: int,
                                                 delivered: int) -> None:
    topic, watcher = watched(env, 4, qos=sub_qos)
    dying = env.raw(4)
    dying.connect(uid("q"), will=Will(topic, b"w", qos=will_qos))
    dying.abort()
    [got] = received(watcher, 1)
    assert got.qos == delivered


@pytest.mark.parametrize("level", LEVELS)
def test_a_will_without_retain_is_not_retained(env: MqttEnv, level: int) -> None:
    topic, watcher = watched(env, level)
    dying = env.raw(level)
    dying.connect(uid("noretain"), will=Will(topic, b"w", qos=1, retain=False))
    dying.abort()
    [got] = received(watcher, 1)
    assert got.retain is False
    late = env.raw_connected(level)
    late.subscribe(topic, qos=1)
    assert late.ping() == []


def test_v5_will_properties_reach_the_subscriber(env: MqttEnv) -> None:
    topic, watcher = watched(env, 5)
    dying = env.raw(5)
    dying.connect(uid("props"), will=Will(topic, b"{}", qos=1, properties=Properties(
        content_type="application/json", payload_format_indicator=1,
        user_properties=[("reason", "power")], response_topic="ask/again",
        correlation_data=b"c-1")))
    dying.abort()
    [got] = received(watcher, 1)
    props = got.properties
    assert props.content_type == "application/json"
    assert props.payload_format_indicator == 1
    assert ("reason", "power") in props.user_properties
    assert props.response_topic == "ask/again"
    assert props.correlation_data == b"c-1"


# ---------------------------------------------------------------------------- expiry


def test_v5_disconnect_may_not_set_an_expiry_when_connect_had_none(env: MqttEnv) -> None:
    """MQTT 5 3.14.2.2.2: a non-zero Session Expiry Interval in DISCONNECT after a CONNECT
    with zero is a protocol error; the session still ends with the connection."""
    will_topic, watcher = watched(env, 5)
    cid = uid("noexpiry")
    raw = env.raw(5)
    raw.connect(cid, will=Will(will_topic, b"not a normal disconnect", qos=1))
    raw.subscribe(uid("gone/"), qos=1)
    raw.disconnect(properties=Properties(session_expiry_interval=300))
    got = raw.until_closed()
    assert len(got) == 1 and isinstance(got[0], Disconnect), got
    assert got[0].reason_code == ReasonCode.PROTOCOL_ERROR
    assert [p.payload for p in received(watcher, 1)] == [b"not a normal disconnect"]
    again = env.raw(5)
    assert again.connect(cid, clean=False,
                         properties=Properties(session_expiry_interval=60)).session_present \
        is False
    assert env.durables(cid) == []


def test_v5_disconnect_may_shorten_or_lengthen_a_non_zero_expiry(env: MqttEnv) -> None:
    cid = uid("longer")
    raw = env.raw(5)
    raw.connect(cid, clean=False, properties=Properties(session_expiry_interval=1))
    raw.subscribe(uid("kept/"), qos=1)
    raw.disconnect(properties=Properties(session_expiry_interval=300))
    assert raw.until_closed() == []
    assert env.runtime.mqtt.states[cid].expiry_s == 300


def test_v5_connack_names_the_expiry_the_broker_grants_when_lower(env: MqttEnv) -> None:
    raw = env.raw(5)
    ack = raw.connect(uid("long"), clean=False,
                      properties=Properties(session_expiry_interval=86_400))
    assert ack.properties.session_expiry_interval == 600


def test_v5_connack_names_no_expiry_when_the_request_is_granted(env: MqttEnv) -> None:
    raw = env.raw(5)
    ack = raw.connect(uid("short"), clean=False,
                      properties=Properties(session_expiry_interval=60))
    assert ack.properties.session_expiry_interval is None


def test_v5_disconnect_expiry_is_capped_by_the_broker(env: MqttEnv) -> None:
    cid = uid("capped")
    raw = env.raw(5)
    raw.connect(cid, clean=False, properties=Properties(session_expiry_interval=60))
    raw.disconnect(properties=Properties(session_expiry_interval=10**6))
    raw.until_closed()
    assert env.runtime.mqtt.states[cid].expiry_s == 600


# ---------------------------------------------------------------------------- stray acks


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("packet", [Puback(321), Pubrec(321), Pubcomp(321)])
def test_acknowledgements_of_unknown_packet_ids_are_ignored(env: MqttEnv, level: int,
                                                            packet: object) -> None:
    raw = env.raw_connected(level)
    raw.send(packet)  # type: ignore[arg-type]
    before = raw.ping()
    # a PUBREC is answered with PUBREL (MQTT 4.3.3): the id is simply released
    assert all(isinstance(p, Pubrel) for p in before), before
    topic = uid("stillok/")
    raw.subscribe(topic, qos=1)
    env.raw_connected(level).publish(topic, b"fine", qos=1)
    assert [p.payload for p in received(raw, 1)] == [b"fine"]


def test_v5_pubrel_of_an_unknown_id_is_answered_packet_identifier_not_found(
        env: MqttEnv) -> None:
    raw = env.raw_connected(5)
    raw.send(Pubrel(999))
    comp = raw.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (999, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
