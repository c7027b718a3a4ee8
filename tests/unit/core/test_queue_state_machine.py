"""Hypothesis drives one queue through random sends, subscribes, acks, nacks and
consumer losses, and checks the invariants that make a queue trustworthy:

* conservation: every message sent is exactly one of pending, in flight (with one
  consumer), consumed, or dead-lettered — never lost, never duplicated;
* a consumer never holds more unacked messages than its prefetch window;
* first deliveries come in send order (ordering per producer);
* whatever is pending when a consumer with room exists gets dispatched (no stuck queue)
  once the pages the queue asked for have arrived; pages arrive late, possibly stale,
  or fail, and order and conservation still hold.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.paging import PageLoad
from meshmq.core.queue import Delivery
from meshmq.store.base import StoredEntry
from meshmq.store.memory import MemoryStore

MAX_REDELIVERIES = 3
Q = dst.queue("sm")
DLQ = dst.queue("ActiveMQ.DLQ")


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        config = BrokerConfig(broker_name="sm", policies=(
            DestinationPolicy(match="queue://>", max_redeliveries=MAX_REDELIVERIES,
                              page_size=8),))
        self.broker = Broker(config, self.store, clock=lambda: 1000)
        self.broker.recover(self.store.open())
        self.conn = self.broker.open_connection(self.broker.authenticate(None, None))
        self.sent: list[str] = []
        self.consumed: list[str] = []
        self.first_seen: list[str] = []
        self.holding: dict[str, Consumer] = {}  # body -> consumer holding it unacked
        self.tags: dict[str, int] = {}
        self.consumers: list[Consumer] = []
        self.next_id = 0
        # Pages the queue asked for (core/paging.py), read when asked (a snapshot, as a
        # store that reads off the loop may return) and handed back by a later rule.
        self.loads: list[tuple[PageLoad, list[StoredEntry]]] = []

    def pump(self) -> None:
        self.broker.dispatch_dirty()
        ops = self.broker.take_ops()
        if ops:
            self.store.write(ops)
        for load in self.broker.take_page_loads():
            self.loads.append((load, self.store.load(load.key, load.after_seq, load.count)))
        for out in self.broker.take_outcomes():
            assert isinstance(out, Delivery)
            body = out.message.body.decode()
            if out.message.destination != Q:
                continue
            assert body not in self.holding, f"{body} delivered while already in flight"
            if out.delivery_count == 1:
                self.first_seen.append(body)
            if out.consumer.ack_mode is AckMode.AUTO:
                self.consumed.append(body)
            else:
                self.holding[body] = out.consumer
                self.tags[body] = out.tag

    @rule(persistent=st.booleans())
    def send(self, persistent: bool) -> None:
        body = f"m{len(self.sent):04d}"
        self.sent.append(body)
        self.broker.send(self.conn, (Q,), Message(
            message_id=f"id-{body}", destination=Q, body=body.encode(),
            persistent=persistent, producer_id=self.conn.id))
        self.pump()

    @rule(prefetch=st.integers(1, 4), auto=st.booleans())
    def subscribe(self, prefetch: int, auto: bool) -> None:
        self.next_id += 1
        mode = AckMode.AUTO if auto else AckMode.CLIENT_INDIVIDUAL
        consumer = self.broker.subscribe(self.conn, f"s{self.next_id}", ConsumerSpec(
            destinations=(Q,), ack_mode=mode, prefetch=prefetch))
        self.consumers.append(consumer)
        self.pump()

    @precondition(lambda self: bool(self.holding))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        body = data.draw(st.sampled_from(sorted(self.holding)))
        consumer = self.holding.pop(body)
        self.broker.ack(self.conn, consumer, self.tags.pop(body), cumulative=False)
        self.consumed.append(body)
        self.pump()

    @precondition(lambda self: bool(self.holding))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        body = data.draw(st.sampled_from(sorted(self.holding)))
        consumer = self.holding.pop(body)
        self.broker.nack(self.conn, consumer, self.tags.pop(body), cumulative=False)
        self.pump()

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data())
    def lose_consumer(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(self.consumers))
        self.consumers.remove(consumer)
        for body in [b for b, c in self.holding.items() if c is consumer]:
            del self.holding[body]
            del self.tags[body]
        self.broker.unsubscribe(self.conn, consumer)
        self.pump()

    @precondition(lambda self: bool(self.loads))
    @rule(reread=st.booleans())
    def page_arrives(self, reread: bool) -> None:
        load, snapshot = self.loads.pop(0)
        if reread:  # or the store is read only now, seeing what was stored meanwhile
            snapshot = self.store.load(load.key, load.after_seq, load.count)
        self.broker.page_loaded(load, snapshot)
        self.pump()

    @precondition(lambda self: bool(self.loads))
    @rule()
    def page_read_fails(self) -> None:
        load, _ = self.loads.pop(0)
        self.broker.page_failed(load)
        self.pump()
        assert self.broker.take_page_loads() == []  # no retry before the next tick
        self.broker.tick()
        self.pump()

    def dead_lettered(self) -> list[str]:
        dlq = self.broker.queues.get(DLQ)
        return [m.body.decode() for m, _ in dlq.browse()] if dlq else []

    def pending(self) -> list[str]:
        queue = self.broker.queues.get(Q)
        if queue is None:
            return []
        inflight = set(self.holding)
        return [m.body.decode() for m, _ in queue.browse() if m.body.decode() not in inflight]

    @invariant()
    def conservation(self) -> None:
        parts = self.pending() + list(self.holding) + self.consumed + self.dead_lettered()
        assert sorted(parts) == sorted(self.sent), "a message was lost or duplicated"

    @invariant()
    def windows_respected(self) -> None:
        for consumer in self.consumers:
            if consumer.ack_mode is not AckMode.AUTO:
                assert len(consumer.dispatched) <= consumer.prefetch

    @invariant()
    def first_deliveries_in_send_order(self) -> None:
        assert self.first_seen == sorted(self.first_seen)

    @invariant()
    def nothing_stuck(self) -> None:
        if any(c.has_capacity for c in self.consumers) and not self.loads:
            assert self.pending() == [], "pending messages while a consumer has room"


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None, derandomize=True,
                                          database=None)
TestQueueMachine = QueueMachine.TestCase
