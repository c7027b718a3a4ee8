"""Refused logins are held back per client address (its host; the port does not
matter), through a broker driven in memory with clients connecting from chosen
addresses: once one address has failed past ``login_backoff_after``, its refusals wait,
while another address's logins, good and bad, are answered at once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import MemoryBroker, StompClient, memory_broker, memory_config

from meshmq.config.model import AuthConfig, User

GUESSER = "10.0.0.9"
OTHER = "10.0.0.10"
AT_ONCE_S = 0.45  # a refusal held back waits 0.5 s at least


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    with memory_broker(memory_config(auth=AuthConfig(
            users=(User("good", "pw"),), login_backoff_after=2,
            login_backoff_max_ms=4000))) as b:
        yield b


def connect_now(broker: MemoryBroker, client: StompClient, passcode: str) -> str:
    """CONNECT as ``good``; the answer's command, which must come at once: within a
    few loop turns, with no timer (a refusal held back waits on one)."""
    client.send("CONNECT", {"accept-version": "1.2", "host": "/", "login": "good",
                            "passcode": passcode})
    broker.turn(10)
    answers = client.received()
    assert answers, f"{passcode!r} was held back"
    return answers[0].command


def test_another_address_is_answered_at_once(broker: MemoryBroker) -> None:
    # Within the allowance the guesser's refusals come at once (each from a new port).
    for port in (5000, 5001):
        assert connect_now(broker, broker.stomp(peer=(GUESSER, port)), "bad") == "ERROR"

    # Its third refusal waits, from yet another port: the count is the host's.
    held = broker.stomp(peer=(GUESSER, 5002))
    t0 = time.monotonic()
    held.send("CONNECT", {"accept-version": "1.2", "host": "/", "login": "good",
                          "passcode": "bad"})

    # Meanwhile another address fails twice and gets in, every answer at once: the
    # guesser's failures are not counted against it.
    assert connect_now(broker, broker.stomp(peer=(OTHER, 6000)), "bad") == "ERROR"
    assert connect_now(broker, broker.stomp(peer=(OTHER, 6001)), "bad") == "ERROR"
    assert connect_now(broker, broker.stomp(peer=(OTHER, 6002)), "pw") == "CONNECTED"
    assert held.received() == []  # still held back after all of those were answered

    assert held.expect("ERROR").get("message")
    assert time.monotonic() - t0 >= AT_ONCE_S
    stats = broker.runtime.broker.statistics()
    # Both addresses reached the allowance: the next refusal of each will wait.
    assert (stats["failed_logins"], stats["login_slowed_addresses"]) == (5, 2)
