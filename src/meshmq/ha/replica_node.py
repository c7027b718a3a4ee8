"""Replicated master/slave for a node of shards (``[ha] mode = "replicated"`` with
``shards = N > 1``; docs/ha.md, "A node of shards in replicated mode").

The node's **supervisor** runs the elections, with votes by node; each **shard** runs a
``ReplicatedHa`` driven by it (``DrivenRole``): shard k of the master node leads one
replication stream to shard k of every other node, which follows it into its own
journal. So a node has N streams, each with its own log positions, acknowledgements,
commit index and master lease (ha/replication.py, unchanged), and one term: the node's.

Addresses: the supervisor's election listener is ``ha.listen``; shard k's stream
listener is the port after it plus k (``shard_address``), and likewise for every
member, so no address has to be exchanged.

Safety is Raft's, per stream, with the node's term:

* one vote per term, by the supervisor, persisted before it is sent (``NodeElection``);
* before it grants a vote (or campaigns) for term T, the supervisor moves every shard to
  T (``control`` ``adopt``: the shard then refuses batches of older masters, and says
  where its log ends, in the same event-loop turn); the vote is granted only when, for
  every shard, the candidate's position is at least as up to date as this node's
  (``decide_node_vote``, ``decide_vote`` per shard). A batch committed on stream k is on
  a majority of shard-k journals, so the winner's shard k holds it: every shard of the
  new master is caught up on whatever any stream confirmed;
* no vote while any shard heard from a live master within ``lease_ms`` (counted as each
  shard's ``ReplicatedHa`` counts it), so each leading shard's lease stays valid.

A master node whose shard exits (deposed by its stream's lease, a newer term, or a
crash) stops all its shards and starts again as a follower (node/supervisor.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshmq.config.model import BrokerConfig, HaConfig
from meshmq.errors import MeshmqError
from meshmq.ha.replica_peer import Kind, split_address
from meshmq.ha.replica_wire import position
from meshmq.ha.replication import ReplicatedHa, monotonic_ms
from meshmq.ha.replication_policy import (
    Position,
    VoteDecision,
    VoterState,
    decide_vote,
    majority,
)
from meshmq.ha.roles import Role, RoleEvent
from meshmq.protocol.wire.codec import FrameType, WireFrame, decode_json, encode_json
from meshmq.tls import CertificateReloader

__all__ = ["NODE_STATE", "NodeElection", "ShardState", "decide_node_vote",
           "shard_address", "shard_ha"]

log = logging.getLogger("meshmq.ha")

NODE_STATE = "replication/node-state.json"  # under the node's data directory
# How long, in leases, an elected node keeps the others waiting while its shards start
# as masters (``NodeElection.hold``): longer than any healthy start, short enough that a
# node whose shards hang does not keep the group from electing another.
HOLD_LEASES = 10


def shard_address(addr: str, index: int) -> str:
    """Shard ``index``'s stream listener of the node whose election address is ``addr``."""
    host, port = split_address(addr)
    return f"{host}:{port + 1 + index}"


def shard_ha(config: BrokerConfig, index: int) -> HaConfig:
    """Shard ``index``'s replication: its own stream listener and node id, shard
    ``index`` of every member; it never restarts itself as a slave (its supervisor
    decides)."""
    ha = config.ha
    node_id = ha.node_id or f"{config.broker_name}@{ha.listen}"
    return dataclasses.replace(
        ha, listen=shard_address(ha.listen, index),
        members=tuple(shard_address(m, index) for m in ha.members),
        node_id=f"{node_id}/s{index}", restart_when_deposed=False)


@dataclass(frozen=True, slots=True)
class ShardState:
    """A shard's answer to its supervisor (``ReplicatedHa.control``)."""

    term: int
    last: Position
    durable: Position
    seen_ago_ms: int  # since it heard from a master (or started, or leads: 0)
    amnesiac: bool
    resigned: int | None  # the term whose master told it that it stepped down
    leader: str | None  # the master shard it follows

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ShardState:
        resigned = body.get("resigned")
        return cls(int(body["term"]), position(body["last"], "shard last"),
                   position(body["durable"], "shard durable"), int(body["seen_ago_ms"]),
                   bool(body.get("amnesiac")),
                   resigned if isinstance(resigned, int) else None,
                   str(body["leader"]) if body.get("leader") else None)


