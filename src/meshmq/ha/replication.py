"""Replicated master/slave (``[ha] mode = "replicated"``, docs/ha.md): every node keeps
its own journal; the master streams each write batch to the others; writes and
takeovers need a majority. The decisions are pure (``replication_policy``); this module
does the I/O: elections, the master's write path and lease here; the streams to the
members in ``replica_leader``; the listener, votes and applying batches in
``replica_follower``; files in ``replica_files``; the master's store in ``replica_store``.

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
import json
import logging
import random
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshmq.config.model import BrokerConfig
from meshmq.errors import ConfigError, MeshmqError, StoreError, describe_bind_failure
from meshmq.ha.replica_files import Generations, write_atomic
from meshmq.ha.replica_follower import FollowerSide
from meshmq.ha.replica_leader import LeaderStreams
from meshmq.ha.replica_ops import encode_ops
from meshmq.ha.replica_peer import REPL_KEY, DrivenRole, Kind, Peer, split_address
from meshmq.ha.replica_store import ReplicatedStore
from meshmq.ha.replica_wire import (
    encode_append,
    position,
)
from meshmq.ha.replication_policy import (
    ADOPTED,
    ZERO,
    Position,
    RetainedLog,
    SendTimeEstimate,
    commit_index,
    lease_deadline,
    majority,
    pack_position,
    retry_spread,
    unpack_position,
)
from meshmq.ha.roles import Role, RoleEvent, RoleMachine
from meshmq.protocol.wire.codec import (
    MAGIC,
    FrameType,
    WireDecoder,
    decode_json,
    encode_json,
)
from meshmq.store.base import (
    Recovery,
    StoreOp,
)
from meshmq.store.fence import FencedError
from meshmq.store.journal import JournalStore
from meshmq.tls import CertificateReloader, TlsFileError, client_context, server_context
from meshmq.tls_accept import TlsListener

log = logging.getLogger("meshmq.ha")

STATE_FILE = "repl-state.json"
LEADER_LEASE_SHARE = 0.9  # the master gives up a little before voters would vote again


def monotonic_ms() -> int:
    """The replicated roles' clock: monotonic milliseconds (a test passes its own)."""
    return int(time.monotonic() * 1000)


