"""The one "confirm once durable" path: order, the failure policy, the trace barrier."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import pytest

from meshmq.errors import StoreError
from meshmq.transport.durability import NOT_STORED, Durability


class FakeStore:
    """Syncs complete when the test says so; ``writes`` counts write_ops calls."""

    def __init__(self) -> None:
        self.writes = 0
        self.syncs: list[asyncio.Future[None]] = []
        self.barriers = 0

    def write_ops(self) -> None:
        self.writes += 1

    def sync(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.syncs.append(fut)
        return fut

    def barrier(self) -> None:
        self.barriers += 1

    def durability(self) -> Durability:
        return Durability(self.write_ops, self.sync, self.barrier)


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_not_durable_confirmation_is_sent_at_once_without_touching_the_store() -> None:
    async def main() -> None:
        store = FakeStore()
        sent: list[str] = []
        q = store.durability().confirmations(flush=lambda: None, closed=lambda: False,
                                             fail=lambda r: None, who="c1")
        q.confirm(lambda: sent.append("r1"), durable=False)
        assert sent == ["r1"]
        assert store.writes == 0 and store.syncs == []

    asyncio.run(main())


def test_durable_confirmation_waits_for_its_sync_and_later_ones_queue_behind() -> None:
    async def main() -> None:
        store = FakeStore()
        sent: list[str] = []
        flushes: list[int] = []
        q = store.durability().confirmations(flush=lambda: flushes.append(len(sent)),
                                             closed=lambda: False, fail=lambda r: None,
                                             who="c1")
        q.confirm(lambda: sent.append("durable"), durable=True)
        q.confirm(lambda: sent.append("plain"), durable=False)
        await turns()
        assert sent == [] and store.writes == 1 and len(q) == 2
        store.syncs[0].set_result(None)
        await turns()
        assert sent == ["durable", "plain"]
        assert flushes == [2]  # one flush for what the sync let out
        assert store.barriers == 1  # traced before the waited-for confirmations
        assert len(q) == 0

    asyncio.run(main())


def test_failed_sync_withholds_it_and_every_later_confirmation_and_fails_once() -> None:
    async def main() -> None:
        store = FakeStore()
        sent: list[str] = []
        reasons: list[str] = []
        q = store.durability().confirmations(flush=lambda: None, closed=lambda: False,
                                             fail=reasons.append, who="c1")
        q.confirm(lambda: sent.append("a"), durable=True)
        await turns()
        q.confirm(lambda: sent.append("b"), durable=True)
        q.confirm(lambda: sent.append("c"), durable=False)
        await turns()
        store.syncs[0].set_exception(OSError("disk full"))
        store.syncs[1].set_result(None)
        await turns()
        assert sent == []
        assert reasons == [f"{NOT_STORED}: disk full"]
        q.confirm(lambda: sent.append("d"), durable=False)
        await turns()
        assert sent == [] and reasons == [f"{NOT_STORED}: disk full"]

    asyncio.run(main())


def test_nothing_is_sent_once_the_connection_is_closed() -> None:
    async def main() -> None:
        store = FakeStore()
        sent: list[str] = []
        closed = [False]
        q = store.durability().confirmations(flush=lambda: None, closed=lambda: closed[0],
                                             fail=lambda r: None, who="c1")
        q.confirm(lambda: sent.append("a"), durable=True)
        await turns()
        closed[0] = True
        store.syncs[0].set_result(None)
        await turns()
        assert sent == [] and len(q) == 0

    asyncio.run(main())


def test_a_sync_that_fails_after_the_connection_closed_fails_nothing_and_logs_no_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """A stopping broker closes its connections, then its store: a confirmation still
    waiting then fails with the store, and there is nobody left to withhold it from."""
    async def main() -> None:
        store = FakeStore()
        failures: list[str] = []
        closed = [False]
        q = store.durability().confirmations(flush=lambda: None, closed=lambda: closed[0],
                                             fail=failures.append, who="c1")
        q.confirm(lambda: None, durable=True)
        await turns()
        closed[0] = True
        store.syncs[0].set_exception(StoreError("store is closed"))
        await turns()
        assert failures == [] and len(q) == 0

    with caplog.at_level(logging.ERROR, logger="meshmq.durability"):
        asyncio.run(main())
    assert caplog.records == []


def test_unordered_confirmation_runs_after_its_sync_or_fails() -> None:
    async def main() -> None:
        store = FakeStore()
        done: list[str] = []
        d = store.durability()
        d.when_durable(lambda: done.append("ok"), done.append, who="bridge")
        await turns()
        d.when_durable(lambda: done.append("ok2"), done.append, who="bridge")
        await turns()
        store.syncs[1].set_result(None)  # later sync first: no order is owed
        await turns()
        assert done == ["ok2"]
        store.syncs[0].set_exception(OSError("gone"))
        await turns()
        assert done == ["ok2", f"{NOT_STORED}: gone"]
        assert store.writes == 2

    asyncio.run(main())


def test_a_shard_confirms_after_its_sync_and_the_owners_stored() -> None:
    async def main() -> None:
        store = FakeStore()
        durability = store.durability()
        stored: list[asyncio.Future[None]] = []

        def owners() -> asyncio.Future[None] | None:
            if len(stored) >= 2:
                return None  # nothing outstanding at the owners any more
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            stored.append(fut)
            return fut

        durability.owners = owners
        sent: list[str] = []
        q = durability.confirmations(flush=lambda: None, closed=lambda: False,
                                     fail=lambda r: None, who="c1")
        q.confirm(lambda: sent.append("r1"), durable=True)
        await turns()  # the turn's write and sync start after it
        store.syncs[0].set_result(None)
        await turns()
        assert sent == []  # synced here, not yet stored by the owner
        stored[0].set_result(None)
        await turns()
        assert sent == ["r1"]
        # A shard link's own STORED waits for the local sync only.
        acked: list[str] = []
        durability.when_durable(lambda: acked.append("a"), lambda r: None, who="link",
                                owners=False)
        await turns()
        assert len(stored) == 1
        store.syncs[1].set_result(None)
        await turns()
        assert acked == ["a"]
        durability.when_durable(lambda: acked.append("b"), lambda r: None, who="bridge")
        await turns()
        store.syncs[2].set_result(None)
        await turns()
        assert acked == ["a"] and len(stored) == 2
        stored[1].set_result(None)
        await turns()
        assert acked == ["a", "b"]

    asyncio.run(main())


def test_syncs_asked_for_in_one_turn_share_one_store_sync_after_the_pump() -> None:
    async def main() -> None:
        store = FakeStore()
        order: list[str] = []
        pumps: list[int] = []

        def request_pump() -> None:
            if not pumps:
                pumps.append(1)
                asyncio.get_running_loop().call_soon(lambda: order.append("pump"))

        def write_ops() -> None:
            store.writes += 1
            order.append("write")

        d = Durability(write_ops, store.sync, store.barrier, request_pump)
        sent: list[str] = []
        queues = [d.confirmations(flush=lambda: None, closed=lambda: False,
                                  fail=lambda r: None, who=f"c{i}") for i in range(3)]
        for i, q in enumerate(queues):
            q.confirm(lambda i=i: sent.append(f"r{i}"), durable=True)
            q.confirm(lambda i=i: sent.append(f"again{i}"), durable=True)
        assert store.syncs == [] and order == []  # nothing before the turn's pump
        await turns()
        assert order == ["pump", "write"] and len(store.syncs) == 1
        assert d.syncs_started == 1
        store.syncs[0].set_result(None)
        await turns()
        assert sent == ["r0", "again0", "r1", "again1", "r2", "again2"]
        q = queues[0]
        q.confirm(lambda: sent.append("next turn"), durable=True)
        await turns()
        assert len(store.syncs) == 2  # a later turn: a sync of its own

    asyncio.run(main())


def test_when_drained_is_told_once_the_queue_is_down_to_its_low_mark() -> None:
    async def main() -> None:
        store = FakeStore()
        q = store.durability().confirmations(flush=lambda: None, closed=lambda: False,
                                             fail=lambda r: None, who="c1")
        for _ in range(5):
            q.confirm(lambda: None, durable=True)
        await turns()
        q.confirm(lambda: None, durable=True)
        await turns()
        told: list[int] = []
        q.when_drained(2, lambda: told.append(len(q)))
        assert len(q) == 6 and told == []
        store.syncs[0].set_result(None)  # the first five go out
        await turns()
        assert told == [1]
        store.syncs[1].set_result(None)
        await turns()
        assert told == [1] and len(q) == 0  # told once

    asyncio.run(main())


def test_a_subscriptions_confirmation_waits_for_its_relays_to_open_in_order() -> None:
    async def main() -> None:
        store = FakeStore()
        durability = store.durability()
        # One broker: nothing to wait for.
        assert durability.opened(()) is None and durability.settled(()) is None
        opening: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asked: list[list[object]] = []

        def relays(consumers: Iterable[Any]) -> asyncio.Future[None] | None:
            asked.append(list(consumers))
            return opening if asked[-1] else None

        durability.relays = relays
        sent: list[str] = []
        q = durability.confirmations(flush=lambda: None, closed=lambda: False,
                                     fail=lambda r: None, who="c1")
        q.confirm(lambda: sent.append("local"), durable=False,
                  after=durability.opened(()))
        assert sent == ["local"]  # not relayed: at once, as before
        q.confirm(lambda: sent.append("relayed"), durable=True,
                  after=durability.opened(["a relayed consumer"]))
        q.confirm(lambda: sent.append("next"), durable=False)
        await turns()  # the turn's write and sync start after it
        store.syncs[0].set_result(None)
        await turns()
        assert sent == ["local"]  # synced, the owner has not answered yet
        opening.set_result(None)
        await turns()
        assert sent == ["local", "relayed", "next"]  # the later one stayed behind it
        assert store.writes == 1

    asyncio.run(main())


def test_a_sync_done_when_it_starts_confirms_in_the_next_pass() -> None:
    """A store that synced on the loop (the journal with its writer idle) hands back a
    done future: the turn's confirmations go out one pass later, not two."""
    async def main() -> None:
        store = FakeStore()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        sent: list[str] = []
        d = Durability(store.write_ops, lambda: done, store.barrier)
        q = d.confirmations(flush=lambda: None, closed=lambda: False, fail=lambda r: None,
                            who="c1")
        q.confirm(lambda: sent.append("r1"), durable=True)
        await asyncio.sleep(0)  # the turn's sync starts (Durability._start) and is done
        assert sent == []
        await asyncio.sleep(0)  # the queue's done-callback
        assert sent == ["r1"] and store.barriers == 1

    asyncio.run(main())
