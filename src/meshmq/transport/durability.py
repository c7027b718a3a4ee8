"""Confirm only once durable: the one path from "the core queued store writes" to "tell
the peer" (a STOMP RECEIPT, an MQTT PUBACK/PUBREC/PUBREL/PUBCOMP, a bridge ACK).

Why one component: the rule "a confirmation leaves only after the store has synced
everything written before it" and what happens when the sync fails must read the same
for every protocol, or a store failure confirms a message in one protocol and not in
another.

The failure policy, the same everywhere: a confirmation whose sync fails is never sent,
nor is any later one on that connection; the connection is failed once with
``message could not be stored: <reason>`` (an ERROR frame, an MQTT DISCONNECT with
Unspecified error, a bridge link abort). The client resends what it was never
confirmed, and duplicate detection absorbs the repeats.

On a shard of a node with several (docs/design.md, "Shards"), what the core routed to
destinations other shards own is confirmed by their ``STORED``: ``owners`` (set by the
runtime), called right after the core's decisions are written, returns a future that is
done once the owners those decisions went to have stored everything sent to them so
far, and a confirmation waits for both; a subscription's confirmation waits for the
owners to run its relayed consumers (``opened``), an acknowledgement's for them to
store its settlements (``settled``). A shard link's own ``STORED`` waits for the
local sync only (``owners=False``), or two shards sending to each other would wait on
each other.

With ``[trace] exact``, the trace is flushed before a confirmation that waited for the
store leaves (confirmations sent in the same turn are flushed by the pump, which flushes
the trace first).

Cost per confirmation, which is what a producer at a confirmation window of 1 pays for
every message: the syncs asked for in one event-loop turn share one store sync, started
after the turn's pump has written its batch (so a message and the removal of its
``ack:auto`` delivery in that pump reach the journal as one record, one write and one
fsync), and a connection's confirmations wait on done-callbacks, not on a task each.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from meshmq.core.consumer import Consumer
    from meshmq.core.state import Connection
    from meshmq.network.shard_clients import ClientClaims

log = logging.getLogger("meshmq.durability")

NOT_STORED: Final = "message could not be stored"


class Durability:
    """Owned by the runtime: writes the core's pending store operations and starts a
    store sync that covers them.

    ``request_pump``: the runtime's pump request. Syncs asked for in a turn start once,
    after that turn's pump (``request_pump`` first, then ``call_soon``: the pump is
    ahead in the loop's queue), so the pump's operations share their record."""

    def __init__(self, write_ops: Callable[[], None], sync: Callable[[], Awaitable[None]],
                 trace_barrier: Callable[[], None],
                 request_pump: Callable[[], None] | None = None) -> None:
        self._write_ops = write_ops
        self._sync = sync
        self.trace_barrier = trace_barrier
        self._request_pump = request_pump
        # The turn's shared futures: the local sync alone, and the local sync with the
        # owners' STORED (a shard of several).
        self._next: asyncio.Future[None] | None = None
        self._next_owned: asyncio.Future[None] | None = None
        self._scheduled = False
        self.syncs_started = 0  # store syncs asked for (one per turn that wanted any)
        # A shard of several: the owners' STORED for what was sent so far (None when
        # nothing is outstanding).
        self.owners: Callable[[], asyncio.Future[None] | None] | None = None
        # A shard of several: the owners' answer that they run a subscription's relayed
        # consumers (None when none is relayed).
        self.relays: Callable[[Iterable[Consumer]], asyncio.Future[None] | None] | None = None
        # ... and their answer that they stored what was settled with them so far.
        self.settles: Callable[[Iterable[Consumer]], asyncio.Future[None] | None] | None = \
            None
        # ... and, for a COMMIT that spans shards, its durable decision to commit.
        self.txns: Callable[[Connection], asyncio.Future[None] | None] | None = None
        # ... and, for a CONNECT with a client id, the node's claim of it (the client id's
        # owning shard grants it, with its MQTT session record): the shard's claims.
        self.clients: ClientClaims | None = None

    def committed(self, conn: Connection) -> asyncio.Future[None] | None:
        """What the confirmation of the COMMIT just made on ``conn`` waits for beyond
        the local sync: on a shard of several, when the transaction spans shards, its
        two-phase commit's durable decision (it fails if the transaction rolls back)."""
        return self.txns(conn) if self.txns is not None else None

    def opened(self, consumers: Iterable[Consumer]) -> asyncio.Future[None] | None:
        """What a subscription's confirmation (STOMP RECEIPT, MQTT SUBACK) waits for:
        on a shard of several, the owners of the destinations it is relayed from running
        its consumers, so a message sent after the confirmation reaches it."""
        return self.relays(consumers) if self.relays is not None else None

    def settled(self, consumers: Iterable[Consumer]) -> asyncio.Future[None] | None:
        """What an acknowledgement's confirmation (the RECEIPT of an ACK or NACK) waits
        for beyond the local sync: on a shard of several, the owners of the destinations
        ``consumers`` are relayed from having stored the settlements; it fails if an
        owner stops first (it delivers those messages again)."""
        return self.settles(consumers) if self.settles is not None else None

    def sync_after_writes(self, *, owners: bool = True) -> asyncio.Future[None]:
        """A future done once everything the core has queued now (and everything written
        before) is durable, and with ``owners`` stored by the shards it went to; it fails
        with the store's error. The write and the sync start later in this loop turn,
        shared by every call made before they do."""
        owned = owners and self.owners is not None
        fut = self._next_owned if owned else self._next
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            if owned:
                self._next_owned = fut
            else:
                self._next = fut
            if not self._scheduled:
                self._scheduled = True
                if self._request_pump is not None:
                    self._request_pump()
                loop.call_soon(self._start)
        return fut

    def _start(self) -> None:
        local, owned = self._next, self._next_owned
        self._next = self._next_owned = None
        self._scheduled = False
        self.syncs_started += 1
        try:
            self._write_ops()
            sync = asyncio.ensure_future(self._sync())
        except Exception as exc:  # a store that refuses at once: fail what waits
            for fut in (local, owned):
                if fut is not None:
                    fut.set_exception(exc)
            return
        if local is not None:
            if sync.done():  # a store that synced on the loop: settled in this turn
                _settles(local)(sync)
            else:
                sync.add_done_callback(_settles(local))
        if owned is not None:
            # Taken after the write: the decisions the pump just wrote went out to
            # their owners, and their STORED is in this future.
            stored = self.owners() if self.owners is not None else None
            if stored is None:
                sync.add_done_callback(_settles(owned))
            else:
                _when_both(sync, stored, owned)

    def when_durable(self, on_durable: Callable[[], None], fail: Callable[[str], None],
                     who: str, *, owners: bool = True) -> None:
        """Unordered: ``on_durable()`` once what is queued now is durable, or
        ``fail(reason)`` if the store could not make it so. For confirmations that name
        what they confirm (a bridge ACK carries sequence numbers), so no order is owed."""
        sync = self.sync_after_writes(owners=owners)

        def done(fut: asyncio.Future[None]) -> None:
            exc = _failure(fut)
            if exc is not None:
                log.error("store sync failed; confirmation withheld from %s: %s", who, exc)
                fail(f"{NOT_STORED}: {exc}")
                return
            self.trace_barrier()
            on_durable()

        sync.add_done_callback(done)

    def confirmations(self, *, flush: Callable[[], None], closed: Callable[[], bool],
                      fail: Callable[[str], None], who: str) -> ConfirmQueue:
        """A connection's ordered confirmations (see ``ConfirmQueue``)."""
        return ConfirmQueue(self, flush=flush, closed=closed, fail=fail, who=who)


