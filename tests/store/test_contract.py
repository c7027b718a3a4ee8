"""The store contract (meshmq.store.base), run against every implementation.

A new store joins by adding a ``StoreKind`` to ``tests.store.helpers.STORE_KINDS`` (or, for
stores that need a server, to ``CONTRACT_KINDS`` below).
Tests that need data to survive close + open skip stores with ``survives_reopen=False``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.errors import StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    KeyInfo,
    LoadsAsync,
    MarkDispatched,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    Store,
)
from tests.store.helpers import (
    STORE_KINDS,
    StoreKind,
    entry_view,
    fields,
    full_msg,
    msg,
    run_async,
    sub,
)
from tests.store.replicated import release, replicated_store
from tests.support.postgres import contract_store

Q = "queue://orders"
Q2 = "queue://other"
D = "durable://client-1:s"


class Harness:
    def __init__(self, kind: StoreKind, directory: Path) -> None:
        self.kind = kind
        self.directory = directory
        self.store: Store = kind.make(directory)
        self.recovery = self.store.open()

    async def reopen(self) -> Recovery:
        """Close and open again; only for stores that survive it."""
        if not self.kind.survives_reopen:
            pytest.skip(f"{self.kind.name} store does not keep data across reopen")
        await self.store.close()
        self.released()
        self.store = self.kind.make(self.directory)
        self.recovery = self.store.open()
        return self.recovery

    def released(self) -> None:
        if self.kind.release is not None:
            self.kind.release(self.store)

    def all(self, key: str) -> list[tuple[int, tuple[object, ...], int]]:
        return entry_view(self.store.load(key, 0, 1 << 30))


# PostgreSQL runs on the private cluster of tests/support/postgres.py; the replicated
# store on a one-node replicated cluster (tests/store/replicated.py).
CONTRACT_KINDS = [
    *STORE_KINDS,
    StoreKind("replicated", replicated_store, survives_reopen=True, release=release),
    StoreKind("postgres", contract_store, survives_reopen=True),
]


@pytest.fixture(params=CONTRACT_KINDS, ids=lambda k: k.name)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path)
    yield harness
    import asyncio

    asyncio.run(harness.store.close())
    harness.released()


def test_store_satisfies_protocol(h: Harness) -> None:
    assert isinstance(h.store, Store)
    assert h.recovery == Recovery()
    assert isinstance(h.store.stats(), dict)
    # Space: a fresh store has room and nothing to reclaim; the runtime may listen.
    assert h.store.persistent_refusal() is None
    assert h.store.compact_step() is False
    h.store.space_listener = lambda: None


@run_async
async def test_write_load_preserves_every_field(h: Harness) -> None:
    m = full_msg(1)
    h.store.write([AddMessage(m, ((Q, 1),))])
    assert h.all(Q) == [(1, fields(m), 0)]
    await h.store.sync()
    assert h.all(Q) == [(1, fields(m), 0)]
    await h.reopen()
    assert h.all(Q) == [(1, fields(m), 0)]


@run_async
async def test_data_visible_before_sync(h: Harness) -> None:
    for i in range(1, 51):
        h.store.write([AddMessage(msg(i), ((Q, i),))])
    assert [e.seq for e in h.store.load(Q, 0, 100)] == list(range(1, 51))
    assert h.store.key_info(Q) == KeyInfo(50, sum(len(msg(i).body) for i in range(1, 51)), 1, 50)
    await h.store.sync()


@run_async
async def test_sync_with_nothing_written_returns(h: Harness) -> None:
    await h.store.sync()
    await h.store.sync()


@run_async
async def test_ref_shared_across_keys(h: Harness) -> None:
    m = msg(1, dest=None)
    h.store.write([AddMessage(m, ((Q, 5), (D, 9)))])
    h.store.write([RemoveRef(Q, 5)])
    assert h.all(Q) == []
    assert h.all(D) == [(9, fields(m), 0)]
    assert h.store.key_info(Q) == KeyInfo(0, 0, 0, 5)
    assert h.store.key_info(D) == KeyInfo(1, len(m.body), 9, 9)
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys == {Q: KeyInfo(0, 0, 0, 5), D: KeyInfo(1, len(m.body), 9, 9)}
    assert h.all(D) == [(9, fields(m), 0)]


@run_async
async def test_seq_order_and_removal_anywhere(h: Harness) -> None:
    n = 3000
    h.store.write([AddMessage(msg(i), ((Q, i * 2),)) for i in range(1, n + 1)])
    removed = {i * 2 for i in range(1, n + 1) if i % 3 == 0 or i < 700 or 1500 < i < 1600}
    h.store.write([RemoveRef(Q, s) for s in sorted(removed, key=lambda s: (s * 7919) % 10007)])
    expect = [s for s in range(2, 2 * n + 1, 2) if s not in removed]
    assert [e.seq for e in h.store.load(Q, 0, 1 << 30)] == expect
    assert h.store.key_info(Q).first_seq == expect[0]
    assert h.store.key_info(Q).count == len(expect)
    await h.store.sync()
    await h.reopen()
    assert [e.seq for e in h.store.load(Q, 0, 1 << 30)] == expect


@run_async
async def test_unknown_refs_and_keys_are_ignored(h: Harness) -> None:
    h.store.write([RemoveRef(Q, 1), SetDeliveryCount(Q, 1, 3), DropKey("queue://nope")])
    h.store.write([AddMessage(msg(1), ((Q, 1),)), RemoveRef(Q, 2), SetDeliveryCount(Q, 7, 1)])
    assert [(e.seq, e.delivery_count) for e in h.store.load(Q, 0, 10)] == [(1, 0)]
    assert h.store.key_info("queue://nope") == KeyInfo()
    await h.store.sync()


@run_async
async def test_delivery_counts(h: Harness) -> None:
    h.store.write([AddMessage(msg(i), ((Q, i), (Q2, i))) for i in (1, 2, 3)])
    h.store.write([SetDeliveryCount(Q, 2, 1), SetDeliveryCount(Q, 2, 4),
                   SetDeliveryCount(Q2, 3, 2)])
    assert [e.delivery_count for e in h.store.load(Q, 0, 10)] == [0, 4, 0]
    assert [e.delivery_count for e in h.store.load(Q2, 0, 10)] == [0, 0, 2]
    await h.store.sync()
    await h.reopen()
    assert [e.delivery_count for e in h.store.load(Q, 0, 10)] == [0, 4, 0]
    assert [e.delivery_count for e in h.store.load(Q2, 0, 10)] == [0, 0, 2]


@run_async
async def test_dispatch_mark_keeps_the_highest_and_survives_reopen(h: Harness) -> None:
    h.store.write([AddMessage(msg(i), ((Q, i), (Q2, i))) for i in (1, 2, 3)])
    h.store.write([MarkDispatched(Q, 50)])
    h.store.write([MarkDispatched(Q, 20), RemoveRef(Q, 1)])  # never lowers the mark
    assert h.store.key_info(Q) == KeyInfo(2, len(msg(2).body) + len(msg(3).body), 2, 3, 50)
    assert h.store.key_info(Q2).dispatched == 0
    # The mark is a number per key; references and their delivery counts are untouched.
    assert [e.delivery_count for e in h.store.load(Q, 0, 10)] == [0, 0]
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys[Q].dispatched == 50
    assert rec.keys[Q2].dispatched == 0
    h.store.write([MarkDispatched(Q, 70)])
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys[Q].dispatched == 70


@run_async
async def test_drop_key_forgets_the_dispatch_mark(h: Harness) -> None:
    h.store.write([AddMessage(msg(1), ((Q, 1),)), MarkDispatched(Q, 10)])
    h.store.write([DropKey(Q)])
    assert h.store.key_info(Q) == KeyInfo()
    h.store.write([AddMessage(msg(2), ((Q, 1),))])  # a recreated key starts afresh
    assert h.store.key_info(Q).dispatched == 0
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys[Q].dispatched == 0


@run_async
async def test_durable_subscriptions_put_replace_drop(h: Harness) -> None:
    s1, s2 = sub(D), sub("durable://client-1:t", "t", selector=None)
    h.store.write([PutDurableSubscription(s1), PutDurableSubscription(s2)])
    s1b = sub(D, selector="n < 2")
    h.store.write([PutDurableSubscription(s1b)])
    h.store.write([AddMessage(msg(1), ((D, 1), (s2.key, 1)))])
    h.store.write([DropKey(s2.key)])
    assert h.all(s2.key) == []
    assert h.store.key_info(s2.key) == KeyInfo()
    await h.store.sync()
    rec = await h.reopen()
    assert rec.durable_subscriptions == [s1b]
    assert set(rec.keys) == {D}


@run_async
async def test_drop_key_forgets_refs_and_last_seq(h: Harness) -> None:
    h.store.write([AddMessage(msg(i), ((Q, i), (Q2, i))) for i in range(1, 6)])
    h.store.write([DropKey(Q)])
    assert h.store.key_info(Q) == KeyInfo()
    assert h.store.load(Q, 0, 10) == []
    assert h.store.key_info(Q2).count == 5
    h.store.write([AddMessage(msg(9), ((Q, 1),))])  # a recreated key starts afresh
    assert h.store.key_info(Q) == KeyInfo(1, len(msg(9).body), 1, 1)
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys[Q] == KeyInfo(1, len(msg(9).body), 1, 1)
    assert [fields(e.message) for e in h.store.load(Q, 0, 10)] == [fields(msg(9))]


@run_async
async def test_key_info_tracks_count_bytes_first_last(h: Harness) -> None:
    bodies = {i: b"x" * (i * 10) for i in range(1, 6)}
    h.store.write([AddMessage(msg(i, bodies[i]), ((Q, i),)) for i in range(1, 6)])
    assert h.store.key_info(Q) == KeyInfo(5, 150, 1, 5)
    h.store.write([RemoveRef(Q, 1), RemoveRef(Q, 3)])
    assert h.store.key_info(Q) == KeyInfo(3, 110, 2, 5)
    h.store.write([RemoveRef(Q, 2), RemoveRef(Q, 4), RemoveRef(Q, 5)])
    assert h.store.key_info(Q) == KeyInfo(0, 0, 0, 5)
    await h.store.sync()
    rec = await h.reopen()
    assert rec.keys == {Q: KeyInfo(0, 0, 0, 5)}


@run_async
async def test_load_pagination(h: Harness) -> None:
    h.store.write([AddMessage(msg(i, b"y" * 100), ((Q, i),)) for i in range(1, 21)])
    load = h.store.load
    assert [e.seq for e in load(Q, 0, 5)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in load(Q, 5, 5)] == [6, 7, 8, 9, 10]
    assert [e.seq for e in load(Q, 18, 5)] == [19, 20]
    assert load(Q, 20, 5) == []
    assert load(Q, 0, 0) == []
    assert load("queue://missing", 0, 5) == []
    # max_bytes: stop once the bodies returned reach it; never return nothing
    assert [e.seq for e in load(Q, 0, 100, max_bytes=250)] == [1, 2, 3]
    assert [e.seq for e in load(Q, 0, 100, max_bytes=200)] == [1, 2]
    assert [e.seq for e in load(Q, 3, 100, max_bytes=1)] == [4]
    h.store.write([RemoveRef(Q, 4), RemoveRef(Q, 5)])
    assert [e.seq for e in load(Q, 3, 2)] == [6, 7]
    await h.store.sync()
    await h.reopen()
    assert [e.seq for e in h.store.load(Q, 3, 2)] == [6, 7]


@run_async
async def test_load_async_agrees_with_load(h: Harness) -> None:
    if not isinstance(h.store, LoadsAsync):
        pytest.skip(f"{h.kind.name} store reads on the loop only")
    store: LoadsAsync = h.store
    h.store.write([AddMessage(msg(i, b"y" * 100), ((Q, i),)) for i in range(1, 11)])
    h.store.write([RemoveRef(Q, 4), SetDeliveryCount(Q, 6, 3)])
    expected = entry_view(h.store.load(Q, 2, 4))
    assert [seq for seq, _, _ in expected] == [3, 5, 6, 7]
    assert entry_view(await store.load_async(Q, 2, 4)) == expected  # not yet synced
    await h.store.sync()
    assert entry_view(await store.load_async(Q, 2, 4)) == expected
    assert await store.load_async(Q, 10, 5) == []
    assert await store.load_async("queue://missing", 0, 5) == []
    assert await store.load_async(Q, 0, 0) == []


@run_async
async def test_batch_is_applied_in_order(h: Harness) -> None:
    h.store.write([
        AddMessage(msg(1), ((Q, 1),)), AddMessage(msg(2), ((Q, 2),)),
        RemoveRef(Q, 1), SetDeliveryCount(Q, 2, 3),
        PutDurableSubscription(sub(D)), DropKey(D), AddMessage(msg(3), ((D, 1),)),
    ])
    assert entry_view(h.store.load(Q, 0, 10)) == [(2, fields(msg(2)), 3)]
    assert entry_view(h.store.load(D, 0, 10)) == [(1, fields(msg(3)), 0)]
    await h.store.sync()
    rec = await h.reopen()
    assert rec.durable_subscriptions == []
    assert entry_view(h.store.load(Q, 0, 10)) == [(2, fields(msg(2)), 3)]


@run_async
async def test_invalid_batch_is_rejected_whole(h: Harness) -> None:
    h.store.write([AddMessage(msg(1), ((Q, 1),))])
    with pytest.raises(StoreError):
        h.store.write([AddMessage(msg(2), ((Q, 2),)), RemoveRef(Q, 1), "bogus"])  # type: ignore[list-item]
    assert [e.seq for e in h.store.load(Q, 0, 10)] == [1]
    assert h.store.key_info(Q) == KeyInfo(1, len(msg(1).body), 1, 1)
    await h.store.sync()
    await h.reopen()
    assert [e.seq for e in h.store.load(Q, 0, 10)] == [1]


@run_async
async def test_empty_batch_and_empty_body(h: Harness) -> None:
    h.store.write([])
    h.store.write([AddMessage(msg(1, b""), ((Q, 1),))])
    assert h.all(Q) == [(1, fields(msg(1, b"")), 0)]
    await h.store.sync()
    await h.reopen()
    assert h.all(Q) == [(1, fields(msg(1, b"")), 0)]


@run_async
async def test_closed_store_refuses_writes(h: Harness) -> None:
    await h.store.close()
    with pytest.raises(StoreError):
        h.store.write([AddMessage(msg(1), ((Q, 1),))])
