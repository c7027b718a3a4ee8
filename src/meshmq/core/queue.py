"""A queue: competing consumers, prefetch windows, priorities, groups,
redelivery, expiry and paging to the store.

The same class backs named queues, a topic subscriber's private queue and a
durable subscription, so there is one dispatch engine to get right.

Pending entries are dispatched in (message priority desc, sequence) order:
higher priorities first, FIFO per priority, and a redelivered entry goes back
to its original place (``PendingOrder``: a deque for the usual run of one
priority in arrival order, a heap for the rest). Entries are never removed
eagerly; their ``state`` says whether a stored item is still live (lazy deletion).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from meshmq.config.model import DestinationPolicy
from meshmq.core.consumer import AckMode, Consumer
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.paging import PageLoad
from meshmq.core.selector import message_lookup
from meshmq.core.trace import ACKED, DELIVERED, DISPATCHED, DROPPED, REDELIVERED, Tracer
from meshmq.core.usage import MemoryUsage
from meshmq.store.base import MarkDispatched, RemoveRef, SetDeliveryCount, StoredEntry, StoreOp

if TYPE_CHECKING:
    from meshmq.store.base import Store

PENDING: Final = 0
INFLIGHT: Final = 1
DONE: Final = 2

# How many undeliverable entries (selector or group mismatch) one dispatch pass
# may step over before giving up until the next change.
SCAN_LIMIT = 2000

# The dispatch mark (store.base.MarkDispatched) runs a window of seqs ahead of the
# highest persistent message dispatched, and moves on once dispatching is within half of
# it: one small record per half window, written ahead so that it is durable before
# dispatching reaches it. The window is twice the prefetch of the queue's consumers
# (what one pump may hand out at once), within these bounds; after a crash at most that
# many never-dispatched messages per queue come back flagged redelivered.
DISPATCH_MARK_WINDOW: Final = 512
DISPATCH_MARK_MIN_WINDOW: Final = 32


class Entry:
    __slots__ = ("consumer", "delivery_count", "expiring", "message", "persisted", "queue",
                 "seq", "size", "state")

    def __init__(self, queue: Queue, seq: int, message: Message, persisted: bool,
                 delivery_count: int = 0) -> None:
        self.queue = queue
        self.seq = seq
        self.message = message
        self.persisted = persisted
        self.delivery_count = delivery_count
        self.state = PENDING
        self.consumer: Consumer | None = None
        # What Queue._charge counted for it, kept so that settling it later need not
        # read the message again: on a bridge the acknowledgement comes milliseconds
        # later, when the message has left the CPU's caches.
        self.size = 0
        self.expiring = False

    def __lt__(self, other: Entry) -> bool:  # heap tie-breaker; never reached in practice
        return self.seq < other.seq


class PendingOrder:
    """Pending entries in dispatch order: ascending (key, seq), where the key is the
    negated priority of a prioritized queue and 0 otherwise (plain FIFO).

    A heap of every entry costs a sift through log2(backlog) tuple comparisons per
    message whenever consumers fall behind. But entries nearly always arrive with one
    key and rising seqs, so those go into a deque (O(1) at both ends, which also takes
    back an entry older than its front); only an entry that would break the deque's
    order (a redelivery returning to a place inside it, a page read after newer
    messages, another priority) goes into the heap, and the next entry is the smaller
    of the two heads. The order is
    exactly the heap's; a queue that never has such entries never touches the heap.

    Dead items (``state`` no longer PENDING) are skipped when they reach a head.
    """

    __slots__ = ("_fifo", "_fifo_key", "_from_heap", "_heap", "prioritized")

    def __init__(self, prioritized: bool) -> None:
        self.prioritized = prioritized
        self._fifo: deque[Entry] = deque()  # one key (_fifo_key), seqs ascending
        self._fifo_key = 0
        self._heap: list[tuple[int, int, Entry]] = []
        self._from_heap = False  # where first() found the entry it returned

    def __len__(self) -> int:
        """Items stored, dead ones included."""
        return len(self._fifo) + len(self._heap)

    def push(self, entry: Entry) -> None:
        key = -entry.message.priority if self.prioritized else 0
        fifo = self._fifo
        if not fifo:
            self._fifo_key = key
            fifo.append(entry)
        elif key == self._fifo_key:
            seq = entry.seq
            if seq > fifo[-1].seq:
                fifo.append(entry)
            elif seq < fifo[0].seq:
                fifo.appendleft(entry)  # e.g. the oldest returned, or a skipped one put back
            else:
                heapq.heappush(self._heap, (key, seq, entry))
        else:
            heapq.heappush(self._heap, (key, entry.seq, entry))

    def first(self) -> Entry | None:
        """The next live entry (dropping dead items on the way), or None; ``pop_first``
        removes it, with no ``push`` in between."""
        fifo = self._fifo
        head: Entry | None = None
        while fifo:
            head = fifo[0]
            if head.state == PENDING:
                break
            fifo.popleft()
            head = None
        heap = self._heap
        while heap:
            top = heap[0]
            entry = top[2]
            if entry.state != PENDING:
                heapq.heappop(heap)
                continue
            if head is not None:
                key = self._fifo_key
                if top[0] > key or (top[0] == key and top[1] > head.seq):
                    break
            self._from_heap = True
            return entry
        self._from_heap = False
        return head

    def pop_first(self) -> None:
        if self._from_heap:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()

    def items(self) -> list[tuple[int, int, Entry]]:
        """Every stored item as (key, seq, entry), dead ones included, in no order."""
        prioritized = self.prioritized
        out = [(-e.message.priority if prioritized else 0, e.seq, e) for e in self._fifo]
        out.extend(self._heap)
        return out

    def clear(self) -> None:
        self._fifo.clear()
        self._heap = []


@dataclass(slots=True, init=False)  # hand-written __init__: compiled by mypyc (see Message)
class Delivery:
    """Decision: hand ``message`` to ``consumer`` under delivery ``tag``."""

    consumer: Consumer
    message: Message
    tag: int
    delivery_count: int

    def __init__(self, consumer: Consumer, message: Message, tag: int,
                 delivery_count: int) -> None:
        self.consumer = consumer
        self.message = message
        self.tag = tag
        self.delivery_count = delivery_count

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1


@dataclass(frozen=True, slots=True)
class BrowseEnd:
    """Decision: the queue browser ``consumer`` has seen every message."""

    consumer: Consumer


Outcome = Delivery | BrowseEnd


class QueueContext(Protocol):
    """What a queue needs from its broker (implemented by ``Broker``)."""

    usage: MemoryUsage
    tracer: Tracer | None
    # Whether the store keeps dispatch marks across a restart (so they are worth writing).
    dispatch_marks: bool

    def now_ms(self) -> int: ...
    def store_op(self, op: StoreOp) -> None: ...
    def emit(self, outcome: Outcome) -> None: ...
    def mark_dirty(self, queue: Queue) -> None: ...
    def remember_stored(self, message: Message) -> bool: ...
    def dispatch_marked(self, queue: Queue, mark: int) -> None: ...
    def hold_deliveries(self) -> None: ...
    def defer(self, queue: Queue) -> None: ...
    def bursting(self, consumer: Consumer) -> None: ...
    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None: ...
    def expired(self, queue: Queue, entry: Entry) -> None: ...
    def request_page(self, load: PageLoad) -> None: ...


class QueueStats:
    __slots__ = ("dead_lettered", "dequeued", "dispatched", "enqueued", "expired",
                 "redelivered")

    def __init__(self) -> None:
        self.dead_lettered = 0  # moved to a dead letter queue (not dropped ones)
        self.enqueued = 0
        self.dequeued = 0
        self.dispatched = 0
        self.expired = 0
        self.redelivered = 0


class Queue:
    retains_all = False  # streams (core/stream.py) keep every message, whatever its kind

    def __init__(self, destination: Destination, key: str | None, policy: DestinationPolicy,
                 ctx: QueueContext, store: Store | None, *, last_seq: int = 0,
                 stored_count: int = 0, prefiltered: bool = False,
                 dispatched: int = 0) -> None:
        self.destination = destination
        self.key = key  # store key; None: memory only
        self.policy = policy
        self.ctx = ctx
        # Kept from ctx (a Protocol, so attribute look-ups by name in the compiled build):
        # used per message.
        self._usage: MemoryUsage = ctx.usage
        self._mark_dirty: Callable[[Queue], None] = ctx.mark_dirty
        self.store = store if key is not None else None
        self.prefiltered = prefiltered  # selector already applied when routing (topic subs)
        self.stats = QueueStats()
        self.consumers: list[Consumer] = []
        self._tiers: list[list[Consumer]] = []  # consumers grouped by priority, highest first
        self._rr: list[int] = []
        self._exclusive: Consumer | None = None
        self.groups: dict[str, Consumer] = {}
        # Without prioritizedMessages (ActiveMQ's default) the queue is plain FIFO.
        self._pending = PendingOrder(policy.prioritized_messages)
        self._next_seq = last_seq + 1
        self._count = stored_count  # live entries: pending + in flight + paged out
        self._mem_pending = 0  # PENDING entries in _pending
        self._mem_persisted_pending = 0
        self._mem_bytes = 0
        # Paging: persisted entries with seq > _mem_high live only in the store.
        self._paging = stored_count > 0
        self._mem_high = 0
        # The page being read for this queue (core/paging.py), None when none is.
        self.loading: PageLoad | None = None
        self.page_failures = 0  # loads the edge reported failed (statistics, retries)
        self._expiring = 0  # in-memory entries that carry an expiration
        self.deleted = False
        # Dispatch marks (store.base.MarkDispatched). Entries up to _recovered_mark may
        # have been delivered before the last stop: they come back flagged redelivered.
        # _mark is the highest mark written, _mark_durable the highest known durable; a
        # persistent entry beyond _mark_durable is delivered only once its mark is.
        self._recovered_mark = min(dispatched, last_seq)  # seqs beyond were never used
        self._mark_window = DISPATCH_MARK_MIN_WINDOW
        self._mark = dispatched
        self._mark_durable = dispatched

    # ------------------------------------------------------------ introspection
    @property
    def depth(self) -> int:
        return self._count

    @property
    def in_memory_bytes(self) -> int:
        return self._mem_bytes

    def backlog_over(self, limit: int) -> bool:
        """Whether more than ``limit`` messages wait for a consumer here: in memory, or
        left in the store to be paged in (then the backlog passed the page size)."""
        return self._mem_pending > limit or self._paging

    @property
    def inflight(self) -> int:
        return sum(1 for c in self.consumers for e in c.dispatched.values() if e.queue is self)

    def allocate_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    # ------------------------------------------------------------ consumers
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._rebuild_tiers()
        self._mark_dirty(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for gid in [g for g, c in self.groups.items() if c is consumer]:
            del self.groups[gid]  # the group moves to another consumer
        self._rebuild_tiers()
        self._mark_dirty(self)

    def _rebuild_tiers(self) -> None:
        by_prio: dict[int, list[Consumer]] = {}
        for c in self.consumers:
            if not c.spec.browser:
                by_prio.setdefault(c.priority, []).append(c)
        self._tiers = [by_prio[p] for p in sorted(by_prio, reverse=True)]
        window = 2 * sum(c.prefetch for c in self.consumers)
        self._mark_window = min(DISPATCH_MARK_WINDOW, max(DISPATCH_MARK_MIN_WINDOW, window))
        self._rr = [0] * len(self._tiers)
        self._exclusive = None
        for tier in self._tiers:
            for c in tier:
                if c.spec.exclusive:
                    self._exclusive = c
                    break
            if self._exclusive is not None:
                break

    # ------------------------------------------------------------ enqueue
    def enqueue(self, message: Message, seq: int, persisted: bool,
                delivery_count: int = 0) -> None:
        """Add a routed message (already written to the store when ``persisted``).
        ``delivery_count`` 1: it may have been delivered before it came here."""
        self._count += 1
        self.stats.enqueued += 1
        if persisted and (self._paging or self._mem_persisted_pending >= self.policy.page_size
                          or self._usage.full):
            # Leave it in the store only; it is paged in when the queue drains.
            self._paging = True
            if self.loading is not None:
                self.loading.more = True  # the page in flight may not reach it
            self._mark_dirty(self)
            return
        if persisted:
            self._mem_high = seq
        entry = Entry(self, seq, message, persisted, delivery_count)
        self._charge(entry)
        if not self._mem_pending and self._tiers and not message.expiration \
                and self.loading is None:
            # Fast path: nothing is waiting, so order cannot suffer; hand the message
            # straight to a consumer with room, skipping _pending and a dispatch pass.
            consumer = self._choose(entry)
            if consumer is not None:
                self._mem_pending += 1  # _deliver leaves the pending state
                if persisted:
                    self._mem_persisted_pending += 1
                self._deliver(entry, consumer)
                return
        self._make_pending(entry)
        self._mark_dirty(self)

    def _push(self, entry: Entry) -> None:
        self._charge(entry)
        self._make_pending(entry)
        self._mark_dirty(self)

    def _charge(self, entry: Entry) -> None:
        message = entry.message
        entry.size = size = message.size
        self._mem_bytes += size
        self._usage.charge(size)
        if message.expiration:
            entry.expiring = True
            self._expiring += 1

    def _refund(self, entry: Entry) -> None:
        size = entry.size
        self._mem_bytes -= size
        self._usage.refund(size)
        if entry.expiring:
            self._expiring -= 1

    def _make_pending(self, entry: Entry) -> None:
        entry.state = PENDING
        entry.consumer = None
        self._mem_pending += 1
        if entry.persisted:
            self._mem_persisted_pending += 1
        self._pending.push(entry)

    def _leave_pending(self, entry: Entry, state: int) -> None:
        entry.state = state
        self._mem_pending -= 1
        if entry.persisted:
            self._mem_persisted_pending -= 1

    # ------------------------------------------------------------ dispatch
    def dispatch(self) -> None:
        """Hand pending entries to consumers with room in their window."""
        if self.deleted:
            return
        self._page_in()
        if not self._tiers or not self._mem_pending:
            return
        pending = self._pending
        now = self.ctx.now_ms()
        skipped: list[Entry] = []
        budget = SCAN_LIMIT
        # While a page is being read, nothing beyond it may overtake it.
        loading = self.loading
        boundary = loading.after_seq if loading is not None else -1
        while True:
            entry = pending.first()
            if entry is None:
                break
            if boundary >= 0 and entry.seq > boundary:
                break
            msg = entry.message
            if msg.expiration and now >= msg.expiration:
                pending.pop_first()
                self._expire(entry)
                continue
            consumer = self._choose(entry)
            if consumer is None:
                if not self._any_capacity():
                    if any(c.burst for tier in self._tiers for c in tier):
                        self.ctx.defer(self)  # burst-limited: continue next pump
                    break
                pending.pop_first()
                skipped.append(entry)
                budget -= 1
                if budget <= 0:
                    break
                continue
            pending.pop_first()
            self._deliver(entry, consumer)
            if not self._mem_pending:
                break
        for entry in reversed(skipped):  # newest first: back to the deque's front
            pending.push(entry)
        if self._paging and self.loading is None and \
                self._mem_persisted_pending < self.policy.page_size // 2:
            self._mark_dirty(self)  # more to page in on the next pass

    def _any_capacity(self) -> bool:
        return any(c.has_capacity for tier in self._tiers for c in tier)

    def _accepts(self, consumer: Consumer, entry: Entry) -> bool:
        if not self.prefiltered and consumer.selector is not None and \
                not consumer.selector.matches(message_lookup(
                    entry.message, delivery_count=entry.delivery_count + 1,
                    redelivered=entry.delivery_count > 0)):
            return False
        # Network demand: may it cross this bridge (loops, TTL, rate limit)? Last,
        # because a rate limit counts what it lets through.
        net_filter = consumer.net_filter
        return net_filter is None or net_filter(entry.message)

    def _choose(self, entry: Entry) -> Consumer | None:
        exclusive = self._exclusive
        if exclusive is not None:
            if exclusive.has_capacity and self._accepts(exclusive, entry):
                return exclusive
            return None
        gid = entry.message.group_id
        if gid is not None:
            owner = self.groups.get(gid)
            if owner is not None and not owner.closed:
                if owner.has_capacity and self._accepts(owner, entry):
                    return owner
                return None
            chosen = self._pick(entry)
            if chosen is not None:
                self.groups[gid] = chosen
            return chosen
        return self._pick(entry)

    def _pick(self, entry: Entry) -> Consumer | None:
        for ti, tier in enumerate(self._tiers):
            n = len(tier)
            start = self._rr[ti]
            for k in range(n):
                c = tier[(start + k) % n]
                if c.has_capacity and self._accepts(c, entry):
                    self._rr[ti] = (start + k + 1) % n
                    return c
        return None

    def _deliver(self, entry: Entry, consumer: Consumer) -> None:
        self._leave_pending(entry, INFLIGHT)
        entry.consumer = consumer
        entry.delivery_count += 1
        if entry.delivery_count > 1:
            self.stats.redelivered += 1
        msg = entry.message
        tag = consumer.next_tag
        consumer.next_tag = tag + 1
        if not consumer.burst:
            self.ctx.bursting(consumer)
        consumer.burst += 1
        consumer.dispatched_count += 1
        self.stats.dispatched += 1
        if msg.group_id is not None and msg.group_seq == -1:
            self.groups.pop(msg.group_id, None)  # JMSXGroupSeq -1 closes the group
        self.ctx.emit(Delivery(consumer, msg, tag, entry.delivery_count))
        # A network bridge's consumer is not a delivery: the bridge traces "forwarded".
        tracer = self.ctx.tracer if consumer.spec.network_path is None else None
        if consumer.spec.ack_mode is AckMode.AUTO:
            if tracer is not None:  # one event for dispatch + ack: half the trace cost
                tracer.hot(DELIVERED, msg, self.destination, entry.delivery_count, consumer.id)
            self.remove_entry(entry, consumed=True)
        else:
            if tracer is not None:
                tracer.hot(DISPATCHED, msg, self.destination, entry.delivery_count,
                           consumer.id)
            consumer.dispatched[tag] = entry
            if consumer.spec.network_path is None:
                # For STOMP 1.0/1.1 acks by message id; a bridge settles by tag.
                consumer.by_message_id[msg.message_id] = tag
            if entry.persisted:
                # The exact count, for the DLQ limit after a restart (written, not synced;
                # the dispatch mark is what guarantees the redelivered flag).
                self.ctx.store_op(SetDeliveryCount(self.key or "", entry.seq,
                                                   entry.delivery_count))
        if entry.persisted and self.ctx.dispatch_marks:
            self._cover(entry.seq)

    def _cover(self, seq: int) -> None:
        """Make sure a crash cannot forget that ``seq`` may have been delivered: advance
        the dispatch mark when ``seq`` is beyond it or getting close, and hold this pump's
        deliveries while the mark covering ``seq`` is not durable yet."""
        window = self._mark_window
        if self._mark - seq < window // 2:
            mark = self._mark = seq + window
            self.ctx.store_op(MarkDispatched(self.key or "", mark))
            self.ctx.dispatch_marked(self, mark)
        if seq > self._mark_durable:
            self.ctx.hold_deliveries()

    def mark_durable(self, mark: int) -> None:
        """The store confirmed a dispatch mark written by ``_cover`` (runtime feedback)."""
        self._mark_durable = max(self._mark_durable, mark)

    # ------------------------------------------------------------ settle
    def ack_entry(self, entry: Entry) -> None:
        """The message is consumed: forget it here and in the store."""
        tracer = self.ctx.tracer
        consumer = entry.consumer
        if tracer is not None and entry.state != DONE and (
                consumer is None or consumer.spec.network_path is None):
            tracer.hot(ACKED, entry.message, self.destination, entry.delivery_count,
                       consumer.id if consumer is not None else None)
        self.remove_entry(entry, consumed=True)

    def remove_entry(self, entry: Entry, *, consumed: bool = False) -> None:
        """Forget an entry here and in the store; only a consumption counts as a
        dequeue (expiry, dead-lettering and purges do not)."""
        if entry.state == DONE:
            return
        if entry.state == PENDING:
            self._leave_pending(entry, DONE)
        entry.state = DONE
        entry.consumer = None
        self._count -= 1
        if consumed:
            self.stats.dequeued += 1
        self._refund(entry)
        if entry.persisted and self.key is not None:
            self.ctx.store_op(RemoveRef(self.key, entry.seq))

    def remove_paged(self, seq: int) -> None:
        """Forget a reference that lives only in the store (paged out): ``purge`` and the
        management API's deletes and moves, which do not load the queue."""
        self._count -= 1
        if self.loading is not None and seq > self.loading.after_seq:
            self.loading.dropped.add(seq)  # the page in flight may hold it
        if self.key is not None:
            self.ctx.store_op(RemoveRef(self.key, seq))

    def release(self, entry: Entry, *, count_delivery: bool = True, cause: str = "",
                reason: str | None = None) -> None:
        """Put an in-flight entry back (NACK, consumer gone); dead-letter it once it
        has been delivered more than ``max_redeliveries`` times. ``cause`` is the DLQ's
        text; ``reason`` the trace's for a redelivery."""
        if entry.state != INFLIGHT:
            return
        limit = self.policy.max_redeliveries
        if not count_delivery:
            entry.delivery_count = max(0, entry.delivery_count - 1)
        if limit >= 0 and entry.delivery_count > limit:
            self.ctx.dead_letter(self, entry, cause or
                                 f"delivery count {entry.delivery_count} exceeds "
                                 f"maximumRedeliveries {limit}")
            return
        tracer = self.ctx.tracer
        consumer = entry.consumer
        if tracer is not None and (consumer is None or consumer.spec.network_path is None):
            tracer.message(REDELIVERED, entry.message, self.destination,
                           consumer=consumer.id if consumer is not None else None,
                           delivery_count=entry.delivery_count, reason=reason)
        self._make_pending(entry)
        self._mark_dirty(self)

    def _expire(self, entry: Entry) -> None:
        self.stats.expired += 1
        self.ctx.expired(self, entry)

    def expire_pending(self) -> None:
        """Sweep expired pending entries (called periodically by the broker)."""
        if not self._expiring:
            return
        now = self.ctx.now_ms()
        for _, _, entry in self._pending.items():
            if entry.state == PENDING and entry.message.is_expired(now):
                self._expire(entry)

    # ------------------------------------------------------------ paging
    def _page_in(self) -> None:
        """Ask for the next page of stored messages when the in-memory window runs low
        (a decision: core/paging.py); one load at a time per queue."""
        if not self._paging or self.store is None or self.key is None:
            self._paging = False
            return
        if self.loading is not None:
            return
        want = self.policy.page_size - self._mem_persisted_pending
        if want < self.policy.page_size // 2 or self._usage.full:
            return
        load = self.loading = PageLoad(self, self.key, self._mem_high, want)
        self.ctx.request_page(load)

    def page_loaded(self, load: PageLoad, loaded: list[StoredEntry]) -> None:
        """The page ``load`` asked for, as the store returned it: the entries join the
        queue in seq order and dispatching carries on."""
        if load is not self.loading:
            return  # purged or deleted meanwhile: the page is stale
        self.loading = None
        if self.deleted:
            return
        dropped = load.dropped
        for stored in loaded:
            self._mem_high = stored.seq
            if dropped and stored.seq in dropped:
                continue  # removed by the management API while the page was read
            if stored.message.broker_path or stored.message.properties:
                # After a restart, a bridge or a failover producer may re-send what it
                # never saw confirmed: what is held here goes back in the window.
                self.ctx.remember_stored(stored.message)
            self._push(Entry(self, stored.seq, stored.message, True,
                             self._recovered_count(stored)))
        if len(loaded) < load.count and not load.more:
            self._paging = False
        self._mark_dirty(self)

    def page_failed(self, load: PageLoad) -> None:
        """The store could not read the page: the queue stays paging and asks again
        the next time it is dispatched (the broker retries on its housekeeping tick)."""
        if load is self.loading:
            self.loading = None
            self.page_failures += 1

    def cancel_load(self) -> None:
        """Forget the page in flight (purge, deletion): when it arrives it is ignored."""
        if self.loading is not None:
            self.loading.cancelled = True
            self.loading = None

    # ------------------------------------------------------------ browsing
    def browse(self, limit: int = 10_000) -> list[tuple[Message, int]]:
        """A snapshot of the queue in dispatch order, paged-out messages included."""
        live = sorted((item for item in self._pending.items() if item[2].state != DONE),
                      key=lambda item: (item[0], item[1]))
        seen = {item[2].seq for item in live}
        for c in self.consumers:
            for e in c.dispatched.values():
                if e.queue is self and e.seq not in seen:
                    live.append((-e.message.priority, e.seq, e))
                    seen.add(e.seq)
        out = [(item[2].message, item[2].delivery_count) for item in live[:limit]]
        if self._paging and self.store is not None and self.key is not None \
                and len(out) < limit:
            stored: list[StoredEntry] = self.store.load(self.key, self._mem_high,
                                                        limit - len(out))
            out.extend((s.message, self._recovered_count(s)) for s in stored)
        return out

    def _recovered_count(self, stored: StoredEntry) -> int:
        """The delivery count of a reference read from the store: at least 1 when the
        dispatch mark of the previous run covers it (it may have been delivered, and the
        record of its delivery count or of its acknowledgement may have been lost)."""
        if stored.delivery_count == 0 and stored.seq <= self._recovered_mark:
            return 1
        return stored.delivery_count

    def purge(self) -> int:
        """Remove every pending message (admin operation); returns how many."""
        removed = 0
        tracer = self.ctx.tracer
        for _, _, entry in self._pending.items():
            if entry.state == PENDING:
                if tracer is not None:
                    tracer.message(DROPPED, entry.message, self.destination, reason="purged")
                self.remove_entry(entry)
                removed += 1
        self._pending.clear()  # nothing in it is pending any more
        if self._paging and self.store is not None and self.key is not None:
            self.cancel_load()
            while True:
                page = self.store.load(self.key, self._mem_high, 1000)
                if not page:
                    break
                for s in page:
                    self._mem_high = s.seq
                    self.remove_paged(s.seq)
                    removed += 1
            self._paging = False
        return removed
