"""The login backoff policy, on an injected clock."""

from __future__ import annotations

from meshmq.core.login_backoff import LoginBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delay_starts_after_a_few_failures_and_doubles_to_a_cap() -> None:
    clock = Clock()
    b = LoginBackoff(after=3, base=0.5, max_delay=5.0, clock=clock)
    delays = []
    for _ in range(9):
        delays.append(b.failed("10.0.0.1"))
        clock.now += 0.1
    assert delays == [0, 0, 0, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.failed_total == 9 and b.slowed() == 1


def test_addresses_are_separate() -> None:
    clock = Clock()
    b = LoginBackoff(after=1, clock=clock)
    assert b.failed("a") == 0 and b.failed("a") == 0.5
    assert b.failed("b") == 0
    assert b.slowed() == 2  # both reached the threshold: their next refusal waits


def test_quiet_address_is_forgotten() -> None:
    clock = Clock()
    b = LoginBackoff(after=1, quiet=60.0, clock=clock)
    b.failed("a")
    assert b.failed("a") == 0.5
    clock.now += 59.0
    assert b.failed("a") == 1.0  # still remembered: quiet is counted from the last failure
    clock.now += 60.0
    assert b.slowed() == 0
    assert b.failed("a") == 0  # a fresh start


def test_memory_is_bounded_oldest_first() -> None:
    clock = Clock()
    b = LoginBackoff(after=1, max_addresses=3, clock=clock)
    for addr in ("a", "b", "c", "d"):
        b.failed(addr)
        clock.now += 1
    assert b.failed("a") == 0  # "a" was dropped to make room for "d"
    assert b.failed("d") == 0.5


def test_disabled_counts_but_never_delays() -> None:
    b = LoginBackoff(after=0, max_delay=0.0, clock=Clock())
    assert [b.failed("a") for _ in range(5)] == [0.0] * 5
    assert b.failed_total == 5
