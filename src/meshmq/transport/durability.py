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
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshmq.core.consumer import Consumer

log = logging.getLogger("meshmq.durability")

NOT_STORED = "message could not be stored"


class Durability:
    """Owned by the runtime: writes the core's pending store operations and starts a
    store sync that covers them."""

    def __init__(self, write_ops: Callable[[], None], sync: Callable[[], Awaitable[None]],
                 trace_barrier: Callable[[], None]) -> None:
        self._write_ops = write_ops
        self._sync = sync
        self.trace_barrier = trace_barrier
        # A shard of several: the owners' STORED for what was sent so far (None when
        # nothing is outstanding).
        self.owners: Callable[[], asyncio.Future[None] | None] | None = None
        # A shard of several: the owners' answer that they run a subscription's relayed
        # consumers (None when none is relayed).
        self.relays: Callable[[Iterable[Consumer]], asyncio.Future[None] | None] | None = None
        # ... and their answer that they stored what was settled with them so far.
        self.settles: Callable[[Iterable[Consumer]], asyncio.Future[None] | None] | None = \
            None

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
        """Write what the core has queued, then sync: the future is done once all of it
        (and everything written before) is durable; it fails with the store's error."""
        self._write_ops()
        sync = asyncio.ensure_future(self._sync())
        if owners and self.owners is not None:
            stored = self.owners()
            if stored is not None:
                return asyncio.ensure_future(_both(sync, stored))
        return sync

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


async def _both(sync: asyncio.Future[None], stored: asyncio.Future[None]) -> None:
    await asyncio.gather(sync, stored)


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
    ``flush`` after sending one that waited. Nothing is sent once ``closed()``.
    """

    def __init__(self, durability: Durability, *, flush: Callable[[], None],
                 closed: Callable[[], bool], fail: Callable[[str], None], who: str) -> None:
        self._durability = durability
        self._flush = flush
        self._closed = closed
        self._fail = fail
        self._who = who
        self._pending: deque[tuple[Callable[[], None], asyncio.Future[None] | None]] = deque()
        self._task: asyncio.Task[None] | None = None
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
            wait = after if wait is None else asyncio.ensure_future(_both(wait, after))
        if wait is None and not self._pending:
            send()  # flushed by the pump this turn (after the trace barrier)
            return
        self._pending.append((send, wait))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                send, wait = self._pending[0]
                if wait is not None:
                    try:
                        await wait
                    except Exception as exc:  # a store failure: never confirm
                        self._pending.clear()
                        self.failed = True
                        log.error("store sync failed; confirmation withheld from %s: %s",
                                  self._who, exc)
                        self._fail(f"{NOT_STORED}: {exc}")
                        return
                self._pending.popleft()
                if self._closed():
                    continue
                self._durability.trace_barrier()  # trace.exact: traced before confirmed
                send()
                self._flush()
        finally:
            self._task = None
