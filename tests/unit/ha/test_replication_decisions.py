"""Decisions of replicated master/slave, case by case (``replication_policy``): why a
vote is refused, what a majority commits, how long a master's lease lasts, and how a
follower that fell behind is caught up (a Hypothesis state machine of a master's
retained log and its followers)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from meshmq.ha.replication_policy import (
    ADOPTED,
    ZERO,
    Catchup,
    RetainedLog,
    SendTimeEstimate,
    VoterState,
    commit_index,
    decide_vote,
    lease_deadline,
    majority,
    pack_position,
)

LEASE = 1000


def vote(state: VoterState, candidate: str = "c", term: int = 5,
         last: tuple[int, int] = (4, 10), now: int = 10_000) -> tuple[bool, str]:
    d = decide_vote(state, candidate, term, last, now, LEASE)
    return d.granted, d.reason


@pytest.mark.parametrize(("state", "args", "reason"), [
    (VoterState(4, None, (4, 10), leader_seen_ms=9_500), {}, "a master is alive"),
    (VoterState(6, None, (4, 10), None), {}, "stale term"),
    (VoterState(5, "other", (4, 10), None), {}, "already voted for other"),
    (VoterState(4, None, (4, 11), None), {}, "candidate log is behind"),
    (VoterState(4, None, (5, 1), None), {"last": (4, 99)}, "candidate log is behind"),
    (VoterState(4, None, ZERO, None, amnesiac=True), {}, "no state of its own"),
], ids=["master-alive", "stale-term", "voted-other", "shorter-log", "older-term-log",
        "amnesiac"])
def test_each_reason_to_refuse_a_vote(state: VoterState, args: dict[str, object],
                                      reason: str) -> None:
    granted, why = vote(state, **args)  # type: ignore[arg-type]
    assert not granted and reason in why


def test_a_vote_is_granted_to_an_up_to_date_candidate_of_a_newer_term() -> None:
    d = decide_vote(VoterState(4, "old", (4, 10), None), "c", 5, (4, 10), 0, LEASE)
    assert (d.granted, d.term, d.voted_for, d.reason) == (True, 5, "c", "granted")


def test_asking_again_in_the_same_term_gets_the_same_vote() -> None:
    """A lost answer is asked for again: the voter must not refuse its own choice."""
    assert vote(VoterState(5, "c", (4, 10), None)) == (True, "granted")


def test_a_higher_term_lifts_an_earlier_vote() -> None:
    assert vote(VoterState(4, "other", (4, 10), None), term=5) == (True, "granted")


def test_a_refusal_for_a_behind_log_still_adopts_the_newer_term() -> None:
    d = decide_vote(VoterState(4, "x", (4, 11), None), "c", 7, (4, 10), 0, LEASE)
    assert (d.granted, d.term, d.voted_for) == (False, 7, None)


def test_the_master_lease_protects_until_exactly_lease_ms() -> None:
    state = VoterState(4, None, (4, 10), leader_seen_ms=9_000)
    assert vote(state, now=9_999)[0] is False
    assert vote(state, now=10_000)[0] is True


@pytest.mark.parametrize("last", [ZERO, ADOPTED], ids=["empty", "adopted-journal"])
def test_a_node_without_state_votes_in_a_cluster_that_never_replicated(
        last: tuple[int, int]) -> None:
    assert vote(VoterState(0, None, ZERO, None, amnesiac=True), term=1, last=last)[0]


def test_pack_position_refuses_negative_parts() -> None:
    for pos in ((-1, 0), (0, -1)):
        with pytest.raises(ValueError, match="out of range"):
            pack_position(pos)


@pytest.mark.parametrize(("nodes", "need"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_a_majority_of_the_nodes(nodes: int, need: int) -> None:
    assert majority(nodes) == need


def test_a_pair_commits_only_what_both_nodes_hold() -> None:
    """Two brokers without a witness: the slave's disk is needed for every write."""
    assert commit_index(9, [4], 2) == 4


def test_a_master_alone_in_three_commits_nothing_new() -> None:
    assert commit_index(9, [], 3) == 0
    assert commit_index(9, [0, 0], 3) == 0


def test_the_slowest_member_of_five_does_not_hold_the_commit_back() -> None:
    assert commit_index(10, [10, 9, 3, 0], 5) == 9


def test_without_answers_from_a_majority_there_is_no_lease() -> None:
    assert lease_deadline(5_000, [None, None], 3, LEASE) is None
    assert lease_deadline(5_000, [4_000, None], 3, LEASE) == 5_000


def test_a_lone_node_cluster_keeps_its_lease_on_its_own() -> None:
    assert lease_deadline(5_000, [], 1, LEASE) == 6_000


def test_the_send_time_window_forgets_an_old_fast_delivery() -> None:
    """Clocks drift: the best offset seen more than a window ago stops counting."""
    est = SendTimeEstimate(window_ms=1000)
    assert est.sent_at(0, 100) == 100  # offset 100
    assert est.sent_at(500, 700) == 600  # offset 200; 100 still in the window
    # Both left the window (received at 100 and 700, before 1_800 - 1_000).
    assert est.sent_at(1_500, 1_800) == 1_800


