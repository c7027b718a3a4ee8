"""QoS 2 exactly-once at the edges of a connection, with the store's syncs held back
by the test (a gated store), so that what the broker writes before and after a sync is
observable without timing.

* Inbound: PUBREL taken, PUBCOMP still waiting for the sync, connection lost. A client
  that then resends the PUBLISH (paho-mqtt does after two reconnect attempts) must not
  make the broker take it for a new message.
* Outbound: the broker sends PUBREL (which lets the receiver hand the message to its
  application) only once the acknowledgement it implies is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from tests.support.memory_mqtt import MemoryMqtt, MqttEnv, mqtt_env, uid

from meshmq.protocol.mqtt import (
    Pingresp,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from meshmq.store.memory import MemoryStore


class GatedStore(MemoryStore):
    """A memory store whose sync() waits while the test holds the gate closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_open = True
        self.syncs_waiting = 0

    async def sync(self) -> None:
        if not self.gate_open:
            self.syncs_waiting += 1
            while not self.gate_open:
                await asyncio.sleep(0.001)
        await super().sync()


@pytest.fixture
def gated() -> Iterator[tuple[MqttEnv, GatedStore]]:
    store = GatedStore()
    try:
        with mqtt_env(store=store) as env:
            yield env, store
    finally:
        store.gate_open = True


def _wait_gone(env: MqttEnv, client_id: str) -> None:
    """The broker has seen the connection end (before the test lets the sync finish)."""
    sessions = env.runtime.mqtt.sessions
    env.broker.wait_for(lambda: client_id not in sessions, what="the connection to end")


def _session(env: MqttEnv, client_id: str) -> MemoryMqtt:
    raw = env.raw(5)
    raw.connect(client_id, clean=False, properties=Properties(session_expiry_interval=300))
    return raw


def test_publish_resent_after_pubrel_is_not_a_new_message(
        gated: tuple[MqttEnv, GatedStore]) -> None:
    env, store = gated
    topic = f"eo/{uid('in')}"
    sub = env.raw(5)
    sub.connect(uid("sub"))
    sub.subscribe((topic, 1))
    pub_id = uid("pub")
    pub = _session(env, pub_id)
    pub.send(Publish(topic=topic, payload=b"once", qos=2, packet_id=7))
    assert pub.expect(Pubrec).packet_id == 7
    store.gate_open = False
    waiting = store.syncs_waiting
    pub.send(Pubrel(7))
    env.broker.wait_for(lambda: store.syncs_waiting > waiting,
                        what="the PUBREL to wait for its sync")
    pub.abort()  # PUBCOMP never reached the client
    _wait_gone(env, pub_id)
    assert not [p for p in pub.pending if isinstance(p, Pubcomp)]
    store.gate_open = True
    again = env.raw(5)
    ack = again.connect(pub_id, clean=False,
                        properties=Properties(session_expiry_interval=300))
    assert ack.session_present
    # The client resends the PUBLISH it still holds, instead of PUBREL.
    again.send(Publish(topic=topic, payload=b"once", qos=2, packet_id=7))
    assert again.expect(Pubrec).packet_id == 7
    again.send(Pubrel(7))
    comp = again.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (7, ReasonCode.SUCCESS)
    # The same id for a different message later is a new message.
    again.send(Publish(topic=topic, payload=b"next", qos=2, packet_id=7))
    assert again.expect(Pubrec).packet_id == 7
    again.send(Pubrel(7))
    again.expect(Pubcomp)
    got = [p.payload for p in sub.publishes(2)]
    assert got == [b"once", b"next"]
    assert [p for p in sub.ping() if isinstance(p, Publish)] == []  # no second "once"


def test_pubrel_resent_after_a_lost_pubcomp_completes(
        gated: tuple[MqttEnv, GatedStore]) -> None:
    env, store = gated
    pub_id = uid("pub")
    pub = _session(env, pub_id)
    pub.send(Publish(topic=f"eo/{uid('rel')}", payload=b"x", qos=2, packet_id=9))
    pub.expect(Pubrec)
    store.gate_open = False
    waiting = store.syncs_waiting
    pub.send(Pubrel(9))
    env.broker.wait_for(lambda: store.syncs_waiting > waiting,
                        what="the PUBREL to wait for its sync")
    pub.abort()
    _wait_gone(env, pub_id)
    store.gate_open = True
    again = _session(env, pub_id)
    again.send(Pubrel(9))
    comp = again.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (9, ReasonCode.SUCCESS)


def test_pubrel_is_sent_only_once_the_ack_is_durable(
        gated: tuple[MqttEnv, GatedStore]) -> None:
    env, store = gated
    topic = f"eo/{uid('out')}"
    sub = _session(env, uid("sub"))
    sub.subscribe((topic, 2))
    pub = env.raw(5)
    pub.connect(uid("pub"))
    pub.publish(topic, b"one", qos=2)
    delivered = sub.expect(Publish)
    store.gate_open = False
    sub.send(Pubrec(delivered.packet_id or 0))
    # PINGRESP is written at once; PUBREL must not be there before it (the ack that
    # lets the receiver deliver is not durable yet).
    before = sub.ping()
    assert not [p for p in before if isinstance(p, Pubrel)], before
    store.gate_open = True
    rel = sub.expect(Pubrel)
    assert rel.packet_id == delivered.packet_id
    assert not isinstance(rel, Pingresp)
