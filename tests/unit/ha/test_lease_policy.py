"""The pure parts of HA: lease decisions, the role table, the lease file's slot codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.errors import StoreError
from meshmq.ha.file_lease import SLOT_SIZE, decode_slot, encode_slot, newest
from meshmq.ha.lease import (
    LeaseKeeper,
    LeaseRecord,
    LeaseView,
    LeaseWatch,
    Verdict,
    release,
    renewal,
    takeover,
)
from meshmq.ha.roles import TRANSITIONS, Role, RoleError, RoleEvent, RoleMachine

holders = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                  min_size=1, max_size=16)
records = st.builds(LeaseRecord, st.integers(1, 2**40), st.none() | holders,
                    st.integers(0, 2**40))

# ------------------------------------------------------------------ LeaseWatch


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 500)), min_size=1, max_size=60))
def test_a_live_holder_is_never_taken_over_while_it_keeps_renewing(
        steps: list[tuple[int, int]]) -> None:
    """Whatever the timing of observations, a lease whose counter changed less than
    lease_ms ago (on the observer's clock) is never judged takeable."""
    lease_ms = 1000
    watch = LeaseWatch(lease_ms)
    now = 0
    counter = 0
    changed_at: int | None = None
    for renewals, advance in steps:
        now += advance
        if renewals:
            counter += renewals
        rec = LeaseRecord(1, "master", counter)
        verdict = watch.observe(LeaseView(rec), now)
        if changed_at is None or renewals:
            changed_at = now
        if now - changed_at < lease_ms:
            assert verdict is Verdict.WAIT
        else:
            assert verdict is Verdict.TAKE


def test_first_sight_of_a_lease_always_waits_a_full_lease() -> None:
    watch = LeaseWatch(1000)
    rec = LeaseRecord(3, "a", 7)
    assert watch.observe(LeaseView(rec), 10_000) is Verdict.WAIT
    assert watch.wait_left_ms(10_500) == 500
    assert watch.observe(LeaseView(rec), 10_999) is Verdict.WAIT
    assert watch.observe(LeaseView(rec), 11_000) is Verdict.TAKE


@pytest.mark.parametrize(("view", "verdict"), [
    (LeaseView(None), Verdict.TAKE),  # nobody ever held it
    (LeaseView(LeaseRecord(4, None, 2)), Verdict.TAKE),  # released by a graceful stop
    (LeaseView(LeaseRecord(4, "a", 2), holder_alive=False), Verdict.TAKE),  # crashed
    (LeaseView(LeaseRecord(4, "a", 2), holder_alive=True), Verdict.WAIT),
    (LeaseView(LeaseRecord(4, "a", 2), expired=True), Verdict.TAKE),  # database clock
    (LeaseView(LeaseRecord(4, "a", 2), expired=False), Verdict.WAIT),
])
def test_immediate_verdicts(view: LeaseView, verdict: Verdict) -> None:
    assert LeaseWatch(1000).observe(view, 0) is verdict


def test_database_verdict_wins_over_the_observers_clock() -> None:
    watch = LeaseWatch(1000)
    rec = LeaseRecord(1, "a", 0)
    assert watch.observe(LeaseView(rec, expired=False), 0) is Verdict.WAIT
    assert watch.observe(LeaseView(rec, expired=False), 50_000) is Verdict.WAIT


def test_watch_rejects_a_nonsense_lease() -> None:
    with pytest.raises(ValueError, match="lease_ms"):
        LeaseWatch(0)


# ------------------------------------------------------------------ record transitions


@given(st.none() | records, holders)
def test_takeover_always_moves_to_a_new_epoch(record: LeaseRecord | None, me: str) -> None:
    new = takeover(record, me)
    assert new.holder == me
    assert new.epoch == (record.epoch if record else 0) + 1
    assert new.counter == 0


@given(records, holders, st.integers(1, 2**40))
def test_renewal_and_release_only_by_the_holder_of_that_epoch(
        record: LeaseRecord, me: str, epoch: int) -> None:
    mine = record.holder == me and record.epoch == epoch
    renewed = renewal(record, me, epoch)
    released = release(record, me, epoch)
    if not mine:
        assert renewed is None and released is None
    else:
        assert renewed == LeaseRecord(epoch, me, record.counter + 1)
        assert released == LeaseRecord(epoch, None, record.counter + 1)


def test_keeper_steps_down_only_after_a_full_lease_without_renewal() -> None:
    keeper = LeaseKeeper(1000, 250, now_ms=0)
    assert keeper.next_renewal_ms() == 250
    assert not keeper.must_step_down(999)
    assert keeper.must_step_down(1000)
    keeper.renewed(900)
    assert not keeper.must_step_down(1899)
    with pytest.raises(ValueError, match="keepalive"):
        LeaseKeeper(1000, 1000, now_ms=0)


# ------------------------------------------------------------------ roles


@given(st.lists(st.sampled_from(list(RoleEvent)), max_size=30))
def test_role_machine_follows_the_table_and_rejects_the_rest(events: list[RoleEvent]) -> None:
    machine = RoleMachine()
    for event in events:
        before = machine.role
        expected = TRANSITIONS.get((before, event))
        if expected is None:
            with pytest.raises(RoleError, match=event.value):
                machine.fire(event)
            assert machine.role is before
        else:
            assert machine.fire(event) is expected
        assert machine.serving == (machine.role is Role.MASTER)
    # Once stopped, a broker never serves again; only a new runtime starts over.
    if Role.STOPPED in machine.history:
        assert machine.role is Role.STOPPED


def test_master_is_reached_only_by_acquiring() -> None:
    for (_state, event), nxt in TRANSITIONS.items():
        if nxt is Role.MASTER:
            assert event is RoleEvent.ACQUIRED


# ------------------------------------------------------------------ lease file slots


@given(st.builds(LeaseRecord, st.integers(0, 2**63), st.none() | holders,
                 st.integers(0, 2**63)))
def test_slot_roundtrip(record: LeaseRecord) -> None:
    data = encode_slot(record)
    assert len(data) == SLOT_SIZE
    assert decode_slot(data) == record


@given(records, st.integers(0, SLOT_SIZE - 1), st.integers(1, 255))
def test_a_damaged_slot_is_never_read_as_a_record(record: LeaseRecord, at: int,
                                                   flip: int) -> None:
    data = bytearray(encode_slot(record))
    data[at] ^= flip
    assert decode_slot(bytes(data)) is None


def test_newest_slot_wins_and_a_torn_one_falls_back() -> None:
    old = encode_slot(LeaseRecord(2, "a", 5))
    new = encode_slot(LeaseRecord(3, "b", 0))
    assert newest(old + new) == (LeaseRecord(3, "b", 0), 1)
    torn = new[:40] + bytes(SLOT_SIZE - 40)
    assert newest(old + torn) == (LeaseRecord(2, "a", 5), 0)
    assert newest(b"") == (None, -1)
    assert newest(bytes(2 * SLOT_SIZE)) == (None, -1)
    with pytest.raises(StoreError, match="damaged"):
        newest(b"garbage" * 40)


def test_holder_ids_are_bounded() -> None:
    with pytest.raises(ValueError, match="64"):
        encode_slot(LeaseRecord(1, "x" * 65, 0))