# ------------------------------------------------------------------ retained log


def test_the_retained_log_numbers_batches_after_its_base() -> None:
    log = RetainedLog((3, 40), 1 << 20)
    assert log.append(3, b"a") == 41
    assert log.append(4, b"b") == 42
    assert log.last == (4, 42)
    assert [pos for pos, _ in log.after(40)] == [(3, 41), (4, 42)]


def test_a_batch_larger_than_the_budget_is_still_kept() -> None:
    log = RetainedLog(ZERO, 10)
    log.append(1, b"x" * 5)
    log.append(1, b"y" * 50)
    assert list(log.after(0)) == [((1, 2), b"y" * 50)]
    assert log.base == (1, 1)


def test_a_follower_in_the_retained_history_is_streamed_to() -> None:
    log = RetainedLog((2, 5), 1 << 20)
    log.append(2, b"a")
    log.append(3, b"b")
    assert log.plan((2, 5)) is Catchup.STREAM  # at the base
    assert log.plan((2, 6)) is Catchup.STREAM
    assert log.plan((3, 7)) is Catchup.STREAM  # up to date: heartbeats only


@pytest.mark.parametrize(("follower", "why"), [
    ((1, 3), "its position was trimmed away"),
    ((2, 7), "same index, another term: a diverged history"),
    ((3, 9), "ahead of this master: written by a deposed one"),
    (ADOPTED, "a journal from before replication"),
], ids=["trimmed", "diverged", "ahead", "adopted"])
def test_a_follower_outside_the_retained_history_gets_a_snapshot(
        follower: tuple[int, int], why: str) -> None:
    log = RetainedLog((2, 5), 1 << 20)
    log.append(2, b"a")
    log.append(3, b"b")
    assert log.plan(follower) is Catchup.SNAPSHOT, why


class CatchUp(RuleBasedStateMachine):
    """A master appends batches (its retained log trims to a budget); followers lag,
    diverge (a deposed master's writes) and catch up as ``plan`` says: stream the
    retained batches after their position, or take a snapshot of the whole log. After
    catching up a follower's log is the master's, batch for batch."""

    def __init__(self) -> None:
        super().__init__()
        self.term = 1
        self.full: list[tuple[int, bytes]] = []  # the master's whole log, index 1..n
        self.log = RetainedLog(ZERO, budget_bytes=12)
        self.followers: dict[str, list[tuple[int, bytes]]] = {"b": [], "c": []}
        self.snapshots = 0

    @rule(size=st.integers(0, 6), new_term=st.booleans())
    def master_writes(self, size: int, new_term: bool) -> None:
        self.term += new_term
        payload = bytes([len(self.full) % 256]) * size
        index = self.log.append(self.term, payload)
        self.full.append((self.term, payload))
        assert index == len(self.full)

    @rule(name=st.sampled_from(["b", "c"]), keep=st.integers(0, 30))
    def follower_loses_its_tail(self, name: str, keep: int) -> None:
        """A follower restarted from an older copy: it is simply behind."""
        del self.followers[name][keep:]

    @rule(name=st.sampled_from(["b", "c"]), extra=st.integers(1, 3))
    def follower_diverges(self, name: str, extra: int) -> None:
        """Batches a deposed master wrote that no majority took: same indexes, a term
        this master never used."""
        stale = self.term + 100
        self.followers[name] += [(stale, b"stale")] * extra

    @rule(name=st.sampled_from(["b", "c"]))
    def catch_up(self, name: str) -> None:
        mine = self.followers[name]
        pos = (mine[-1][0], len(mine)) if mine else ZERO
        if self.log.plan(pos) is Catchup.STREAM:
            assert mine == self.full[:len(mine)]  # only a matching log is streamed to
            for (term, index), payload in self.log.after(pos[1]):
                assert index == len(mine) + 1
                mine.append((term, payload))
        else:
            self.snapshots += 1
            self.followers[name] = list(self.full)
        assert self.followers[name] == self.full

    @invariant()
    def retained_log_is_a_suffix_of_the_full_log(self) -> None:
        kept = list(self.log.after(0))
        assert self.log.last == ((self.full[-1][0], len(self.full)) if self.full else ZERO)
        for (term, index), payload in kept:
            assert self.full[index - 1] == (term, payload)

    @invariant()
    def a_follower_that_only_lags_inside_the_retained_log_is_streamed_to(self) -> None:
        for mine in self.followers.values():
            if mine and mine == self.full[:len(mine)] and len(mine) >= self.log.base[1]:
                assert self.log.plan((mine[-1][0], len(mine))) is Catchup.STREAM


CatchUp.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
test_followers_catch_up_by_stream_or_snapshot = CatchUp.TestCase
