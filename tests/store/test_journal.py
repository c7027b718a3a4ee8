"""Journal-specific behaviour: crashes, damage, compaction, segments, lock, I/O failure."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from meshmq.errors import CorruptStoreError, StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    KeyInfo,
    MarkDispatched,
    PutDurableSubscription,
    RemoveRef,
    SetDeliveryCount,
    Store,
    StoreOp,
)
from meshmq.store.journal import JournalStore
from meshmq.store.journal import format as fmt
from meshmq.store.journal import store as journal_store
from meshmq.store.journal.index import KeyIndex
from meshmq.store.memory import MemoryStore
from tests.store.helpers import entry_view, msg, run_async, sub

Q = "queue://orders"
Q2 = "queue://other"
D = "durable://client-1:s"
KEYS = (Q, Q2, D)


def state(store: Store) -> dict[str, Any]:
    return {k: (entry_view(store.load(k, 0, 1 << 30)), store.key_info(k)) for k in KEYS}


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("seg-*.log"))


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))
    return dst


async def reopen_state(d: Path, **kw: Any) -> dict[str, Any]:
    store = JournalStore(d, **kw)
    store.open()
    try:
        return state(store)
    finally:
        await store.close()


def batch(i: int) -> list[StoreOp]:
    ops: list[StoreOp] = [AddMessage(msg(i, b"b" * (i % 7 * 20)), ((Q, i), (D, i)))]
    if i > 2:
        ops.append(RemoveRef(Q, i - 2))
    if i % 2:
        ops.append(SetDeliveryCount(D, i, i))
    return ops


# ---------------------------------------------------------------- crashes and damage


@run_async
async def test_truncation_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, fsync=False)
    store.open()
    model = MemoryStore()
    model.open()
    states = [state(model)]
    for i in range(1, 6):
        store.write(batch(i))
        model.write(batch(i))
        states.append(state(model))
    await store.sync()
    await store.close()
    [seg] = segments(d)
    data = seg.read_bytes()
    last = fmt.scan_records(data).records[-1][0]
    for cut in range(last, len(data) + 1):
        c = copy_dir(d, tmp_path / f"cut{cut}")
        (c / seg.name).write_bytes(data[:cut])
        assert await reopen_state(c) == (states[5] if cut == len(data) else states[4]), cut
        assert (c / seg.name).stat().st_size == (len(data) if cut == len(data) else last)
        shutil.rmtree(c)


@run_async
async def test_copy_while_writing_recovers_a_prefix_of_batches(tmp_path: Path) -> None:
    """Snapshot the files at arbitrary moments while the writer thread runs (a crash):
    the copy holds a whole prefix of the batches, at least everything synced."""
    d = tmp_path / "j"
    # No compaction: a segment unlinked during copytree would break the copy, not the store.
    store = JournalStore(d, segment_size=2048, compact_live_ratio=0.0)
    store.open()
    model = MemoryStore()
    model.open()
    states = [state(model)]
    snapshots: list[tuple[Path, int]] = []
    synced = 0
    for i in range(1, 61):
        store.write(batch(i))
        model.write(batch(i))
        states.append(state(model))
        if i % 7 == 0:
            await store.sync()
            synced = i
        if i % 4 == 0:
            snapshots.append((copy_dir(d, tmp_path / f"snap{i}"), synced))
    await store.sync()
    await store.close()
    for snap, synced_then in snapshots:
        got = await reopen_state(snap)
        assert got in states[synced_then:], snap.name


@run_async
async def test_crc_flip_in_the_tail_is_truncated_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshmq.store")
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    model = MemoryStore()
    model.open()
    for i in range(1, 4):
        store.write(batch(i))
        model.write(batch(i))
    expect = state(model)
    store.write(batch(4))
    await store.sync()
    await store.close()
    [seg] = segments(d)
    data = bytearray(seg.read_bytes())
    last = fmt.scan_records(bytes(data)).records[-1][0]
    data[last + 12] ^= 0xFF
    seg.write_bytes(bytes(data))
    assert await reopen_state(d) == expect
    assert "record checksum mismatch" in caplog.text
    assert seg.stat().st_size == last


@run_async
async def test_corruption_in_an_older_segment_refuses_to_open(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=1024)
    store.open()
    for i in range(1, 40):
        store.write(batch(i))
    await store.sync()
    await store.close()
    segs = segments(d)
    assert len(segs) >= 3
    victim = segs[1]
    data = bytearray(victim.read_bytes())
    second = fmt.scan_records(bytes(data)).records[1][0]
    data[second + 9] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match=rf"{victim.name}: .*offset {second}"):
        JournalStore(d).open()
    # A short record in an older segment is corruption too, not a torn tail.
    victim.write_bytes(bytes(data[:second + 3]))
    with pytest.raises(CorruptStoreError, match=rf"{victim.name}: short record header"):
        JournalStore(d).open()


@run_async
async def test_unknown_record_type_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write(batch(1))
    await store.close()
    [seg] = segments(d)
    with seg.open("ab") as f:
        f.write(fmt.pack_record(99, b"from the future"))
    with pytest.raises(CorruptStoreError, match="unknown record type 99"):
        JournalStore(d).open()


@run_async
async def test_empty_segments_are_not_kept(tmp_path: Path) -> None:
    d = tmp_path / "j"
    for _ in range(3):
        store = JournalStore(d)
        store.open()
        await store.close()
    assert segments(d) == []
    store = JournalStore(d)
    store.open()
    store.write(batch(1))
    await store.close()
    assert [p.name for p in segments(d)] == ["seg-0000000000000001.log"]


# ---------------------------------------------------------------- segments and compaction


@run_async
async def test_segments_roll_at_segment_size(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=2048, compact_live_ratio=0.0)
    store.open()
    for i in range(1, 80):
        store.write([AddMessage(msg(i, b"z" * 100), ((Q, i),))])
    await store.sync()
    segs = segments(d)
    assert [fmt.parse_segment_name(p.name) for p in segs] == list(range(1, len(segs) + 1))
    assert len(segs) >= 4
    for p in segs[:-1]:
        size = p.stat().st_size
        assert 2048 <= size < 2048 + 300  # rolls once past the size, never mid-record
    assert store.stats()["segments"] == len(segs)
    await store.close()


@run_async
async def test_compaction_reclaims_space_and_keeps_order_and_counts(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=4096)
    store.open()
    model = MemoryStore()
    model.open()

    def both(ops: list[StoreOp]) -> None:
        store.write(ops)
        model.write(ops)

    both([PutDurableSubscription(sub(D))])
    for i in range(1, 401):
        both([AddMessage(msg(i, b"p" * 150), ((Q, i), (D, i)) if i % 50 == 0 else ((Q, i),))])
        both([AddMessage(msg(1000 + i), ((Q2, i),)), RemoveRef(Q2, i)])
    both([SetDeliveryCount(Q, i, 3) for i in range(5, 401, 10)])
    await store.sync()
    disk_before = sum(p.stat().st_size for p in segments(d))
    files_before = len(segments(d))
    both([RemoveRef(Q, i) for i in range(1, 401) if i % 10])
    steps = 0
    while store.compact_step():
        steps += 1
    await store.sync()
    disk_after = sum(p.stat().st_size for p in segments(d))
    assert disk_after < disk_before / 3
    assert len(segments(d)) < files_before
    assert store.stats()["segments_deleted"] >= files_before - 2
    assert state(store) == state(model)
    await store.close()
    store = JournalStore(d, segment_size=4096)
    rec = store.open()
    assert state(store) == state(model)
    assert rec.durable_subscriptions == [sub(D)]
    assert rec.keys[Q2] == KeyInfo(0, 0, 0, 400)  # last_seq survives its records' deletion
    await store.close()


@run_async
async def test_dispatch_marks_survive_the_compaction_of_their_segment(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=2048)
    store.open()
    store.write([AddMessage(msg(1, b"m" * 100), ((Q, 1),)), MarkDispatched(Q, 40),
                 MarkDispatched(D, 7)])
    store.write([MarkDispatched(D, 9)])  # the newest mark of D is in a later record
    await store.sync()
    first = segments(d)
    assert first
    for i in range(2, 80):  # churn: later segments, all acknowledged (in a later batch:
        # one removed in its own batch would not be written at all)
        store.write([AddMessage(msg(i, b"c" * 100), ((Q2, i),))])
        store.write([RemoveRef(Q2, i)])
    store.write([RemoveRef(Q, 1)])
    await store.sync()
    while store.compact_step():
        pass
    await store.sync()
    assert not set(first) & set(segments(d)), "the segment holding the marks was deleted"
    assert (store.key_info(Q).dispatched, store.key_info(D).dispatched) == (40, 9)
    await store.close()
    store = JournalStore(d, segment_size=2048)
    rec = store.open()
    assert rec.keys[Q] == KeyInfo(0, 0, 0, 1, 40)
    assert store.key_info(D).dispatched == 9
    await store.close()


@run_async
async def test_lost_delete_after_compaction_replays_without_duplicates(tmp_path: Path) -> None:
    """Crash after the copies were synced but before the old segment was unlinked."""
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=2048)
    store.open()
    model = MemoryStore()
    model.open()
    for i in range(1, 60):
        ops: list[StoreOp] = [AddMessage(msg(i, b"q" * 80), ((Q, i), (D, i)))]
        store.write(ops)
        model.write(ops)
    ops = [RemoveRef(Q, i) for i in range(1, 60) if i % 3]
    ops += [RemoveRef(D, i) for i in range(1, 60) if i % 4] + [SetDeliveryCount(D, 4, 5)]
    store.write(ops)
    model.write(ops)
    await store.sync()
    saved = {p.name: p.read_bytes() for p in segments(d)}  # final contents
    while store.compact_step():
        pass
    await store.sync()
    await store.close()
    deleted = set(saved) - {p.name for p in segments(d)}
    assert deleted
    for name in deleted:
        (d / name).write_bytes(saved[name])
    store = JournalStore(d, segment_size=2048)
    store.open()
    assert state(store) == state(model)
    assert store.stats()["live_refs"] == model.stats()["live_refs"]
    while store.compact_step():  # the resurrected segments hold nothing live now
        pass
    await store.sync()
    assert not deleted & {p.name for p in segments(d)}
    assert state(store) == state(model)
    await store.close()


def test_index_memory_per_reference() -> None:
    idx = KeyIndex()
    n = 200_000
    for i in range(1, n + 1):
        idx.add(i, 1 + i // 50_000, i * 100, 300, 200)
    per_ref = idx.memory_bytes() / n
    assert per_ref <= 40  # 1M refs well under 100 MB
    for i in range(1, 3 * n // 4):
        idx.remove(i)
    # in-order acks give the memory back (columns are rebuilt once half of them are dead)
    assert idx.memory_bytes() / idx.live <= 2 * 40
    assert [e[0] for e in idx.iter_after(0)] == list(range(3 * n // 4, n + 1))


# ---------------------------------------------------------------- lock and failures


@run_async
async def test_directory_lock_is_exclusive(tmp_path: Path) -> None:
    d = tmp_path / "j"
    first = JournalStore(d)
    first.open()
    with pytest.raises(StoreError, match="is locked by another broker"):
        JournalStore(d).open()
    await first.close()
    second = JournalStore(d)
    second.open()
    await second.close()


@run_async
async def test_io_failure_fails_waiters_and_refuses_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    store.write(batch(1))
    await store.sync()

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "simulated disk failure")

    monkeypatch.setattr(os, "fdatasync", broken)
    store.write(batch(2))
    with pytest.raises(StoreError, match="simulated disk failure"):
        await store.sync()
    with pytest.raises(StoreError, match="refuses writes"):
        store.write(batch(3))
    with pytest.raises(StoreError):
        await store.sync()
    assert [e.seq for e in store.load(D, 0, 10)] == [1, 2]  # what it has is still readable
    with pytest.raises(StoreError):
        await store.close()
    JournalStore(tmp_path / "j")  # the lock is released after close


@run_async
async def test_group_commit_shares_fsyncs(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    for i in range(1, 201):
        store.write(batch(i))
    await asyncio.gather(*(store.sync() for _ in range(50)))
    stats = store.stats()
    assert stats["records_written"] == 200
    assert stats["syncs"] < 200
    assert stats["pending_batches"] == 0
    await store.sync()  # everything durable: returns at once
    await store.close()


async def _written(store: JournalStore, records: int) -> None:
    """Poll (with a deadline) until the writer thread has written ``records`` records."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while store.stats()["records_written"] < records:
        assert loop.time() < deadline, "writer did not write in time"
        await asyncio.sleep(0.001)


