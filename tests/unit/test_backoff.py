"""The reconnect policy as a pure iterator: no sockets, no clock."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from meshmq.backoff import Attempt, ReconnectPolicy, ReconnectSchedule

ORDERED = ReconnectPolicy(randomize=False)


def take(schedule: ReconnectSchedule[str], n: int) -> list[Attempt[str]]:
    return list(itertools.islice(schedule, n))


def test_activemq_defaults() -> None:
    p = ReconnectPolicy()
    assert (p.initial_delay, p.max_delay, p.exponential, p.multiplier) == (0.010, 30.0, True, 2.0)
    assert (p.max_attempts, p.startup_max_attempts, p.randomize) == (-1, -1, True)


def test_startup_passes_and_exponential_delays() -> None:
    s = ReconnectSchedule(["a", "b"], ORDERED)
    got = [(a.endpoint, a.delay, a.pass_number) for a in take(s, 8)]
    assert got == [("a", 0.0, 1), ("b", 0.0, 1), ("a", 0.01, 2), ("b", 0.0, 2),
                   ("a", 0.02, 3), ("b", 0.0, 3), ("a", 0.04, 4), ("b", 0.0, 4)]


def test_delay_is_capped_and_constant_without_exponential() -> None:
    s = ReconnectSchedule(["a"], ReconnectPolicy(initial_delay=1, max_delay=5, randomize=False))
    assert [a.delay for a in take(s, 6)] == [0, 1, 2, 4, 5, 5]
    s = ReconnectSchedule(["a"], ReconnectPolicy(initial_delay=1, exponential=False))
    assert [a.delay for a in take(s, 4)] == [0, 1, 1, 1]


def test_bridge_defaults_are_parameters() -> None:
    bridge = ReconnectPolicy(initial_delay=1.0, max_delay=30.0, multiplier=2.0)
    s = ReconnectSchedule(["x"], bridge)
    assert [a.delay for a in take(s, 7)] == [0, 1, 2, 4, 8, 16, 30]


@pytest.mark.parametrize(("startup", "maximum", "passes"), [
    (-1, 3, 3), (2, -1, 2), (0, -1, 1), (1, -1, 1), (5, 0, 5),
])
def test_startup_attempt_budget(startup: int, maximum: int, passes: int) -> None:
    policy = ReconnectPolicy(randomize=False, startup_max_attempts=startup, max_attempts=maximum)
    s = ReconnectSchedule(["a", "b"], policy)
    attempts = list(s)
    assert len(attempts) == 2 * passes and s.exhausted
    assert s.next_attempt() is None


def test_max_reconnect_attempts_zero_means_no_reconnect() -> None:
    s = ReconnectSchedule(["a", "b"], ReconnectPolicy(max_attempts=0, randomize=False))
    first = s.next_attempt()
    assert first is not None and first.endpoint == "a"  # a connect tries once
    s.connected("a", now=0.0)
    assert s.next_attempt() is None
    s.lost(now=5.0)
    assert s.exhausted and list(s) == []


def test_after_loss_first_pass_waits_and_lost_endpoint_goes_last() -> None:
    s = ReconnectSchedule(["a", "b", "c"], ORDERED)
    assert s.next_attempt() == Attempt("a", 0.0, 1)
    s.connected("a", now=0.0)
    s.lost(now=100.0)
    got = [(a.endpoint, a.delay) for a in take(s, 3)]
    assert got == [("b", 0.01), ("c", 0.0), ("a", 0.0)]


def test_reconnect_budget_after_loss_counts_passes() -> None:
    s = ReconnectSchedule(["a", "b"], ReconnectPolicy(max_attempts=2, randomize=False))
    s.next_attempt()
    s.connected("a", now=0)
    s.lost(now=1)
    assert len(list(s)) == 4 and s.exhausted
    s.restart()
    assert s.next_attempt() is not None


def test_reset_after_keeps_the_grown_delay_for_flapping_connections() -> None:
    policy = ReconnectPolicy(initial_delay=1, randomize=False, reset_after=10)
    s = ReconnectSchedule(["a"], policy)
    take(s, 3)  # delays 0, 1, 2: the delay is now 4
    s.connected("a", now=0)
    s.lost(now=1)  # lived 1 s < 10 s: keep growing
    assert s.next_attempt() == Attempt("a", 4, 1)
    s.connected("a", now=2)
    s.lost(now=50)  # lived 48 s: start again
    assert s.next_attempt() == Attempt("a", 1, 1)


def test_activemq_resets_on_every_connect_by_default() -> None:
    s = ReconnectSchedule(["a"], ReconnectPolicy(initial_delay=1, randomize=False))
    take(s, 4)
    s.connected("a", now=0)
    s.lost(now=0.1)
    assert s.next_attempt() == Attempt("a", 1, 1)


def test_priority_endpoints_come_first_even_when_randomized() -> None:
    rng = random.Random(7)
    s = ReconnectSchedule(["a", "b", "c", "d"], ReconnectPolicy(), priority=["c"], rng=rng)
    for _ in range(5):
        first = take(s, 4)
        assert first[0].endpoint == "c"
        assert sorted(a.endpoint for a in first) == ["a", "b", "c", "d"]


def test_randomize_shuffles_each_pass_deterministically_with_a_seed() -> None:
    def order(seed: int) -> list[str]:
        s = ReconnectSchedule(list("abcdef"), ReconnectPolicy(), rng=random.Random(seed))
        return [a.endpoint for a in take(s, 12)]
    assert order(1) == order(1)
    assert len({tuple(order(seed)[:6]) for seed in range(10)}) > 1


def test_jitter_spreads_delays_within_bounds() -> None:
    policy = ReconnectPolicy(initial_delay=1, exponential=False, jitter=0.5, randomize=False)
    s = ReconnectSchedule(["a"], policy, rng=random.Random(3))
    delays = [a.delay for a in take(s, 50)][1:]
    assert all(0.5 <= d <= 1.5 for d in delays)
    assert len(set(delays)) > 10


def test_update_endpoints_applies_to_the_next_pass() -> None:
    s = ReconnectSchedule(["a", "b"], ORDERED)
    assert s.next_attempt() == Attempt("a", 0.0, 1)
    s.update_endpoints(["c", "b", "c"])
    assert [a.endpoint for a in take(s, 3)] == ["b", "c", "b"]
    assert s.endpoints == ("c", "b")


@pytest.mark.parametrize("kwargs", [
    {"initial_delay": -1}, {"max_delay": -1}, {"multiplier": 0.5}, {"max_attempts": -2},
    {"startup_max_attempts": -3}, {"jitter": 1.5}, {"reset_after": -1},
])
def test_bad_policy_values_are_rejected(kwargs: dict[str, float]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name.split("_")[0]):
        ReconnectPolicy(**kwargs)  # type: ignore[arg-type]


def test_empty_endpoint_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        ReconnectSchedule([])


@given(
    n=st.integers(1, 5),
    initial=st.floats(0, 5),
    maximum=st.floats(0, 60),
    multiplier=st.floats(1, 4),
    startup=st.integers(-1, 6),
    jitter=st.floats(0, 1),
    seed=st.integers(0, 2**32),
)
def test_schedule_invariants(n: int, initial: float, maximum: float, multiplier: float,
                             startup: int, jitter: float, seed: int) -> None:
    policy = ReconnectPolicy(initial_delay=initial, max_delay=maximum, multiplier=multiplier,
                             startup_max_attempts=startup, jitter=jitter)
    endpoints = [f"e{i}" for i in range(n)]
    s = ReconnectSchedule(endpoints, policy, rng=random.Random(seed))
    attempts = take(s, 40 * n)
    passes: dict[int, list[Attempt[str]]] = {}
    for a in attempts:
        passes.setdefault(a.pass_number, []).append(a)
    for number, items in passes.items():
        # Each pass tries every endpoint once (the last may be cut short by take());
        # only its first attempt may wait.
        names = [a.endpoint for a in items]
        assert len(set(names)) == len(names) and set(names) <= set(endpoints)
        if number != max(passes):
            assert len(names) == n
        assert all(a.delay == 0 for a in items[1:])
        first = items[0].delay
        assert first == 0 if number == 1 else 0 <= first <= maximum * (1 + jitter) + 1e-9
    if startup > 0:
        assert len(attempts) == startup * n and s.exhausted
    elif startup == 0:
        assert len(attempts) == n
    else:
        assert len(attempts) == 40 * n and not s.exhausted


class ScheduleMachine(RuleBasedStateMachine):
    """Any interleaving of attempts, successes and losses keeps the policy's promises."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.schedule: ReconnectSchedule[str] | None = None
        self.policy = ReconnectPolicy()
        self.in_pass: list[str] = []
        self.pass_number = 0
        self.connected_to: str | None = None

    @initialize(n=st.integers(1, 4), max_attempts=st.integers(-1, 3),
                startup=st.integers(-1, 3), jitter=st.floats(0, 1),
                reset_after=st.sampled_from([0.0, 5.0]), seed=st.integers(0, 1000))
    def setup(self, n: int, max_attempts: int, startup: int, jitter: float,
              reset_after: float, seed: int) -> None:
        self.policy = ReconnectPolicy(initial_delay=0.5, max_delay=4.0,
                                      max_attempts=max_attempts,
                                      startup_max_attempts=startup, jitter=jitter,
                                      reset_after=reset_after)
        self.endpoints = [f"e{i}" for i in range(n)]
        self.schedule = ReconnectSchedule(self.endpoints, self.policy,
                                          rng=random.Random(seed))

    @rule()
    def attempt(self) -> None:
        assert self.schedule is not None
        a = self.schedule.next_attempt()
        if self.connected_to is not None:
            assert a is None  # nothing to do while connected
            return
        if a is None:
            assert self.schedule.exhausted
            return
        assert a.endpoint in self.endpoints
        assert 0 <= a.delay <= self.policy.max_delay * (1 + self.policy.jitter) + 1e-9
        if a.pass_number != self.pass_number:  # a new pass: only its first try waits
            self.pass_number = a.pass_number
            self.in_pass = []
        else:
            assert a.delay == 0
        assert a.endpoint not in self.in_pass  # every endpoint once per pass
        self.in_pass.append(a.endpoint)
        self.last = a.endpoint
        self.now += a.delay

    @precondition(lambda self: self.connected_to is None and self.in_pass)
    @rule()
    def succeed(self) -> None:
        assert self.schedule is not None
        self.schedule.connected(self.last, self.now)
        self.connected_to = self.last
        assert self.schedule.current == self.last
        self.in_pass = []
        self.pass_number = 0

    @precondition(lambda self: self.connected_to is not None)
    @rule(lived=st.floats(0, 10))
    def lose(self, lived: float) -> None:
        assert self.schedule is not None
        self.now += lived
        self.schedule.lost(self.now)
        self.connected_to = None
        self.in_pass = []
        self.pass_number = 0
        if self.policy.max_attempts == 0:
            assert self.schedule.exhausted and self.schedule.next_attempt() is None

    @invariant()
    def delay_within_bounds(self) -> None:
        if self.schedule is not None:
            assert self.policy.initial_delay <= self.schedule.current_delay <= \
                self.policy.max_delay


TestScheduleMachine = ScheduleMachine.TestCase
