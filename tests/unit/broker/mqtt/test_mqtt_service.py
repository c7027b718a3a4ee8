"""What MQTT keeps across connections (``MqttService``: live sessions, persistent session
states, teardowns, wills waiting for their delay) and the order of an MQTT session's
confirmations through the runtime's ``Durability``: a PUBACK leaves only once the store
has synced the message, and a failed sync ends the connection without one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import LEVELS, MqttEnv, mqtt_env, uid

from meshmq.core import destinations as dst
from meshmq.core.message import Message
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
from meshmq.store.memory import MemoryStore
from meshmq.transport.durability import NOT_STORED


class ControlledStore(MemoryStore):
    """A memory store whose syncs wait while ``held`` and fail while ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False
        self.failing: str | None = None
        self.syncs = 0

    async def sync(self) -> None:
        self.syncs += 1
        while self.held:
            await asyncio.sleep(0.001)
        if self.failing is not None:
            raise OSError(self.failing)
        await super().sync()


@pytest.fixture
def controlled() -> Iterator[tuple[MqttEnv, ControlledStore]]:
    store = ControlledStore()
    with mqtt_env(memory_config(persistent=True), store=store) as env:
        yield env, store


# ---------------------------------------------------------------- confirmation ordering
# A message is stored (and its PUBACK waits for a sync) when a persistent session's
# subscription holds it; a topic no durable subscription matches stores nothing.


def stored_topic(env: MqttEnv) -> str:
    """A topic a persistent session subscribes to at QoS 1."""
    topic = uid("stored/")
    keeper = env.raw(4)
    keeper.connect(uid("keeper"), clean=False)
    keeper.subscribe(topic, qos=1)
    return topic



@pytest.mark.parametrize("level", LEVELS)
def test_qos1_puback_waits_for_the_store_sync(controlled: tuple[MqttEnv, ControlledStore],
                                              level: int) -> None:
    env, store = controlled
    topic = stored_topic(env)
    pub = env.raw_connected(level)
    store.held = True
    syncs = store.syncs
    pub.send(Publish(topic, b"m", qos=1, packet_id=5))
    env.broker.wait_for(lambda: store.syncs > syncs, what="the PUBLISH's sync")
    assert pub.ping() == []  # PINGRESP is not held back; the PUBACK is
    store.held = False
    ack = pub.expect(Puback)
    assert (ack.packet_id, ack.reason_code) == (5, ReasonCode.SUCCESS)


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_pubrec_waits_for_the_store_sync(controlled: tuple[MqttEnv, ControlledStore],
                                              level: int) -> None:
    env, store = controlled
    topic = stored_topic(env)
    pub = env.raw_connected(level)
    store.held = True
    syncs = store.syncs
    pub.send(Publish(topic, b"m", qos=2, packet_id=6))
    env.broker.wait_for(lambda: store.syncs > syncs, what="the PUBLISH's sync")
    assert pub.ping() == []
    store.held = False
    assert pub.expect(Pubrec).packet_id == 6


@pytest.mark.parametrize("level", LEVELS)
def test_a_later_confirmation_does_not_overtake_a_waiting_puback(
        controlled: tuple[MqttEnv, ControlledStore], level: int) -> None:
    env, store = controlled
    topic = stored_topic(env)
    pub = env.raw_connected(level)
    store.held = True
    pub.send(Publish(topic, b"1", qos=1, packet_id=1))
    pub.send(Pubrel(77))  # answered without the store, but queued behind the PUBACK
    assert pub.ping() == []
    store.held = False
    assert pub.expect(Puback).packet_id == 1
    assert pub.expect(Pubcomp).packet_id == 77


