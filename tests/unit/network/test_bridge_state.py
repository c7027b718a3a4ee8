"""The bridge machine, socket-free: event sequences in, actions out; its reconnect
schedule (-1 for ever, 0 no reconnect, N passes); and, for any event sequence, a bridge
that is not stopped or out of attempts always has a way back to CONNECTING."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.bridge_machine import HELLO, A, B, frame, machine, of, retry_delays, states

from meshmq.network.bridge_state import (
    HANDSHAKE_TIMER,
    RETRY_TIMER,
    Action,
    BridgeEvent,
    BridgeMachine,
    BridgeState,
    CancelTimer,
    Changed,
    CloseLink,
    Connect,
    GiveUp,
    InvalidTransitionError,
    Send,
    StartHalves,
    StartTimer,
    Teardown,
    transition,
)
from meshmq.network.endpoint import BYE_CAUSE
from meshmq.protocol.wire import FEATURES, WIRE_VERSION, FrameType, WireFrame

S = BridgeState


def welcome(remote: str = "remote") -> WireFrame:
    return frame(FrameType.WELCOME, {"version": WIRE_VERSION, "broker": remote,
                                     "features": list(FEATURES), "client_uris": []})


def up(m: BridgeMachine, now: float = 0.0) -> list[Action]:
    """Dial succeeds, WELCOME, first interest sync: FORWARDING."""
    out = m.transport_up(now)
    out += m.handshake_frame(welcome(), now)
    out += m.synced(now)
    return out


def test_happy_path_dials_sends_hello_starts_halves_and_forwards() -> None:
    m = machine()
    out = m.start(0.0)
    assert of(out, Connect) == [Connect(A)] and m.state is S.CONNECTING
    out = m.transport_up(1.0)
    assert states(out) == [S.HANDSHAKING]
    assert of(out, Send) == [Send(HELLO)]
    assert of(out, StartTimer) == [StartTimer(HANDSHAKE_TIMER, m.handshake_timeout_s)]
    out = m.handshake_frame(welcome("hub"), 2.0)
    assert CancelTimer(HANDSHAKE_TIMER) in out
    (halves,) = of(out, StartHalves)
    assert isinstance(halves, StartHalves) and halves.remote == "hub"
    assert halves.again and halves.refusals
    assert states(out) == [S.SYNCING] and m.remote == "hub"
    assert states(m.synced(3.0)) == [S.FORWARDING]
    assert (m.attempts, m.connects, m.connected_to) == (1, 1, A)
    assert m.synced(4.0) == []  # a later sync changes nothing


def test_static_bridge_forwards_without_waiting_for_interest() -> None:
    m = machine(static_bridge=True)
    m.start(0.0)
    m.transport_up(0.0)
    assert states(m.handshake_frame(welcome(), 0.0)) == [S.SYNCING, S.FORWARDING]


def test_refused_dial_tries_the_next_target_at_once_then_backs_off() -> None:
    m = machine(A, B)
    m.start(0.0)
    out = m.connect_failed("connection-refused", "a: refused", 0.0)
    assert of(out, Connect) == [Connect(B)] and states(out) == []
    out = m.connect_failed("connection-refused", "b: refused", 0.0)
    assert states(out) == [S.BACKING_OFF] and of(out, Connect) == []
    assert m.last_error is not None and m.last_error["kind"] == "connection-refused"
    (delay,) = retry_delays(out)
    assert 0.9 <= delay <= 1.1  # initial delay, +/- 10% jitter
    out = m.timer_fired(RETRY_TIMER, 1.0)
    assert states(out) == [S.CONNECTING] and of(out, Connect) == [Connect(A)]
    assert m.attempts == 2


def test_slave_refusal_moves_on_but_bad_credentials_end_the_pass() -> None:
    m = machine(A, B)
    m.start(0.0)
    m.transport_up(0.0)
    out = m.handshake_frame(frame(FrameType.REFUSE, {"code": "remote-is-slave",
                                                     "message": "not master"}), 0.0)
    assert states(out) == [S.CONNECTING] and of(out, Connect) == [Connect(B)]
    assert CloseLink("tcp://a:61616: not master") in out
    m.transport_up(0.0)
    out = m.handshake_frame(frame(FrameType.REFUSE, {"code": "authentication-failed",
                                                     "message": "no"}), 0.0)
    assert states(out) == [S.BACKING_OFF] and len(retry_delays(out)) == 1
    m.timer_fired(RETRY_TIMER, 1.0)
    m.transport_up(1.0)
    out = m.handshake_frame(frame(FrameType.REFUSE, {"code": "authentication-failed",
                                                     "message": "no"}), 1.0)
    # One answering broker refusing the credentials ends the pass: B is not tried.
    assert of(out, Connect) == [] and states(out) == [S.BACKING_OFF]


def test_handshake_timeout_and_unexpected_frames_fail_the_handshake() -> None:
    m = machine()
    m.start(0.0)
    m.transport_up(0.0)
    out = m.timer_fired(HANDSHAKE_TIMER, 30.0)
    assert states(out) == [S.BACKING_OFF]
    assert m.last_error is not None and m.last_error["kind"] == "handshake-timeout"
    assert m.timer_fired(HANDSHAKE_TIMER, 31.0) == []  # late: ignored
    m.timer_fired(RETRY_TIMER, 31.0)
    m.transport_up(31.0)
    m.handshake_frame(frame(FrameType.INTEREST, {"op": "sync", "items": []}), 32.0)
    assert m.last_error is not None and m.last_error["kind"] == "protocol-error"
    m.timer_fired(RETRY_TIMER, 40.0)
    m.transport_up(40.0)
    m.handshake_frame(frame(FrameType.WELCOME, {"version": WIRE_VERSION + 1}), 41.0)
    assert m.last_error is not None and m.last_error["kind"] == "version-mismatch"


def test_lost_link_tears_down_records_why_and_retries_after_the_initial_delay() -> None:
    m = machine()
    m.start(0.0)
    up(m, 0.0)
    out = m.link_lost(f"{BYE_CAUSE} (maintenance)", 100.0)
    assert out[0] == Teardown() and states(out) == [S.BACKING_OFF]
    assert m.link_ended is not None and m.link_ended["kind"] == "remote-shutdown"
    assert 0.9 <= retry_delays(out)[0] <= 1.1
    assert m.link_lost("again", 101.0) == []  # not linked any more


def test_stop_from_forwarding_says_bye_and_tears_down() -> None:
    m = machine()
    m.start(0.0)
    up(m)
    out = m.stop(5.0)
    assert CloseLink("bridge stopped", bye=True) in out and Teardown() in out
    assert m.state is S.STOPPED
    assert m.timer_fired(RETRY_TIMER, 6.0) == [] and m.connect_failed("x", "y", 6.0) == []


def _fail_passes(m: BridgeMachine, now: float, limit: int = 50) -> tuple[list[float], bool]:
    """Fail every dial; returns the retry delays seen and whether the bridge gave up."""
    seen: list[float] = []
    for _ in range(limit):
        out = m.connect_failed("connection-refused", "refused", now)
        seen += retry_delays(out)
        if of(out, GiveUp):
            return seen, True
        if m.state is S.BACKING_OFF:
            m.timer_fired(RETRY_TIMER, now)
    return seen, False


def test_minus_one_retries_for_ever_with_exponential_delays_capped() -> None:
    m = machine(max_reconnect_attempts=-1, max_reconnect_delay_ms=8000)
    m.start(0.0)
    seen, gave_up = _fail_passes(m, 0.0, limit=8)
    assert not gave_up
    nominal = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(n * 0.9 - 1e-9 <= d <= n * 1.1 + 1e-9 for n, d in zip(nominal, seen,
                                                                      strict=True))


def test_n_attempts_give_up_after_n_failed_passes() -> None:
    m = machine(A, B, max_reconnect_attempts=3)
    m.start(0.0)
    seen, gave_up = _fail_passes(m, 0.0)
    assert gave_up and len(seen) == 2 and m.state is S.STOPPED
    assert m.attempts == 6  # 3 passes of 2 targets


def test_zero_is_one_pass_at_startup_and_no_reconnect_after_a_loss() -> None:
    m = machine(max_reconnect_attempts=0)
    m.start(0.0)
    seen, gave_up = _fail_passes(m, 0.0)
    assert gave_up and seen == []
    m = machine(max_reconnect_attempts=0)
    m.start(0.0)
    up(m)
    out = m.link_lost("connection closed by the peer", 10.0)
    assert of(out, GiveUp) and m.state is S.STOPPED and of(out, Connect) == []


def test_a_long_lived_link_resets_the_backoff_and_a_short_one_does_not() -> None:
    m = machine(min_connect_time_ms=5000, use_exponential_backoff=True)
    m.start(0.0)
    for _ in range(3):  # grow the delay: 1, 2, 4
        m.connect_failed("connection-refused", "x", 0.0)
        m.timer_fired(RETRY_TIMER, 0.0)
    up(m, 10.0)
    short = retry_delays(m.link_lost("gone", 11.0))[0]
    assert short >= 8 * 0.9
    m.timer_fired(RETRY_TIMER, 20.0)
    up(m, 20.0)
    long = retry_delays(m.link_lost("gone", 100.0))[0]
    assert long <= 1.1


def test_self_targets_are_skipped_without_counting_an_attempt() -> None:
    m = machine(A, B)
    m.start(0.0)
    out = m.connect_failed("self", "a is this broker", 0.0)
    assert of(out, Connect) == [Connect(B)] and m.attempts == 0


EVENTS = ["connect_failed", "transport_up", "welcome", "refuse", "junk", "lost_hs",
          "synced", "link_lost", "retry_timer", "handshake_timer", "stop", "start"]


def _fire(m: BridgeMachine, event: str, now: float) -> list[Action]:
    match event:
        case "connect_failed":
            return m.connect_failed("connection-refused", "refused", now)
        case "transport_up":
            return m.transport_up(now)
        case "welcome":
            return m.handshake_frame(welcome(), now)
        case "refuse":
            return m.handshake_frame(frame(FrameType.REFUSE, {"code": "remote-is-slave"}),
                                     now)
        case "junk":
            return m.handshake_frame(frame(FrameType.ACKS, {}), now)
        case "lost_hs":
            return m.handshake_failed("connection-lost", "gone", now)
        case "synced":
            return m.synced(now)
        case "link_lost":
            return m.link_lost("connection closed by the peer", now)
        case "retry_timer":
            return m.timer_fired(RETRY_TIMER, now)
        case "handshake_timer":
            return m.timer_fired(HANDSHAKE_TIMER, now)
        case "stop":
            return m.stop(now)
        case _:
            return m.start(now)


@given(st.lists(st.sampled_from(EVENTS), max_size=80), st.sampled_from([-1, 0, 1, 3]))
def test_any_event_sequence_keeps_the_machine_consistent(events: list[str],
                                                         attempts: int) -> None:
    m = machine(A, B, max_reconnect_attempts=attempts)
    pending_retry = False
    for i, event in enumerate(events):
        before = m.state
        out = _fire(m, event, float(i))
        # Every reported transition is a valid one, in a chain from the old state.
        state = before
        for change in out:
            if isinstance(change, Changed):
                assert change.old is state
                assert transition(change.old, change.event) is change.new
                state = change.new
        assert state is m.state
        if m.state is S.BACKING_OFF and any(isinstance(a, StartTimer) and
                                            a.name == RETRY_TIMER for a in out):
            pending_retry = True
        if m.state is not S.BACKING_OFF:
            pending_retry = False
        # Never silently dead: backing off always has a retry timer running; stopped
        # only by a stop, or by giving up (a GiveUp action says so).
        if before is not S.STOPPED and m.state is S.STOPPED:
            assert event == "stop" or of(out, GiveUp)
        if m.state is S.BACKING_OFF:
            assert pending_retry
            retry = m.timer_fired(RETRY_TIMER, float(i))
            assert states(retry)[-1] is S.CONNECTING
            assert of(retry, Connect)  # the retry timer always dials
            pending_retry = False
        elif m.state is S.CONNECTING and before is not S.CONNECTING:
            assert of(out, Connect)


def test_transition_table_rejects_nonsense() -> None:
    with pytest.raises(InvalidTransitionError):
        transition(S.FORWARDING, BridgeEvent.WELCOMED)
    for state in S:
        assert transition(state, BridgeEvent.STOP) is S.STOPPED
