"""Refused logins held back per client address, through a broker driven in memory: past
``login_backoff_after`` failures from one address each refusal waits (0.5 s, then twice
as long), while other clients, from that address too, are answered at once; STOMP and
MQTT share the count. Every memory connection comes from 127.0.0.1, as loopback clients
of a real listener do."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import MemoryBroker, memory_broker, memory_config

from meshmq.config.model import AuthConfig, User
from meshmq.protocol.mqtt import Properties, ReasonCode


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    with memory_broker(memory_config(auth=AuthConfig(
            users=(User("good", "pw"),), login_backoff_after=1,
            login_backoff_max_ms=4000))) as b:
        yield b


def test_refusals_are_held_back_while_others_connect(broker: MemoryBroker) -> None:
    bad = {"accept-version": "1.2", "host": "/", "login": "good", "passcode": "bad"}
    # Within the allowance: answered at once, within a few loop turns (no timer).
    first = broker.stomp()
    first.send("CONNECT", bad)
    broker.turn(10)
    assert [f.command for f in first.received()] == ["ERROR"]

    # The second refusal waits 0.5 s on a timer: the loop goes on meanwhile, and
    # another client gets in.
    held = broker.stomp()
    t0 = time.monotonic()
    held.send("CONNECT", bad)
    broker.turn(10)
    assert held.received() == []
    assert broker.stomp().connect(login="good", passcode="pw").command == "CONNECTED"
    assert held.expect("ERROR").get("message")
    assert time.monotonic() - t0 >= 0.45

    # MQTT 5 too (the same address): the third refusal waits 1 s, then CONNACK 0x87.
    mqtt = broker.mqtt(5)
    t0 = time.monotonic()
    ack = mqtt.connect("x", username="good", password=b"bad", properties=Properties())
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert time.monotonic() - t0 >= 0.95
    stats = broker.runtime.broker.statistics()
    assert (stats["failed_logins"], stats["login_slowed_addresses"]) == (3, 1)
