"""Replicated master/slave (``[ha] mode = "replicated"``, docs/ha.md): every node keeps
its own journal; the master streams each write batch to the others; writes and
takeovers need a majority. The decisions are pure (``replication_policy``); this module
does the I/O: the replication listener, elections, streaming, snapshots.

One asyncio object per broker process plays both sides:

* **follower** (a slave): applies the master's batches to its journal, acknowledges
  each once it is on disk, votes; campaigns when it has not heard from a master for
  ``lease_ms`` (after a pre-vote, so a node cut off alone never disturbs the others);
* **leader** (the master): one replicator task per member streams the retained batches
  (or a snapshot of the live store when those are gone); ``sync()`` of the store
  completes once a majority has the batch on disk; it steps down when a majority has
  not answered for ``lease_ms`` (see the lease rule in ``replication_policy``).
* a **witness** only votes and acknowledges heartbeats; it stores its term and vote.

Each batch's log position is kept in the journal itself, as the ``last_seq`` of the
reserved key ``REPL_KEY`` written in the same record, so data and position never
disagree after a crash. A snapshot is written into a new journal directory
(``gen-<n>``) and switched to by renaming a pointer file, so a crash mid-copy leaves the
old journal in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshmq.config.model import BrokerConfig
from meshmq.errors import MeshmqError, StoreError
from meshmq.ha.replica_files import Generations, write_atomic
from meshmq.ha.replica_ops import decode_ops, encode_ops
from meshmq.ha.replica_store import ReplicatedStore
from meshmq.ha.replica_wire import (
    decode_append,
    decode_mixed,
    encode_append,
    encode_mixed,
    position,
)
from meshmq.ha.replication_policy import (
    ADOPTED,
    ZERO,
    Catchup,
    Position,
    RetainedLog,
    VoterState,
    commit_index,
    decide_vote,
    lease_deadline,
    majority,
    pack_position,
    unpack_position,
)
from meshmq.ha.roles import Role, RoleEvent, RoleMachine
from meshmq.protocol.wire.codec import (
    MAGIC,
    FrameType,
    WireDecoder,
    WireFrame,
    decode_json,
    encode_json,
)
from meshmq.store.base import (
    AddMessage,
    PutDurableSubscription,
    Recovery,
    SetDeliveryCount,
    StoredEntry,
    StoreOp,
)
from meshmq.store.fence import FencedError
from meshmq.store.journal import JournalStore

log = logging.getLogger("meshmq.ha")

REPL_KEY = "\x00meshmq:replication"  # journal key whose last_seq is the log position
STATE_FILE = "repl-state.json"
_SEND_BYTES = 1 << 20  # batches per APPEND frame, by payload bytes
_SNAPSHOT_PART_BYTES = 4 << 20
LEADER_LEASE_SHARE = 0.9  # the master gives up a little before voters would vote again


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Kind(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


@dataclass(slots=True)
class _Peer:
    addr: str
    match: int = 0  # highest index known on its disk and agreeing with ours
    acked_sent_ms: int | None = None  # send time of the newest message it answered
    last: Position | None = None  # its position, from its newest answer
    witness: bool = False
    mismatch: bool = False
    closed: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None


class ReplicatedHa:
    """The HA controller of mode ``replicated`` (same surface as ``HaController``)."""

    mode = "replicated"

    def __init__(self, config: BrokerConfig, *, on_lost: Callable[[str], None],
                 clock: Callable[[], int] = _now_ms) -> None:
        ha = config.ha
        self.config = config
        self.ha = ha
        self.witness = ha.role == "witness"
        self.node_id = ha.node_id or f"{config.broker_name}@{ha.listen}"
        self.nodes = len(ha.members) + 1
        self.machine = RoleMachine()
        self._on_lost = on_lost
        self._clock = clock
        base = (config.data_directory / "witness") if self.witness else config.store_directory
        self.generations = Generations(base)
        self._state_path = base / STATE_FILE
        self.term = 0
        self.voted_for: str | None = None
        self.kind = Kind.FOLLOWER
        self.leader_id: str | None = None
        self.leader_seen_ms: int | None = None
        # A node that just started campaigns soon (after two heartbeat intervals, time
        # for a live master to reach it first): its pre-vote is refused anyway while a
        # master is alive, and a cluster starting from scratch elects at once.
        self._timer_base = clock() - ha.lease_ms + 2 * ha.keepalive_ms
        self.journal: JournalStore | None = None
        self.last: Position = ZERO  # newest batch written to the journal
        self.durable: Position = ZERO  # newest batch known to be on disk
        self.commit = 0
        self.retained: RetainedLog | None = None
        self._peers: dict[str, _Peer] = {}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._server: asyncio.Server | None = None
        self._stop = asyncio.Event()
        self._elect_now = asyncio.Event()
        self._closing = False  # deposed: the runtime is closing this node's journal
        self._tasks: set[asyncio.Task[Any]] = set()
        self._snapshot: tuple[JournalStore, Path] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.became_master_ms: int | None = None
        self.elections = 0
        self.snapshots_sent = 0
        self.snapshots_installed = 0
        self.store = ReplicatedStore(self)

    # ------------------------------------------------------------ state and status
    @property
    def deposed(self) -> bool:
        return self._closing

    @property
    def role(self) -> Role:
        return self.machine.role

    def status(self) -> dict[str, object]:
        dl = self._deadline()
        return {"mode": self.mode, "role": self.role.value, "node_id": self.node_id,
                "witness": self.witness, "raft": self.kind.value, "term": self.term,
                "epoch": self.term, "holder_id": self.node_id,
                "leader": self.leader_id, "last": list(self.last),
                "durable": list(self.durable), "commit": self.commit,
                "writable": self._writable(), "synchronous": self.ha.synchronous,
                "lease_ms": self.ha.lease_ms, "elections": self.elections,
                "lease_left_ms": (dl - self._clock()) if dl is not None else None,
                "snapshots_sent": self.snapshots_sent,
                "snapshots_installed": self.snapshots_installed,
                "members": {p.addr: {"match": p.match, "witness": p.witness,
                                     "last": list(p.last) if p.last else None}
                            for p in self._peers.values()}}

    def _load_state(self) -> None:
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        if self._state_path.exists():
            try:
                raw = json.loads(self._state_path.read_text())
                self.term = int(raw["term"])
                self.voted_for = raw.get("voted_for")
                if self.witness:
                    self.last = self.durable = position(raw.get("last", [0, 0]), "last")
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(f"{self._state_path} is damaged ({exc!r}); refusing to "
                                 "guess the term: a node could vote twice") from None

    def _save_state(self) -> None:
        state: dict[str, Any] = {"term": self.term, "voted_for": self.voted_for}
        if self.witness:
            state["last"] = list(self.last)
        write_atomic(self._state_path, json.dumps(state).encode())

    def _open_journal(self, path: Path) -> JournalStore:
        store = self.config.store
        journal = JournalStore(path, segment_size=store.segment_size, fsync=store.fsync,
                               max_batch_bytes=store.max_batch_bytes,
                               compact_live_ratio=store.compact_live_ratio)
        journal.open()
        return journal

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ lifecycle
    async def _start(self) -> None:
        self._load_state()
        if not self.witness:
            self.journal = await asyncio.to_thread(self._open_journal,
                                                   self.generations.current())
            mark = self.journal.key_info(REPL_KEY).last_seq
            self.last = self.durable = unpack_position(mark)
            if mark == 0 and self.journal.key_names():
                # Data written without replication (see Generations): ahead of an empty
                # node, and never taken for anybody else's history (ADOPTED).
                self.last = self.durable = ADOPTED
        host, port = _split(self.ha.listen)
        self._server = await asyncio.start_server(self._serve, host, port,
                                                  reuse_address=True)
        log.info("replication: node %s listening on %s (term %d, log at %s, %d nodes)",
                 self.node_id, self.ha.listen, self.term, self.last, self.nodes)

    async def acquire(self) -> bool:
        """Follow until this node is master with a majority behind it (True) or stop()."""
        await self._start()
        self.machine.fire(RoleEvent.WAIT)
        if self.witness:
            log.info("witness: voting in elections of %s; stores no messages",
                     ", ".join(self.ha.members))
            await self._stop.wait()
            self.machine.fire(RoleEvent.STOP)
            return False
        if not self.ha.can_be_master:
            log.info("slave: can_be_master = false: this node keeps a copy and votes, and "
                     "never takes over")
            await self._stop.wait()
            self.machine.fire(RoleEvent.STOP)
            return False
        log.info("slave: the replicated master role is decided by election; no client "
                 "connectors are started until this broker is master")
        lease = self.ha.lease_ms
        jitter = random.randint(0, lease // 5)
        while not self._stop.is_set():
            seen = self.leader_seen_ms if self.leader_seen_ms is not None else 0
            due = max(seen, self._timer_base) + lease + jitter
            if not self._elect_now.is_set() and self._clock() < due:
                await self._pause(min(0.05, max(0.0, (due - self._clock()) / 1000)))
                continue
            self._elect_now.clear()
            if await self._campaign() and await self._lead():
                self.machine.fire(RoleEvent.ACQUIRED)
                self.became_master_ms = self._clock()
                log.info("master: elected for term %d with the log at %s", self.term,
                         self.last)
                return True
            # Lost or no quorum: try again after a short random pause.
            self._timer_base = self._clock() - lease + random.randint(50, 50 + lease // 5)
            jitter = random.randint(0, lease // 5)
        if self.role in (Role.STARTING, Role.SLAVE):
            self.machine.fire(RoleEvent.STOP)
        return False

    async def _pause(self, seconds: float) -> None:
        waits = [asyncio.ensure_future(self._stop.wait()),
                 asyncio.ensure_future(self._elect_now.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def stop(self) -> None:
        """Hand over (master: after the store closed) and close everything."""
        self._stop.set()
        if self.kind is Kind.LEADER and self.role is Role.MASTER:
            self.machine.fire(RoleEvent.STOP)
            await self._hand_over()
            self.machine.fire(RoleEvent.RELEASED)
        elif self.role is not Role.STOPPED:
            self.machine.fire(RoleEvent.STOP)
        self._step_down_internal(FencedError("this broker is stopping"))
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
            self._server = None
        if self._snapshot is not None:
            with contextlib.suppress(StoreError):
                await self._snapshot[0].close()
            self._snapshot = None
        if self.journal is not None:
            with contextlib.suppress(StoreError):
                await self.journal.close()

    async def _hand_over(self) -> None:
        """Graceful stop: let the followers catch up (bounded), then tell them to elect
        a successor at once instead of waiting for the lease to run out."""
        deadline = self._clock() + self.ha.lease_ms
        data = [p for p in self._peers.values() if not p.witness]
        while self._clock() < deadline and any(p.match < self.last[1] and not p.closed
                                               for p in data):
            await asyncio.sleep(0.01)
        frame = encode_append(self._head(self.last, resign=True), [])
        for p in self._peers.values():
            if p.writer is not None and not p.closed:
                with contextlib.suppress(Exception):
                    p.writer.write(frame)
                    await asyncio.wait_for(p.writer.drain(), 1)
        log.info("handed the replicated master role over (term %d, log at %s)", self.term,
                 self.last)

    # ------------------------------------------------------------ elections
    async def _ask(self, addr: str, frame: bytes) -> dict[str, Any] | None:
        host, port = _split(addr)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.ha.lease_ms / 2000):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(MAGIC + self._hello() + frame)
                decoder = WireDecoder(expect_magic=False)
                while True:
                    data = await reader.read(65536)
                    if not data:
                        return None
                    for f in decoder.feed(data):
                        if f.type is FrameType.REPL_VOTE:
                            return decode_json(f)
        except (OSError, TimeoutError, MeshmqError):
            return None
        finally:
            if writer is not None:
                writer.close()

    async def _poll_votes(self, term: int, pre: bool) -> int | None:
        """Votes granted (this node's included), or None when a higher term was seen."""
        frame = encode_json(FrameType.REPL_VOTE_REQUEST, {
            "term": term, "candidate": self.node_id, "last": list(self.durable),
            "pre": pre})
        answers = await asyncio.gather(*(self._ask(m, frame) for m in self.ha.members))
        granted = 1
        for a in answers:
            if a is None:
                continue
            if int(a.get("term", 0)) > self.term and not a.get("granted"):
                self._adopt_term(int(a["term"]))
                return None
            if a.get("granted"):
                granted += 1
        return granted

    async def _campaign(self) -> bool:
        need = majority(self.nodes)
        pre = await self._poll_votes(self.term + 1, pre=True)
        if pre is None or pre < need or self._stop.is_set():
            return False
        self.term += 1
        self.voted_for = self.node_id
        self.kind = Kind.CANDIDATE
        self._save_state()
        self.elections += 1
        term = self.term
        log.info("candidate: asking for votes in term %d (log at %s)", term, self.durable)
        got = await self._poll_votes(term, pre=False)
        if got is None or self.term != term or self.kind is not Kind.CANDIDATE:
            self.kind = Kind.FOLLOWER
            return False
        if got < need:
            log.info("candidate: %d of %d votes in term %d; not elected", got, self.nodes,
                     term)
            self.kind = Kind.FOLLOWER
            return False
        return True

    def _adopt_term(self, term: int) -> None:
        """A newer term exists: remember it (no vote yet) and follow."""
        if term > self.term:
            self.term = term
            self.voted_for = None
            self._save_state()
        if self.kind is Kind.LEADER:
            self._lose(f"a newer master exists (term {term})")
        self.kind = Kind.FOLLOWER

    async def _lead(self) -> bool:
        """Become leader of the current term: replicate a term-start batch and wait for a
        majority to have it (which also commits everything before it)."""
        journal = self.journal
        assert journal is not None
        await journal.sync()
        self.durable = self.last
        self.kind = Kind.LEADER
        self.leader_id = self.node_id
        self.leader_seen_ms = self._clock()
        self.retained = RetainedLog(self.last, self.ha.log_retain_bytes)
        self.commit = 0
        self._peers = {m: _Peer(m) for m in self.ha.members}
        for p in self._peers.values():
            p.task = asyncio.get_running_loop().create_task(self._replicate(p, self.term))
            self._tasks.add(p.task)
            p.task.add_done_callback(self._tasks.discard)
        self._lease_task = asyncio.get_running_loop().create_task(self._watch_lease())
        self._tasks.add(self._lease_task)
        self._lease_task.add_done_callback(self._tasks.discard)
        index = self._append([])
        try:
            async with asyncio.timeout(2 * self.ha.lease_ms / 1000):
                await self._sync_own(journal)
                await self._wait_commit(index)
        except (TimeoutError, StoreError) as exc:
            log.warning("elected for term %d but no majority stored its first batch (%s); "
                        "following again", self.term, exc if str(exc) else "timeout")
            self._step_down_internal(FencedError("no majority"))
            return False
        return self.kind is Kind.LEADER and not self._stop.is_set()

    # ------------------------------------------------------------ leader: write path
    def _deadline(self) -> int | None:
        if self.kind is not Kind.LEADER:
            return None
        return lease_deadline(self._clock(), [p.acked_sent_ms for p in self._peers.values()],
                              self.nodes, int(self.ha.lease_ms * LEADER_LEASE_SHARE))

    def _writable(self) -> bool:
        dl = self._deadline()
        return (self.role is Role.MASTER and not self._closing and dl is not None
                and self._clock() < dl)

    def _append(self, ops: list[StoreOp]) -> int:
        journal, retained = self.journal, self.retained
        assert journal is not None and retained is not None
        pos = (self.term, self.last[1] + 1)
        payload = encode_ops(ops)
        journal.write(ops, {REPL_KEY: pack_position(pos)})
        retained.append(self.term, payload)
        self.last = pos
        for p in self._peers.values():
            p.wake.set()
        return pos[1]

    def replicate(self, ops: list[StoreOp]) -> None:
        if self.kind is not Kind.LEADER or self._closing or self.journal is None:
            raise FencedError("this broker is no longer the replicated master")
        dl = self._deadline()
        if dl is None or self._clock() >= dl:
            self._lose("no majority answered within the lease")
            raise FencedError("this broker lost its majority; it no longer accepts writes")
        self._append(ops)

    async def sync(self) -> None:
        journal = self.journal
        if journal is None:
            raise StoreError("replicated store is not open")
        target = self.last[1]
        await self._sync_own(journal)
        if self.ha.synchronous:
            await self._wait_commit(target)

    async def _sync_own(self, journal: JournalStore) -> None:
        pos = self.last
        await journal.sync()
        if pos > self.durable and journal is self.journal:
            self.durable = pos
            if self.kind is Kind.LEADER:
                self._advance_commit()

    async def _wait_commit(self, index: int) -> None:
        if index <= self.commit:
            return
        if self.kind is not Kind.LEADER:
            raise FencedError("this broker is no longer the replicated master")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((index, fut))
        await fut

    def _advance_commit(self) -> None:
        new = commit_index(self.durable[1], [p.match for p in self._peers.values()],
                           self.nodes)
        if new <= self.commit:
            return
        self.commit = new
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for index, fut in self._waiters:
            if index <= new:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((index, fut))
        self._waiters = keep

    async def _watch_lease(self) -> None:
        step = max(0.01, self.ha.keepalive_ms / 4000)
        started = self._clock()
        while self.kind is Kind.LEADER:
            await asyncio.sleep(step)
            now = self._clock()
            dl = self._deadline()
            if dl is None:
                if now - started >= self.ha.lease_ms:
                    self._lose("no majority answered since the election")
                    return
                continue
            if now >= dl:
                self._lose(f"no majority answered for {self.ha.lease_ms} ms")
                return

    def _lose(self, why: str) -> None:
        was_master = self.role is Role.MASTER
        self._step_down_internal(FencedError(f"deposed: {why}"))
        if was_master:
            self._closing = True
            self.machine.fire(RoleEvent.LOST)
            log.error("deposed: %s (term %d); this broker stops accepting writes and all "
                      "connectors close", why, self.term)
            self._on_lost(why)
        else:
            log.warning("stepping down before serving: %s (term %d)", why, self.term)

    def _step_down_internal(self, error: StoreError) -> None:
        if self.kind is Kind.LEADER:
            self.kind = Kind.FOLLOWER
            self.leader_id = None
            self.leader_seen_ms = None
            self._timer_base = self._clock()
        for p in self._peers.values():
            if p.task is not None:
                p.task.cancel()
        if self._lease_task is not None:
            self._lease_task.cancel()
            self._lease_task = None
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(FencedError(error.message))

    # ------------------------------------------------------------ leader: replicators
    def _head(self, prev: Position | None, **extra: Any) -> dict[str, Any]:
        return {"term": self.term, "leader": self.node_id, "sent_ms": self._clock(),
                "prev": list(prev) if prev is not None else None, "commit": self.commit,
                **extra}

    async def _replicate(self, p: _Peer, term: int) -> None:
        host, port = _split(p.addr)
        backoff = max(0.02, self.ha.keepalive_ms / 2000)
        while self.kind is Kind.LEADER and self.term == term:
            try:
                async with asyncio.timeout(self.ha.lease_ms / 1000):
                    reader, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                await asyncio.sleep(backoff)
                continue
            p.closed = False
            p.writer = writer
            acks = asyncio.get_running_loop().create_task(self._read_acks(p, reader))
            try:
                writer.write(MAGIC + self._hello())
                await self._feed(p, writer)
            except (OSError, ConnectionError, TimeoutError):
                pass
            finally:
                acks.cancel()
                p.writer = None
                writer.close()
            await asyncio.sleep(backoff)

    async def _read_acks(self, p: _Peer, reader: asyncio.StreamReader) -> None:
        decoder = WireDecoder(expect_magic=False)
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for frame in decoder.feed(data):
                    if frame.type is FrameType.REPL_ACK:
                        self._on_ack(p, decode_json(frame))
        except (OSError, MeshmqError, ValueError, TypeError) as exc:
            log.debug("replication link to %s: %r", p.addr, exc)
        finally:
            p.closed = True
            p.wake.set()
            p.answered.set()

    def _on_ack(self, p: _Peer, ack: dict[str, Any]) -> None:
        term = int(ack.get("term", 0))
        if term > self.term:
            self._adopt_term(term)
            return
        if self.kind is not Kind.LEADER or term != self.term:
            return
        sent = ack.get("sent_ms")
        if isinstance(sent, int):
            p.acked_sent_ms = max(p.acked_sent_ms or 0, sent)
        p.witness = bool(ack.get("witness", False))
        p.last = position(ack.get("last"), "ACK last")
        durable = position(ack.get("durable"), "ACK durable")
        if not ack.get("ok"):
            p.mismatch = True
            p.wake.set()
        elif (self.retained is not None and durable[1] > p.match
              and self.retained.term_at(durable[1]) == durable[0]):
            p.match = durable[1]
            self._advance_commit()
            if not p.witness:
                for w in self._peers.values():
                    if w.witness:
                        w.wake.set()
        p.answered.set()

    async def _feed(self, p: _Peer, writer: asyncio.StreamWriter) -> None:
        retained = self.retained
        assert retained is not None
        keepalive = self.ha.keepalive_ms
        # Probe: an empty APPEND; the answer says where the follower's log ends.
        p.last, p.mismatch = None, False
        p.answered.clear()
        writer.write(encode_append(self._head(None), []))
        await writer.drain()
        reported = await self._answer(p)
        if reported is None:
            return
        nxt: Position = reported
        if retained.plan(nxt) is Catchup.SNAPSHOT:
            nxt = await self._send_snapshot(p, writer)
        sent_at = self._clock()
        while self.kind is Kind.LEADER and not p.closed and not p.mismatch:
            p.wake.clear()
            batch: list[tuple[Position, bytes]] = []
            if retained.term_at(nxt[1]) != nxt[0]:
                return  # trimmed away while it lagged: probe again (a snapshot)
            limit = self._witness_limit() if p.witness else self.last[1]
            size = 0
            for pos, payload in retained.after(nxt[1]):
                if pos[1] > limit:
                    break
                # A witness gets positions only.
                batch.append((pos, b"" if p.witness else payload))
                size += len(payload)
                if size >= _SEND_BYTES:
                    break
            now = self._clock()
            if batch:
                writer.write(encode_append(self._head(nxt), batch))
                nxt = batch[-1][0]
            elif now - sent_at >= keepalive:
                writer.write(encode_append(self._head(nxt), []))
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout((keepalive - (now - sent_at)) / 1000):
                        await p.wake.wait()
                continue
            sent_at = now
            await writer.drain()

    def _witness_limit(self) -> int:
        """How far a witness may acknowledge: no further than every live data follower
        has on disk. Otherwise a witness could hold a batch a surviving slave never
        received, and refuse it its vote though nothing it lacks was confirmed. A follower
        still catching up (behind the commit point: it lacks confirmed batches anyway)
        does not hold the others back until it has caught up."""
        now = self._clock()
        live = [p.match for p in self._peers.values() if not p.witness
                and p.acked_sent_ms is not None and now - p.acked_sent_ms < self.ha.lease_ms
                and p.match >= self.commit]
        return min(live) if live else self.last[1]

    async def _answer(self, p: _Peer) -> Position | None:
        """The position in the peer's first answer on this link (None: link closed)."""
        async with asyncio.timeout(self.ha.lease_ms / 1000):
            while p.last is None and not p.closed:
                p.answered.clear()
                await p.answered.wait()
        return p.last

    def _snapshot_ops(self) -> tuple[list[StoreOp], dict[str, int]]:
        journal = self.journal
        assert journal is not None
        ops: list[StoreOp] = [PutDurableSubscription(s)
                              for s in journal.durable_subscriptions()]
        marks: dict[str, int] = {}
        for key in journal.key_names():
            if key == REPL_KEY:
                continue
            marks[key] = journal.key_info(key).last_seq
            entries: list[StoredEntry] = journal.load(key, 0, 1 << 62)
            for e in entries:
                ops.append(AddMessage(e.message, ((key, e.seq),)))
                if e.delivery_count:
                    ops.append(SetDeliveryCount(key, e.seq, e.delivery_count))
        return ops, marks

    async def _send_snapshot(self, p: _Peer, writer: asyncio.StreamWriter) -> Position:
        if p.witness:
            retained = self.retained
            assert retained is not None
            index = self._witness_limit()
            term = retained.term_at(index)
            pos = (term, index) if term is not None else self.last
            writer.write(encode_mixed(FrameType.REPL_SNAPSHOT, self._head(
                None, position=list(pos), part=0, final=True), encode_ops([])))
            await writer.drain()
            return pos
        # Taken in one event-loop turn, so it is exactly the state at ``pos``.
        pos = self.last
        ops, marks = self._snapshot_ops()
        log.info("replication: %s is at %s, history not retained here; sending a snapshot "
                 "at %s (%d operations)", p.addr, p.last, pos, len(ops))
        parts: list[list[StoreOp]] = [[]]
        size = 0
        for op in ops:
            parts[-1].append(op)
            size += len(op.message.body) + 64 if isinstance(op, AddMessage) else 64
            if size >= _SNAPSHOT_PART_BYTES:
                parts.append([])
                size = 0
        for i, part in enumerate(parts):
            final = i == len(parts) - 1
            writer.write(encode_mixed(FrameType.REPL_SNAPSHOT, self._head(
                None, position=list(pos), part=i, final=final),
                encode_ops(part, marks if final else None)))
            await writer.drain()
        self.snapshots_sent += 1
        return pos

    # ------------------------------------------------------------ follower side
    def _hello(self) -> bytes:
        body: dict[str, Any] = {"replication": 1, "node": self.node_id}
        if self.ha.user is not None or self.ha.password is not None:
            body.update(user=self.ha.user or "", password=self.ha.password or "")
        return encode_json(FrameType.HELLO, body)

    def _hello_ok(self, frame: WireFrame) -> str | None:
        """None when the link may be used, else why not."""
        if frame.type is not FrameType.HELLO:
            return f"expected HELLO first, got {frame.type.name}"
        body = decode_json(frame)
        if body.get("replication") != 1:
            return "not a replication link (this port is a replication listener)"
        if self.ha.user is not None or self.ha.password is not None:
            ok = hmac.compare_digest(str(body.get("user", "")), self.ha.user or "") and \
                hmac.compare_digest(str(body.get("password", "")), self.ha.password or "")
            if not ok:
                return "bad replication credentials (ha.user / ha.password)"
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = WireDecoder(expect_magic=True)
        greeted = False
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    return
                for frame in decoder.feed(data):
                    if not greeted:
                        why = self._hello_ok(frame)
                        if why is not None:
                            peer = writer.get_extra_info("peername")
                            log.warning("replication: refused a link from %s: %s", peer, why)
                            writer.write(encode_json(FrameType.REFUSE, {"reason": why}))
                            return
                        greeted = True
                        continue
                    await self._on_frame(frame, writer)
        except (OSError, MeshmqError, ValueError, TypeError, KeyError) as exc:
            log.debug("replication: inbound link closed: %r", exc)
        finally:
            writer.close()

    async def _on_frame(self, frame: WireFrame, writer: asyncio.StreamWriter) -> None:
        if frame.type is FrameType.REPL_VOTE_REQUEST:
            writer.write(encode_json(FrameType.REPL_VOTE, self._on_vote(decode_json(frame))))
        elif frame.type is FrameType.REPL_APPEND:
            head, batches = decode_append(frame)
            if self._accept_leader(head, writer):
                self._on_append(head, batches, writer)
        elif frame.type is FrameType.REPL_SNAPSHOT:
            head, payload = decode_mixed(frame)
            if self._accept_leader(head, writer):
                await self._on_snapshot(head, payload, writer)

    def _on_vote(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self._clock()
        seen = now if self.kind is Kind.LEADER else self.leader_seen_ms
        candidate = str(req.get("candidate"))
        term = int(req.get("term", 0))
        last = position(req.get("last"), "vote request last")
        d = decide_vote(VoterState(self.term, self.voted_for, self.last, seen), candidate, term,
                        last, now, self.ha.lease_ms)
        if not req.get("pre") and (d.term, d.voted_for) != (self.term, self.voted_for):
            if d.term > self.term and self.kind is not Kind.FOLLOWER:
                self._adopt_term(d.term)
            self.term, self.voted_for = d.term, d.voted_for
            self._save_state()  # before the answer leaves: one vote per term, ever
            if d.granted:
                self._timer_base = now
        log.info("vote %s: %s for %s in term %d (%s)", "pre-check" if req.get("pre")
                 else "request", "granted" if d.granted else "refused", candidate, term,
                 d.reason)
        return {"term": self.term, "granted": d.granted, "reason": d.reason}

    def _ack(self, writer: asyncio.StreamWriter, head: dict[str, Any], ok: bool,
             reason: str = "") -> None:
        writer.write(encode_json(FrameType.REPL_ACK, {
            "term": self.term, "ok": ok, "last": list(self.last),
            "durable": list(self.durable), "sent_ms": head.get("sent_ms"),
            "witness": self.witness, "reason": reason}))

    def _accept_leader(self, head: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        term = int(head.get("term", 0))
        if self._closing or term < self.term or self._stop.is_set():
            self._ack(writer, head, False, "stale term" if term < self.term else "closing")
            return False
        if term > self.term or self.kind is not Kind.FOLLOWER:
            self._adopt_term(term)
            if self.deposed:
                self._ack(writer, head, False, "closing")
                return False
        leader = str(head.get("leader"))
        if leader != self.leader_id:
            log.info("slave: following %s in term %d (log at %s)", leader, term, self.last)
        self.leader_id = leader
        self.leader_seen_ms = self._clock()
        return True

    def _on_append(self, head: dict[str, Any], batches: list[tuple[Position, bytes]],
                   writer: asyncio.StreamWriter) -> None:
        if head.get("resign"):
            # The master is stopping gracefully: elect a successor now.
            log.info("slave: master %s handed over; electing a successor", self.leader_id)
            self.leader_seen_ms = None
            self.leader_id = None
            self._timer_base = 0
            self._elect_now.set()
            return
        if not batches:
            self._ack(writer, head, True)
            return
        prev = position(head.get("prev"), "APPEND prev")
        if prev != self.last:
            self._ack(writer, head, False, f"log ends at {self.last}, not {prev}")
            return
        if self.witness:
            # Positions only: enough to refuse votes to a candidate missing a batch
            # this witness helped confirm.
            self.last = self.durable = batches[-1][0]
            self._save_state()
            self._ack(writer, head, True)
            return
        journal = self.journal
        assert journal is not None
        for pos, payload in batches:
            ops, marks = decode_ops(payload)
            marks[REPL_KEY] = pack_position(pos)
            journal.write(ops, marks)
            self.last = pos
        self._spawn(self._ack_when_durable(journal, self.last, head, writer))

    async def _ack_when_durable(self, journal: JournalStore, target: Position,
                                head: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        try:
            await journal.sync()
        except StoreError as exc:
            log.error("slave: journal write failed: %s", exc.message)
            writer.close()
            return
        if target > self.durable and journal is self.journal:
            self.durable = target
        if not writer.is_closing():
            self._ack(writer, head, True)

    async def _on_snapshot(self, head: dict[str, Any], payload: bytes,
                           writer: asyncio.StreamWriter) -> None:
        pos = position(head.get("position"), "SNAPSHOT position")
        if self.witness:
            self.last = self.durable = pos
            self._save_state()
            self._ack(writer, head, True)
            return
        if int(head.get("part", -1)) == 0:
            if self._snapshot is not None:
                with contextlib.suppress(StoreError):
                    await self._snapshot[0].close()
            path = self.generations.fresh()
            log.info("slave: receiving a snapshot at %s into %s (log was at %s)", pos, path,
                     self.last)
            self._snapshot = (await asyncio.to_thread(self._open_journal, path), path)
        if self._snapshot is None:
            self._ack(writer, head, False, "snapshot part without its beginning")
            return
        snap, path = self._snapshot
        ops, marks = decode_ops(payload)
        if head.get("final"):
            marks[REPL_KEY] = pack_position(pos)
        snap.write(ops, marks)
        if not head.get("final"):
            return
        await snap.sync()
        self._snapshot = None
        old = self.journal
        self.journal = snap
        self.last = self.durable = pos
        if old is not None:
            with contextlib.suppress(StoreError):
                await old.close()
        await asyncio.to_thread(self.generations.switch, path)
        self.snapshots_installed += 1
        log.info("slave: snapshot at %s installed; following live", pos)
        self._ack(writer, head, True)

    # ------------------------------------------------------------ store side (master)
    def recovery(self) -> Recovery:
        journal = self.journal
        if journal is None or self.kind is not Kind.LEADER:
            raise FencedError("the replicated store opens only on the master")
        keys = {k: journal.key_info(k) for k in journal.key_names() if k != REPL_KEY}
        return Recovery(keys, journal.durable_subscriptions())
