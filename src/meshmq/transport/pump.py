"""The per-turn engine every session and bridge talks to: the pump.

Work is batched per event-loop turn: protocol callbacks only *request* a pump; the pump
runs once per turn, dispatches every dirty queue, writes one store batch, hands out the
deliveries (holding those beyond the last durable dispatch mark until its sync) and
flushes each touched connection's output with one write. The pump also keeps the
session registry (which session gets a connection's deliveries, which are open on each
listener) and the 0.5 s housekeeping timer.

Why apart from the composition root (transport/runtime.py): this is what runs for every
message; building, starting and stopping the broker is not. It receives only the core,
the store, the page reader, the trace recorder and what to do when the store refuses
a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from meshmq.core.queue import Outcome, Queue
from meshmq.errors import StoreError
from meshmq.management.metrics import sync_histogram
from meshmq.store.base import Store
from meshmq.transport.handout import hand_out
from meshmq.transport.host import Session

if TYPE_CHECKING:
    from meshmq.core.broker import Broker
    from meshmq.transport.paging import PageReader
    from meshmq.transport.push_back import PushBack
    from meshmq.transport.trace_recorder import TraceRecorder

log = logging.getLogger("meshmq.runtime")

TIMER_INTERVAL = 0.5


class ShardLinks(Protocol):
    """A shard's links to the other shards of its node (network/shards.py)."""

    def take(self) -> None:
        """Take the core's shard decisions (sends, relays) into the links' buffers."""
    def flush(self) -> None:
        """Write what the links' buffers hold: once per pump."""


class _Gate:
    """Deliveries held until the store has synced a dispatch mark (see ``pump``)."""

    __slots__ = ("ready",)

    def __init__(self) -> None:
        self.ready = False


