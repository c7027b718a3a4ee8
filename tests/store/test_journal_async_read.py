"""Journal page reads off the event loop (``JournalStore.load_async``) against compaction.

The reader thread is held on a gate the test opens, so compaction, removals and writes
run while a read is in flight; the read must return what was live when it was asked for,
and a segment it reads must be deleted only after it is done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.store.base import AddMessage, RemoveRef, SetDeliveryCount, StoredEntry, StoreOp
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore
from tests.store.helpers import entry_view, msg, run_async

Q = "queue://paged"
X = "queue://churn"


class Gates:
    """Holds each page read on the reader thread until its gate is opened, in order."""

    def __init__(self, store: JournalStore) -> None:
        self.pending: queue.Queue[tuple[threading.Event, threading.Event]] = queue.Queue()
        # One reader thread: reads start in the order they were asked for.
        store._readers = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        read = store._read_page

        def gated(page: list[tuple[int, int, int, int, int]]) -> list[StoredEntry]:
            try:
                started, gate = self.pending.get_nowait()
            except queue.Empty:
                return read(page)  # a read the test does not hold
            started.set()
            gate.wait()
            return read(page)

        store._read_page = gated  # type: ignore[method-assign]

    def next(self) -> tuple[threading.Event, threading.Event]:
        events = threading.Event(), threading.Event()
        self.pending.put(events)
        return events


def segment_files(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*.log")}


@run_async
async def test_compaction_during_a_read_keeps_the_segment_until_the_read_ends() -> None:
    directory = Path(tempfile.mkdtemp(prefix="meshmq-async-read-"))
    try:
        store = JournalStore(directory, segment_size=1024, fsync=False)
        store.open()
        gates = Gates(store)
        store.write([AddMessage(msg(i, b"p" * 60), ((Q, i),)) for i in range(1, 4)])
        store.write([AddMessage(msg(100 + i, b"x" * 200), ((X, i),)) for i in range(1, 13)])
        await store.sync()
        first = min(segment_files(directory))
        expected = entry_view(store.load(Q, 0, 10))
        started, gate = gates.next()
        read = asyncio.ensure_future(store.load_async(Q, 0, 10))
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        assert store.stats()["pinned_segments"] == 1
        # Everything but the page goes: the pinned oldest segment is copied forward and
        # would be deleted now, were it not being read.
        store.write([RemoveRef(X, i) for i in range(1, 13)] + [RemoveRef(Q, 2)])
        while store.compact_step():
            pass
        await store.sync()
        assert store.stats()["segments_deleted"] >= 1
        assert store.stats()["held_deletions"] >= 1
        assert first in segment_files(directory)
        # A held segment is still on disk: it counts towards the store's disk usage.
        held_size = (directory / first).stat().st_size
        assert store.disk_bytes() >= held_size
        on_disk = sum(p.stat().st_size for p in directory.glob("*.log"))
        assert store.disk_bytes() == on_disk
        gate.set()
        assert entry_view(await read) == expected  # as live when asked: seq 2 included
        assert store.stats()["pinned_segments"] == 0
        assert store.stats()["held_deletions"] == 0
        await store.sync()
        assert first not in segment_files(directory)
        assert [e.seq for e in await store.load_async(Q, 0, 10)] == [1, 3]
        await store.close()
        reopened = JournalStore(directory, segment_size=1024, fsync=False)
        reopened.open()
        assert [e.seq for e in reopened.load(Q, 0, 10)] == [1, 3]
        await reopened.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


KEYS = ("queue://a", "queue://b")


class AsyncReadsMatchModel(RuleBasedStateMachine):
    """Writes, removals, compaction steps and gated page reads, interleaved; every read
    returns what the model held when it was asked for, and recovery agrees at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="meshmq-async-sm-"))
        self.journal = JournalStore(self.dir, segment_size=1024, fsync=False,
                                    compact_live_ratio=0.6)
        self.journal.open()
        self.gates = Gates(self.journal)
        self.model = MemoryStore()
        self.model.open()
        self.next_seq = dict.fromkeys(KEYS, 0)
        self.live: dict[str, list[int]] = {k: [] for k in KEYS}
        self.n = 0
        self.reads: list[tuple[threading.Event, asyncio.Future[list[StoredEntry]],
                               list[Any]]] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def both(self, ops: list[StoreOp]) -> None:
        self.journal.write(ops)
        self.model.write(ops)

    @rule(key=st.sampled_from(KEYS), size=st.integers(0, 300), count=st.integers(1, 4))
    def add(self, key: str, size: int, count: int) -> None:
        ops: list[StoreOp] = []
        for _ in range(count):
            self.n += 1
            self.next_seq[key] += 1
            ops.append(AddMessage(msg(self.n, bytes([self.n % 251]) * size),
                                  ((key, self.next_seq[key]),)))
            self.live[key].append(self.next_seq[key])
        self.both(ops)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(KEYS))
        if self.live[key]:
            seqs = data.draw(st.lists(st.sampled_from(self.live[key]), min_size=1,
                                      max_size=len(self.live[key]), unique=True))
            for seq in seqs:
                self.live[key].remove(seq)
            self.both([RemoveRef(key, seq) for seq in seqs])

    @rule(data=st.data(), count=st.integers(1, 9))
    def deliver(self, data: st.DataObject, count: int) -> None:
        key = data.draw(st.sampled_from(KEYS))
        if self.live[key]:
            self.both([SetDeliveryCount(key, data.draw(st.sampled_from(self.live[key])),
                                        count)])

    @rule(steps=st.integers(1, 4))
    def compact(self, steps: int) -> None:
        for _ in range(steps):
            if not self.journal.compact_step():
                break

    @rule()
    def sync(self) -> None:
        self.run(self.journal.sync())

    @precondition(lambda self: len(self.reads) < 4)
    @rule(key=st.sampled_from(KEYS), after=st.integers(0, 30), count=st.integers(1, 12))
    def start_read(self, key: str, after: int, count: int) -> None:
        _, gate = self.gates.next()  # queued reads wait behind the first, pinned already
        expected = entry_view(self.model.load(key, after, count))
        fut = asyncio.ensure_future(self.journal.load_async(key, after, count),
                                    loop=self.loop)
        self.run(asyncio.sleep(0))  # the read resolves its page and is submitted
        self.reads.append((gate, fut, expected))

    @precondition(lambda self: bool(self.reads))
    @rule()
    def finish_read(self) -> None:
        gate, fut, expected = self.reads.pop(0)
        gate.set()
        assert entry_view(self.run(fut)) == expected

    @invariant()
    def loads_agree(self) -> None:
        for key in KEYS:
            assert (entry_view(self.journal.load(key, 0, 1 << 30))
                    == entry_view(self.model.load(key, 0, 1 << 30)))

    def teardown(self) -> None:
        try:
            while self.reads:
                self.finish_read()
            assert self.journal.stats()["pinned_segments"] == 0
            assert self.journal.stats()["held_deletions"] == 0
            self.run(self.journal.sync())
            self.run(self.journal.close())
            reopened = JournalStore(self.dir, segment_size=1024, fsync=False)
            reopened.open()
            for key in KEYS:
                assert (entry_view(reopened.load(key, 0, 1 << 30))
                        == entry_view(self.model.load(key, 0, 1 << 30)))
            self.run(reopened.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)


TestAsyncReadsMatchModel = AsyncReadsMatchModel.TestCase
TestAsyncReadsMatchModel.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
