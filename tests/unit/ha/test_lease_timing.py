"""When a slave may take a lease and when a master must step down, with the clock passed
in (milliseconds of a monotonic clock): ``LeaseWatch``, ``LeaseKeeper`` and the records
a takeover, a renewal and a release write."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.ha.lease import (
    LeaseKeeper,
    LeaseRecord,
    LeaseView,
    LeaseWatch,
    Verdict,
    release,
    renewal,
)

LEASE = 1000
HELD = LeaseRecord(5, "master", 10)


def test_a_renewal_restarts_the_wait() -> None:
    watch = LeaseWatch(LEASE)
    assert watch.observe(LeaseView(HELD), 0) is Verdict.WAIT
    renewed = LeaseRecord(5, "master", 11)
    assert watch.observe(LeaseView(renewed), 900) is Verdict.WAIT
    # A full lease after first sight, but only 100 ms after the renewal was seen.
    assert watch.observe(LeaseView(renewed), 1000) is Verdict.WAIT
    assert watch.wait_left_ms(1000) == 900
    assert watch.observe(LeaseView(renewed), 1900) is Verdict.TAKE


def test_a_takeover_by_another_slave_restarts_the_wait() -> None:
    watch = LeaseWatch(LEASE)
    watch.observe(LeaseView(HELD), 0)
    other = LeaseRecord(6, "other-slave", 0)
    assert watch.observe(LeaseView(other), 999) is Verdict.WAIT
    assert watch.observe(LeaseView(other), 1500) is Verdict.WAIT
    assert watch.observe(LeaseView(other), 1999) is Verdict.TAKE


def test_a_record_seen_again_after_a_change_is_a_new_first_sight() -> None:
    """A counter that went back (a restored file) is a change like any other."""
    watch = LeaseWatch(LEASE)
    watch.observe(LeaseView(HELD), 0)
    watch.observe(LeaseView(LeaseRecord(5, "master", 11)), 500)
    assert watch.observe(LeaseView(HELD), 1200) is Verdict.WAIT
    assert watch.observe(LeaseView(HELD), 2199) is Verdict.WAIT
    assert watch.observe(LeaseView(HELD), 2200) is Verdict.TAKE


def test_a_paused_holder_that_is_still_alive_loses_the_lease_once_it_expires() -> None:
    """A SIGSTOPped master keeps its alive lock: the lease timeout decides."""
    watch = LeaseWatch(LEASE)
    assert watch.observe(LeaseView(HELD, holder_alive=True), 0) is Verdict.WAIT
    assert watch.observe(LeaseView(HELD, holder_alive=True), 999) is Verdict.WAIT
    assert watch.observe(LeaseView(HELD, holder_alive=True), 1000) is Verdict.TAKE


def test_a_released_lease_is_taken_whatever_the_backend_clock_says() -> None:
    released = LeaseRecord(5, None, 11)
    assert LeaseWatch(LEASE).observe(LeaseView(released, expired=False), 0) is Verdict.TAKE


def test_a_dead_holder_wins_over_an_unexpired_database_lease() -> None:
    """The database lease's holder lost its session: no need to wait for the row."""
    view = LeaseView(HELD, holder_alive=False, expired=False)
    assert LeaseWatch(LEASE).observe(view, 0) is Verdict.TAKE


def test_nothing_seen_yet_means_a_full_lease_to_wait() -> None:
    assert LeaseWatch(LEASE).wait_left_ms(123_456) == LEASE


def test_wait_left_never_goes_below_zero() -> None:
    watch = LeaseWatch(LEASE)
    watch.observe(LeaseView(HELD), 0)
    assert watch.wait_left_ms(5000) == 0


@pytest.mark.parametrize("lease_ms", [0, -1, -5000])
def test_a_lease_must_last_some_time(lease_ms: int) -> None:
    with pytest.raises(ValueError, match="lease_ms must be positive"):
        LeaseWatch(lease_ms)


@given(st.integers(-10**9, 10**9), st.lists(st.integers(0, 3 * LEASE), max_size=20))
def test_an_unchanged_record_is_taken_exactly_a_lease_after_first_sight(
        start: int, gaps: list[int]) -> None:
    """Whatever the clock's origin (a monotonic clock may be negative) and however often
    the slave looks."""
    watch = LeaseWatch(LEASE)
    assert watch.observe(LeaseView(HELD), start) is Verdict.WAIT
    now = start
    for gap in gaps:
        now += gap
        expected = Verdict.TAKE if now - start >= LEASE else Verdict.WAIT
        assert watch.observe(LeaseView(HELD), now) is expected
        assert watch.wait_left_ms(now) == max(0, LEASE - (now - start))


# ------------------------------------------------------------------ the master's side


def test_the_master_renews_one_keepalive_after_its_last_renewal() -> None:
    keeper = LeaseKeeper(LEASE, 300, now_ms=5_000)
    assert keeper.next_renewal_ms() == 5_300
    keeper.renewed(5_310)
    assert keeper.next_renewal_ms() == 5_610


def test_a_late_renewal_counts_from_when_it_happened() -> None:
    keeper = LeaseKeeper(LEASE, 300, now_ms=0)
    keeper.renewed(950)  # late, but before the lease ran out
    assert not keeper.must_step_down(1_900)
    assert keeper.must_step_down(1_950)


def test_a_new_master_has_a_full_lease_from_its_takeover() -> None:
    keeper = LeaseKeeper(LEASE, 300, now_ms=70_000)
    assert not keeper.must_step_down(70_999)
    assert keeper.must_step_down(71_000)


@pytest.mark.parametrize(("lease_ms", "keepalive_ms"), [
    (1000, 0),  # never renews
    (1000, -100),
    (1000, 1000),  # renews only when the lease already ran out
    (1000, 1500),
])
def test_the_keepalive_must_fall_inside_the_lease(lease_ms: int, keepalive_ms: int) -> None:
    with pytest.raises(ValueError, match="keepalive_ms must be positive and below lease_ms"):
        LeaseKeeper(lease_ms, keepalive_ms, now_ms=0)


@given(st.lists(st.integers(0, 2 * LEASE), min_size=1, max_size=30))
def test_a_master_renewing_in_time_never_steps_down(gaps: list[int]) -> None:
    keeper = LeaseKeeper(LEASE, 250, now_ms=0)
    now = 0
    for gap in gaps:
        now += gap
        late = now - keeper.renewed_ms >= LEASE
        assert keeper.must_step_down(now) is late
        if late:
            return
        keeper.renewed(now)


# ------------------------------------------------------------------ records


@pytest.mark.parametrize(("record", "holder", "epoch"), [
    (None, "master", 5),  # the lease file or row is gone
    (HELD, "master", 4),  # an older epoch of the same holder
    (HELD, "other", 5),  # another holder at that epoch
    (LeaseRecord(5, None, 11), "master", 5),  # already released
])
def test_renewal_and_release_refuse_a_lease_that_is_not_theirs(
        record: LeaseRecord | None, holder: str, epoch: int) -> None:
    assert renewal(record, holder, epoch) is None
    assert release(record, holder, epoch) is None