def _settles(fut: asyncio.Future[None]) -> Callable[[asyncio.Future[None]], None]:
    """A done-callback that passes a sync's outcome on to ``fut``."""
    def done(s: asyncio.Future[None]) -> None:
        if fut.done():
            return
        exc = _failure(s)
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)

    return done


def _when_both(sync: asyncio.Future[None], stored: asyncio.Future[None],
               fut: asyncio.Future[None]) -> None:
    """Settle ``fut`` once the local sync and the owners' STORED are both done (with the
    first failure, if any): done-callbacks, no task."""
    def done(_: asyncio.Future[None]) -> None:
        if fut.done():
            return
        for part in (sync, stored):
            if part.done():
                exc = _failure(part)
                if exc is not None:
                    fut.set_exception(exc)
                    return
        if sync.done() and stored.done():
            fut.set_result(None)

    sync.add_done_callback(done)
    stored.add_done_callback(done)


def _failure(fut: asyncio.Future[None]) -> BaseException | None:
    if fut.cancelled():
        return asyncio.CancelledError("store sync cancelled")
    return fut.exception()


class ConfirmQueue:
    """One connection's confirmations, sent in the order they were made.

    ``confirm(send, durable=True)`` writes the core's queued operations and sends once a
    sync covers them; ``durable=False`` sends at once unless earlier confirmations still
    wait, then behind them (a client never sees a later receipt before an earlier one).
    ``send`` writes the confirmation into the connection's output; the queue calls
    ``flush`` once after sending those that waited. Nothing is sent once ``closed()``.

    ``len()`` is how many confirmations wait: a session that stops reading its client
    above some number of them asks ``when_drained`` to hear when they are out.
    """

    def __init__(self, durability: Durability, *, flush: Callable[[], None],
                 closed: Callable[[], bool], fail: Callable[[str], None], who: str) -> None:
        self._durability = durability
        self._flush = flush
        self._closed = closed
        self._fail = fail
        self._who = who
        self._pending: deque[tuple[Callable[[], None], asyncio.Future[None] | None]] = deque()
        self._watched: asyncio.Future[None] | None = None  # the last sync given a callback
        self._drained: tuple[int, Callable[[], None]] | None = None
        self.failed = False

    def __len__(self) -> int:
        return len(self._pending)

    def confirm(self, send: Callable[[], None], *, durable: bool,
                after: asyncio.Future[None] | None = None) -> None:
        """``after``: something else the confirmation waits for (``Durability.opened``)."""
        if self.failed:
            return
        wait = self._durability.sync_after_writes() if durable else None
        if after is not None:
            if wait is None:
                wait = after
            else:
                both: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                _when_both(wait, after, both)
                wait = both
        if wait is None and not self._pending:
            send()  # flushed by the pump this turn (after the trace barrier)
            return
        self._pending.append((send, wait))
        if wait is not None and wait is not self._watched:
            # Syncs of one turn are shared: one callback per sync, not per confirmation.
            self._watched = wait
            wait.add_done_callback(self._advance)

    def when_drained(self, low: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once at most ``low`` confirmations wait (or the queue
        failed); replaces an earlier request."""
        self._drained = (low, callback)

    def _advance(self, _: object = None) -> None:
        pending = self._pending
        sent = False
        while pending:
            send, wait = pending[0]
            if wait is not None:
                if not wait.done():
                    break  # its own callback comes
                exc = _failure(wait)
                if exc is not None:  # a store failure: never confirm
                    pending.clear()
                    self.failed = True
                    if self._closed():
                        # The connection is gone (the broker stopping closes it before
                        # its store): nobody to withhold a confirmation from.
                        log.debug("store sync failed after %s closed: %s", self._who, exc)
                        break
                    log.error("store sync failed; confirmation withheld from %s: %s",
                              self._who, exc)
                    self._fail(f"{NOT_STORED}: {exc}")
                    break
            pending.popleft()
            if self._closed():
                continue
            if not sent:
                self._durability.trace_barrier()  # trace.exact: traced before confirmed
                sent = True
            send()
        if sent:
            self._flush()
        drained = self._drained
        if drained is not None and (len(pending) <= drained[0] or self.failed):
            self._drained = None
            drained[1]()