@run_async
async def test_a_removal_alone_is_synced_only_when_somebody_waits(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write([AddMessage(msg(1), ((Q, 1),)), AddMessage(msg(2), ((Q, 2),))])
    await store.sync()
    assert store.stats()["syncs"] == 1
    store.write([RemoveRef(Q, 1)])  # an ack: written, but no disk sync of its own
    await _written(store, 2)
    stats = store.stats()
    assert stats["syncs"] == 1
    assert stats["pending_batches"] == 1
    # The next message's sync covers the removal too: one disk sync for both.
    store.write([AddMessage(msg(3), ((Q, 3),))])
    await asyncio.wait_for(store.sync(), 10)
    assert store.stats()["syncs"] == 2
    assert store.stats()["pending_batches"] == 0
    # A removal somebody waits for (a receipt on ACK, close) is synced on request.
    store.write([RemoveRef(Q, 2)])
    await _written(store, 4)
    await asyncio.wait_for(store.sync(), 10)
    assert store.stats()["syncs"] == 3
    assert store.stats()["pending_batches"] == 0
    await store.close()
    assert [seq for seq, _, _ in (await reopen_state(d))[Q][0]] == [3]


@run_async
async def test_waiting_for_a_removal_before_it_is_written_never_hangs(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    store.write([AddMessage(msg(i), ((Q, i),)) for i in range(1, 51)])
    await store.sync()
    for i in range(1, 51):  # each sync races the writer's "anybody waiting?" check
        store.write([RemoveRef(Q, i)])
        await asyncio.wait_for(store.sync(), 10)
        assert store.stats()["pending_batches"] == 0
    await store.close()


@run_async
async def test_zeroed_header_of_newest_segment_keeps_its_records(tmp_path: Path) -> None:
    """A zeroed header is damage, not a segment that was never written: the records
    behind it have their own checksums and are recovered; the file is kept aside."""
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    for i in range(1, 101):
        store.write(batch(i))
    await store.sync()
    expect = state(store)
    await store.close()
    [seg] = segments(d)
    data = bytearray(seg.read_bytes())
    data[:fmt.HEADER_SIZE] = bytes(fmt.HEADER_SIZE)
    seg.write_bytes(bytes(data))
    assert await reopen_state(d) == expect
    assert (d / (seg.name + ".damaged")).read_bytes() == bytes(data)


@run_async
async def test_damage_followed_by_intact_records_is_not_a_torn_tail(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    after_nine: dict[str, Any] = {}
    for i in range(1, 21):
        store.write(batch(i))
        await store.sync()  # one record per batch
        if i == 9:
            after_nine = state(store)
    await store.close()
    [seg] = segments(d)
    data = bytearray(seg.read_bytes())
    records = fmt.scan_records(bytes(data)).records
    assert len(records) == 20
    tenth = records[9][0]
    data[tenth + 12] ^= 0xFF  # records 11..20 stay intact behind it
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="not a torn write") as info:
        JournalStore(d).open()
    assert "--accept-data-loss" in str(info.value)
    assert seg.read_bytes() == bytes(data)  # nothing was changed
    # Only the records before the damage replay in order; they are kept.
    assert await reopen_state(d, accept_data_loss=True) == after_nine
    assert (d / (seg.name + ".damaged")).read_bytes() == bytes(data)


@run_async
async def test_reclaim_keeps_pace_with_churn(tmp_path: Path) -> None:
    """Under send/ack churn with one long-lived message, the journal stays small: space
    is reclaimed as fast as it is freed, by writes alone (no idle timer)."""
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=4096)
    store.open()
    store.write([AddMessage(msg(0, b"keep"), ((Q2, 0),))])
    for i in range(1, 3001):
        store.write([AddMessage(msg(i, b"x" * 400), ((Q, i),))])
        store.write([RemoveRef(Q, i)])
        if i % 500 == 0:
            await store.sync()
    await store.sync()
    written = 3000 * 450
    on_disk = sum(p.stat().st_size for p in segments(d))
    try:
        assert len(segments(d)) <= 8, f"{len(segments(d))} segments after churn"
        assert on_disk < written / 20
        assert store.key_info(Q2).count == 1
    finally:
        await store.close()
    # Recovery reads only what is left.
    state_after = await reopen_state(d)
    assert state_after[Q2][1].count == 1 and state_after[Q][1].count == 0


# ---------------------------------------------------------------- syncs and the writer's wake-ups


@run_async
async def test_syncs_asked_for_between_writes_all_resolve_and_share_disk_syncs(
        tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    try:
        futures = []
        for i in range(1, 301):
            store.write(batch(i))
            futures.append(store.sync_at_once())  # target: this batch, taken now
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        stats = store.stats()
        assert stats["pending_batches"] == 0
        # The writer is woken once per loop turn: the 300 records share far fewer syncs.
        assert stats["syncs"] < 300
    finally:
        await store.close()


def test_a_write_made_outside_any_event_loop_still_reaches_the_disk(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    store.write(batch(1))  # no loop here: the writer is woken at once

    async def settle() -> dict[str, Any]:
        await asyncio.wait_for(store.sync(), 30)
        seen = state(store)
        await store.close()
        return seen

    seen = asyncio.run(settle())
    assert asyncio.run(reopen_state(tmp_path / "j")) == seen
    assert seen[Q][0] != []


# ---------------------------------------------------------------- syncs on the event loop


def _quick_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any sync of this machine's disk counts as quick (a shared machine's disk can take
    milliseconds now and then, which would rightly send syncs to the writer thread)."""
    monkeypatch.setattr(journal_store, "INLINE_SYNC_MAX_S", 60.0)


def _record_sync_threads(monkeypatch: pytest.MonkeyPatch, delays: list[float]) -> list[int]:
    """Every ``os.fdatasync`` from now on: the thread it ran on (appended); the first
    ``delays`` make it that much slower (a slow disk)."""
    real = os.fdatasync
    threads: list[int] = []

    def fdatasync(fd: int) -> None:
        threads.append(threading.get_ident())
        if delays:
            time.sleep(delays.pop(0))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return threads


async def _writer_idle(store: JournalStore) -> None:
    """Poll (with a deadline) until the writer thread waits for work: it resolves a sync
    before it goes back to waiting, and the loop syncs itself only once it does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not store._w_idle:
        assert loop.time() < deadline, "the writer thread did not go idle"
        await asyncio.sleep(0.001)


@run_async
async def test_a_sync_with_the_writer_idle_is_done_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quick_disk(monkeypatch)
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write(batch(1))
    await store.sync()  # the writer thread creates the segment
    await _writer_idle(store)
    assert store.stats()["inline_syncs"] == 0
    threads = _record_sync_threads(monkeypatch, [])
    for i in range(2, 7):
        store.write(batch(i))
        fut = store.sync_at_once()
        assert fut.done() and fut.result() is None  # durable before the call returned
        await asyncio.sleep(0)  # the next pass of the loop
    assert threads == [threading.get_ident()] * 5
    stats = store.stats()
    assert stats["inline_syncs"] == 5
    assert stats["pending_batches"] == 0
    assert stats["records_written"] == 6
    seen = state(store)
    await store.close()
    assert await reopen_state(d) == seen
    assert [e[0] for e in seen[D][0]] == [1, 2, 3, 4, 5, 6]


@run_async
async def test_syncs_asked_for_in_one_pass_after_an_inline_one_share_the_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quick_disk(monkeypatch)
    store = JournalStore(tmp_path / "j")
    store.open()
    try:
        store.write(batch(1))
        await store.sync()
        await _writer_idle(store)
        futures = []
        for i in range(2, 22):
            store.write(batch(i))
            futures.append(store.sync_at_once())
        assert futures[0].done()
        assert not any(f.done() for f in futures[1:])  # the writer thread's group commit
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        stats = store.stats()
        assert stats["inline_syncs"] == 1
        assert stats["syncs"] < 21
        assert stats["pending_batches"] == 0
    finally:
        await store.close()


@run_async
async def test_a_slow_disk_keeps_syncs_on_the_writer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JournalStore(tmp_path / "j")
    store.open()
    try:
        store.write(batch(1))
        await store.sync()
        await _writer_idle(store)
        threads = _record_sync_threads(monkeypatch, [0.05])
        store.write(batch(2))
        assert store.sync_at_once().done()  # inline, and it took 50 ms
        await asyncio.sleep(0)
        for i in range(3, 6):
            store.write(batch(i))
            fut = store.sync_at_once()
            assert not fut.done()
            await asyncio.wait_for(fut, 10)
        assert threads[0] == threading.get_ident()
        assert threading.get_ident() not in threads[1:] and len(threads) == 4
        assert store.stats()["inline_syncs"] == 1
    finally:
        await store.close()


@run_async
async def test_a_disk_that_fills_during_an_inline_write_is_left_to_the_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quick_disk(monkeypatch)
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write(batch(1))
    await store.sync()
    await _writer_idle(store)
    real = os.write
    loop_thread = threading.get_ident()
    refused: list[int] = []

    def write(fd: int, data: Any) -> int:
        if threading.get_ident() == loop_thread and len(refused) < 2:
            # A short write of half the record, then the disk is full.
            if not refused:
                refused.append(real(fd, bytes(data[:len(data) // 2])))
                return refused[0]
            refused.append(0)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    store.write(batch(2))
    fut = store.sync_at_once()
    assert len(refused) == 2  # the loop tried, and handed the rest over instead of waiting
    assert not fut.done()
    await asyncio.wait_for(fut, 10)
    store.write(batch(3))
    await asyncio.wait_for(store.sync(), 10)
    assert store.persistent_refusal() is None
    seen = state(store)
    await store.close()
    assert await reopen_state(d) == seen
    assert [e[0] for e in seen[D][0]] == [1, 2, 3]


@run_async
async def test_an_io_error_during_an_inline_sync_fails_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quick_disk(monkeypatch)
    store = JournalStore(tmp_path / "j")
    store.open()
    store.write(batch(1))
    await store.sync()
    await _writer_idle(store)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "simulated disk failure")

    monkeypatch.setattr(os, "fdatasync", broken)
    store.write(batch(2))
    fut = store.sync_at_once()
    assert fut.done()
    with pytest.raises(StoreError, match="simulated disk failure"):
        fut.result()
    assert store.persistent_refusal() is not None
    with pytest.raises(StoreError, match="refuses writes"):
        store.write(batch(3))
    with pytest.raises(StoreError):
        await store.close()


@run_async
async def test_without_inline_sync_the_writer_thread_syncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JournalStore(tmp_path / "j", inline_sync=False)
    store.open()
    try:
        store.write(batch(1))
        await store.sync()
        threads = _record_sync_threads(monkeypatch, [])
        store.write(batch(2))
        fut = store.sync_at_once()
        assert not fut.done()
        await asyncio.wait_for(fut, 10)
        assert threads and threading.get_ident() not in threads
        assert store.stats()["inline_syncs"] == 0
    finally:
        await store.close()


# ---------------------------------------------------------------- consumed before written


@run_async
async def test_a_message_removed_in_its_own_batch_is_never_written(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write([AddMessage(msg(1), ((Q, 1),))])
    await store.sync()
    written = store.stats()["bytes_written"]
    # Delivered to an ack:auto consumer (a delivery count, a removal) in the same batch.
    store.write([AddMessage(msg(2, b"x" * 500), ((Q, 2),)), SetDeliveryCount(Q, 2, 1),
                 RemoveRef(Q, 2)])
    assert store.sync_at_once().done()  # nothing of it to wait for
    stats = store.stats()
    assert (stats["bytes_written"], stats["pending_batches"]) == (written, 0)
    assert store.key_info(Q) == KeyInfo(1, len(msg(1).body), 1, 2, 0)
    assert [e.seq for e in store.load(Q, 0, 10)] == [1]
    await store.close()
    assert (await reopen_state(d))[Q][1] == KeyInfo(1, len(msg(1).body), 1, 2, 0)


@run_async
async def test_only_messages_every_reference_of_which_is_removed_are_left_out(
        tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write([
        AddMessage(msg(1), ((Q, 1), (D, 1))),  # one of two subscribers acknowledged it
        AddMessage(msg(2), ((Q, 2),)),
        SetDeliveryCount(Q, 2, 3),
        RemoveRef(Q, 1), RemoveRef(Q2, 5),  # Q2's seq 5 was never added here
        AddMessage(msg(3), ((Q, 3),)), RemoveRef(Q, 3),
    ])
    await store.sync()
    seen = state(store)
    assert [(seq, dc) for seq, _, dc in seen[D][0]] == [(1, 0)]
    assert [(seq, dc) for seq, _, dc in seen[Q][0]] == [(2, 3)]
    assert seen[Q][1].last_seq == 3
    await store.close()
    assert await reopen_state(d) == seen


@run_async
async def test_a_crash_loses_at_most_the_seq_of_a_message_never_written(
        tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    try:
        store.write([AddMessage(msg(1), ((Q, 1),))])
        store.write([AddMessage(msg(2), ((Q, 2),)), RemoveRef(Q, 2)])
        await store.sync()
        # A crash now: message 2 was never written, its seq may come again.
        crashed = await reopen_state(copy_dir(d, tmp_path / "c1"))
        assert crashed[Q][0] == state(store)[Q][0]
        assert crashed[Q][1] == KeyInfo(1, len(msg(1).body), 1, 1, 0)
        # The seq is written with the next record, or by the next compaction step.
        store.write([MarkDispatched(Q2, 4)])
        await store.sync()
        assert (await reopen_state(copy_dir(d, tmp_path / "c2")))[Q][1].last_seq == 2
        store.write([AddMessage(msg(3), ((Q, 3),)), RemoveRef(Q, 3)])
        store.compact_step()
        await store.sync()
        assert (await reopen_state(copy_dir(d, tmp_path / "c3")))[Q][1].last_seq == 3
    finally:
        await store.close()


@run_async
async def test_a_dropped_key_stays_dropped_after_messages_left_out(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    store.write([AddMessage(msg(1), ((Q, 1),)), RemoveRef(Q, 1), DropKey(Q)])
    store.write([AddMessage(msg(2), ((Q2, 1),)), RemoveRef(Q2, 1)])
    store.write([DropKey(Q2)])  # the seq left out before is not written after the drop
    store.write([AddMessage(msg(3), ((D, 1),))])
    await store.sync()
    await store.close()
    store = JournalStore(d)
    recovery = store.open()
    try:
        assert set(recovery.keys) == {D}
    finally:
        await store.close()


# ---------------------------------------------------------------- zero-filled tail


def _record_end(seg: Path) -> int:
    scan = fmt.scan_records(seg.read_bytes())
    off, body = scan.records[-1]
    return off + fmt.RECORD_HEADER_SIZE + len(body)


@run_async
async def test_the_open_segment_is_zero_filled_ahead_and_cut_at_a_clean_stop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshmq.store")
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    for i in range(1, 6):
        store.write(batch(i))
        await store.sync()
    [seg] = segments(d)
    end = _record_end(seg)
    # Synced records are followed by zeros, so the next syncs do not grow the file.
    assert seg.stat().st_size >= end + 64 * 1024
    assert seg.read_bytes()[end:].count(0) == seg.stat().st_size - end
    # A crash now: the copy's newest segment has the zero tail; it is the clean end.
    crashed = copy_dir(d, tmp_path / "crash")
    seen = state(store)
    await store.close()
    assert seg.stat().st_size == end  # a clean stop leaves no zeros behind
    assert await reopen_state(d) == seen
    assert await reopen_state(crashed) == seen
    [copied] = segments(crashed)
    assert copied.stat().st_size == end
    assert caplog.text == ""  # neither was a torn tail


@run_async
async def test_a_segment_left_for_a_newer_one_ends_at_its_records(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, segment_size=4096)
    store.open()
    try:
        for i in range(1, 120):
            store.write(batch(i))
            await store.sync()
        segs = segments(d)
        assert len(segs) > 2
        for seg in segs[:-1]:
            assert seg.stat().st_size == _record_end(seg)
        newest = segs[-1]
        assert newest.stat().st_size <= 4096  # never zero-filled past the segment size
    finally:
        await store.close()


@run_async
async def test_a_torn_record_before_the_zero_tail_is_cut_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshmq.store")
    d = tmp_path / "j"
    store = JournalStore(d)
    store.open()
    try:
        model = MemoryStore()
        model.open()
        for i in range(1, 4):
            store.write(batch(i))
            model.write(batch(i))
            await store.sync()
        expect = state(model)
        store.write(batch(4))
        await store.sync()
        crashed = copy_dir(d, tmp_path / "crash")
    finally:
        await store.close()
    [seg] = segments(crashed)
    data = bytearray(seg.read_bytes())
    last = fmt.scan_records(bytes(data)).records[-1][0]
    end = _record_end(seg)
    data[last + 12:end] = bytes(end - last - 12)  # the last record half written
    seg.write_bytes(bytes(data))
    assert await reopen_state(crashed) == expect
    assert "record checksum mismatch" in caplog.text
    assert seg.stat().st_size == last


@run_async
async def test_without_fsync_the_file_grows_with_its_records(tmp_path: Path) -> None:
    d = tmp_path / "j"
    store = JournalStore(d, fsync=False)
    store.open()
    try:
        store.write(batch(1))
        await store.sync()
        [seg] = segments(d)
        assert seg.stat().st_size == _record_end(seg)
    finally:
        await store.close()
