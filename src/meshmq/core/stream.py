"""Stream destinations: append-only, retained logs whose messages have offsets.

A queue whose name matches a ``[[streams]]`` policy is a stream (as RabbitMQ
streams): every message is appended at the next offset (0, 1, 2, ...) and stays
until retention (``max_bytes``, ``max_age_ms``) trims the oldest. Consuming does
not remove anything: each consumer has its own cursor, chosen at SUBSCRIBE with
``x-stream-offset`` (``first``, ``last``, ``next``, ``offset=N`` or ``N``,
``timestamp=<POSIX seconds>``); acknowledgements only open the consumer's window
again. Every MESSAGE carries its ``x-stream-offset``, so a reader can ask again for
exactly the same range (what the Spark source does for exactly-once replays).

The log lives in the message store under the key ``stream://<name>``, with
store sequence = offset + 1, so it survives restarts like any persistent queue;
offsets are never reused. Timestamps and sizes of the retained messages are kept
in memory (16 bytes per message) for timestamp lookups and size retention; the
bodies of a consumer behind the in-memory tail come back from the store as pages the
stream asks for (``PageLoad``, core/paging.py) and the runtime reads, as a deep queue's
do; only rebuilding the index at start and browsing read the store directly.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from meshmq.config.model import DestinationPolicy, StreamPolicy
from meshmq.core.consumer import AckMode, Consumer
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.paging import PageLoad
from meshmq.core.queue import DONE, INFLIGHT, Delivery, Entry, Queue, QueueContext
from meshmq.core.trace import DROPPED
from meshmq.errors import ProtocolError
from meshmq.store.base import RemoveRef

if TYPE_CHECKING:
    from meshmq.store.base import Store, StoredEntry

STREAM_PREFIX: Final = "stream://"
OFFSET_HEADER: Final = "x-stream-offset"
# meshmq extension: the RECEIPT of a SUBSCRIBE to a stream says what it holds.
FIRST_HEADER: Final = "x-stream-first"  # oldest offset still retained
NEXT_HEADER: Final = "x-stream-next"  # offset the next message will get
TAIL_MESSAGES: Final = 2000  # recent messages kept in memory for live consumers
PAGE: Final = 500  # messages read from the store at once for a consumer that is behind


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """Where a stream consumer starts: ``kind`` is first, last, next, offset or
    timestamp; ``value`` the offset, or the timestamp in ms."""

    kind: str
    value: int = 0


NEXT: Final = StreamOffset("next")


def parse_offset(text: str) -> StreamOffset:
    """Parse an ``x-stream-offset`` header value."""
    value = text.strip()
    low = value.lower()
    if low in ("first", "last", "next"):
        return StreamOffset(low)
    kind, sep, number = low.partition("=")
    if not sep:
        kind, number = "offset", low
    try:
        if kind == "offset":
            n = int(number)
            if n < 0:
                raise ValueError
            return StreamOffset("offset", n)
        if kind == "timestamp":
            seconds = float(number)
            if not 0 <= seconds < 1e13:  # negative, NaN or absurd
                raise ValueError
            return StreamOffset("timestamp", int(seconds * 1000))
    except ValueError:
        pass
    raise ProtocolError(f"invalid {OFFSET_HEADER} {text!r}: use first, last, next, "
                        "offset=<n> (or <n>), or timestamp=<POSIX seconds>",
                        code="invalid-stream-offset")


def stream_key(dest: Destination) -> str:
    return STREAM_PREFIX + dest.name


class StreamQueue(Queue):
    """A stream destination. Subclasses ``Queue`` so statistics, consumer tiers and
    the broker's bookkeeping treat it as a queue; dispatch and acks differ."""

    retains_all = True

    def __init__(self, destination: Destination, policy: DestinationPolicy,
                 stream: StreamPolicy, ctx: QueueContext, store: Store, *,
                 first_seq: int = 0, last_seq: int = 0) -> None:
        super().__init__(destination, stream_key(destination), policy, ctx, store,
                         last_seq=last_seq)
        self._paging = False  # the base class's paging does not apply
        self.stream = stream
        self._store = store
        self.first_seq = first_seq if first_seq else last_seq + 1  # oldest retained
        # Timestamps (ms) and body sizes of seqs first_seq.. (from index _head on).
        self._ts = array("q")
        self._sizes = array("q")
        self._head = 0
        self.retained_bytes = 0
        self._tail: OrderedDict[int, Message] = OrderedDict()
        self._page: dict[int, Message] = {}
        self.cursors: dict[Consumer, int] = {}  # consumer -> next seq to deliver
        self._starts: dict[Consumer, StreamOffset] = {}
        if last_seq >= self.first_seq:
            self._rebuild_index()

    # ------------------------------------------------------------ offsets
    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def first_offset(self) -> int:
        return self.first_seq - 1

    @property
    def next_offset(self) -> int:
        return self._next_seq - 1

    @property
    def depth(self) -> int:
        return self._next_seq - self.first_seq

    @property
    def in_memory_bytes(self) -> int:
        return sum(len(m.body) for m in self._tail.values())

    def _rebuild_index(self) -> None:
        after = self.first_seq - 1
        while True:
            entries = self._store.load(self.key or "", after, 1000)
            for e in entries:
                if not self._ts:
                    self.first_seq = e.seq
                self._ts.append(e.message.timestamp)
                self._sizes.append(len(e.message.body))
                self.retained_bytes += len(e.message.body)
                after = e.seq
            if len(entries) < 1000:
                break
        if not self._ts:
            self.first_seq = self._next_seq

    def seq_for(self, start: StreamOffset) -> int:
        """The first seq a consumer starting at ``start`` gets."""
        kind = start.kind
        if kind == "first":
            return self.first_seq
        if kind == "last":
            return max(self.first_seq, self._next_seq - 1)
        if kind == "offset":
            return min(max(start.value + 1, self.first_seq), self._next_seq)
        if kind == "timestamp":
            i = bisect.bisect_left(self._ts, start.value, lo=self._head)
            return self.first_seq + (i - self._head)
        return self._next_seq

    def stamp(self, message: Message, seq: int) -> Message:
        """The message as the stream keeps it: a copy carrying its offset."""
        props = dict(message.properties)
        props[OFFSET_HEADER] = seq - 1
        return message.copy_to(self.destination, properties=props)

    # ------------------------------------------------------------ appending and retention
    def enqueue(self, message: Message, seq: int, persisted: bool,
                delivery_count: int = 0) -> None:
        # (delivery_count: a stream's readers track offsets, not deliveries.)
        self.stats.enqueued += 1
        self._ts.append(message.timestamp)
        size = len(message.body)
        self._sizes.append(size)
        self.retained_bytes += size
        self._tail[seq] = message
        if len(self._tail) > TAIL_MESSAGES:
            self._tail.popitem(last=False)
        if self.stream.max_bytes and self.retained_bytes > self.stream.max_bytes:
            self._trim(lambda: self.retained_bytes > self.stream.max_bytes)
        if self.cursors:
            self.ctx.mark_dirty(self)

    def expire_pending(self) -> None:
        """Called periodically: retention by age."""
        if not self.stream.max_age_ms or self._head >= len(self._ts):
            return
        cutoff = self.ctx.now_ms() - self.stream.max_age_ms
        self._trim(lambda: self._ts[self._head] < cutoff)

    def _trim(self, too_much: object) -> None:
        assert callable(too_much)
        tracer = self.ctx.tracer
        # Always keep the newest message, so the stream's offsets stay discoverable.
        while self._head < len(self._ts) - 1 and too_much():
            seq = self.first_seq
            self.retained_bytes -= self._sizes[self._head]
            self._head += 1
            self.first_seq += 1
            self.ctx.store_op(RemoveRef(self.key or "", seq))
            gone = self._tail.pop(seq, None)
            if tracer is not None and gone is not None:
                tracer.message(DROPPED, gone, self.destination, reason="stream retention")
        if self._head > 4096 and self._head * 2 > len(self._ts):
            del self._ts[:self._head]
            del self._sizes[:self._head]
            self._head = 0
        for consumer, cursor in self.cursors.items():
            if cursor < self.first_seq:
                self.cursors[consumer] = self.first_seq  # it lost what was trimmed

    # ------------------------------------------------------------ consumers
    def expect(self, consumer: Consumer, start: StreamOffset) -> None:
        """Set where ``consumer`` starts (before ``add_consumer``)."""
        self._starts[consumer] = start

    def add_consumer(self, consumer: Consumer) -> None:
        start = self._starts.pop(consumer, NEXT)
        self.cursors[consumer] = self.seq_for(start)
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        self.cursors.pop(consumer, None)
        self._starts.pop(consumer, None)
        super().remove_consumer(consumer)

    def _message(self, seq: int) -> Message | None:
        """The message at ``seq`` if it is in memory (the tail or the last page read)."""
        return self._tail.get(seq) or self._page.get(seq)

    def _read(self, seq: int) -> Message | None:
        """The message at ``seq``, read from the store at once if need be: only for
        browsing, an operator's request (dispatching asks for a page instead)."""
        msg = self._message(seq)
        if msg is None:
            entries = self._store.load(self.key or "", seq - 1, PAGE)
            self._page = {e.seq: e.message for e in entries}
            msg = self._page.get(seq)
        return msg

    def _ask_page(self, seq: int) -> None:
        """A consumer is behind the in-memory tail: ask for the page of the log from
        ``seq`` on (core/paging.py, the same decision queues use); one at a time."""
        if self.loading is None:
            load = self.loading = PageLoad(self, self.key or "", seq - 1, PAGE)
            self.ctx.request_page(load)

    def page_loaded(self, load: PageLoad, loaded: list[StoredEntry]) -> None:
        """The page asked for by ``_ask_page``: its consumers carry on from it."""
        if load is not self.loading:
            return
        self.loading = None
        if self.deleted:
            return
        self._page = {e.seq: e.message for e in loaded}
        self.ctx.mark_dirty(self)

    def page_failed(self, load: PageLoad) -> None:
        """The page could not be read: asked again when the broker's housekeeping tick
        dispatches the stream again."""
        if load is self.loading:
            self.loading = None
            self.page_failures += 1

    def dispatch(self) -> None:
        if self.deleted:
            return
        for consumer, start in list(self.cursors.items()):
            cursor = start
            while cursor < self._next_seq and consumer.has_capacity:
                cursor = max(cursor, self.first_seq)  # trimmed meanwhile: skip ahead
                msg = self._message(cursor)
                if msg is None:
                    # Behind the tail: read by the runtime (a page load), dispatched
                    # when it comes back. A message whose store write is still pending
                    # comes back short and is asked for again after that write.
                    self._ask_page(cursor)
                    break
                self._deliver_stream(consumer, msg, cursor)
                cursor += 1
            self.cursors[consumer] = cursor
            if cursor < self._next_seq and consumer.burst and not consumer.paused:
                self.ctx.defer(self)  # budget for this pump used up: go on next pump

    def _deliver_stream(self, consumer: Consumer, msg: Message, seq: int) -> None:
        tag = consumer.next_tag
        consumer.next_tag = tag + 1
        if not consumer.burst:
            self.ctx.bursting(consumer)
        consumer.burst += 1
        consumer.dispatched_count += 1
        self.stats.dispatched += 1
        # Reads of a stream are not traced as deliveries: a stream is read again and
        # again by design, which the audit would otherwise count as duplicates.
        self.ctx.emit(Delivery(consumer, msg, tag, 1))
        if consumer.spec.ack_mode is AckMode.AUTO:
            self.stats.dequeued += 1
            return
        entry = Entry(self, seq, msg, False, 1)
        entry.state = INFLIGHT
        entry.consumer = consumer
        consumer.dispatched[tag] = entry
        consumer.by_message_id[msg.message_id] = tag

    # ------------------------------------------------------------ settling
    def ack_entry(self, entry: Entry) -> None:
        """An acknowledgement only frees window space: the log keeps the message."""
        if entry.state == DONE:
            return
        entry.state = DONE
        entry.consumer = None
        self.stats.dequeued += 1

    def remove_entry(self, entry: Entry, *, consumed: bool = False) -> None:
        entry.state = DONE
        entry.consumer = None

    def release(self, entry: Entry, *, count_delivery: bool = True, cause: str = "",
                reason: str | None = None) -> None:
        """NACK or a closed consumer: nothing to redeliver (a stream consumer picks its
        offset when it subscribes again)."""
        entry.state = DONE
        entry.consumer = None

    def purge(self) -> int:
        return 0  # a stream is trimmed by retention only

    def browse(self, limit: int = 10_000) -> list[tuple[Message, int]]:
        out: list[tuple[Message, int]] = []
        seq = self.first_seq
        while seq < self._next_seq and len(out) < limit:
            msg = self._read(seq)
            if msg is not None:
                out.append((msg, 0))
            seq += 1
        return out
