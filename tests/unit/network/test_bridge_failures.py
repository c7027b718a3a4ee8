"""Why a bridge failed, and what it does next: each failure kind the bridge machine
records (moving on to the next broker of a list at once, or ending the pass and backing
off), the handshake's answer (features, client URIs), late events, stop and start, the
reconnect policy a connector maps to, and a stateful model of its timers and counters."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.support.bridge_machine import A, B, frame, machine, of, retry_delays, states

from meshmq.backoff import ReconnectPolicy
from meshmq.config.model import NetworkConnectorConfig
from meshmq.connector_uri import parse_endpoint
from meshmq.errors import RemoteProtocolError
from meshmq.network.bridge_state import (
    BRIDGE_JITTER,
    HANDSHAKE_TIMER,
    RETRY_TIMER,
    TRANSITIONS,
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
    StartHalves,
    StartTimer,
    Teardown,
    reconnect_policy,
    transition,
)
from meshmq.network.endpoint import BYE_CAUSE
from meshmq.protocol.wire import (
    FEATURE_ACK_RANGES,
    FEATURE_MESSAGES_AGAIN,
    FEATURE_REFUSALS,
    WIRE_VERSION,
    FrameType,
    WireFrame,
)

S = BridgeState


def welcome(**extra: object) -> WireFrame:
    return frame(FrameType.WELCOME, {"version": WIRE_VERSION, "broker": "remote", **extra})


def handshaking(m: BridgeMachine, now: float = 0.0) -> None:
    if m.state is S.STOPPED:
        m.start(now)
    m.transport_up(now)
    assert m.state is S.HANDSHAKING


def forwarding(m: BridgeMachine, now: float = 0.0) -> None:
    handshaking(m, now)
    m.handshake_frame(welcome(), now)
    m.synced(now)
    assert m.state is S.FORWARDING


def fail_pass(m: BridgeMachine, now: float) -> list[Action]:
    """Every target of the list refuses the connection; the actions of the last."""
    out: list[Action] = []
    while m.state is S.CONNECTING:
        out = m.connect_failed("connection-refused", "refused", now)
    return out


# ---------------------------------------------------------------- failure kinds
@pytest.mark.parametrize("kind", ["remote-is-slave", "connection-lost"])
def test_a_handshake_failure_of_this_broker_only_moves_on_to_the_next_at_once(
        kind: str) -> None:
    m = machine(A, B)
    handshaking(m)
    out = m.handshake_failed(kind, f"a: {kind}", 0.0)
    assert of(out, Connect) == [Connect(B)] and retry_delays(out) == []
    assert states(out) == [S.CONNECTING]
    assert m.last_error is None  # the bridge has not failed: the pass goes on


@pytest.mark.parametrize("kind", [
    "authentication-failed", "loop", "version-mismatch", "handshake-timeout",
    "protocol-error", "internal-error", "tls-refused"])
def test_a_handshake_failure_that_holds_for_the_whole_list_ends_the_pass(kind: str) -> None:
    m = machine(A, B)
    handshaking(m)
    out = m.handshake_failed(kind, f"a: {kind}", 0.0)
    assert of(out, Connect) == [] and states(out) == [S.BACKING_OFF]
    assert len(retry_delays(out)) == 1
    assert CloseLink(f"a: {kind}") in out
    assert m.last_error is not None and m.last_error["kind"] == kind
    # The retry starts a new pass from the top of the list.
    assert of(m.timer_fired(RETRY_TIMER, 1.0), Connect) == [Connect(A)]


@pytest.mark.parametrize("kind", ["connection-refused", "connect-timeout", "unreachable",
                                  "tls-failed", "tls-verify-failed", "tls-config"])
def test_a_failed_dial_tries_the_rest_of_the_list_before_backing_off(kind: str) -> None:
    m = machine(A, B)
    m.start(0.0)
    out = m.connect_failed(kind, f"a: {kind}", 0.0)
    assert of(out, Connect) == [Connect(B)] and m.state is S.CONNECTING
    out = m.connect_failed(kind, f"b: {kind}", 0.0)
    assert states(out) == [S.BACKING_OFF]
    assert m.last_error == {"kind": kind, "message": f"b: {kind}", "at": 0.0}


@pytest.mark.parametrize(("code", "kind"), [
    ("authentication-failed", "authentication-failed"), ("loop", "loop"),
    ("version-mismatch", "version-mismatch"), (None, "refused")])
def test_a_refusal_records_the_remotes_code_and_message_with_the_target(
        code: str | None, kind: str) -> None:
    m = machine()
    handshaking(m)
    body: dict[str, object] = {"message": "because"}
    if code is not None:
        body["code"] = code
    m.handshake_frame(frame(FrameType.REFUSE, body), 5.0)
    assert m.last_error == {"kind": kind, "message": "tcp://a:61616: because", "at": 5.0}
    assert m.state is S.BACKING_OFF


def test_the_handshake_timeout_names_the_target_and_the_configured_bound() -> None:
    m = machine(handshake_timeout_ms=2500)
    handshaking(m)
    assert of(m.transport_up(0.0), StartTimer) == []  # no second dial, no second timer
    m.timer_fired(HANDSHAKE_TIMER, 2.5)
    assert m.last_error is not None
    assert m.last_error["message"] == "tcp://a:61616: no handshake within 2.5s"


def test_a_welcome_with_a_malformed_client_list_is_a_protocol_error_for_the_driver() -> None:
    m = machine()
    handshaking(m)
    with pytest.raises(RemoteProtocolError, match="client_uris must be a list of strings"):
        m.handshake_frame(welcome(client_uris="stomp://x:1"), 0.0)
    assert m.state is S.HANDSHAKING and m.remote is None  # the driver closes the link


def test_a_welcome_without_a_version_is_a_version_mismatch() -> None:
    m = machine()
    handshaking(m)
    m.handshake_frame(frame(FrameType.WELCOME, {"broker": "remote"}), 0.0)
    assert m.last_error is not None and m.last_error["kind"] == "version-mismatch"
    assert m.last_error["message"] == "remote speaks wire version None"


# ---------------------------------------------------------------- the handshake's answer
@pytest.mark.parametrize(("features", "again", "refusals", "ranges"), [
    (None, False, False, False), ([], False, False, False),
    ([FEATURE_MESSAGES_AGAIN], True, False, False), ([FEATURE_REFUSALS], False, True, False),
    ([FEATURE_ACK_RANGES], False, False, True),
    ([FEATURE_MESSAGES_AGAIN, FEATURE_REFUSALS, FEATURE_ACK_RANGES, "from-the-future"],
     True, True, True)])
def test_the_halves_use_only_the_features_the_remote_offered(
        features: list[str] | None, again: bool, refusals: bool, ranges: bool) -> None:
    m = machine()
    handshaking(m)
    extra = {} if features is None else {"features": features}
    (halves,) = of(m.handshake_frame(welcome(**extra), 0.0), StartHalves)
    assert isinstance(halves, StartHalves)
    assert (halves.again, halves.refusals, halves.ranges) == (again, refusals, ranges)


def test_the_remotes_client_uris_and_management_url_reach_the_halves() -> None:
    m = machine()
    handshaking(m)
    (halves,) = of(m.handshake_frame(welcome(client_uris=["stomp://b:61613"],
                                             management_url="http://b:8161"), 0.0),
                   StartHalves)
    assert isinstance(halves, StartHalves)
    assert halves.client_uris == ("stomp://b:61613",)
    assert halves.management_url == "http://b:8161"


# ---------------------------------------------------------------- links that end
def test_a_lost_link_to_a_pair_tries_the_other_broker_first() -> None:
    m = machine(A, B)
    forwarding(m)
    m.link_lost("connection closed by the peer", 10.0)
    assert of(m.timer_fired(RETRY_TIMER, 11.0), Connect) == [Connect(B)]
    out = m.connect_failed("connection-refused", "b down", 11.0)
    assert of(out, Connect) == [Connect(A)]  # the lost one comes last, in the same pass


def test_a_clean_remote_shutdown_stays_the_reason_the_link_ended_while_retries_fail() -> None:
    m = machine()
    forwarding(m)
    m.link_lost(f"{BYE_CAUSE} (broker stopping)", 10.0)
    m.timer_fired(RETRY_TIMER, 11.0)
    m.connect_failed("connection-refused", "tcp://a:61616: connection refused", 11.0)
    assert m.last_error is not None and m.last_error["kind"] == "connection-refused"
    assert m.link_ended == {"kind": "remote-shutdown",
                            "message": f"tcp://a:61616: {BYE_CAUSE} (broker stopping)",
                            "at": 10.0}


def test_a_link_lost_before_the_first_interest_sync_counts_no_connect() -> None:
    m = machine()
    handshaking(m)
    m.handshake_frame(welcome(), 0.0)
    assert m.state is S.SYNCING
    out = m.link_lost("connection reset by peer", 1.0)
    assert out[0] == Teardown() and states(out) == [S.BACKING_OFF]
    assert m.connects == 0 and m.link_ended is not None
    assert m.link_ended["kind"] == "link-lost"


def test_a_remote_refusal_after_the_handshake_is_recorded_until_the_loss_follows() -> None:
    m = machine()
    forwarding(m)
    m.refused("authentication-failed", "credentials changed", 3.0)
    assert m.last_error == {"kind": "authentication-failed",
                            "message": "credentials changed", "at": 3.0}
    assert m.state is S.FORWARDING  # the loss of the link is what moves it on
    m.link_lost("refused by the remote: authentication-failed: credentials changed", 3.0)
    assert m.link_ended is not None and "credentials changed" in m.link_ended["message"]


def test_the_last_error_stays_after_the_bridge_recovers() -> None:
    m = machine()
    m.start(0.0)
    m.connect_failed("connection-refused", "down", 1.0)
    m.timer_fired(RETRY_TIMER, 2.0)
    forwarding(m, 3.0)
    assert m.last_error == {"kind": "connection-refused", "message": "down", "at": 1.0}
    assert (m.attempts, m.connects) == (2, 1)


def test_only_failure_transitions_carry_an_error() -> None:
    m = machine()
    changes = [a for a in m.start(0.0) if isinstance(a, Changed)]
    changes += [a for a in m.connect_failed("connection-refused", "x", 0.0)
                if isinstance(a, Changed)]
    changes += [a for a in m.timer_fired(RETRY_TIMER, 1.0) if isinstance(a, Changed)]
    assert [(c.event, c.error) for c in changes] == [
        (BridgeEvent.START, None), (BridgeEvent.FAILED, ("connection-refused", "x")),
        (BridgeEvent.RETRY, None)]


# ---------------------------------------------------------------- late events
@pytest.mark.parametrize("late", ["transport_up", "handshake", "synced", "connect_failed",
                                  "handshake_timer", "link_lost"])
def test_an_event_that_does_not_apply_while_backing_off_does_nothing(late: str) -> None:
    m = machine()
    m.start(0.0)
    m.connect_failed("connection-refused", "x", 0.0)
    before = (m.state, m.attempts, m.last_error)
    out = {"transport_up": lambda: m.transport_up(1.0),
           "handshake": lambda: m.handshake_frame(welcome(), 1.0),
           "synced": lambda: m.synced(1.0),
           "connect_failed": lambda: m.connect_failed("unreachable", "y", 1.0),
           "handshake_timer": lambda: m.timer_fired(HANDSHAKE_TIMER, 1.0),
           "link_lost": lambda: m.link_lost("gone", 1.0)}[late]()
    assert out == [] and (m.state, m.attempts, m.last_error) == before


def test_a_retry_timer_that_fires_while_connected_is_ignored() -> None:
    m = machine()
    forwarding(m)
    assert m.timer_fired(RETRY_TIMER, 1.0) == [] and m.state is S.FORWARDING


# ---------------------------------------------------------------- stop and start
def test_starting_a_running_bridge_does_nothing() -> None:
    m = machine()
    m.start(0.0)
    assert m.start(1.0) == [] and m.attempts == 0


@pytest.mark.parametrize(("prepare", "says_bye"), [
    ("connecting", False), ("handshaking", True), ("syncing-demand", True),
    ("backing-off", False)])
def test_stop_says_goodbye_only_over_a_link_that_is_up(prepare: str, says_bye: bool) -> None:
    m = machine()
    m.start(0.0)
    if prepare in ("handshaking", "syncing-demand"):
        m.transport_up(0.0)
    if prepare == "syncing-demand":
        m.handshake_frame(welcome(), 0.0)
    if prepare == "backing-off":
        m.connect_failed("connection-refused", "x", 0.0)
    assert m.state.value == prepare
    out = m.stop(1.0)
    assert (CloseLink("bridge stopped", bye=True) in out) is says_bye
    assert {CancelTimer(RETRY_TIMER), CancelTimer(HANDSHAKE_TIMER), Teardown()} <= set(out)
    assert m.state is S.STOPPED


def test_a_bridge_that_gave_up_starts_a_fresh_budget_when_started_again() -> None:
    m = machine(max_reconnect_attempts=1)
    m.start(0.0)
    out = fail_pass(m, 0.0)
    assert of(out, GiveUp) == [GiveUp(1)] and m.state is S.STOPPED
    assert m.last_error is not None and m.last_error["kind"] == "connection-refused"
    out = m.start(10.0)
    assert of(out, Connect) == [Connect(A)] and m.state is S.CONNECTING


def test_a_stopped_bridge_ignores_its_retry_timer() -> None:
    m = machine()
    m.start(0.0)
    m.connect_failed("connection-refused", "x", 0.0)
    m.stop(0.5)
    assert m.timer_fired(RETRY_TIMER, 1.0) == [] and m.state is S.STOPPED


# ---------------------------------------------------------------- reconnect policy
def test_without_exponential_backoff_every_wait_is_the_initial_delay() -> None:
    m = machine(use_exponential_backoff=False, initial_reconnect_delay_ms=2000)
    m.start(0.0)
    waits = []
    for i in range(5):
        waits += retry_delays(fail_pass(m, float(i)))
        m.timer_fired(RETRY_TIMER, float(i))
    assert len(waits) == 5
    assert all(2.0 * (1 - BRIDGE_JITTER) <= w <= 2.0 * (1 + BRIDGE_JITTER) for w in waits)


def test_the_multiplier_grows_the_wait_up_to_the_cap() -> None:
    m = machine(backoff_multiplier=3.0, max_reconnect_delay_ms=20_000)
    m.start(0.0)
    waits = []
    for i in range(5):
        waits += retry_delays(fail_pass(m, float(i)))
        m.timer_fired(RETRY_TIMER, float(i))
    nominal = [1, 3, 9, 20, 20]
    assert all(n * 0.9 - 1e-9 <= w <= n * 1.1 + 1e-9
               for n, w in zip(nominal, waits, strict=True)), waits


def test_a_connector_maps_onto_the_one_reconnect_policy() -> None:
    config = NetworkConnectorConfig(uri="x", initial_reconnect_delay_ms=250,
                                    max_reconnect_delay_ms=4000,
                                    use_exponential_backoff=False, backoff_multiplier=1.5,
                                    max_reconnect_attempts=7, min_connect_time_ms=9000)
    assert reconnect_policy(config) == ReconnectPolicy(
        initial_delay=0.25, max_delay=4.0, exponential=False, multiplier=1.5,
        max_attempts=7, startup_max_attempts=7, randomize=False, jitter=BRIDGE_JITTER,
        reset_after=9.0)


def test_targets_are_tried_in_the_written_order_on_every_pass() -> None:
    c = parse_endpoint("tcp://c:61616")
    m = machine(A, B, c)
    dialled = [a.endpoint for a in m.start(0.0) if isinstance(a, Connect)]
    for _ in range(2):
        for _ in range(3):
            dialled += [a.endpoint for a in m.connect_failed("connection-refused", "x", 0.0)
                        if isinstance(a, Connect)]
        dialled += [a.endpoint for a in m.timer_fired(RETRY_TIMER, 0.0)
                    if isinstance(a, Connect)]
    assert dialled == [A, B, c, A, B, c, A]


# ---------------------------------------------------------------- the transition table
def test_every_state_is_reachable_from_stopped() -> None:
    reached = {S.STOPPED}
    frontier = [S.STOPPED]
    while frontier:
        state = frontier.pop()
        for (old, _), new in TRANSITIONS.items():
            if old is state and new not in reached:
                reached.add(new)
                frontier.append(new)
    assert reached == set(S)


@pytest.mark.parametrize(("state", "event"), [
    (S.STOPPED, BridgeEvent.RETRY), (S.FORWARDING, BridgeEvent.NEXT_TARGET),
    (S.SYNCING, BridgeEvent.CONNECTED), (S.BACKING_OFF, BridgeEvent.FAILED),
    (S.CONNECTING, BridgeEvent.GIVE_UP), (S.STOPPED, BridgeEvent.FAILED)])
def test_events_that_make_no_sense_in_a_state_are_rejected(state: BridgeState,
                                                           event: BridgeEvent) -> None:
    with pytest.raises(InvalidTransitionError, match=f"{event} is not valid in state {state}"):
        transition(state, event)


# ---------------------------------------------------------------- a stateful model
class BridgeTimers(RuleBasedStateMachine):
    """Timers and counters stay consistent whatever the events: the handshake timer
    runs exactly while handshaking, a retry timer exactly while backing off, attempts
    never decrease, and connects counts the transitions into FORWARDING."""

    def __init__(self) -> None:
        super().__init__()
        self.m = machine(A, B, max_reconnect_attempts=-1)
        self.timers: set[str] = set()
        self.now = 0.0
        self.attempts = 0
        self.forwarded_transitions = 0

    def apply(self, out: list[Action]) -> None:
        for action in out:
            if isinstance(action, StartTimer):
                self.timers.add(action.name)
            elif isinstance(action, CancelTimer):
                self.timers.discard(action.name)
            elif isinstance(action, Changed) and action.new is S.FORWARDING:
                self.forwarded_transitions += 1
        self.now += 1.0

    def fire(self, name: str) -> None:
        if name in self.timers:
            self.timers.discard(name)
            self.apply(self.m.timer_fired(name, self.now))

    @rule()
    def start(self) -> None:
        self.apply(self.m.start(self.now))

    @rule(kind=st.sampled_from(["connection-refused", "connect-timeout", "self"]))
    def dial_fails(self, kind: str) -> None:
        self.apply(self.m.connect_failed(kind, "x", self.now))

    @rule()
    def dial_works(self) -> None:
        self.apply(self.m.transport_up(self.now))

    @rule(answer=st.sampled_from(["welcome", "slave", "auth", "junk"]))
    def answer(self, answer: str) -> None:
        f = {"welcome": welcome(),
             "slave": frame(FrameType.REFUSE, {"code": "remote-is-slave"}),
             "auth": frame(FrameType.REFUSE, {"code": "authentication-failed"}),
             "junk": frame(FrameType.ACKS, {})}[answer]
        self.apply(self.m.handshake_frame(f, self.now))

    @rule()
    def synced(self) -> None:
        self.apply(self.m.synced(self.now))

    @rule(cause=st.sampled_from(["connection reset", f"{BYE_CAUSE} (stopping)"]))
    def lost(self, cause: str) -> None:
        self.apply(self.m.link_lost(cause, self.now))

    @precondition(lambda self: RETRY_TIMER in self.timers)
    @rule()
    def retry_timer(self) -> None:
        self.fire(RETRY_TIMER)

    @precondition(lambda self: HANDSHAKE_TIMER in self.timers)
    @rule()
    def handshake_timer(self) -> None:
        self.fire(HANDSHAKE_TIMER)

    @rule()
    def stop(self) -> None:
        self.apply(self.m.stop(self.now))

    @invariant()
    def timers_match_the_state(self) -> None:
        assert (HANDSHAKE_TIMER in self.timers) == (self.m.state is S.HANDSHAKING)
        assert (RETRY_TIMER in self.timers) == (self.m.state is S.BACKING_OFF)

    @invariant()
    def counters_only_grow_and_connects_count_forwarding(self) -> None:
        assert self.m.attempts >= self.attempts
        self.attempts = self.m.attempts
        assert self.m.connects == self.forwarded_transitions
        assert self.m.connects <= self.m.attempts


TestBridgeTimers = BridgeTimers.TestCase
TestBridgeTimers.settings = settings(max_examples=40, stateful_step_count=40)
