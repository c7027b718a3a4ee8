"""What a failover URI's options make of the reconnect schedule the client walks: which
broker is tried next, how long each pass waits, and exactly when the client gives up."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from meshmq.backoff import Attempt, ReconnectSchedule
from meshmq.client import Endpoint, parse_failover


def schedule_of(uri: str, seed: int = 0) -> ReconnectSchedule[Endpoint]:
    """The schedule FailoverClient builds from ``uri``."""
    spec = parse_failover(uri)
    return ReconnectSchedule(spec.endpoints, spec.options.policy(),
                             priority=spec.priority_endpoints(), rng=random.Random(seed))


def walk(s: ReconnectSchedule[Endpoint], limit: int = 100) -> list[Attempt[Endpoint]]:
    attempts = []
    while len(attempts) < limit and (a := s.next_attempt()) is not None:
        attempts.append(a)
    return attempts


def hosts(attempts: list[Attempt[Endpoint]]) -> list[str]:
    return [a.endpoint.host for a in attempts]


def pass_delays(attempts: list[Attempt[Endpoint]]) -> list[float]:
    return [a.delay for a in attempts if a.delay or a.pass_number == 1][1:]


def test_startup_and_reconnect_budgets_are_separate() -> None:
    s = schedule_of("failover:(stomp://a,stomp://b)?randomize=false&"
                    "startupMaxReconnectAttempts=1&maxReconnectAttempts=3")
    assert hosts(walk(s)) == ["a", "b"] and s.exhausted  # one pass at startup
    s.restart()
    first = s.next_attempt()
    assert first is not None
    s.connected(first.endpoint, now=0.0)
    s.lost(now=1.0)
    assert hosts(walk(s)) == ["b", "a"] * 3 and s.exhausted  # three after a loss


def test_without_a_startup_budget_the_reconnect_budget_applies_at_startup() -> None:
    s = schedule_of("failover:(stomp://a,stomp://b)?randomize=false&maxReconnectAttempts=2")
    assert hosts(walk(s)) == ["a", "b", "a", "b"] and s.exhausted


def test_by_default_the_client_never_gives_up() -> None:
    s = schedule_of("failover:(stomp://a,stomp://b)")
    assert len(walk(s, limit=500)) == 500 and not s.exhausted


def test_exponential_delays_from_the_uri_are_capped() -> None:
    s = schedule_of("failover:(stomp://a)?initialReconnectDelay=100&"
                    "reconnectDelayExponent=3&maxReconnectDelay=2000")
    assert pass_delays(walk(s, 7)) == pytest.approx([0.1, 0.3, 0.9, 2.0, 2.0, 2.0])


def test_a_constant_delay_without_exponential_backoff() -> None:
    s = schedule_of("failover:(stomp://a)?initialReconnectDelay=250&"
                    "useExponentialBackOff=false")
    assert pass_delays(walk(s, 5)) == [0.25] * 4


def test_a_max_delay_below_the_initial_delay_caps_every_wait() -> None:
    s = schedule_of("failover:(stomp://a)?initialReconnectDelay=5000&maxReconnectDelay=1000")
    assert pass_delays(walk(s, 4)) == [1.0] * 3


def test_only_the_first_try_of_a_pass_waits() -> None:
    s = schedule_of("failover:(stomp://a,stomp://b,stomp://c)?randomize=false&"
                    "initialReconnectDelay=100")
    assert [a.delay for a in walk(s, 9)] == [0, 0, 0, 0.1, 0, 0, 0.2, 0, 0]


def test_jitter_from_the_uri_spreads_each_wait() -> None:
    s = schedule_of("failover:(stomp://a)?initialReconnectDelay=1000&"
                    "useExponentialBackOff=false&jitter=0.2", seed=5)
    waits = pass_delays(walk(s, 40))
    assert all(0.8 <= w <= 1.2 for w in waits) and len(set(waits)) > 5


def test_a_randomized_list_is_shuffled_per_pass_but_the_priority_broker_leads() -> None:
    s = schedule_of("failover:(stomp://a,stomp://b,stomp://c,stomp://d,stomp://e)"
                    "?priorityURIs=stomp://c", seed=3)
    passes = [hosts(walk(s, 5)) for _ in range(8)]
    assert all(p[0] == "c" and sorted(p) == list("abcde") for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_reconnect_reset_after_keeps_a_flapping_connection_slow() -> None:
    s = schedule_of("failover:(stomp://a)?initialReconnectDelay=100&reconnectResetAfter=10000")
    walk(s, 3)  # two failed passes: the next wait is 0.4 s
    s.connected(s.endpoints[0], now=0.0)
    s.lost(now=2.0)  # lived 2 s: not long enough to start over
    assert walk(s, 1)[0].delay == pytest.approx(0.4)
    s.connected(s.endpoints[0], now=3.0)
    s.lost(now=20.0)  # lived 17 s: back to the initial delay
    assert walk(s, 1)[0].delay == pytest.approx(0.1)


class FailoverScheduleMachine(RuleBasedStateMachine):
    """Any run of failed tries, connects and losses, on a schedule built from a failover
    URI: every pass tries each broker once, the priority broker leads unless it is the
    one just lost, the lost broker goes last, and the client gives up exactly when its
    budget (startup, then reconnect) of whole passes is spent."""

    @initialize(n=st.integers(1, 4), randomize=st.booleans(), priority=st.booleans(),
                startup=st.integers(-1, 3), maximum=st.integers(-1, 3),
                seed=st.integers(0, 1000))
    def build(self, n: int, randomize: bool, priority: bool, startup: int, maximum: int,
              seed: int) -> None:
        self.names = [f"h{i}" for i in range(n)]
        uri = (f"failover:({','.join(f'stomp://{h}' for h in self.names)})"
               f"?randomize={str(randomize).lower()}&priorityBackup={str(priority).lower()}"
               f"&startupMaxReconnectAttempts={startup}&maxReconnectAttempts={maximum}"
               "&initialReconnectDelay=10&maxReconnectDelay=80")
        self.schedule = schedule_of(uri, seed)
        self.priority = "h0" if priority else None
        self.startup, self.maximum = startup, maximum
        self.ever_connected = False
        self.lost_host: str | None = None
        self.connected_host: str | None = None
        self.tried: list[str] = []  # in the current pass
        self.passes_done = 0  # whole passes that failed in this cycle
        self.now = 0.0

    def budget(self) -> int:
        limit = self.startup if not self.ever_connected and self.startup != -1 \
            else self.maximum
        return -1 if limit == -1 else max(limit, 1)

    @rule()
    def fail_one_try(self) -> None:
        a = self.schedule.next_attempt()
        if self.connected_host is not None:
            assert a is None
            return
        if len(self.tried) == len(self.names):
            self.passes_done += 1
            self.tried = []
        budget = self.budget()
        lost_without_retry = self.lost_host is not None and self.maximum == 0
        if lost_without_retry or (budget != -1 and self.passes_done >= budget):
            assert a is None and self.schedule.exhausted
            return
        assert a is not None
        host = a.endpoint.host
        assert host not in self.tried
        if not self.tried:  # a pass starts
            if self.priority is not None and self.priority != self.lost_host:
                assert host == self.priority
            first_ever = self.passes_done == 0 and self.lost_host is None
            assert (a.delay == 0) if first_ever else (0.01 <= a.delay <= 0.08)
        else:
            assert a.delay == 0
        if self.lost_host is not None and len(self.names) > 1:
            is_last = len(self.tried) == len(self.names) - 1
            assert (host == self.lost_host) == is_last
        self.tried.append(host)

    @rule()
    def connect_on_the_last_try(self) -> None:
        if self.connected_host is not None or not self.tried:
            return
        self.connected_host = self.tried[-1]
        self.schedule.connected(self.schedule.endpoints[self.names.index(
            self.connected_host)], self.now)
        self.ever_connected = True
        self.tried, self.passes_done, self.lost_host = [], 0, None

    @rule(lived=st.floats(0, 5))
    def lose(self, lived: float) -> None:
        if self.connected_host is None:
            return
        self.now += lived
        self.schedule.lost(self.now)
        self.lost_host, self.connected_host = self.connected_host, None
        self.tried, self.passes_done = [], 0

    @invariant()
    def current_is_the_connected_broker(self) -> None:
        current = self.schedule.current
        assert (current.host if current else None) == self.connected_host


TestFailoverScheduleMachine = FailoverScheduleMachine.TestCase
TestFailoverScheduleMachine.settings = settings(max_examples=40, stateful_step_count=25)
