"""A queue's pending order (``PendingOrder``: a deque for the run of one priority in
arrival order, a heap for the rest) against the plain heap it replaces (Hypothesis):
for random mixes of priorities, new entries, redeliveries returning to their place,
pages read after newer messages, removals and skipped entries put back, the next entry
is always the heap's, and a FIFO queue's usual traffic never reaches the heap."""

from __future__ import annotations

import heapq
from types import SimpleNamespace
from typing import cast

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import admin
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.queue import (
    DONE,
    INFLIGHT,
    PENDING,
    Delivery,
    Entry,
    PendingOrder,
    Queue,
    QueueContext,
)
from meshmq.core.usage import MemoryUsage
from meshmq.store.memory import MemoryStore

Q = dst.queue("order")
PRIORITIES = st.integers(0, 9)


# The queue the entries belong to: PendingOrder never looks at it (the queue keeps its
# context's usage and mark_dirty when made, nothing else).
_CONTEXT = SimpleNamespace(usage=MemoryUsage(0), mark_dirty=lambda queue: None)
_QUEUE = Queue(Q, None, DestinationPolicy(match="queue://>"), cast(QueueContext, _CONTEXT),
               None)


def _entry(seq: int, priority: int) -> Entry:
    return Entry(_QUEUE, seq, Message(f"id-{seq}", Q, b"", priority=priority), False)


class HeapModel:
    """The heap the queue used before: (key, seq, entry) items, deleted lazily."""

    def __init__(self, prioritized: bool) -> None:
        self.prioritized = prioritized
        self.heap: list[tuple[int, int, Entry]] = []

    def push(self, entry: Entry) -> None:
        key = -entry.message.priority if self.prioritized else 0
        heapq.heappush(self.heap, (key, entry.seq, entry))

    def pop_first(self) -> Entry | None:
        while self.heap:
            entry = heapq.heappop(self.heap)[2]
            if entry.state == PENDING:
                return entry
        return None


class PendingOrderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.prioritized = True
        self.order = PendingOrder(True)
        self.model = HeapModel(True)
        self.next_seq = 1000  # new messages; pages read late use the seqs below
        self.used: set[int] = set()
        self.pending: list[Entry] = []
        self.taken: list[Entry] = []  # popped (in flight), may come back

    @precondition(lambda self: not self.used)
    @rule(prioritized=st.booleans())
    def kind(self, prioritized: bool) -> None:
        self.prioritized = prioritized
        self.order = PendingOrder(prioritized)
        self.model = HeapModel(prioritized)

    def _add(self, entry: Entry) -> None:
        self.used.add(entry.seq)
        self.pending.append(entry)
        self.order.push(entry)
        self.model.push(entry)

    @rule(priority=PRIORITIES, n=st.integers(1, 5))
    def arrive(self, priority: int, n: int) -> None:
        for _ in range(n):
            self.next_seq += 1
            self._add(_entry(self.next_seq, priority))

    @rule(priority=PRIORITIES, seq=st.integers(1, 999))
    def page_read_late(self, priority: int, seq: int) -> None:
        if seq not in self.used:
            self._add(_entry(seq, priority))

    @precondition(lambda self: bool(self.taken))
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.taken))
        self.taken.remove(entry)
        entry.state = PENDING
        self.pending.append(entry)
        self.order.push(entry)
        self.model.push(entry)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.pending))
        self.pending.remove(entry)
        entry.state = DONE  # left where it is: deleted lazily

    @rule(n=st.integers(1, 6))
    def take(self, n: int) -> None:
        for _ in range(n):
            expected = self.model.pop_first()
            got = self.order.first()
            assert got is expected
            if got is None:
                return
            self.order.pop_first()
            got.state = INFLIGHT
            self.pending.remove(got)
            self.taken.append(got)

    @rule(n=st.integers(1, 6))
    def skip_and_put_back(self, n: int) -> None:
        """A dispatch pass that steps over entries no consumer takes (selectors, groups)
        puts them back newest first."""
        skipped = []
        for _ in range(n):
            entry = self.order.first()
            if entry is None:
                break
            self.order.pop_first()
            skipped.append(entry)
        for entry in reversed(skipped):
            self.order.push(entry)

    @invariant()
    def same_live_items(self) -> None:
        live = sorted((k, s) for k, s, e in self.order.items() if e.state == PENDING)
        key = (lambda e: -e.message.priority) if self.prioritized else (lambda e: 0)
        assert live == sorted((key(e), e.seq) for e in self.pending)


PendingOrderMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                                 deadline=None, derandomize=True,
                                                 database=None)
TestPendingOrder = PendingOrderMachine.TestCase


def test_fifo_arrivals_and_the_oldest_returned_never_reach_the_heap() -> None:
    order = PendingOrder(False)
    entries = [_entry(seq, seq % 10) for seq in range(1, 101)]
    for entry in entries:
        order.push(entry)
    first = order.first()
    assert first is entries[0]
    order.pop_first()
    first.state = INFLIGHT
    first.state = PENDING
    order.push(first)  # returned (NACK): older than the front, so back at the front
    assert order._heap == []
    taken = []
    while (entry := order.first()) is not None:
        order.pop_first()
        entry.state = INFLIGHT
        taken.append(entry)
    assert taken == entries and order._heap == []


class QueueOrderMachine(RuleBasedStateMachine):
    """The same order through a real broker queue: every delivery is the pending
    message of the highest priority (when prioritized) and then the lowest seq, with
    NACKed messages returning to their place and others deleted through the admin API."""

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.broker: Broker | None = None
        self.sent = 0
        self.pending: dict[str, tuple[int, int]] = {}  # message id -> (key, seq)
        self.holding: dict[str, int] = {}  # message id -> tag
        self.consumer: Consumer | None = None

    @precondition(lambda self: self.broker is None)
    @rule(prioritized=st.booleans(), prefetch=st.integers(1, 4))
    def start(self, prioritized: bool, prefetch: int) -> None:
        self.prioritized = prioritized
        config = BrokerConfig(broker_name="po", policies=(DestinationPolicy(
            match="queue://>", prioritized_messages=prioritized, max_redeliveries=-1),))
        self.broker = Broker(config, self.store, clock=lambda: 1000)
        self.broker.recover(self.store.open())
        self.conn = self.broker.open_connection(self.broker.authenticate(None, None))
        self.consumer = self.broker.subscribe(self.conn, "s", ConsumerSpec(
            destinations=(Q,), ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=prefetch))

    def pump(self) -> None:
        assert self.broker is not None
        self.broker.dispatch_dirty()
        self.broker.take_ops()
        for out in self.broker.take_outcomes():
            assert isinstance(out, Delivery)
            mid = out.message.message_id
            assert self.pending, "a delivery with nothing pending"
            assert mid == min(self.pending, key=self.pending.__getitem__), \
                "delivered out of (priority, seq) order"
            del self.pending[mid]
            self.holding[mid] = out.tag

    @precondition(lambda self: self.broker is not None)
    @rule(priority=PRIORITIES, n=st.integers(1, 4))
    def send(self, priority: int, n: int) -> None:
        assert self.broker is not None
        for _ in range(n):
            self.sent += 1
            mid = f"m{self.sent}"
            self.pending[mid] = (-priority if self.prioritized else 0, self.sent)
            self.broker.send(self.conn, (Q,), Message(mid, Q, b"x", priority=priority))
        self.pump()

    def _settle(self, data: st.DataObject, *, ack: bool) -> None:
        assert self.broker is not None and self.consumer is not None
        mid = data.draw(st.sampled_from(sorted(self.holding)))
        tag = self.holding.pop(mid)
        if ack:
            self.broker.ack(self.conn, self.consumer, tag, cumulative=False)
        else:
            queue = self.broker.queues[Q]
            entry = self.consumer.dispatched[tag]
            self.pending[mid] = (-entry.message.priority if self.prioritized else 0,
                                 entry.seq)
            assert queue is entry.queue
            self.broker.nack(self.conn, self.consumer, tag, cumulative=False)
        self.pump()

    @precondition(lambda self: bool(self.holding))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self._settle(data, ack=True)

    @precondition(lambda self: bool(self.holding))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        self._settle(data, ack=False)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        assert self.broker is not None
        mid = data.draw(st.sampled_from(sorted(self.pending)))
        admin.delete_message(self.broker, Q, mid)
        del self.pending[mid]
        self.pump()

    @invariant()
    def browse_shows_the_dispatch_order(self) -> None:
        if self.broker is None or Q not in self.broker.queues:
            return
        shown = [m.message_id for m, _ in self.broker.queues[Q].browse()
                 if m.message_id in self.pending]
        assert shown == sorted(self.pending, key=self.pending.__getitem__)


QueueOrderMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                               deadline=None, derandomize=True,
                                               database=None)
TestQueueOrder = QueueOrderMachine.TestCase
