"""The runtime's page reader (transport/paging.py) without sockets: a store that reads
off the loop hands its page back later; a local store is read at once; failures reach
the core as page_failed."""

from __future__ import annotations

import asyncio
import dataclasses

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker, Connection
from meshmq.core.consumer import ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.errors import StoreError
from meshmq.store.base import StoredEntry
from meshmq.store.memory import MemoryStore
from meshmq.transport.paging import PageReader

Q = dst.queue("q")


class SlowStore(MemoryStore):
    """Reads complete when the test opens the gate, like a database query would."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.fail = False

    async def load_async(self, key: str, after_seq: int,
                         max_count: int) -> list[StoredEntry]:
        await self.gate.wait()
        if self.fail:
            raise StoreError("read failed")
        return self.load(key, after_seq, max_count)


class BrokenStore(MemoryStore):
    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        raise StoreError("segment missing")


def setup(store: MemoryStore) -> tuple[Broker, Connection]:
    config = dataclasses.replace(BrokerConfig(broker_name="unit"), policies=(
        DestinationPolicy(match="queue://>", page_size=4),))
    broker = Broker(config, store, clock=lambda: 1_000_000)
    broker.recover(store.open())
    conn = broker.open_connection(broker.authenticate(None, None))
    for i in range(8):
        broker.send(conn, (Q,), Message(f"id{i}", Q, f"m{i}".encode(), persistent=True))
    store.write(broker.take_ops())
    broker.subscribe(conn, "c", ConsumerSpec(destinations=(Q,), prefetch=100))
    return broker, conn


def step(broker: Broker, store: MemoryStore, reader: PageReader) -> list[str]:
    broker.dispatch_dirty()
    store.write(broker.take_ops())
    loads = broker.take_page_loads()
    if loads and reader.read(loads):
        broker.dispatch_dirty()
        store.write(broker.take_ops())
    return [o.message.body.decode() for o in broker.take_outcomes() if isinstance(o, Delivery)]


def test_a_store_that_reads_off_the_loop_hands_the_page_back_later() -> None:
    async def run() -> None:
        store = SlowStore()
        broker, _ = setup(store)
        woken: list[int] = []
        reader = PageReader(broker, store, lambda: woken.append(1))
        assert step(broker, store, reader) == ["m0", "m1", "m2", "m3"]
        assert step(broker, store, reader) == []  # the read is in flight
        store.gate.set()
        deadline = asyncio.get_running_loop().time() + 5
        while not woken:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0)
        assert step(broker, store, reader) == ["m4", "m5", "m6", "m7"]

    asyncio.run(run())


def test_a_failed_asynchronous_read_is_reported_to_the_core() -> None:
    async def run() -> None:
        store = SlowStore()
        store.fail = True
        store.gate.set()
        broker, _ = setup(store)
        reader = PageReader(broker, store, lambda: None)
        step(broker, store, reader)
        deadline = asyncio.get_running_loop().time() + 5
        while not reader.failures:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0)
        assert broker.queues[Q].page_failures == 1
        store.fail = False
        broker.tick()  # the queue asks again
        step(broker, store, reader)
        while broker.queues[Q].depth:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0)
            step(broker, store, reader)

    asyncio.run(run())


def test_a_local_store_is_read_at_once_and_a_failure_is_counted() -> None:
    store = MemoryStore()
    broker, _ = setup(store)
    reader = PageReader(broker, store, lambda: None)
    assert step(broker, store, reader) == [f"m{i}" for i in range(8)]  # one pump
    broken = BrokenStore()
    broker, _ = setup(broken)
    reader = PageReader(broker, broken, lambda: None)
    assert step(broker, broken, reader) == ["m0", "m1", "m2", "m3"]
    assert reader.failures == 1 and broker.queues[Q].page_failures == 1
