"""The master's side of replication: one stream per member (probe its position, then
stream retained batches or send a snapshot, heartbeats when idle) and the acks that
move its match index and the master's lease. A mixin of ``ReplicatedHa``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from meshmq.errors import MeshmqError
from meshmq.ha.replica_ops import encode_ops
from meshmq.ha.replica_peer import REPL_KEY, Kind, Peer, split_address
from meshmq.ha.replica_state import NodeState
from meshmq.ha.replica_wire import (
    encode_append,
    encode_mixed,
    position,
)
from meshmq.ha.replication_policy import (
    Catchup,
    Position,
)
from meshmq.protocol.wire.codec import (
    MAGIC,
    FrameType,
    WireDecoder,
    decode_json,
)
from meshmq.store.base import (
    AddMessage,
    MarkDispatched,
    PutDurableSubscription,
    SetDeliveryCount,
    StoredEntry,
    StoreOp,
)

log = logging.getLogger("meshmq.ha")

_SEND_BYTES = 1 << 20  # batches per APPEND frame, by payload bytes
_SNAPSHOT_PART_BYTES = 4 << 20


class LeaderStreams(NodeState):
    _leader_since_ms: int

    if TYPE_CHECKING:
        def _hello(self) -> bytes: ...
        async def _dial(self, host: str, port: int
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...

    def _head(self, prev: Position | None, **extra: Any) -> dict[str, Any]:
        return {"term": self.term, "leader": self.node_id, "sent_ms": self._clock(),
                "prev": list(prev) if prev is not None else None, "commit": self.commit,
                **extra}

    async def _replicate(self, p: Peer, term: int) -> None:
        host, port = split_address(p.addr)
        backoff = max(0.02, self.ha.keepalive_ms / 2000)
        failures = 0
        while self.kind is Kind.LEADER and self.term == term:
            try:
                async with asyncio.timeout(self.ha.lease_ms / 1000):
                    reader, writer = await self._dial(host, port)
            except (OSError, TimeoutError):
                p.unreachable = True
                await asyncio.sleep(backoff)
                continue
            p.closed = p.unreachable = False
            p.writer = writer
            acks = asyncio.get_running_loop().create_task(self._read_acks(p, reader))
            pause = backoff
            try:
                writer.write(MAGIC + self._hello())
                await self._feed(p, writer)
            except (OSError, ConnectionError, TimeoutError):
                pass
            except Exception as exc:  # the stream must outlive any one failure
                # Anything else (a store read for a snapshot, say) would otherwise end
                # this member's stream for the whole term without a word, and leave it
                # unable to follow until the next election.
                failures += 1
                log.warning("replication to %s failed (%s); retrying", p.addr,
                            str(exc) or type(exc).__name__,
                            exc_info=log.isEnabledFor(logging.DEBUG))
                pause = min(backoff * (1 << min(failures, 6)), self.ha.lease_ms / 1000)
            else:
                failures = 0
            finally:
                acks.cancel()
                p.writer = None
                writer.close()
            await asyncio.sleep(pause)

    async def _read_acks(self, p: Peer, reader: asyncio.StreamReader) -> None:
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

    def _on_ack(self, p: Peer, ack: dict[str, Any]) -> None:
        term = int(ack.get("term", 0))
        if term > self.term:
            self._adopt_term(term)
            return
        if self.kind is not Kind.LEADER or term != self.term:
            return
        sent = ack.get("sent_ms")
        if isinstance(sent, int) and ack.get("accepted", True):
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

    async def _feed(self, p: Peer, writer: asyncio.StreamWriter) -> None:
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
        received, and refuse it its vote though nothing it lacks was confirmed. A data
        follower is live until it has not answered for ``lease_ms``, so writes wait for
        a slave that is there, even while it catches up, and go on without one that is
        gone."""
        now = self._clock()
        live = [p.match for p in self._peers.values() if not p.witness and (
            now - p.acked_sent_ms < self.ha.lease_ms if p.acked_sent_ms is not None
            # Never answered since the election: give it two heartbeats to show up.
            else not p.unreachable
            and now - self._leader_since_ms < 2 * self.ha.keepalive_ms)]
        return min(live) if live else self.last[1]

    async def _answer(self, p: Peer) -> Position | None:
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
            info = journal.key_info(key)
            marks[key] = info.last_seq
            if info.dispatched:
                ops.append(MarkDispatched(key, info.dispatched))
            entries: list[StoredEntry] = journal.load(key, 0, 1 << 62)
            for e in entries:
                ops.append(AddMessage(e.message, ((key, e.seq),)))
                if e.delivery_count:
                    ops.append(SetDeliveryCount(key, e.seq, e.delivery_count))
        return ops, marks

    async def _send_snapshot(self, p: Peer, writer: asyncio.StreamWriter) -> Position:
        if p.witness:
            retained = self.retained
            assert retained is not None
            index = self._witness_limit()
            term = retained.term_at(index)
            if term is None:
                # A live slave is behind the retained history (it gets a snapshot of its
                # own first): telling the witness of batches that slave lacks would
                # confirm writes on the master's disk alone. Probe again later.
                assert p.last is not None
                return p.last
            pos = (term, index)
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
