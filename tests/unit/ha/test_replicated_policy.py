"""The pure parts of replicated master/slave: positions, votes, commit, lease, the
retained log and the batch codec (Hypothesis), plus a small election model checking
that no two masters ever share a term and that a master's lease never overlaps the
next master's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.store.helpers import fields, messages

from meshmq.errors import RemoteProtocolError
from meshmq.ha.replica_ops import decode_ops, encode_ops
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
    retry_spread,
    unpack_position,
)
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    MarkDispatched,
    PutDurableSubscription,
    RemoveRef,
    SetDeliveryCount,
    StoreOp,
)
from meshmq.store.journal import JournalStore

positions = st.tuples(st.integers(0, (1 << 23) - 1), st.integers(0, (1 << 40) - 1))


@given(positions, positions)
def test_packed_positions_round_trip_and_keep_their_order(a: tuple[int, int],
                                                          b: tuple[int, int]) -> None:
    assert unpack_position(pack_position(a)) == a
    assert (pack_position(a) < pack_position(b)) == (a < b)


def test_out_of_range_positions_are_refused() -> None:
    with pytest.raises(ValueError):
        pack_position((1 << 23, 0))
    with pytest.raises(ValueError):
        pack_position((0, 1 << 40))


voters = st.builds(VoterState, st.integers(0, 20), st.none() | st.sampled_from("abc"),
                   st.tuples(st.integers(0, 20), st.integers(0, 50)),
                   st.none() | st.integers(0, 10_000), st.booleans())


@given(voters, st.sampled_from("abc"), st.integers(0, 25),
       st.tuples(st.integers(0, 20), st.integers(0, 50)), st.integers(0, 20_000),
       st.none() | st.integers(0, 20))
def test_a_vote_obeys_every_rule(state: VoterState, cand: str, term: int,
                                 last: tuple[int, int], now: int,
                                 resigned: int | None) -> None:
    d = decide_vote(state, cand, term, last, now, lease_ms=1000, resigned_term=resigned)
    handed_over = resigned == state.term
    assert d.term >= state.term  # terms never go back
    if d.granted:
        assert d.voted_for == cand and d.term == term
        assert last >= state.last  # never for a candidate behind this node
        # Only the master of this very term may waive its own lease, by resigning.
        assert handed_over or state.leader_seen_ms is None \
            or now - state.leader_seen_ms >= 1000
        assert term > state.term or state.voted_for in (None, cand)
        # A node without state of its own votes only in a cluster that never wrote.
        assert not state.amnesiac or last <= ADOPTED
    if not handed_over and state.leader_seen_ms is not None \
            and now - state.leader_seen_ms < 1000:
        assert (d.term, d.voted_for, d.granted) == (state.term, state.voted_for, False)


def test_a_handover_lets_a_voter_of_that_term_vote_at_once() -> None:
    state = VoterState(4, "m", (4, 10), leader_seen_ms=1000)
    assert not decide_vote(state, "s", 5, (4, 10), 1100, 1000).granted
    assert decide_vote(state, "s", 5, (4, 10), 1100, 1000, resigned_term=4).granted
    # A resignation from an older term says nothing about the master of this one.
    assert not decide_vote(state, "s", 5, (4, 10), 1100, 1000, resigned_term=3).granted


@given(st.integers(-10**9, 10**9),
       st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 5_000)), min_size=1,
                max_size=60))
def test_a_send_time_estimate_never_comes_before_the_true_send_time(
        clock_offset: int, messages: list[tuple[int, int]]) -> None:
    """Messages sent at rising times (master clock) and delivered after any delay: the
    estimate lies between the true send time and the time the message was read."""
    est = SendTimeEstimate(window_ms=10_000)
    sent = 0
    for gap, delay in messages:
        sent += gap
        received = sent + clock_offset + delay  # this node's clock
        at = est.sent_at(sent, received)
        assert sent + clock_offset <= at <= received


def test_a_backlog_read_late_counts_from_when_it_was_sent() -> None:
    est = SendTimeEstimate()
    assert est.sent_at(100, 5_100) == 5_100  # first message: no better knowledge
    assert est.sent_at(400, 5_400) == 5_400
    # The master died at 400; its last 600 ms of heartbeats are read 2 s late.
    assert est.sent_at(700, 7_400) == 5_700
    assert est.sent_at(1_000, 7_401) == 6_000
    est.reset()  # another master, another clock
    assert est.sent_at(50, 7_500) == 7_500


@given(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 6)), max_size=40))
def test_one_vote_per_term_whatever_the_order_of_requests(
        requests: list[tuple[str, int]]) -> None:
    state = VoterState(0, None, ZERO, None)
    granted: dict[int, set[str]] = {}
    for cand, term in requests:
        d = decide_vote(state, cand, term, ZERO, 0, 1000)
        state = VoterState(d.term, d.voted_for, ZERO, None)
        if d.granted:
            granted.setdefault(term, set()).add(cand)
    assert all(len(c) == 1 for c in granted.values())


@given(st.integers(0, 100), st.lists(st.integers(0, 100), max_size=6))
def test_commit_is_the_highest_index_a_majority_holds(own: int, matches: list[int]) -> None:
    nodes = len(matches) + 1
    c = commit_index(own, matches, nodes)
    have = [own, *matches]
    assert sum(v >= c for v in have) >= majority(nodes)
    assert sum(v >= c + 1 for v in have) < majority(nodes)


@given(st.integers(0, 10_000), st.lists(st.none() | st.integers(0, 10_000), max_size=6))
def test_the_lease_lasts_from_the_majority_s_oldest_answer(
        now: int, acked: list[int | None]) -> None:
    nodes = len(acked) + 1
    dl = lease_deadline(now, acked, nodes, 1000)
    answered = [now, *(a for a in acked if a is not None)]
    if len(answered) < majority(nodes):
        assert dl is None
        return
    assert dl is not None
    # A majority answered at or after dl - lease; not a majority after it.
    assert sum(t >= dl - 1000 for t in answered) >= majority(nodes)
    assert sum(t > dl - 1000 for t in answered) < majority(nodes) or dl - 1000 == max(answered)


@settings(max_examples=200)
@given(st.tuples(st.integers(0, 3), st.integers(0, 5)),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), max_size=40),
       st.integers(0, 100), st.tuples(st.integers(0, 9), st.integers(0, 60)))
def test_the_retained_log_matches_a_plain_list(base: tuple[int, int],
                                               appends: list[tuple[int, int]], budget: int,
                                               probe: tuple[int, int]) -> None:
    log = RetainedLog(base, budget)
    full: list[tuple[int, bytes]] = []  # (term, payload) of every index after base
    term = base[0]
    for bump, size in appends:
        term += bump
        full.append((term, bytes(size)))
        assert log.append(term, bytes(size)) == base[1] + len(full)
    assert log.last == ((full[-1][0], base[1] + len(full)) if full else base)
    # Within budget, except that the newest batch is always kept.
    kept = list(log.after(0))
    assert sum(len(p) for _, p in kept) <= budget or len(kept) == 1
    assert log.base[1] + len(kept) == log.last[1]
    for (t, i), payload in kept:
        assert full[i - base[1] - 1] == (t, payload)
        assert log.term_at(i) == t
    known = {log.base[1]: log.base[0], **{i: t for (t, i), _ in kept}}
    t, i = probe
    adopted = t == 0 and i > 0  # a journal from before replication: never streamed to
    expect = Catchup.STREAM if known.get(i) == t and not adopted else Catchup.SNAPSHOT
    assert log.plan((t, i)) is expect
    assert [pos for pos, _ in log.after(i)] == [pos for pos, _ in kept if pos[1] > i]


def test_terms_in_the_retained_log_never_decrease() -> None:
    log = RetainedLog((3, 7), 100)
    with pytest.raises(ValueError):
        log.append(2, b"")


keys = st.text(min_size=1, max_size=20)
seqs = st.integers(-(2**63), 2**63 - 1)
subs = st.builds(DurableSubscription, keys, st.text(max_size=10), st.text(max_size=10),
                 st.text(max_size=20), st.none() | st.text(max_size=20), st.booleans(),
                 seqs)
ops = st.lists(st.one_of(
    st.builds(AddMessage, messages, st.lists(st.tuples(keys, seqs), max_size=3).map(tuple)),
    st.builds(RemoveRef, keys, seqs),
    st.builds(SetDeliveryCount, keys, seqs, st.integers(0, 2**32 - 1)),
    st.builds(PutDurableSubscription, subs),
    st.builds(DropKey, keys),
    st.builds(MarkDispatched, keys, seqs),
), max_size=8)


@settings(max_examples=150)
@given(ops, st.dictionaries(keys, seqs, max_size=3))
def test_replicated_batches_round_trip(batch: list[StoreOp], marks: dict[str, int]) -> None:
    data = encode_ops(batch, marks)
    got, got_marks = decode_ops(data)
    assert [_comparable(op) for op in got] == [_comparable(op) for op in batch]
    assert got_marks == marks


def _comparable(op: StoreOp) -> object:
    if isinstance(op, AddMessage):  # messages compare field by field (NaN, caches)
        return fields(op.message), op.refs
    return op


@given(ops, st.data())
def test_damaged_batches_are_refused_with_a_clear_error(batch: list[StoreOp],
                                                        data: st.DataObject) -> None:
    raw = encode_ops(batch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(RemoteProtocolError, match="replicated batch"):
        decode_ops(raw[:cut])
    with pytest.raises(RemoteProtocolError, match="replicated batch"):
        decode_ops(raw + b"\x00")


def test_a_journal_keeps_the_position_mark_with_its_batch(tmp_path: Path) -> None:
    """The log position rides in the batch's own record, and survives reopen and
    compaction (it is a key's last_seq watermark)."""
    asyncio.run(_marks(tmp_path))


async def _marks(tmp_path: Path) -> None:
    j = JournalStore(tmp_path / "j", segment_size=600, compact_live_ratio=1.0)
    j.open()
    mark = pack_position((2, 9))
    j.write([], {"\x00pos": mark})
    for i in range(30):
        j.write([DropKey(f"k{i}")], {"\x00pos": mark + i + 1})
    await j.sync()
    while j.compact_step():
        pass
    await j.sync()
    await j.close()
    again = JournalStore(tmp_path / "j")
    recovery = again.open()
    assert recovery.keys["\x00pos"].last_seq == mark + 30
    assert "\x00pos" in again.key_names()
    await again.close()


# --------------------------------------------------------------------------- election model
# Three nodes exchange heartbeats, acks and votes with arbitrary delays (messages wait in
# a pool until a step delivers one), time jumps arbitrarily, any node may campaign once
# its own rule allows. The node logic is the module's pure functions; the model only
# moves messages. Invariant: never two masters with a valid lease, one master per term.

LEASE = 1000
LEADER_LEASE = int(LEASE * 0.9)  # as meshmq.ha.replication.LEADER_LEASE_SHARE
N = 3

_tick = st.tuples(st.just("tick"),  # jumps around the lease boundaries
                  st.sampled_from([1, 50, 300, 899, 900, 901, 999, 1000, 1001]))
_round = st.tuples(st.just("round"), st.sets(st.integers(0, N - 1)))
_campaign = st.tuples(st.just("campaign"), st.integers(0, N - 1),
                      st.sets(st.integers(0, N - 1)))
_message = st.one_of(  # one heartbeat at a time, delivered late, out of order, or lost
    st.tuples(st.just("heartbeat"), st.integers(0, N - 1), st.integers(0, N - 1)),
    st.tuples(st.just("exchange"), st.integers(0, N - 1), st.integers(0, N - 1)),
    st.tuples(st.just("deliver"), st.integers(0, 1000)),
    st.tuples(st.just("drop"), st.integers(0, 1000)))
# A master resigns (stops taking writes) and hands over to a node that heard it.
_handover = st.tuples(st.just("handover"), st.integers(0, N - 1), st.integers(0, N - 1),
                      st.sets(st.integers(0, N - 1)))
actions = st.lists(st.one_of(_tick, _round, _campaign, _handover, _message, _message),
                   min_size=8, max_size=60)


@settings(max_examples=1500, deadline=None)
@given(actions)
def test_no_two_masters_ever_hold_a_valid_lease(steps: list[tuple[object, ...]]) -> None:
    _run_model(steps, LEADER_LEASE)


# A master elected, a heartbeat acknowledged, a lease later another node elected.
RACE: list[tuple[object, ...]] = [
    ("campaign", 0, {1}), ("exchange", 0, 1), ("tick", 1000), ("tick", 50),
    ("campaign", 1, {2}), ("exchange", 1, 2)]


def test_the_race_is_safe_with_the_real_lease_share() -> None:
    _run_model(RACE, LEADER_LEASE)


def test_the_model_catches_a_master_lease_longer_than_the_voters_wait() -> None:
    with pytest.raises(AssertionError):
        _run_model(RACE, int(LEASE * 1.1))


# A heartbeat delivered and acknowledged through the pool, then just under the master's
# lease later another node campaigns.
LATE: list[tuple[object, ...]] = [
    ("campaign", 0, {1}), ("heartbeat", 0, 1), ("deliver", 0), ("deliver", 0),
    ("tick", 300), ("tick", 300), ("tick", 50), ("tick", 50), ("tick", 50), ("tick", 50),
    ("tick", 1), ("campaign", 1, {2}), ("round", {2})]


def test_voters_counting_from_the_send_time_are_safe() -> None:
    _run_model(LATE, LEADER_LEASE)


def test_the_model_catches_a_voter_counting_from_before_the_send_time() -> None:
    with pytest.raises(AssertionError):
        _run_model(LATE, LEADER_LEASE, seen_skew=-200)


def _run_model(steps: list[tuple[object, ...]], leader_lease: int,
               seen_skew: int = 0) -> None:
    now = 0
    term = [0] * N
    voted: list[str | None] = [None] * N
    seen: list[int | None] = [None] * N
    leader: dict[int, int] = {}  # node -> the term it leads
    acked: dict[int, dict[int, int]] = {}  # leader -> peer -> send time of its newest ack
    pool: list[tuple[str, int, int, int, int]] = []  # kind, src, dst, term, sent time
    leaders_of_term: dict[int, set[int]] = {}

    def step_down(i: int) -> None:
        leader.pop(i, None)
        acked.pop(i, None)

    def adopt(i: int, t: int) -> None:
        if t > term[i]:
            term[i], voted[i] = t, None
            step_down(i)

    for action in steps:
        kind = action[0]
        if kind == "tick":
            now += int(action[1])  # type: ignore[call-overload]
        elif kind == "heartbeat":
            src, dst = int(action[1]), int(action[2])  # type: ignore[call-overload]
            if src in leader and src != dst:
                pool.append(("hb", src, dst, leader[src], now))
        elif kind == "exchange":  # heartbeat, delivered and acknowledged at once
            src, dst = int(action[1]), int(action[2])  # type: ignore[call-overload]
            if src in leader and src != dst and leader[src] >= term[dst]:
                adopt(dst, leader[src])
                seen[dst] = now
                acked[src][dst] = now
        elif kind == "round":  # every master's heartbeat to these nodes, answered at once
            reached = action[1]
            assert isinstance(reached, set)
            for src in list(leader):
                for dst in reached - {src}:
                    if src in leader and leader[src] >= term[dst]:
                        adopt(dst, leader[src])
                        seen[dst] = now
                        acked[src][dst] = now
        elif kind in ("deliver", "drop") and pool:
            msg = pool.pop(int(action[1]) % len(pool))  # type: ignore[call-overload]
            if kind == "drop":
                continue
            what, src, dst, t, sent = msg
            if what == "hb":
                if t < term[dst]:
                    pool.append(("nack", dst, src, term[dst], sent))
                    continue
                adopt(dst, t)
                # A voter counts from when the heartbeat was sent (SendTimeEstimate is
                # never earlier): the most a backlog read late may be discounted.
                at = sent + seen_skew
                seen[dst] = at if seen[dst] is None else max(seen[dst], at)
                pool.append(("ack", dst, src, t, sent))
            elif what == "ack":
                if leader.get(dst) == t:
                    acked[dst][src] = max(acked[dst].get(src, 0), sent)
            elif t > term[dst]:  # nack from a newer term
                adopt(dst, t)
        elif kind in ("campaign", "handover"):
            resigned: int | None = None
            if kind == "handover":
                old, c = int(action[1]), int(action[2])  # type: ignore[call-overload]
                voters = action[3]
                if old not in leader or c == old or term[c] != leader[old]:
                    continue  # only a node in the resigning master's term hears it
                resigned = leader[old]
                step_down(old)
            else:
                c = int(action[1])  # type: ignore[call-overload]
                voters = action[2]
                if c in leader or (seen[c] is not None and now - seen[c] < LEASE):
                    continue  # a node campaigns only after a lease without a master
            assert isinstance(voters, set)
            term[c] += 1
            voted[c] = str(c)
            votes = 1
            for v in voters - {c}:
                v_seen = now if v in leader else seen[v]
                d = decide_vote(VoterState(term[v], voted[v], ZERO, v_seen), str(c), term[c],
                                ZERO, now, LEASE, resigned_term=resigned)
                if d.term > term[v]:
                    step_down(v)
                term[v], voted[v] = d.term, d.voted_for
                votes += d.granted
            if votes >= majority(N) and term[c] == max(term):
                leader[c] = term[c]
                acked[c] = {}
                leaders_of_term.setdefault(term[c], set()).add(c)
        valid = [i for i in leader
                 if (dl := lease_deadline(now, [acked[i].get(j) for j in range(N) if j != i],
                                          N, leader_lease)) is not None and now < dl]
        assert len(valid) <= 1, (valid, now, leader, acked, seen)
        assert all(len(s) == 1 for s in leaders_of_term.values())


@given(lease=st.integers(1, 600_000), keepalive=st.integers(1, 60_000))
def test_a_retry_after_a_handover_is_spread_over_a_few_keepalives_at_most(
        lease: int, keepalive: int) -> None:
    """A member that stood and lost retries within a fifth of the lease, and after a
    handover (no lease holds votes back) within two keepalives if that is sooner."""
    normal = retry_spread(lease, keepalive, after_handover=False)
    handed = retry_spread(lease, keepalive, after_handover=True)
    assert 0 <= normal <= lease // 5
    assert handed <= normal and handed <= 2 * keepalive
    if 2 * keepalive >= lease // 5:  # a short lease: the handover changes nothing
        assert handed == normal


def test_an_eight_second_lease_retries_within_a_second_after_a_handover() -> None:
    """lease_ms = 8000, keepalive_ms = 400: the spread falls from 1.6 s to 0.8 s."""
    assert retry_spread(8000, 400, after_handover=False) == 1600
    assert retry_spread(8000, 400, after_handover=True) == 800
