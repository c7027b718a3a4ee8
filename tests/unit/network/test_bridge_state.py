"""The bridge state machine never leaves a bridge dead, whatever happens."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.network.bridge_state import (
    BridgeEvent,
    BridgeState,
    InvalidTransitionError,
    ReconnectPolicy,
    transition,
)

FAILING = (BridgeState.CONNECTING, BridgeState.HANDSHAKING, BridgeState.SYNCING,
           BridgeState.FORWARDING)


@given(st.lists(st.sampled_from([e for e in BridgeEvent if e not in
                                 (BridgeEvent.STOP, BridgeEvent.GIVE_UP)]), max_size=60))
def test_without_stop_or_give_up_a_bridge_is_never_stopped(events: list[BridgeEvent]) -> None:
    state = transition(BridgeState.STOPPED, BridgeEvent.START)
    for event in events:
        try:
            state = transition(state, event)
        except InvalidTransitionError:
            continue  # the driver never sends those; they change nothing
        assert state is not BridgeState.STOPPED


@pytest.mark.parametrize("state", FAILING)
def test_every_failure_backs_off_and_every_backoff_retries(state: BridgeState) -> None:
    backing = transition(state, BridgeEvent.FAILED)
    assert backing is BridgeState.BACKING_OFF
    assert transition(backing, BridgeEvent.RETRY) is BridgeState.CONNECTING


def test_happy_path_and_stop_from_anywhere() -> None:
    s = BridgeState.STOPPED
    for event, expected in [(BridgeEvent.START, BridgeState.CONNECTING),
                            (BridgeEvent.CONNECTED, BridgeState.HANDSHAKING),
                            (BridgeEvent.WELCOMED, BridgeState.SYNCING),
                            (BridgeEvent.SYNCED, BridgeState.FORWARDING)]:
        s = transition(s, event)
        assert s is expected
    for state in BridgeState:
        assert transition(state, BridgeEvent.STOP) is BridgeState.STOPPED
    with pytest.raises(InvalidTransitionError):
        transition(BridgeState.FORWARDING, BridgeEvent.WELCOMED)


def test_backoff_doubles_to_the_cap_and_resets_after_a_long_link() -> None:
    p = ReconnectPolicy(initial_delay_s=1, max_delay_s=30, multiplier=2, jitter=0)
    assert [p.next_delay() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    p.connected_for(1.0)  # shorter than min_connect_time: still failing
    assert p.next_delay() == 30
    p.connected_for(10.0)
    assert p.next_delay() == 1


def test_backoff_without_exponential_and_max_attempts() -> None:
    p = ReconnectPolicy(initial_delay_s=0.5, exponential=False, max_attempts=3, jitter=0)
    assert [p.next_delay(), p.next_delay(), p.next_delay()] == [0.5, 0.5, None]


@given(st.floats(0.01, 5), st.floats(0, 0.5), st.integers(1, 20))
def test_jitter_stays_within_bounds(initial: float, jitter: float, failures: int) -> None:
    p = ReconnectPolicy(initial_delay_s=initial, max_delay_s=60, jitter=jitter)
    rng = random.Random(failures)
    for _ in range(failures):
        delay = p.next_delay(rng)
        assert delay is not None
        base = min(60, initial * 2 ** (p.failures - 1))
        assert base * (1 - jitter) - 1e-9 <= delay <= base * (1 + jitter) + 1e-9
