"""Pure decisions of replicated master/slave (Raft-style), with no I/O and no clock of
their own, so Hypothesis can check them (tests/unit/ha/test_replicated_policy.py).

A node's log position is ``(term, index)`` of the last batch it has on disk; positions
compare as tuples (Raft's "at least as up to date"). A witness keeps positions only.

Safety rests on three rules:

* **Votes** (``decide_vote``): one vote per term, persisted before it is sent; only for a
  candidate whose log is at least as up to date; and never while this node heard from a
  live master less than ``lease_ms`` ago, so a master's lease (below) stays valid, unless
  that master resigned. "Heard from" counts from when the message was *sent*, as far as
  the voter can tell (``SendTimeEstimate``): a backlog of heartbeats read late after the
  master died must not keep refusing votes.
* **Master lease** (``lease_deadline``): a master counts, for each node, the send time
  of the newest heartbeat that node acknowledged; once a majority's newest
  acknowledged send time is ``lease_ms`` old it stops accepting writes. A voter that saw
  that heartbeat refuses votes for ``lease_ms`` after *receiving* it, which is later
  than it was sent, so a new master is elected only after the old one stepped down.
* **Commit** (``commit_index``): a batch counts as durable once a majority of all
  nodes (master included) acknowledged it on disk.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

Position = tuple[int, int]  # (term, index) of the newest batch a node has on disk
ZERO: Position = (0, 0)
# The position of a journal written before replication was turned on: real batches have
# terms >= 1, so (0, n > 0) is never part of a replicated history and always gets a
# snapshot rather than a stream.
ADOPTED: Position = (0, 1)
_INDEX_BITS = 40


def pack_position(pos: Position) -> int:
    """One non-negative int64 that orders like the position (kept as a journal mark)."""
    term, index = pos
    if not (0 <= term < 1 << (63 - _INDEX_BITS) and 0 <= index < 1 << _INDEX_BITS):
        raise ValueError(f"log position {pos} out of range")
    return term << _INDEX_BITS | index


def unpack_position(value: int) -> Position:
    return value >> _INDEX_BITS, value & ((1 << _INDEX_BITS) - 1)


def majority(nodes: int) -> int:
    return nodes // 2 + 1


@dataclass(frozen=True, slots=True)
class VoterState:
    term: int
    voted_for: str | None
    last: Position
    leader_seen_ms: int | None  # when this node last heard from a live master (or is one)
    # No state of its own (a new node, or one whose directory was lost) and no master
    # heard since: it cannot know what it promised before.
    amnesiac: bool = False


@dataclass(frozen=True, slots=True)
class VoteDecision:
    granted: bool
    term: int  # this node's term afterwards (persist before replying when it changed)
    voted_for: str | None
    reason: str


def decide_vote(state: VoterState, candidate: str, term: int, last: Position,
                now_ms: int, lease_ms: int, resigned_term: int | None = None) -> VoteDecision:
    """``resigned_term``: the candidate was told by the master of that term that it
    stepped down (a graceful handover, Raft's leadership transfer). A master that
    resigned accepts no more writes, so its lease need not be waited out: a voter still
    in that term votes at once."""
    handed_over = resigned_term is not None and resigned_term == state.term
    if not handed_over and state.leader_seen_ms is not None \
            and now_ms - state.leader_seen_ms < lease_ms:
        # Not even the term moves: a node that cannot reach the master must not depose
        # it by bumping terms (its lease is still valid here).
        return VoteDecision(False, state.term, state.voted_for, "a master is alive")
    if term < state.term:
        return VoteDecision(False, state.term, state.voted_for, "stale term")
    voted_for = state.voted_for if term == state.term else None
    if voted_for is not None and voted_for != candidate:
        return VoteDecision(False, term, voted_for, f"already voted for {voted_for}")
    if last < state.last:
        return VoteDecision(False, term, voted_for, "candidate log is behind")
    if state.amnesiac and last > ADOPTED:
        # A node that lost its state may have promised (or recorded) more than this
        # candidate holds: it votes only in a cluster that has never written (a new one)
        # until a master has brought it up to date. A candidate with the newest log
        # still wins with the other nodes' votes.
        return VoteDecision(False, term, voted_for, "this node has no state of its own "
                            "yet (new or wiped): it votes only once a master has "
                            "brought it up to date")
    return VoteDecision(True, term, candidate, "granted")


class SendTimeEstimate:
    """When, on this node's monotonic clock, a master sent a message stamped with its own
    clock: at the earliest ``stamp + offset``, ``offset`` being the smallest ``received -
    stamp`` seen over the last ``window_ms``. That offset is the clocks' difference plus
    the quickest delivery, so the estimate never comes before the true send time (what
    the lease rule needs), while a message that waited in a buffer counts from when it
    was sent, not from when it was read. The window bounds the error of clocks that
    drift apart (ppm: microseconds over the window)."""

    def __init__(self, window_ms: int = 10_000) -> None:
        self.window_ms = window_ms
        self._mins: deque[tuple[int, int]] = deque()  # (received, offset), offsets rising

    def reset(self) -> None:
        """A new master (another process, another clock)."""
        self._mins.clear()

    def sent_at(self, stamp: int, received: int) -> int:
        offset = received - stamp
        mins = self._mins
        while mins and mins[-1][1] >= offset:
            mins.pop()
        mins.append((received, offset))
        while mins[0][0] < received - self.window_ms:
            mins.popleft()
        return stamp + mins[0][1]


def commit_index(own: int, matches: Sequence[int], nodes: int) -> int:
    """The highest index a majority of ``nodes`` has on disk (``own``: the master's)."""
    known = sorted([own, *matches], reverse=True)
    need = majority(nodes)
    return known[need - 1] if len(known) >= need else 0


def retry_spread(lease_ms: int, keepalive_ms: int, *, after_handover: bool) -> int:
    """How far (ms) a member that stood and was not elected spreads its next try at random
    (Raft's randomized election timeout, which splits votes rarely twice in a row). After
    a handover no lease holds the votes back, so the spread is a few keepalives at most:
    two members told at once split their votes, and neither should then wait most of a
    lease. Otherwise a fifth of the lease, as the first try's jitter."""
    spread = lease_ms // 5
    return min(spread, 2 * keepalive_ms) if after_handover else spread


def lease_deadline(now_ms: int, acked_sent_ms: Sequence[int | None], nodes: int,
                   lease_ms: int) -> int | None:
    """When the master must stop accepting writes; None when a majority never answered.
    ``acked_sent_ms``: per other node, the send time of its newest acknowledged message."""
    known = sorted([now_ms, *(t for t in acked_sent_ms if t is not None)], reverse=True)
    need = majority(nodes)
    if len(known) < need:
        return None
    return known[need - 1] + lease_ms


class Catchup(enum.Enum):
    STREAM = "stream"  # send the retained batches after the follower's position
    SNAPSHOT = "snapshot"  # that history is gone (or diverged): copy the live store


@dataclass(slots=True)
class _Entry:
    term: int
    payload: bytes


class RetainedLog:
    """The master's recent batches in memory, for followers that fall behind. ``base`` is
    the position just before the first retained batch (the master's position when it
    took over, or the newest batch trimmed away)."""

    def __init__(self, base: Position, budget_bytes: int) -> None:
        self.base = base
        self.budget = budget_bytes
        self._entries: deque[_Entry] = deque()
        self._bytes = 0

    @property
    def last(self) -> Position:
        if self._entries:
            return self._entries[-1].term, self.base[1] + len(self._entries)
        return self.base

    def append(self, term: int, payload: bytes) -> int:
        if term < self.last[0]:
            raise ValueError("terms in a log never decrease")
        self._entries.append(_Entry(term, payload))
        self._bytes += len(payload)
        index = self.last[1]
        # Keep the newest batch even when it alone exceeds the budget.
        while self._bytes > self.budget and len(self._entries) > 1:
            old = self._entries.popleft()
            self._bytes -= len(old.payload)
            self.base = (old.term, self.base[1] + 1)
        return index

    def term_at(self, index: int) -> int | None:
        """The term of the batch at ``index`` when known (retained, or the base)."""
        if index == self.base[1]:
            return self.base[0]
        pos = index - self.base[1] - 1
        if 0 <= pos < len(self._entries):
            return self._entries[pos].term
        return None

    def after(self, index: int) -> Iterator[tuple[Position, bytes]]:
        """Retained batches with a higher index, oldest first."""
        start = max(0, index - self.base[1])
        for i in range(start, len(self._entries)):
            e = self._entries[i]
            yield (e.term, self.base[1] + 1 + i), e.payload

    def plan(self, follower: Position) -> Catchup:
        """Stream when this log holds the follower's position (the logs then agree up to
        it: Raft's log matching), else send a snapshot."""
        term = self.term_at(follower[1])
        if follower[0] == 0 and follower[1] > 0:
            return Catchup.SNAPSHOT  # ADOPTED data: nobody else's history
        if term is not None and term == follower[0]:
            return Catchup.STREAM
        return Catchup.SNAPSHOT