def decide_node_vote(term: int, voted_for: str | None, shards: Sequence[Position],
                     leader_seen_ms: int | None, amnesiac: bool, candidate: str,
                     cand_term: int, cand_shards: Sequence[Position], now_ms: int,
                     lease_ms: int, resigned_term: int | None = None) -> VoteDecision:
    """A node's vote: ``decide_vote`` for every shard's stream with the node's term and
    vote; granted only when every stream grants (the candidate is at least as up to
    date on each). The first refusal is the answer."""
    if len(cand_shards) != len(shards):
        return VoteDecision(False, term, voted_for,
                            f"the candidate has {len(cand_shards)} shards, this node "
                            f"{len(shards)}")
    decision: VoteDecision | None = None
    for own, theirs in zip(shards, cand_shards, strict=True):
        decision = decide_vote(VoterState(term, voted_for, own, leader_seen_ms, amnesiac),
                               candidate, cand_term, theirs, now_ms, lease_ms,
                               resigned_term=resigned_term)
        if not decision.granted:
            return decision
    assert decision is not None
    return decision


AskShards = Callable[[int | None], Awaitable[list[dict[str, Any]] | None]]


class NodeElection(ReplicatedHa):
    """The supervisor's side: its election listener, its votes and campaigns. It holds
    no journal; ``ask_shards(adopt)`` asks every shard for its state (after moving it to
    term ``adopt`` when given), None when a shard did not answer."""

    def __init__(self, config: BrokerConfig, ask_shards: AskShards, *,
                 on_lost: Callable[[str], None],
                 tls: CertificateReloader | None = None,
                 clock: Callable[[], int] = monotonic_ms) -> None:
        super().__init__(config, on_lost=on_lost, tls=tls, clock=clock)
        self._ask_shards = ask_shards
        self.count = config.shards
        self._state_path = config.data_directory / NODE_STATE
        self._votes = asyncio.Lock()  # one vote or campaign step at a time
        self.shard_states: list[ShardState] = []
        # When this node last granted a vote: the winner's shards take a moment to start
        # (new processes) before their streams reach this node's, and no other candidate
        # should depose it meanwhile, so a vote counts as hearing from a master.
        self._granted_ms = -(1 << 62)
        self._granted_term = 0  # the term of that vote
        self._positions: list[Position] = []  # the shards' logs it was elected with

    async def _start(self) -> None:
        self._load_state()
        host, port = split_address(self.ha.listen)
        try:
            self._server = await self._listen(host, port)
        except OSError as exc:
            from meshmq.errors import describe_bind_failure

            raise describe_bind_failure("replication", host, port, exc,
                                        "change [ha] listen") from None
        log.info("replication: node %s (%d shards) holding elections on %s (term %d, "
                 "%d nodes)", self.node_id, self.count, self.ha.listen, self.term, self.nodes)

    def status(self) -> dict[str, object]:
        return {"mode": self.mode, "role": self.role.value, "node_id": self.node_id,
                "raft": self.kind.value, "term": self.term, "epoch": self.term,
                "holder_id": self.node_id, "took_over_from": self.took_over_from,
                "leader": self.leader_id, "elections": self.elections,
                "lease_ms": self.ha.lease_ms, "synchronous": self.ha.synchronous,
                "shards": [{"term": s.term, "last": list(s.last), "durable": list(s.durable),
                            "seen_ago_ms": s.seen_ago_ms} for s in self.shard_states]}

    # ------------------------------------------------------------ shards
    async def _shards(self, adopt: int | None) -> list[ShardState] | None:
        """Every shard's state (moved to term ``adopt`` first); the caller holds
        ``_votes``. A shard term above the node's is the node's term from now on (a
        master elected without this node's vote, or a vote whose answer never left)."""
        answers = await self._ask_shards(adopt)
        if answers is None:
            return None
        try:
            states = [ShardState.parse(a) for a in answers]
        except (KeyError, TypeError, ValueError, MeshmqError) as exc:
            log.warning("replication: a shard's state is not readable (%r)", exc)
            return None
        self.shard_states = states
        leaders = {s.leader.rpartition("/s")[0] for s in states if s.leader}
        if len(leaders) == 1 and self.kind is not Kind.LEADER:
            self.leader_id = self.followed = leaders.pop()
        newest = max(s.term for s in states)
        if newest > self.term:
            self.term, self.voted_for = newest, None
            self._save_state()
        if self.amnesiac and all((s.leader is not None or s.resigned is not None)
                                 and not s.amnesiac for s in states):
            # Every shard (all started by this supervisor) followed a master since: the
            # node is up to date again. Until then a lost state file must not let it vote
            # twice in a term its shards already adopted. A shard whose master resigned
            # follows nobody now but did follow it: a master that ran for less than one
            # look of this supervisor must not leave the node unable to vote for ever.
            self.amnesiac = False
            self._save_state()
        return states

    def _seen(self, states: Sequence[ShardState]) -> int:
        now = self._clock()
        if self.kind is Kind.LEADER:
            return now
        # A vote stands in for the winner's streams until they arrive; once a shard heard
        # the winner resign, it no longer does (the others' own streams still count
        # until each is told), or a node whose term moved on since (its own candidacy)
        # would refuse every successor for a lease after a graceful handover.
        granted = self._granted_ms if not any(
            s.resigned is not None and s.resigned >= self._granted_term for s in states) \
            else -(1 << 62)
        return max([self._started_ms, granted, *(now - s.seen_ago_ms for s in states)])

    # ------------------------------------------------------------ votes (voter)
    async def _on_frame(self, frame: WireFrame, writer: asyncio.StreamWriter) -> None:
        if frame.type is FrameType.REPL_VOTE_REQUEST:
            answer = await self._on_node_vote(decode_json(frame))
            writer.write(encode_json(FrameType.REPL_VOTE, answer))
        else:  # a stream sent to the node's address instead of a shard's
            writer.write(encode_json(FrameType.REFUSE, {
                "reason": "this is a node's election address; shard k's stream goes to "
                          "the port after it plus k"}))
            writer.close()

    async def _on_node_vote(self, req: dict[str, Any]) -> dict[str, Any]:
        candidate = str(req.get("candidate"))
        term = int(req.get("term", 0))
        pre = bool(req.get("pre"))
        resigned = req.get("resigned")
        resigned_term = resigned if isinstance(resigned, int) else None
        raw = req.get("shards")
        if not isinstance(raw, list):
            return {"term": self.term, "granted": False,
                    "reason": "not a node of shards (no shard positions)"}
        theirs = [position(p, "vote request shard position") for p in raw]
        async with self._votes:
            if not pre and term == self.term and candidate == self.voted_for \
                    and candidate != self.node_id:
                # The node this one elected, asking again while its shards start as
                # masters (``hold``): the same vote, and another lease of waiting.
                self._timer_base = self._granted_ms = self._clock()
                self._granted_term = self.term
                return {"term": self.term, "granted": True, "reason": "granted"}
            states = await self._shards(None)
            if states is None:
                return {"term": self.term, "granted": False,
                        "reason": "a shard of this node is not answering"}
            seen = self._seen(states)
            d = self._decide(states, seen, candidate, term, theirs, resigned_term)
            if not pre and (d.granted or d.term > self.term):
                # Every shard moves to the term first (older masters refused from now
                # on), and the positions it reports then are the ones that count. The
                # node's term moves with its shards; the vote is still judged from the
                # term it was in (a master of that term that resigned hands over at
                # once), unless a shard was already beyond the candidate's term.
                voter = (self.term, self.voted_for)
                states = await self._shards(d.term)
                if states is None:
                    return {"term": self.term, "granted": False,
                            "reason": "a shard of this node is not answering"}
                if self.term > d.term:
                    voter = (self.term, self.voted_for)
                d = self._decide(states, seen, candidate, term, theirs, resigned_term,
                                 voter=voter)
            if not pre and d.term >= self.term and \
                    (d.term, d.voted_for) != (self.term, self.voted_for):
                self.term, self.voted_for = d.term, d.voted_for
                self._save_state()  # before the answer leaves: one vote per term, ever
                if d.granted:
                    self._timer_base = self._granted_ms = self._clock()
                    self._granted_term = d.term
        log.info("vote %s: %s for %s in term %d (%s)", "pre-check" if pre else "request",
                 "granted" if d.granted else "refused", candidate, term, d.reason)
        return {"term": self.term, "granted": d.granted, "reason": d.reason}

    def _decide(self, states: Sequence[ShardState], seen: int, candidate: str, term: int,
                theirs: Sequence[Position], resigned: int | None,
                voter: tuple[int, str | None] | None = None) -> VoteDecision:
        """``voter``: the node's (term, vote) to judge from; its current ones by default."""
        own_term, voted_for = voter if voter is not None else (self.term, self.voted_for)
        return decide_node_vote(
            own_term, voted_for, [s.last for s in states], seen,
            self.amnesiac or any(s.amnesiac for s in states), candidate, term, theirs,
            self._clock(), self.ha.lease_ms, resigned_term=resigned)

    # ------------------------------------------------------------ campaigns
    async def acquire(self) -> bool:
        """Follow (the shards follow the master's streams) until this node was elected
        (True) or stop(). A node campaigns once no shard heard from a master for
        ``lease_ms``, or at once when the master's shards said they handed over."""
        if self._stop.is_set():  # stopped while its shards were starting
            return False
        await self._start()
        if self._stop.is_set():  # stopped while the listener opened: stop() ended the role
            if self._server is not None:  # opened after stop() looked for it
                self._server.close()
            return False
        self.machine.fire(RoleEvent.WAIT)
        if self.witness:  # node/witness.py: its streams record positions only
            await self._stop.wait()
            self.machine.fire(RoleEvent.STOP)
            return False
        if not self.ha.can_be_master:
            log.info("slave: can_be_master = false: this node's shards keep a copy and it "
                     "votes, and never takes over")
            await self._stop.wait()
            self.machine.fire(RoleEvent.STOP)
            return False
        log.info("slave: the replicated master role is decided by election; no client "
                 "connectors are started until this node is master")
        lease = self.ha.lease_ms
        step = max(0.02, min(self.ha.keepalive_ms, lease // 4) / 1000)
        jitter = random.randint(0, lease // 5)
        while not self._stop.is_set():
            async with self._votes:
                states = await self._shards(None)
            if states is not None:
                handed = any(s.resigned is not None and s.resigned >= self.term
                             for s in states)
                due = max(self._seen(states), self._timer_base) + lease + jitter
                if handed or self._clock() >= due:
                    resigned = max(s.resigned for s in states if s.resigned is not None) \
                        if handed else None
                    won = await self._node_campaign(states, resigned)
                    if self._stop.is_set():
                        # SIGTERM during the campaign: stop() ended the role already; a
                        # node that is stopping takes no master role, won or not (the
                        # others elect again once its vote's lease ran out).
                        self.kind = Kind.FOLLOWER
                        break
                    if won:
                        self.kind = Kind.LEADER
                        self.took_over_from = self.followed
                        self.leader_id = self.node_id
                        if self.amnesiac:
                            # Elected by a majority: its shards' logs are the cluster's.
                            # Kept, the flag would outlive a lost master role, and such
                            # a node refuses every candidate with data: with one other
                            # node left the cluster could never elect again.
                            self.amnesiac = False
                            self._save_state()
                        self.machine.fire(RoleEvent.ACQUIRED)
                        self.became_master_ms = self._clock()
                        log.info("master: node elected for term %d (shards' logs at %s)",
                                 self.term, ", ".join(str(s.durable) for s in states))
                        return True
                    # Not elected (votes split, or no quorum): again after a short
                    # random pause.
                    jitter = self._retry_later(after_handover=resigned is not None)
            await self._pause(step)
        if self.role in (Role.STARTING, Role.SLAVE):
            self.machine.fire(RoleEvent.STOP)
        return False

    async def _node_campaign(self, states: list[ShardState], resigned: int | None) -> bool:
        need = majority(self.nodes)
        pre = await self._node_votes(self.term + 1, True, [s.durable for s in states],
                                     resigned)
        if pre is None or pre < need or self._stop.is_set():
            return False
        async with self._votes:
            term = self.term + 1
            adopted = await self._shards(term)  # own shards refuse older masters now
            if adopted is None or self.term > term:
                return False
            self.term, self.voted_for = term, self.node_id
            self.kind = Kind.CANDIDATE
            self._save_state()
        self.elections += 1
        positions = self._positions = [s.durable for s in adopted]
        log.info("candidate: asking for votes in term %d (shards' logs at %s)", term,
                 ", ".join(str(p) for p in positions))
        got = await self._node_votes(term, False, positions, resigned)
        if got is None or self.term != term or self.kind is not Kind.CANDIDATE:
            self.kind = Kind.FOLLOWER
            return False
        if got < need:
            log.info("candidate: %d of %d votes in term %d; not elected", got, self.nodes,
                     term)
            self.kind = Kind.FOLLOWER
            return False
        return True

    async def _node_votes(self, term: int, pre: bool, positions: list[Position],
                          resigned: int | None) -> int | None:
        """Votes granted (this node's included), or None when a higher term was seen
        (adopted here, under ``_votes``)."""
        frame = encode_json(FrameType.REPL_VOTE_REQUEST, {
            "term": term, "candidate": self.node_id, "pre": pre, "resigned": resigned,
            "shards": [list(p) for p in positions]})
        need = majority(self.nodes)
        asks = [asyncio.ensure_future(self._ask(m, frame)) for m in self.ha.members]
        granted = 1
        higher = 0
        try:
            for left, next_answer in enumerate(asyncio.as_completed(asks)):
                a = await next_answer
                if a is not None:
                    if int(a.get("term", 0)) > self.term and not a.get("granted"):
                        higher = int(a["term"])
                        break
                    if a.get("granted"):
                        granted += 1
                if granted >= need or granted + len(asks) - left - 1 < need:
                    break
        finally:
            for ask in asks:
                ask.cancel()
        if higher:
            async with self._votes:
                if higher > self.term:
                    self.term, self.voted_for = higher, None
                    self._save_state()
                self.kind = Kind.FOLLOWER
            return None
        return granted

    # ------------------------------------------------------------ the master's shards start
    async def hold(self) -> None:
        """Run (until cancelled) while this elected node restarts its shards as the
        masters of their streams. Those are new processes: until they lead, the other
        nodes hear from no master, and once ``lease_ms`` passed after their vote they
        would elect again, so a node whose shards start slower than a lease would lose
        every election it wins. Every ``keepalive_ms`` it repeats its vote request in its
        term; a node that granted it grants it again and waits another lease. After
        ``HOLD_LEASES`` leases it stops asking: shards that never start must not keep
        the group from electing another master."""
        frame = encode_json(FrameType.REPL_VOTE_REQUEST, {
            "term": self.term, "candidate": self.node_id, "pre": False, "resigned": None,
            "shards": [list(p) for p in self._positions]})
        deadline = self._clock() + HOLD_LEASES * self.ha.lease_ms
        while self.kind is Kind.LEADER and self._clock() < deadline:
            await asyncio.gather(*(self._ask(m, frame) for m in self.ha.members))
            await asyncio.sleep(self.ha.keepalive_ms / 1000)

    # ------------------------------------------------------------ stop
    def lose(self, why: str) -> None:
        """The master node's shards are gone or deposed: it is no master any more."""
        if self.role is Role.MASTER:
            self.kind = Kind.FOLLOWER
            self.machine.fire(RoleEvent.LOST)
            log.error("deposed: %s (term %d); the node stops its shards", why, self.term)
            self._on_lost(why)

    async def stop(self) -> None:
        """Close the election listener (the shards hand their streams over themselves)."""
        self._stop.set()
        if self.role is Role.MASTER:
            self.machine.fire(RoleEvent.STOP)
            self.machine.fire(RoleEvent.RELEASED)
        elif self.role is not Role.STOPPED:
            self.machine.fire(RoleEvent.STOP)
        self.kind = Kind.FOLLOWER
        await self._close_listener_and_tasks()