class Pump:
    """Dispatch, store batches, deliveries and flushes of one broker, once per turn.

    ``on_write_refused(reason)``: a master whose store refuses a write (fenced, or
    failed) must stop serving; None keeps serving what does not need the store.
    """

    def __init__(self, broker: Broker, store: Store, trace: TraceRecorder,
                 on_write_refused: Callable[[str], None] | None) -> None:
        self.broker = broker
        self.store = store
        self.trace = trace
        self.on_write_refused = on_write_refused
        self.pages: PageReader | None = None  # set by the root; needs request_pump
        self.shards: ShardLinks | None = None  # a shard of several: set by the root
        # Producers held back by slow consumers (transport/push_back.py): set by the
        # root. A pump that handed messages out may have drained what held them.
        self.push_back: PushBack | None = None
        self.sessions: dict[str, Session] = {}  # by broker connection id
        self.all_sessions: set[Session] = set()
        self._to_flush: dict[Session, None] = {}
        self._scheduled = False
        # Outcomes waiting for a dispatch mark to be durable, in pump order; a group
        # with no gate waits only for the groups before it.
        self._held: deque[tuple[_Gate | None, list[Outcome]]] = deque()
        self._mark_syncs: set[asyncio.Task[None]] = set()
        self._limits: dict[str, int] = {}  # listener -> max_connections
        self._counts: dict[str, int] = {}  # listener -> open connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.store_closed = False
        self.closing = False  # set by close_sessions: later connections are closed
        self._store_failure_logged = False
        # Read by GET /metrics: one observation per dispatch-mark sync.
        self.sync_seconds = sync_histogram()

    # ------------------------------------------------------------ lifecycle
    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pumps requested from now on run on ``loop``."""
        self._loop = loop

    def start_housekeeping(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(TIMER_INTERVAL, self._on_timer)

    def stop_housekeeping(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close_sessions(self) -> None:
        """Close every session, and from now on each one that connects: a connection the
        listener accepted just before it closed is made a moment later."""
        self.closing = True
        for session in list(self.all_sessions):
            session.close()

    async def drain(self, timeout_s: float) -> None:
        """Let connection_lost callbacks run (WebSocket close handshakes take a moment)
        until every session is gone, or ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        await asyncio.sleep(0)
        while self.all_sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------ sessions
    def limit(self, listener: str, max_connections: int) -> None:
        self._limits[listener] = max_connections
        self._counts[listener] = 0

    def admit(self, listener: str) -> bool:
        """Count a new connection on ``listener``; False once it is at max_connections."""
        count = self._counts.get(listener, 0)
        if count >= self._limits.get(listener, 1 << 62):
            log.warning("listener %s refused a connection: max_connections (%d) reached",
                        listener, count)
            return False
        self._counts[listener] = count + 1
        return True

    def release(self, listener: str) -> None:
        self._counts[listener] = self._counts.get(listener, 1) - 1

    def connections_by_listener(self) -> dict[str, int]:
        return dict(self._counts)

    def accepted(self, session: Session) -> None:
        self.all_sessions.add(session)
        if self.closing:
            session.close()

    def forget(self, session: Session) -> None:
        self.all_sessions.discard(session)
        self._to_flush.pop(session, None)

    def register(self, session: Session) -> None:
        assert session.conn is not None
        self.sessions[session.conn.id] = session

    def unregister(self, session: Session) -> None:
        if session.conn is not None:
            self.sessions.pop(session.conn.id, None)

    def close_connection(self, connection_id: str) -> bool:
        session = self.sessions.get(connection_id)
        if session is None:
            return False
        log.info("connection %s closed by an administrator", connection_id)
        session.close_by_admin()
        return True

    def mark_flush(self, session: Session) -> None:
        self._to_flush[session] = None

    # ------------------------------------------------------------ pump
    def request_pump(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self.pump)

    def write_ops(self) -> None:
        if self.shards is not None:  # taken with the store batch they belong with
            self.shards.take()
        ops = self.broker.take_ops()
        if ops:
            if self.store_closed:
                log.warning("store already closed at shutdown; %d late operations dropped",
                            len(ops))
                return
            try:
                self.store.write(ops)
            except StoreError as exc:
                if self.on_write_refused is None:
                    # A failed store: the sessions waiting for these operations to be
                    # durable are told so by store.sync(); the pump goes on serving
                    # everything that does not need the store.
                    if not self._store_failure_logged:
                        self._store_failure_logged = True
                        log.error("store refused a write (%s); operations that need it are "
                                  "failed", exc.message)
                    return
                # Fenced (another broker is master) or failed: a master that cannot
                # write must stop serving, so the slave can take over.
                log.error("store refused a write (%s); %d operations dropped, stopping",
                          exc.message, len(ops))
                self.on_write_refused(exc.message)

    def pump(self) -> None:
        self._scheduled = False
        broker = self.broker
        broker.dispatch_dirty()
        self.write_ops()
        loads = broker.take_page_loads()
        if loads and self.pages is not None and self.pages.read(loads):
            broker.dispatch_dirty()  # the pages read at once go out in this pump
            self.write_ops()
            if broker.has_page_loads:
                self.request_pump()
        marks, hold = broker.take_dispatch_marks()
        gate = self._sync_marks(marks) if marks or hold else None
        outcomes = broker.take_outcomes()
        if hold or self._held:
            # A delivery of this pump is beyond the last durable dispatch mark: nothing
            # leaves before the mark is on disk (one sync per mark window), and later
            # pumps' deliveries queue behind, so every consumer keeps its order.
            if outcomes:
                self._held.append((gate if hold else None, outcomes))
        else:
            hand_out(self.sessions, outcomes)
        self._flush_sessions()
        push_back = self.push_back
        if push_back is not None and push_back.held:
            # A backlog drained below the bound by this pump's deliveries wakes its
            # producers now, not at their timer (up to 50 ms later: consumers that
            # never pause, such as auto-ack topic subscribers, would idle meanwhile).
            push_back.wake()
        if self.shards is not None:
            self.shards.flush()
        if broker.tracer is not None:
            self.trace.write()
        if broker.has_deferred:
            self.request_pump()  # after the loop has done I/O (and maybe paused writers)

    def _flush_sessions(self) -> None:
        if self._to_flush:
            if self.trace.exact:
                self.trace.barrier()
            to_flush, self._to_flush = self._to_flush, {}
            for session in to_flush:
                session.flush()

    def _sync_marks(self, marks: list[tuple[Queue, int]]) -> _Gate:
        """Sync the store (it holds ``marks`` and everything written before), then tell
        the queues their marks are durable and hand out the deliveries that waited."""
        gate = _Gate()
        assert self._loop is not None

        async def run() -> None:
            started = time.perf_counter()
            try:
                await self.store.sync()
                # One observation per mark window (not per message): GET /metrics.
                self.sync_seconds.observe(time.perf_counter() - started)
            except StoreError:
                # A failed store is reported where it is used; the deliveries go out
                # anyway (withholding them would not make anything durable).
                pass
            else:
                self.broker.dispatch_marks_durable(marks)
            gate.ready = True
            self._release_held()

        task = self._loop.create_task(run())
        self._mark_syncs.add(task)
        task.add_done_callback(self._mark_syncs.discard)
        return gate

    def _release_held(self) -> None:
        held = self._held
        while held:
            gate, outcomes = held[0]
            if gate is not None and not gate.ready:
                break
            held.popleft()
            hand_out(self.sessions, outcomes)
        self._flush_sessions()

    # ------------------------------------------------------------ housekeeping
    def _on_timer(self) -> None:
        assert self._loop is not None
        # Rescheduled first: housekeeping that fails (a broken store) must not stop the
        # timeouts and expiry of every later tick.
        self._timer = self._loop.call_later(TIMER_INTERVAL, self._on_timer)
        now = time.monotonic()
        for session in list(self.all_sessions):
            session.check_timeouts(now)
        self.broker.tick()
        self.pump()
        self.trace.tick(now)
        # Reclaim journal space while idle too (the journal also compacts on writes).
        with contextlib.suppress(StoreError):  # reported where the store is used
            self.store.compact_step()
        self.check_store_space()

    def check_store_space(self) -> None:
        """Refuse persistent messages while the store says it has no room for them."""
        reason = self.store.persistent_refusal()
        if reason != self.broker.persistent_refusal:
            if reason is not None:
                log.warning("refusing persistent messages: %s", reason)
            else:
                log.info("store has room again: accepting persistent messages")
            self.broker.persistent_refusal = reason
