"""A stream consumer behind the in-memory tail gets its messages through page loads
(core/paging.py), never by the core reading the store during dispatch."""

from __future__ import annotations

import dataclasses

from tests.unit.core.test_broker_core import Clock, connect, send

from meshmq.config.model import BrokerConfig, StreamPolicy
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.consumer import ConsumerSpec
from meshmq.core.queue import Delivery
from meshmq.core.stream import TAIL_MESSAGES, parse_offset
from meshmq.store.base import StoredEntry
from meshmq.store.memory import MemoryStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def load(self, key: str, after_seq: int, count: int) -> list[StoredEntry]:
        self.loads += 1
        return super().load(key, after_seq, count)


def _stream_broker() -> tuple[Broker, CountingStore]:
    store = CountingStore()
    config = dataclasses.replace(BrokerConfig(broker_name="unit"),
                                 streams=(StreamPolicy(match="queue://log"),))
    broker = Broker(config, store, clock=Clock())
    broker.recover(store.open())
    return broker, store


def test_replaying_from_the_first_offset_asks_for_pages() -> None:
    broker, store = _stream_broker()
    conn = connect(broker)
    total = TAIL_MESSAGES + 10  # the first ten are no longer in memory
    for i in range(total):
        send(broker, conn, "log", f"m{i}")
    store.write(broker.take_ops())
    store.loads = 0
    reader = broker.subscribe(conn, "r", ConsumerSpec(destinations=(dst.queue("log"),),
                                                      prefetch=5),
                              stream_offset=parse_offset("first"))
    broker.dispatch_dirty()
    assert [o for o in broker.take_outcomes() if isinstance(o, Delivery)] == []
    loads = broker.take_page_loads()
    assert store.loads == 0  # a decision, not a read
    assert [(load.key, load.after_seq) for load in loads] == [("stream://log", 0)]
    broker.dispatch_dirty()
    assert broker.take_page_loads() == []  # one load in flight at a time
    broker.page_loaded(loads[0], store.load(loads[0].key, 0, loads[0].count))
    broker.dispatch_dirty()
    out = [o for o in broker.take_outcomes() if isinstance(o, Delivery)]
    assert [d.message.body for d in out] == [f"m{i}".encode() for i in range(5)]
    assert all(d.consumer is reader for d in out)


def test_a_failed_page_is_asked_for_again_on_the_next_tick() -> None:
    broker, store = _stream_broker()
    conn = connect(broker)
    for i in range(TAIL_MESSAGES + 1):
        send(broker, conn, "log", f"m{i}")
    store.write(broker.take_ops())
    broker.subscribe(conn, "r", ConsumerSpec(destinations=(dst.queue("log"),), prefetch=5),
                     stream_offset=parse_offset("first"))
    broker.dispatch_dirty()
    [load] = broker.take_page_loads()
    broker.page_failed(load)
    assert load.queue.page_failures == 1
    broker.dispatch_dirty()
    assert broker.take_page_loads() == []  # not in a tight loop
    broker.tick()
    broker.dispatch_dirty()
    [again] = broker.take_page_loads()
    assert again is not load and again.after_seq == load.after_seq