class ReplicatedHa(LeaderStreams, FollowerSide):
    """The HA controller of mode ``replicated`` (same surface as ``HaController``)."""

    mode = "replicated"

    def __init__(self, config: BrokerConfig, *, on_lost: Callable[[str], None],
                 clock: Callable[[], int] = monotonic_ms,
                 tls: CertificateReloader | None = None) -> None:
        ha = config.ha
        self.config = config
        self.ha = ha
        self.tls = tls if tls is not None else CertificateReloader()
        self._server_tls, self._client_tls = self._tls_contexts()
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
        # Started without a state file and no master accepted since (replication_policy).
        self.amnesiac = False
        self.kind = Kind.FOLLOWER
        self.leader_id: str | None = None
        # The last master this node followed, and, once master, the one it succeeded
        # (None: none was followed): the trace's ``took_over``.
        self.followed: str | None = None
        self.took_over_from: str | None = None
        self.leader_seen_ms: int | None = None
        # When the master sent what this node read, not when it was read (policy).
        self._send_times = SendTimeEstimate()
        # The term whose master told this node it stepped down (a graceful handover).
        self._resigned_term: int | None = None
        # A node that (re)started may have acknowledged a master just before: it neither
        # campaigns nor votes for a lease after its start (that master's lease may
        # still count on it).
        self._started_ms = self._timer_base = clock()
        self.journal: JournalStore | None = None
        self.last: Position = ZERO  # newest batch written to the journal
        self.durable: Position = ZERO  # newest batch known to be on disk
        self.commit = 0
        self.retained: RetainedLog | None = None
        self._peers: dict[str, Peer] = {}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._server: asyncio.Server | TlsListener | None = None
        self._stop = asyncio.Event()
        self._elect_now = asyncio.Event()
        self._closing = False  # deposed: the runtime is closing this node's journal
        self._tasks: set[asyncio.Task[Any]] = set()
        self._snapshot: tuple[JournalStore, Path] | None = None
        self._tls_refused: set[tuple[str, str]] = set()
        self._lease_task: asyncio.Task[None] | None = None
        self.became_master_ms: int | None = None
        self._leader_since_ms = 0  # when this node last won an election
        self.elections = 0
        self.snapshots_sent = 0
        self.snapshots_installed = 0
        self.store = ReplicatedStore(self)
        # A shard of a node (ha/replica_node.py): its supervisor decides terms and roles.
        self.driven: DrivenRole | None = None
        # Called once a driven follower's listener and journal are up (its start report).
        self.on_following: Callable[[], None] | None = None

    # ------------------------------------------------------------ TLS
    def _tls_contexts(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """With ``ssl_certfile`` every link is TLS, both ways: each node is the server
        of the links it accepts and the client of those it dials (mutual TLS once
        ``ssl_cafile`` is set). Never plaintext then."""
        ha = self.ha
        if ha.ssl_certfile is None:
            return None, None
        try:
            server = server_context(ha.ssl_certfile, ha.ssl_keyfile, ha.ssl_cafile,
                                    "need" if ha.ssl_cafile else "none", ha.ssl_ciphers)
            client = client_context(ha.ssl_cafile, ha.ssl_certfile, ha.ssl_keyfile,
                                    ha.verify_hostname, ha.ssl_ciphers)
        except TlsFileError as exc:
            raise ConfigError(str(exc), file=self.config.source,
                              option=f"ha.{exc.option}") from None
        for ctx in (server, client):
            self.tls.register("replication", ctx, ha.ssl_certfile, ha.ssl_keyfile)
        return server, client

    async def _dial(self, host: str, port: int
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ctx = self._client_tls
        try:
            return await asyncio.open_connection(
                host, port, ssl=ctx, server_hostname=host if ctx is not None else None,
                ssl_handshake_timeout=self.ha.lease_ms / 1000 if ctx is not None else None)
        except ssl.SSLError as exc:
            # An EOF mid-handshake is a node going away as often as a refusal: not logged.
            if not isinstance(exc, ssl.SSLEOFError):
                self._tls_failed(f"{host}:{port}", "to", exc)
            raise

    def _tls_failed(self, peer: str, direction: str, exc: BaseException) -> None:
        """Log a failed TLS handshake once per address and cause (peers retry often)."""
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        if reason in ("HTTP_REQUEST", "WRONG_VERSION_NUMBER"):
            reason = f"{reason}: the node speaks plaintext (no ha.ssl_certfile)"
        elif isinstance(exc, ssl.SSLCertVerificationError):
            reason = f"{exc.verify_message}: a certificate ha.ssl_cafile does not trust"
        key = (f"{direction} {peer.rpartition(':')[0]}", reason)
        if key not in self._tls_refused:
            self._tls_refused.add(key)
            log.warning("replication: refused a link %s %s: TLS handshake failed (%s)",
                        direction, peer, reason)

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
                "took_over_from": self.took_over_from,
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
        if not self._state_path.exists():
            self.amnesiac = True
            # INFO: every new node starts so; for a node that had state, the refused votes
            # it logs say why no stale node is elected.
            log.info("replication: node %s starts with no state in %s: it will not vote "
                        "for a candidate with data until a master has brought it up to "
                        "date (a lost state directory must not elect a stale node)",
                        self.node_id, self._state_path.parent)
        else:
            try:
                raw = json.loads(self._state_path.read_text())
                self.term = int(raw["term"])
                self.voted_for = raw.get("voted_for")
                self.amnesiac = bool(raw.get("amnesiac", False))
                if self.witness:
                    self.last = self.durable = position(raw.get("last", [0, 0]), "last")
            except (ValueError, KeyError, TypeError) as exc:
                raise StoreError(f"{self._state_path} is damaged ({exc!r}); refusing to "
                                 "guess the term: a node could vote twice") from None

    def _save_state(self) -> None:
        state: dict[str, Any] = {"term": self.term, "voted_for": self.voted_for}
        if self.amnesiac:
            state["amnesiac"] = True  # survives restarts until a master is accepted
        if self.witness:
            state["last"] = list(self.last)
        write_atomic(self._state_path, json.dumps(state).encode())

    def _open_journal(self, path: Path) -> JournalStore:
        store = self.config.store
        journal = JournalStore(path, segment_size=store.segment_size, fsync=store.fsync,
                               max_batch_bytes=store.max_batch_bytes,
                               compact_live_ratio=store.compact_live_ratio,
                               max_disk_bytes=store.max_disk_bytes,
                               min_free_disk=store.min_free_disk,
                               disk_reserve=store.disk_reserve)
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
        host, port = split_address(self.ha.listen)
        try:
            self._server = await self._listen(host, port)
        except OSError as exc:
            raise describe_bind_failure(
                "replication", host, port, exc,
                "change [ha] listen (in activemq.xml: the node's tcp:// "
                "transportConnector that the other nodes' masterConnectorURI names)") from None
        log.info("replication: node %s listening on %s (term %d, log at %s, %d nodes)",
                 self.node_id, self.ha.listen, self.term, self.last, self.nodes)

    async def acquire(self) -> bool:
        """Follow until this node is master with a majority behind it (True) or stop()."""
        await self._start()
        self.machine.fire(RoleEvent.WAIT)
        if self.driven is not None:
            return await self._acquire_driven(self.driven)
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
            won = await self._campaign() and not self._stop.is_set() and await self._lead()
            if self._stop.is_set():
                # SIGTERM during the campaign or the term's first batch: stop() ended
                # the role already, and a broker that is stopping takes no master role.
                if self.kind is Kind.LEADER:
                    self._step_down_internal(FencedError("this broker is stopping"))
                    await self._close_listener_and_tasks()
                self.kind = Kind.FOLLOWER
                break
            if won:
                self.machine.fire(RoleEvent.ACQUIRED)
                self.became_master_ms = self._clock()
                log.info("master: elected for term %d with the log at %s", self.term,
                         self.last)
                return True
            # Lost or no quorum: try again after a short random pause (shorter after
            # a handover, when no master has been heard from since).
            jitter = self._retry_later(
                after_handover=self._resigned_term is not None and self.leader_id is None)
        if self.role in (Role.STARTING, Role.SLAVE):
            self.machine.fire(RoleEvent.STOP)
        return False

    def _retry_later(self, *, after_handover: bool) -> int:
        """After a campaign that did not elect this member: the next try comes a random
        pause from now (``retry_spread``). Returns the jitter to add to the due time."""
        lease = self.ha.lease_ms
        spread = retry_spread(lease, self.ha.keepalive_ms, after_handover=after_handover)
        self._timer_base = self._clock() - lease + random.randint(50, 50 + spread)
        return random.randint(0, spread)

    async def _acquire_driven(self, role: DrivenRole) -> bool:
        """A shard of a node: follow until stopped, or lead the term the node's
        supervisor won (True once a majority of this shard's nodes stored the term's
        first batch; a ``FencedError`` otherwise, which fails this start)."""
        if role.term > self.term:
            self.term, self.voted_for = role.term, None
            self._save_state()
        if not role.lead:
            log.info("slave: following the stream of this shard's master (term %d, log "
                     "at %s)", self.term, self.last)
            if self.on_following is not None:
                self.on_following()
            await self._stop.wait()
            self.machine.fire(RoleEvent.STOP)
            return False
        if self.term != role.term:
            raise FencedError(f"this shard saw term {self.term} since its node was "
                              f"elected in term {role.term}: not taking over")
        self.elections += 1
        if not await self._lead():
            raise FencedError(f"no majority of this shard's nodes stored the first batch "
                              f"of term {role.term}: not taking over")
        self.machine.fire(RoleEvent.ACQUIRED)
        self.became_master_ms = self._clock()
        log.info("master: leading this shard's stream in term %d with the log at %s",
                 self.term, self.last)
        return True

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A driven shard's answer to its supervisor (ha/replica_node.py): ``adopt``
        moves it to a newer term first (it then refuses the batches of any older master,
        and a leader of an older term steps down); every answer says where its log is
        and how long ago it heard from a master. One event-loop turn: no batch is
        written between the adoption and the position reported."""
        if request.get("op") == "adopt":
            term = int(request.get("term", 0))
            if term > self.term:
                self._adopt_term(term)
        now = self._clock()
        seen = now if self.kind is Kind.LEADER else max(
            self.leader_seen_ms if self.leader_seen_ms is not None else self._started_ms,
            self._started_ms)
        return {"id": request.get("id"), "term": self.term, "last": list(self.last),
                "durable": list(self.durable), "seen_ago_ms": now - seen,
                "amnesiac": self.amnesiac, "leader": self.leader_id,
                "resigned": self._resigned_term, "kind": self.kind.value}

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
        await self._close_listener_and_tasks()
        if self._snapshot is not None:
            with contextlib.suppress(StoreError):
                await self._snapshot[0].close()
            self._snapshot = None
        if self.journal is not None:
            with contextlib.suppress(StoreError):
                await self.journal.close()

    async def _close_listener_and_tasks(self) -> None:
        """Close the listener, cancel and await every task, wait (1 s at most) for the
        listener's connections to close."""
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

    async def _hand_over(self) -> None:
        """Graceful stop: let the followers catch up (bounded), then tell them to elect
        a successor at once instead of waiting for the lease to run out."""
        deadline = self._clock() + self.ha.lease_ms
        data = [p for p in self._peers.values() if not p.witness]
        # A member that is down (never reached, or its link closed) cannot catch up.
        while self._clock() < deadline and any(
                p.match < self.last[1] and not p.closed and not p.unreachable for p in data):
            await asyncio.sleep(0.01)
        frame = encode_append(self._head(self.last, resign=True), [])
        drains = []
        for p in self._peers.values():
            if p.writer is not None and not p.closed:
                with contextlib.suppress(Exception):
                    p.writer.write(frame)
                    drains.append(asyncio.wait_for(p.writer.drain(), 1))
        # To every member at once: one slow link must not hold the others' notice back.
        await asyncio.gather(*drains, return_exceptions=True)
        log.info("handed the replicated master role over (term %d, log at %s)", self.term,
                 self.last)

    # ------------------------------------------------------------ elections
    async def _ask(self, addr: str, frame: bytes) -> dict[str, Any] | None:
        host, port = split_address(addr)
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.ha.lease_ms / 2000):
                reader, writer = await self._dial(host, port)
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
        """Votes granted (this node's included), or None when a higher term was seen.
        Returns as soon as the outcome is known: a member that is paused or cut off
        does not hold a round up for its whole timeout once a majority answered."""
        frame = encode_json(FrameType.REPL_VOTE_REQUEST, {
            "term": term, "candidate": self.node_id, "last": list(self.durable),
            "pre": pre, "resigned": self._resigned_term})
        need = majority(self.nodes)
        asks = [asyncio.ensure_future(self._ask(m, frame)) for m in self.ha.members]
        granted = 1
        try:
            for left, next_answer in enumerate(asyncio.as_completed(asks)):
                a = await next_answer
                if a is not None:
                    if int(a.get("term", 0)) > self.term and not a.get("granted"):
                        self._adopt_term(int(a["term"]))
                        return None
                    if a.get("granted"):
                        granted += 1
                if granted >= need or granted + len(asks) - left - 1 < need:
                    break
        finally:
            for ask in asks:
                ask.cancel()
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
        self.took_over_from = self.followed if self.followed != self.node_id else None
        self.leader_id = self.node_id
        self.leader_seen_ms = self._leader_since_ms = self._clock()
        if self.amnesiac:
            self.amnesiac = False  # elected by a majority: its log is the cluster's
            self._save_state()
        self.retained = RetainedLog(self.last, self.ha.log_retain_bytes)
        self.commit = 0
        self._peers = {m: Peer(m) for m in self.ha.members}
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

    # ------------------------------------------------------------ store side (master)
    def recovery(self) -> Recovery:
        journal = self.journal
        if journal is None or self.kind is not Kind.LEADER:
            raise FencedError("the replicated store opens only on the master")
        keys = {k: journal.key_info(k) for k in journal.key_names() if k != REPL_KEY}
        return Recovery(keys, journal.durable_subscriptions())