@pytest.mark.parametrize("level", LEVELS)
def test_failed_sync_disconnects_without_a_puback(
        controlled: tuple[MqttEnv, ControlledStore], level: int) -> None:
    env, store = controlled
    topic = stored_topic(env)
    pub = env.raw_connected(level)
    store.failing = "disk full"
    pub.send(Publish(topic, b"m", qos=1, packet_id=9))
    got = pub.until_closed()
    assert not [p for p in got if isinstance(p, Puback)], got
    if level == 5:
        assert len(got) == 1 and isinstance(got[0], Disconnect), got
        assert got[0].reason_code == ReasonCode.UNSPECIFIED_ERROR
        assert (got[0].properties.reason_string or "").startswith(NOT_STORED), got[0]
        assert "disk full" in (got[0].properties.reason_string or "")
    else:
        assert got == []
    assert any(NOT_STORED in m or "store sync failed" in m for m in env.errors.messages())
    env.errors.records.clear()  # the failure is expected here
    store.failing = None
    env.assert_healthy()


# ---------------------------------------------------------------- the service's tables


def test_live_sessions_are_registered_by_client_id_and_leave_with_the_connection(
        env: MqttEnv) -> None:
    service = env.runtime.mqtt
    raw = env.raw_connected(5, "live-1")
    assert service.sessions["live-1"] is raw.session
    raw.disconnect()
    raw.until_closed()
    assert "live-1" not in service.sessions
    env.broker.wait_for(lambda: "live-1" not in service.teardowns, what="the teardown")


def test_a_persistent_session_keeps_its_state_and_a_clean_one_drops_it(env: MqttEnv) -> None:
    service = env.runtime.mqtt
    raw = env.raw(5)
    raw.connect("kept-1", clean=False, properties=Properties(session_expiry_interval=300))
    raw.subscribe("kept/t", qos=1)
    raw.disconnect()
    raw.until_closed()
    state = service.states["kept-1"]
    assert list(state.subscriptions) == ["kept/t"]
    handle = state.expiry_handle
    assert handle is not None  # the expiry timer runs while it is away
    again = env.raw(5)
    assert again.connect("kept-1", clean=False).session_present
    assert handle.cancelled()  # ... and stops when it comes back
    again.disconnect()  # expiry 0 now: the session ends with this connection
    again.until_closed()
    assert "kept-1" not in service.states
    env.broker.wait_for(lambda: env.durables("kept-1") == [], what="the durables to go")


def test_a_delayed_will_waits_and_a_reconnect_cancels_it(env: MqttEnv) -> None:
    service = env.runtime.mqtt
    raw = env.raw(5)
    raw.connect("will-1", clean=False, properties=Properties(session_expiry_interval=60),
                will=Will("will/t", b"w", qos=1,
                          properties=Properties(will_delay_interval=30)))
    raw.abort()
    env.broker.wait_for(lambda: "will-1" in service._wills, what="the will to be scheduled")
    handle = service._wills["will-1"]
    back = env.raw(5)
    assert back.connect("will-1", clean=False).session_present
    assert "will-1" not in service._wills and handle.cancelled()


def test_a_will_without_delay_is_published_at_once(env: MqttEnv) -> None:
    watcher = env.raw_connected(4)
    watcher.subscribe("now/t", qos=1)
    service = env.runtime.mqtt
    message = Message(message_id="ID:will-now", destination=dst.topic("now.t"), body=b"gone")

    async def schedule() -> None:
        service.schedule_will("w-now", message, 0)
    env.broker.loop.run_until_complete(schedule())
    assert "w-now" not in service._wills
    assert watcher.expect(Publish).payload == b"gone"


def test_wills_still_waiting_at_shutdown_are_not_published(env: MqttEnv) -> None:
    service = env.runtime.mqtt
    raw = env.raw(5)
    raw.connect("w-stop", clean=False, properties=Properties(session_expiry_interval=60),
                will=Will("stop/t", b"w", qos=1, properties=Properties(will_delay_interval=30)))
    raw.abort()
    env.broker.wait_for(lambda: "w-stop" in service._wills, what="the will to be scheduled")
    handle = service._wills["w-stop"]
    service.stop()
    assert service._wills == {} and handle.cancelled()
