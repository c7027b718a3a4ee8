"""A member's side of replication: the replication listener (link handshake), votes,
and applying the master's batches and snapshots to this node's journal. A mixin of
``ReplicatedHa``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from typing import TYPE_CHECKING, Any

from meshmq.errors import MeshmqError, StoreError
from meshmq.ha.replica_ops import decode_ops
from meshmq.ha.replica_peer import REPL_KEY, Kind
from meshmq.ha.replica_state import NodeState
from meshmq.ha.replica_wire import (
    decode_append,
    decode_mixed,
    position,
)
from meshmq.ha.replication_policy import (
    Position,
    VoterState,
    decide_vote,
    pack_position,
)
from meshmq.protocol.wire.codec import (
    FrameType,
    WireDecoder,
    WireFrame,
    decode_json,
    encode_json,
)
from meshmq.store.journal import JournalStore
from meshmq.tls_accept import TlsListener, tls_listen

log = logging.getLogger("meshmq.ha")


class FollowerSide(NodeState):
    _closing: bool
    _started_ms: int

    if TYPE_CHECKING:
        def _head(self, prev: Position | None, **extra: Any) -> dict[str, Any]: ...

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
            # As bytes: compare_digest refuses str with non-ASCII characters.
            ok = hmac.compare_digest(str(body.get("user", "")).encode(),
                                     (self.ha.user or "").encode()) and \
                hmac.compare_digest(str(body.get("password", "")).encode(),
                                    (self.ha.password or "").encode())
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
        except asyncio.CancelledError:
            # The node is stopping with this link open: the end of the link, not an
            # error. Nothing awaits this task; ending it normally keeps asyncio from
            # logging the cancellation as an unhandled error with a traceback.
            return
        finally:
            writer.close()

    async def _listen(self, host: str, port: int) -> asyncio.Server | TlsListener:
        """The replication listener: streams served by ``_serve``, behind TLS when
        ``ha.ssl_certfile`` is set. With TLS it accepts sockets itself and each
        connection speaks TLS from its first byte (meshmq/tls_accept.py): no plain phase
        in which the event loop could read a peer's ClientHello before the handshake. A
        failure (a plaintext node, a certificate ssl_cafile does not trust) is logged
        once per address and kind; a dialer that gave up (a vote round already decided)
        is no refusal. OSError when it cannot bind."""
        def streams() -> asyncio.Protocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._serve)

        if self._server_tls is None:
            return await asyncio.get_running_loop().create_server(
                streams, host, port, reuse_address=True)
        return await tls_listen(
            streams, self._server_tls, host, port, timeout_s=self.ha.lease_ms / 1000,
            on_failure=lambda peer, exc: self._tls_failed(peer, "from", exc))

    async def _on_frame(self, frame: WireFrame, writer: asyncio.StreamWriter) -> None:
        if frame.type is FrameType.REPL_VOTE_REQUEST:
            if self.driven is not None:  # a shard: its node's supervisor votes
                writer.write(encode_json(FrameType.REPL_VOTE, {
                    "term": self.term, "granted": False,
                    "reason": "a shard's stream, not a node's election address"}))
                return
            writer.write(encode_json(FrameType.REPL_VOTE, self._on_vote(decode_json(frame))))
        elif frame.type is FrameType.REPL_APPEND:
            head, batches = decode_append(frame)
            if head.get("resign") and self._resigned_late(head):
                return
            if self._accept_leader(head, writer):
                self._on_append(head, batches, writer)
        elif frame.type is FrameType.REPL_SNAPSHOT:
            head, payload = decode_mixed(frame)
            if self._accept_leader(head, writer):
                await self._on_snapshot(head, payload, writer)

    def _on_vote(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self._clock()
        # A node that started less than a lease ago may have acknowledged a master just
        # before it (re)started: it votes as if it had heard from one at start.
        seen = now if self.kind is Kind.LEADER else max(
            self.leader_seen_ms if self.leader_seen_ms is not None else -(1 << 62),
            self._started_ms)
        candidate = str(req.get("candidate"))
        term = int(req.get("term", 0))
        last = position(req.get("last"), "vote request last")
        resigned = req.get("resigned")
        d = decide_vote(VoterState(self.term, self.voted_for, self.last, seen, self.amnesiac),
                        candidate, term, last, now, self.ha.lease_ms,
                        resigned_term=resigned if isinstance(resigned, int) else None)
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
             reason: str = "", *, accepted: bool = True) -> None:
        """``accepted``: this node took the sender as its master (and so refuses votes
        for ``lease_ms``); only such answers extend the master's lease."""
        writer.write(encode_json(FrameType.REPL_ACK, {
            "term": self.term, "ok": ok, "accepted": accepted, "last": list(self.last),
            "durable": list(self.durable), "sent_ms": head.get("sent_ms"),
            "witness": self.witness, "reason": reason}))

    def _accept_leader(self, head: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        term = int(head.get("term", 0))
        if self._closing or term < self.term or self._stop.is_set():
            self._ack(writer, head, False, "stale term" if term < self.term else "closing",
                      accepted=False)
            return False
        if term > self.term or self.kind is not Kind.FOLLOWER:
            self._adopt_term(term)
            if self.deposed:
                self._ack(writer, head, False, "closing", accepted=False)
                return False
        leader = str(head.get("leader"))
        if leader != self.leader_id:
            log.info("slave: following %s in term %d (log at %s)", leader, term, self.last)
            self._send_times.reset()
        self.leader_id = self.followed = leader
        self._resigned_term = None
        now = self._clock()
        stamp = head.get("sent_ms")
        # From when the master sent it: frames read late from a backlog (the master died
        # meanwhile) must not keep this node refusing votes.
        seen = self._send_times.sent_at(stamp, now) if isinstance(stamp, int) else now
        self.leader_seen_ms = seen if self.leader_seen_ms is None \
            else max(self.leader_seen_ms, seen)
        if self.amnesiac:
            self.amnesiac = False  # the master's stream brings this node up to date
            self._save_state()
            log.info("replication: node %s has state again (following %s)", self.node_id,
                     leader)
        return True

    def _resigned_late(self, head: dict[str, Any]) -> bool:
        """The master this node followed resigned, but its notice came after the node
        moved on to a newer term: an election under way, which for a node's shard may
        have begun on another shard's notice. Its appends are refused as stale; its
        notice still counts: that master takes no more writes, so its lease must not
        keep this node refusing votes until it would have run out."""
        term = int(head.get("term", 0))
        if term >= self.term or self.kind is not Kind.FOLLOWER \
                or str(head.get("leader")) != self.leader_id:
            return False
        log.info("slave: master %s handed over after this node moved to term %d; its "
                 "lease no longer holds votes back", self.leader_id, self.term)
        # No election at once, unlike a notice in its own term: the newer term's
        # election may be under way, and its votes were given by this node's timer.
        self._resigned(term)
        return True

    def _resigned(self, term: int) -> None:
        self._resigned_term = term
        self.leader_seen_ms = None
        self.leader_id = None

    def _on_append(self, head: dict[str, Any], batches: list[tuple[Position, bytes]],
                   writer: asyncio.StreamWriter) -> None:
        if head.get("resign"):
            # The master is stopping gracefully: elect a successor now.
            log.info("slave: master %s handed over; electing a successor", self.leader_id)
            self._resigned(int(head.get("term", 0)))
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
        if old is not None:
            with contextlib.suppress(StoreError):
                await old.close()
        await asyncio.to_thread(self.generations.switch, path)
        # Only now (the copy is the node's journal for good) does the position move.
        self.last = self.durable = pos
        self.snapshots_installed += 1
        log.info("slave: snapshot at %s installed; following live", pos)
        self._ack(writer, head, True)
