"""``JournalStore``: the embedded default store (append-only segments, group commit).

Threads. The event-loop thread owns the index and every decision: ``write`` encodes a
batch into one record, assigns its file position, updates the index and queues the
record. One writer thread takes what is queued, writes it (one ``write`` call per
group), fsyncs once and resolves the ``sync`` futures waiting on that group. They
share only the queue, the durability counter, the waiter list and a few counters
(under ``_lock``) plus ``_unwritten``, whose single-key get/pop are atomic under the GIL.

Data written but not yet on disk is served from ``_unwritten`` (message objects, or
for compaction copies a pointer to the original bytes), so ``load`` sees it at once.

Space reclaim copies the live contents of the OLDEST segment forward and deletes it
once the copies are durable; see docs/store-format.md for why only the oldest.

Page reads off the loop (``load_async``). The loop resolves the page's locations in the
index and *pins* their segments; a reader thread then reads and decodes them with file
descriptors of its own, following ``_unwritten`` exactly as ``_fetch`` does for the
loop (the writer's ordering makes that safe from any thread). Compaction still copies a
pinned segment forward, but its deletion is held back, together with every younger
deletion (they must reach the disk oldest first), until the last read pinning it ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshmq.core import message_codec as codec
from meshmq.core.message import Message
from meshmq.errors import CorruptStoreError, StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    KeyInfo,
    MarkDispatched,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    StoredEntry,
    StoreOp,
)
from meshmq.store.fence import WriteFence
from meshmq.store.journal import epochs
from meshmq.store.journal import format as fmt
from meshmq.store.journal.index import KeyIndex
from meshmq.store.waiters import Waiter
from meshmq.store.waiters import notify as notify_waiters

log = logging.getLogger("meshmq.store")

MIB = 1024 * 1024
_COMPACT_STEP_BYTES = 1 * MIB  # message bytes copied per compaction step
_COMPACT_CHECK_EVERY = 64  # writes between checks for a segment worth compacting
_COMPACT_SEGMENTS_PER_STEP = 64  # segments one compaction step may release
RESERVE_FILE = "space.reserve"  # space held back for acks when the disk fills
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_SPACE_RETRY_MAX_S = 2.0
# A sync the event loop does itself (``_write_inline``): only while recent disk syncs
# took less than this on average (it blocks the loop meanwhile: a disk whose syncs take
# milliseconds keeps them on the writer thread), and for a group up to this size.
INLINE_SYNC_MAX_S = 0.002
_INLINE_MAX_BYTES = 256 * 1024
# The open segment's tail is zero-filled this far ahead of its records, in groups of at
# most _PREALLOC_GROUP bytes: an fdatasync of blocks that already belong to the file
# flushes the data alone, while one that makes the file grow must also write its inode
# and wait for it (on ext4 one more I/O round trip and wake-up per sync). Big groups
# append as before (zero-filling would double what they write).
_PREALLOC_BYTES = 1 * MIB
_PREALLOC_GROUP = 64 * 1024


class _HandOverError(Exception):
    """The disk filled during an inline write: the writer thread finishes it (it may wait
    for space, the event loop may not)."""

    def __init__(self, rest: bytes) -> None:
        super().__init__()
        self.rest = rest

# A part of a record body: bytes, or (segment, offset, length) the writer copies from disk.
Part = bytes | tuple[int, int, int]


@dataclass(slots=True)
class _SegInfo:
    size: int = fmt.HEADER_SIZE  # file bytes (records queued but unwritten included)
    live_refs: int = 0
    live_bytes: int = 0  # message bytes per live ref
    total_bytes: int = 0  # message bytes per ref ever added here
    keys: dict[str, int] = field(default_factory=dict)  # key -> live refs here


@dataclass(slots=True)
class _Item:
    """One record for the writer thread, or (``delete``) a segment to unlink once durable."""

    batch_no: int
    seg: int = 0
    off: int = 0
    parts: list[Part] = field(default_factory=list)
    size: int = 0  # body bytes (type + payload)
    unwritten: list[tuple[int, int]] = field(default_factory=list)
    delete: int | None = None
    # Only removals (acks): durable at the next disk sync anybody needs, not at once.
    lazy: bool = False


@dataclass(slots=True)
class _Plan:
    """Live contents of the segment being compacted, copied forward step by step."""

    seg: int
    messages: list[tuple[int, int, list[tuple[str, int]]]]  # (offset, length, refs)
    pos: int = 0
    carried: bool = False  # subscriptions, last_seq and dispatch watermarks copied


class JournalStore:
    keeps_dispatch_marks = True  # store.base.Store

    def __init__(self, directory: Path, *, segment_size: int = 32 * MIB, fsync: bool = True,
                 max_batch_bytes: int = 4 * MIB, compact_live_ratio: float = 0.5,
                 fence: WriteFence | None = None, accept_data_loss: bool = False,
                 max_disk_bytes: int = 0, min_free_disk: int = 0, disk_reserve: int = 0,
                 close_timeout: float = 10.0, inline_sync: bool = True) -> None:
        if segment_size < 512 or segment_size > (1 << 40):
            raise StoreError(f"segment_size {segment_size} out of range [512, 2**40]")
        if max_batch_bytes < 1:
            raise StoreError("max_batch_bytes must be positive")
        if not 0.0 <= compact_live_ratio <= 1.0:
            raise StoreError("compact_live_ratio must be within [0, 1]")
        self.directory = Path(directory)
        self._segment_size = segment_size
        self._fsync = fsync
        self._max_batch_bytes = max_batch_bytes
        self._ratio = compact_live_ratio
        # Master/slave on a shared directory: the HA lease replaces the directory lock,
        # and every write group must pass the lease's fence (docs/ha.md).
        self._fence = fence
        # Start even if recovery must drop data that damage made unreadable (docs:
        # store-format.md, "Damaged segments"); the damaged file is kept aside either way.
        self._accept_data_loss = accept_data_loss
        # Disk space (docs/store-format.md, "A full disk"): persistent messages are refused
        # above max_disk_bytes of journal or below min_free_disk free on the filesystem;
        # disk_reserve bytes are held in a file given back when the disk fills, so that
        # acknowledgements (which free space) can still be written.
        self._max_disk_bytes = max_disk_bytes
        self._min_free_disk = min_free_disk
        self._reserve_bytes = disk_reserve
        self._reserve_path = self.directory / RESERVE_FILE
        self._disk_full = False  # the writer met ENOSPC and has not written since
        self._space_wake = threading.Event()
        self._close_timeout = close_timeout
        self._space_delay = 0.0
        self._abandon = False  # close() gave up waiting: the writer stops retrying
        # Called (from the writer thread) when the disk fills or has room again; the
        # broker hands in a thread-safe wake-up of its own space check.
        self.space_listener: Callable[[], None] | None = None
        # --- event-loop thread state
        self._index: dict[str, KeyIndex] = {}
        self._subs: dict[str, DurableSubscription] = {}
        self._sub_seg: dict[str, int] = {}  # segment holding the newest record of each sub
        self._last_seq_seg: dict[str, int] = {}  # segment whose record set each last_seq
        self._dispatched_seg: dict[str, int] = {}  # segment whose record set each dispatch mark
        self._segs: dict[int, _SegInfo] = {}  # ascending ids; excludes segments being deleted
        self._key_ids: dict[str, int] = {}
        self._defined: set[int] = set()  # key ids defined in the active segment
        self._active = 0
        self._tail = fmt.HEADER_SIZE
        self._read_fds: dict[int, int] = {}
        self._unwritten: dict[tuple[int, int], Message | tuple[int, int]] = {}
        self._batch_no = 0
        self._plan: _Plan | None = None
        self._writes_since_check = 0
        self._lock_fd: int | None = None
        self._opened = False
        self._closed = False
        self._segments_deleted = 0
        self._bytes_copied = 0
        # Page reads in flight off the loop: segment -> readers. A compacted segment is
        # not deleted while pinned; its deletion, and every younger one, wait in _held.
        self._pins: dict[int, int] = {}
        self._held: deque[int] = deque()
        # Sizes of held segments: still on disk, so they count towards max_disk_bytes.
        self._held_bytes: dict[int, int] = {}
        self._readers: concurrent.futures.ThreadPoolExecutor | None = None
        # --- shared with the writer thread (under _lock)
        self._lock = threading.Lock()
        # Waking the writer: a token in a C queue, put only while the writer says it is
        # idle (so at most one waits). A threading.Condition cost a lock allocation and
        # a few microseconds of Python per record on both threads, which a producer at a
        # confirmation window of 1 pays on every message.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._w_idle = False
        # The loop a _deferred_kick is scheduled on (another loop, or none: kick anew).
        self._kick_soon: asyncio.AbstractEventLoop | None = None
        # Whoever writes and syncs holds _io_lock: the writer thread, or the event loop
        # when it finds the writer idle and does a small group itself (``_write_inline``:
        # no thread hop, so no wake-up of the writer and none of the loop afterwards).
        # Not with a fence (its checks read the lease file), and only while disk syncs
        # are quick (``_sync_cost``: a moving average of their seconds).
        self._io_lock = threading.Lock()
        self._inline_ok = inline_sync and fence is None
        self._sync_cost = 0.0
        # The loop writing now, in its own thread (a full disk hands over, _HandOverError;
        # its waiters are resolved at once).
        self._inline: asyncio.AbstractEventLoop | None = None
        self._resume: Callable[[], None] | None = None  # a handed-over inline write
        self._inline_syncs = 0
        # The loop that synced inline in its current pass of callbacks: at most one
        # inline sync per pass, so syncs asked for one after another in a pass (a replica
        # applying batches) still share the writer's group commit.
        self._inline_pass: asyncio.AbstractEventLoop | None = None
        # key -> the highest seq of a message consumed before it was written (``write``),
        # to be written with the next record (every compaction step writes it at latest).
        self._unwritten_last: dict[str, int] = {}
        self._queue: deque[_Item] = deque()
        self._durable_no = 0
        self._written_no = 0  # written to the file, maybe not yet synced (lazy removals)
        self._sync_wanted = False  # a sync() waits for written but unsynced batches
        self._w_unsynced = False  # writer thread only: the active segment has unsynced data
        self._waiters: deque[Waiter] = deque()  # ascending targets
        self._failed: StoreError | None = None
        self._stopping = False
        self._deleted: list[int] = []
        self._syncs = 0
        self._bytes_written = 0
        self._groups = 0
        self._records_written = 0
        # --- writer thread state
        self._thread: threading.Thread | None = None
        self._w_fd: int | None = None
        self._w_seg = 0
        self._w_off = 0
        self._w_alloc = 0  # the file's size: zero-filled from _w_off up to here
        self._w_read_fds: dict[int, int] = {}

    # ------------------------------------------------------------------ open / replay

    def open(self) -> Recovery:
        if self._opened:
            raise StoreError("store already opened")
        self._opened = True
        base = self.directory
        base.mkdir(parents=True, exist_ok=True)
        self._take_lock(base, shared=self._fence is not None)
        try:
            if self._fence is not None:
                # Each master of a shared store writes in its epoch's own directory, so
                # that late writes of a paused old master cannot reach it (epochs.py).
                self.directory = epochs.enter_epoch(base, self._fence.epoch,
                                                    fsync=self._fsync)
                self._reserve_path = self.directory / RESERVE_FILE
            else:
                epochs.leave_epochs(base, fsync=self._fsync)
            self._recover()
        except BaseException:
            self._release_files()
            raise
        if self._fence is not None:
            epochs.remove_older(base, self._fence.epoch)
        self._make_reserve()
        self._active = (max(self._segs) if self._segs else 0) + 1
        self._segs[self._active] = _SegInfo()
        self._tail = fmt.HEADER_SIZE
        self._thread = threading.Thread(target=self._writer_main, name="meshmq-journal-writer",
                                        daemon=True)
        self._thread.start()
        keys = {k: self.key_info(k) for k, idx in self._index.items()
                if idx.live or idx.last_seq}
        return Recovery(keys, list(self._subs.values()))

    def _take_lock(self, base: Path, *, shared: bool = False) -> None:
        """Exclusive for a broker alone on the directory. HA brokers (``shared``) hold it
        shared: the lease decides between them (a paused old master still holds its
        lock), while a broker without HA on the same directory is kept out."""
        path = base / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            if shared:
                raise StoreError(f"store directory {base} is locked by a broker "
                                 "running without HA", retriable=True) from None
            raise StoreError(f"store directory {base} is locked by another broker",
                             code="store-locked", retriable=True) from None
        self._lock_fd = fd
        if shared:
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def _segment_path(self, seg: int) -> Path:
        return self.directory / fmt.segment_name(seg)

    def _recover(self) -> None:
        ids = sorted(sid for p in self.directory.iterdir()
                     if (sid := fmt.parse_segment_name(p.name)) is not None)
        for n, sid in enumerate(ids):
            last = n == len(ids) - 1
            path = self._segment_path(sid)
            data = path.read_bytes()
            if last and (len(data) < fmt.HEADER_SIZE or not data.strip(b"\x00")):
                # Crash while creating the newest segment: nothing in it was ever synced.
                log.warning("journal: removing %s, it holds no record (%d bytes, header "
                            "incomplete)", path, len(data))
                path.unlink()
                continue
            scan = self._check_segment(path, sid, data, last)
            if scan is None:
                continue
            self._segs[sid] = _SegInfo(size=scan.good_end)
            key_names: dict[int, str] = {}
            for off, body in scan.records:
                if body[0] != fmt.REC_BATCH:
                    raise CorruptStoreError(f"{path}: unknown record type {body[0]} at offset "
                                            f"{off} (written by a newer meshmq?)")
                try:
                    self._replay_batch(sid, off + fmt.RECORD_HEADER_SIZE, body, key_names)
                except CorruptStoreError as exc:
                    raise CorruptStoreError(f"{path}: record at offset {off}: {exc}") from exc
                except (struct.error, IndexError, KeyError, ValueError) as exc:
                    raise CorruptStoreError(f"{path}: record at offset {off} is malformed: "
                                            f"{exc!r}") from exc
        for idx in self._index.values():
            idx.normalize()

    def _check_segment(self, path: Path, sid: int, data: bytes,
                       last: bool) -> fmt.ScanResult | None:
        """Validate one segment before replay; repair what can be proven, refuse to drop
        what cannot (unless ``accept_data_loss``). None: the segment holds nothing."""
        damage = fmt.header_damage(data, str(path), sid)
        scan = fmt.scan_records(data)
        lost: str | None = None
        if scan.problem is not None:
            later = fmt.find_next_record(data, scan.good_end + 1)
            if not last or later is not None:
                lost = (f"{scan.problem}: {len(data) - scan.good_end} bytes after it are "
                        "unreadable" + (f" (an intact record follows at offset {later}, so "
                                        "this is not a torn write)" if later is not None
                                        else ""))
        if damage is not None and not scan.records and lost is None \
                and data[fmt.HEADER_SIZE:].strip(b"\x00"):
            lost = "no intact record could be read after it"
        if damage is None and lost is None:
            if scan.problem is not None and \
                    data.count(0, scan.good_end) == len(data) - scan.good_end:
                # Space zero-filled ahead of the records (JournalStore._preallocate).
                log.debug("journal: %s: cutting %d zero bytes after the last record",
                          path, len(data) - scan.good_end)
            elif scan.problem is not None:  # the newest segment's torn tail
                log.warning("journal: %s: %s; discarding %d bytes of torn tail "
                            "(batches never acknowledged as synced)",
                            path, scan.problem, len(data) - scan.good_end)
            if scan.problem is not None:
                with open(path, "r+b") as f:
                    f.truncate(scan.good_end)
                    f.flush()
                    os.fsync(f.fileno())
            if not scan.records:
                # A segment without records holds nothing; removing it is always safe.
                path.unlink()
                return None
            return scan
        what = "; ".join(x for x in (f"damaged header ({damage})" if damage else None, lost)
                         if x)
        if lost is not None and not self._accept_data_loss:
            raise CorruptStoreError(
                f"{path}: {what}. Starting would drop data that may have been confirmed to "
                f"clients; nothing was changed. To start anyway, keeping this file aside and "
                f"recovering its first {len(scan.records)} intact records, run the broker "
                "once with --accept-data-loss (see docs/store-format.md, damaged segments).")
        aside = path.with_name(path.name + ".damaged")
        k = 1
        while aside.exists():
            aside = path.with_name(f"{path.name}.damaged.{k}")
            k += 1
        os.replace(path, aside)  # kept for inspection, never deleted
        # The same records behind a fresh header: record offsets do not change.
        repaired = fmt.pack_segment_header(sid) + data[fmt.HEADER_SIZE:scan.good_end]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, repaired)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_directory()
        log.warning("journal: %s: %s; kept the original as %s and recovered %d intact "
                    "records%s", path, what, aside.name, len(scan.records),
                    " (data after them was dropped: --accept-data-loss)" if lost else "")
        if not scan.records:
            path.unlink()  # the repaired copy is empty; the original stays aside
            return None
        return fmt.ScanResult(scan.records, scan.good_end, None)

    def _replay_batch(self, seg: int, base: int, body: memoryview,
                      key_names: dict[int, str]) -> None:
        for op in fmt.iter_batch_ops(body):
            code = op[0]
            if code == fmt.OP_KEY:
                key_names[op[1]] = op[2]
            elif code in (fmt.OP_ADD, fmt.OP_COPY):
                _, moff, mlen, msize, refs = op
                for kid, seq, dc in refs:
                    self._add_ref(_key(key_names, kid), seq, seg, base + moff, mlen, msize, dc)
            else:
                key = _key(key_names, op[1])
                if code == fmt.OP_REMOVE:
                    self._remove_ref(key, op[2])
                elif code == fmt.OP_DELIVERY:
                    idx = self._index.get(key)
                    if idx is not None:
                        idx.set_delivery_count(op[2], op[3])
                elif code == fmt.OP_SUB:
                    sub: DurableSubscription = op[2]
                    self._put_sub(DurableSubscription(
                        key, sub.client_id, sub.subscription_name, sub.destination,
                        sub.selector, sub.no_local, sub.created_ms), seg)
                elif code == fmt.OP_DROP:
                    self._drop_key(key)
                elif code == fmt.OP_LAST_SEQ:
                    self._raise_last_seq(key, op[2], seg)
                elif code == fmt.OP_DISPATCHED:
                    self._raise_dispatched(key, op[2], seg)

    # ------------------------------------------------------------------ index updates

    def _add_ref(self, key: str, seq: int, seg: int, off: int,
                 length: int, size: int, dc: int) -> None:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = KeyIndex()
        old = idx.add(seq, seg, off, length, size, dc)
        if old is not None:
            self._unaccount(key, old[1], old[3])
        info = self._segs[seg]
        info.live_refs += 1
        info.live_bytes += length
        info.total_bytes += length
        info.keys[key] = info.keys.get(key, 0) + 1
        if idx.last_seq == seq:
            self._last_seq_seg[key] = seg

    def _unaccount(self, key: str, seg: int, length: int) -> None:
        info = self._segs.get(seg)
        if info is None:  # pragma: no cover - refs never point at deleted segments
            return
        info.live_refs -= 1
        info.live_bytes -= length
        left = info.keys[key] - 1
        if left:
            info.keys[key] = left
        else:
            del info.keys[key]

    def _remove_ref(self, key: str, seq: int) -> None:
        idx = self._index.get(key)
        if idx is not None:
            old = idx.remove(seq)
            if old is not None:
                self._unaccount(key, old[1], old[3])

    def _put_sub(self, sub: DurableSubscription, seg: int) -> None:
        self._subs[sub.key] = sub
        self._sub_seg[sub.key] = seg

    def _drop_key(self, key: str) -> None:
        idx = self._index.pop(key, None)
        if idx is not None:
            for _seq, seg, _off, length, _size, _dc in idx.entries():
                self._unaccount(key, seg, length)
        self._subs.pop(key, None)
        self._sub_seg.pop(key, None)
        self._last_seq_seg.pop(key, None)
        self._dispatched_seg.pop(key, None)

    def _raise_dispatched(self, key: str, seq: int, seg: int) -> None:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = KeyIndex()
        if seq > idx.dispatched:
            idx.dispatched = seq
            self._dispatched_seg[key] = seg

    def _raise_last_seq(self, key: str, seq: int, seg: int) -> None:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = KeyIndex()
        if seq >= idx.last_seq:
            idx.last_seq = seq
            self._last_seq_seg[key] = seg

    # ------------------------------------------------------------------ write path

    def _check_writable(self) -> None:
        if not self._opened or self._closed:
            raise StoreError("journal store is not open")
        if self._failed is not None:
            raise StoreError(f"journal store refuses writes after an I/O failure: "
                             f"{self._failed.message}")

    def _key_id(self, key: str) -> int:
        kid = self._key_ids.get(key)
        if kid is None:
            kid = self._key_ids[key] = len(self._key_ids) + 1
        return kid

    def _roll_if_full(self) -> None:
        if self._tail >= self._segment_size:
            self._active += 1
            self._segs[self._active] = _SegInfo()
            self._tail = fmt.HEADER_SIZE
            self._defined = set()

    def write(self, ops: Sequence[StoreOp], marks: Mapping[str, int] | None = None) -> None:
        """``marks``: raise these keys' ``last_seq`` in the same atomic record (replicated
        HA keeps its log position this way, so the position and the data never disagree).

        A message whose every reference is removed later in the same batch (delivered to
        an ``ack:auto`` consumer, or acknowledged, before its batch was written) is not
        written at all, nor are its removal and delivery counts: replaying them would
        leave nothing. Only its seq is remembered (``_unwritten_last``) and written with
        the next record; see docs/store-format.md, "Messages consumed before they were
        written"."""
        self._check_writable()
        if not ops and not marks:
            return
        consumed = self._consumed(ops) if len(ops) > 1 else None
        if consumed is not None:
            ops, gone = consumed
            if not ops and not marks:
                self._note_unwritten(gone)
                return
        # An ack's removal alone need not reach the disk before the next message: losing
        # it in a crash redelivers the message (flagged redelivered), never loses one.
        # Syncing it at once cost a second disk sync per message under window-1 load.
        lazy = not marks and all(isinstance(op, RemoveRef) for op in ops)
        if consumed is not None:
            # In this record: last_seq stays exact (a key dropped in it stays dropped).
            marks = _raised(marks, _undropped(consumed[1], ops))
        self._write_record(ops, marks, lazy=lazy)
        self._writes_since_check += 1
        if self._plan is not None or self._writes_since_check >= _COMPACT_CHECK_EVERY:
            self.compact_step()

    def _consumed(self, ops: Sequence[StoreOp]
                  ) -> tuple[list[StoreOp], dict[str, int]] | None:
        """``ops`` less the messages removed again within them (see ``write``), and the
        highest seq per key of those left out; None when there are none."""
        added: set[tuple[str, int]] | None = None
        removed: set[tuple[str, int]] | None = None
        for op in ops:
            if isinstance(op, AddMessage):
                if added is None:
                    added = set()
                added.update(op.refs)
            elif isinstance(op, RemoveRef) and added is not None:
                ref = (op.key, op.seq)
                if ref in added:
                    if removed is None:
                        removed = set()
                    removed.add(ref)
        if removed is None:
            return None
        gone: set[tuple[str, int]] = set()
        for op in ops:
            if isinstance(op, AddMessage) and all(ref in removed for ref in op.refs):
                gone.update(op.refs)
        if not gone:
            return None
        kept: list[StoreOp] = []
        for op in ops:
            if isinstance(op, AddMessage):
                if op.refs and op.refs[0] in gone:
                    continue
            elif isinstance(op, (RemoveRef, SetDeliveryCount)) and (op.key, op.seq) in gone:
                continue
            kept.append(op)
        last: dict[str, int] = {}
        for key, seq in gone:
            last[key] = max(seq, last.get(key, 0))
        return kept, last

    def _note_unwritten(self, last: dict[str, int]) -> None:
        """Seqs of messages left out with nothing else to write: each key's last_seq
        rises now, as if they had been written and removed, and reaches the disk with
        the next record."""
        unwritten = self._unwritten_last
        for key, seq in last.items():
            idx = self._index.get(key)
            if idx is None:
                idx = self._index[key] = KeyIndex()
            idx.last_seq = max(idx.last_seq, seq)
            unwritten[key] = max(seq, unwritten.get(key, 0))

    def _flush_unwritten_last(self) -> None:
        """Write the seqs of messages that were never written (lazily: no sync of its own,
        the next one anybody needs covers it)."""
        if self._unwritten_last and self._opened and not self._closed \
                and self._failed is None:
            self._write_record([], None, lazy=True)

    def _write_record(self, ops: Sequence[StoreOp], marks: Mapping[str, int] | None, *,
                      lazy: bool) -> None:
        pending = self._unwritten_last
        if pending:
            marks = _raised(marks, _undropped(pending, ops))
        self._reap_deleted()
        self._roll_if_full()
        seg = self._active
        defined = self._defined
        new_defs: set[int] = set()
        parts: list[Part] = [b"\x01"]  # REC_BATCH
        pos = 1
        msg_offsets: list[int] = []
        encoded: list[bytes] = []

        def kid_for(key: str) -> int:
            nonlocal pos
            kid = self._key_id(key)
            if kid not in defined and kid not in new_defs:
                raw = key.encode("utf-8")
                piece = fmt.OP_U32.pack(fmt.OP_KEY, kid) + fmt.U32.pack(len(raw)) + raw
                parts.append(piece)
                pos += len(piece)
                new_defs.add(kid)
            return kid

        # Pass 1: encode the whole batch. Any error leaves store state untouched.
        try:
            for op in ops:
                if isinstance(op, AddMessage):
                    refs = [fmt.KEY_SEQ.pack(kid_for(k), s) for k, s in op.refs]
                    data = codec.encoded(op.message)
                    head = fmt.OP_U32.pack(fmt.OP_ADD, len(data))
                    msg_offsets.append(pos + len(head))
                    encoded.append(data)
                    tail = fmt.U32.pack(len(refs)) + b"".join(refs)
                    parts.append(head)
                    parts.append(data)
                    parts.append(tail)
                    pos += len(head) + len(data) + len(tail)
                elif isinstance(op, RemoveRef):
                    piece = fmt.OP_KEY_SEQ.pack(fmt.OP_REMOVE, kid_for(op.key), op.seq)
                    parts.append(piece)
                    pos += len(piece)
                elif isinstance(op, SetDeliveryCount):
                    piece = fmt.OP_KEY_SEQ_DC.pack(fmt.OP_DELIVERY, kid_for(op.key), op.seq,
                                                   op.count)
                    parts.append(piece)
                    pos += len(piece)
                elif isinstance(op, PutDurableSubscription):
                    piece = self._sub_bytes(op.subscription, kid_for(op.subscription.key))
                    parts.append(piece)
                    pos += len(piece)
                elif isinstance(op, DropKey):
                    piece = fmt.OP_U32.pack(fmt.OP_DROP, kid_for(op.key))
                    parts.append(piece)
                    pos += len(piece)
                elif isinstance(op, MarkDispatched):
                    piece = fmt.OP_KEY_SEQ.pack(fmt.OP_DISPATCHED, kid_for(op.key), op.seq)
                    parts.append(piece)
                    pos += len(piece)
                else:
                    raise StoreError(f"unknown store operation {op!r}")
            for key, mark in (marks or {}).items():
                piece = fmt.OP_KEY_SEQ.pack(fmt.OP_LAST_SEQ, kid_for(key), mark)
                parts.append(piece)
                pos += len(piece)
        except struct.error as exc:
            raise StoreError(f"cannot encode store batch: {exc}") from exc

        # Pass 2: the batch is accepted; apply it to the index in order.
        pending.clear()  # in ``marks`` now
        defined |= new_defs
        rec_off = self._tail
        base = rec_off + fmt.RECORD_HEADER_SIZE
        unwritten = self._unwritten
        keys: list[tuple[int, int]] = []
        n_msg = 0
        for op in ops:
            if isinstance(op, AddMessage):
                off = base + msg_offsets[n_msg]
                data = encoded[n_msg]
                n_msg += 1
                unwritten[(seg, off)] = op.message
                keys.append((seg, off))
                size = len(op.message.body)
                for k, s in op.refs:
                    self._add_ref(k, s, seg, off, len(data), size, 0)
            elif isinstance(op, RemoveRef):
                self._remove_ref(op.key, op.seq)
            elif isinstance(op, SetDeliveryCount):
                idx = self._index.get(op.key)
                if idx is not None:
                    idx.set_delivery_count(op.seq, op.count)
            elif isinstance(op, PutDurableSubscription):
                self._put_sub(op.subscription, seg)
            elif isinstance(op, MarkDispatched):
                self._raise_dispatched(op.key, op.seq, seg)
            else:
                self._drop_key(op.key)
        for key, mark in (marks or {}).items():
            self._raise_last_seq(key, mark, seg)
        self._enqueue_record(seg, rec_off, parts, pos, keys, lazy=lazy)

    @staticmethod
    def _sub_bytes(sub: DurableSubscription, kid: int) -> bytes:
        flags = (fmt.SUB_NO_LOCAL if sub.no_local else 0) | (
            fmt.SUB_HAS_SELECTOR if sub.selector is not None else 0)
        out = [fmt.SUB_FIXED.pack(fmt.OP_SUB, kid, flags, sub.created_ms)]
        fmt.put_str(out, sub.client_id)
        fmt.put_str(out, sub.subscription_name)
        fmt.put_str(out, sub.destination)
        if sub.selector is not None:
            fmt.put_str(out, sub.selector)
        return b"".join(out)

    def _enqueue_record(self, seg: int, off: int, parts: list[Part], size: int,
                        unwritten: list[tuple[int, int]], *, lazy: bool = False) -> None:
        self._batch_no += 1
        item = _Item(self._batch_no, seg, off, parts, size, unwritten, lazy=lazy)
        self._tail = off + fmt.RECORD_HEADER_SIZE + size
        self._segs[seg].size = self._tail
        with self._lock:
            self._queue.append(item)
        self._wake_writer()

    def _wake_writer(self) -> None:
        """Wake the writer for what was just queued: on an event loop, once, after the
        callbacks of this turn (a writer woken at once would block on the GIL that this
        thread holds until the turn ends: two more context switches per record); at
        once elsewhere."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and self._kick_soon is loop:
            return  # a kick is already scheduled on this loop
        if loop is None:
            with self._lock:
                self._kick()
            return
        self._kick_soon = loop
        loop.call_soon(self._deferred_kick)

    def _deferred_kick(self) -> None:
        self._kick_soon = None
        with self._lock:
            self._kick()

    def _kick(self) -> None:
        """Wake the writer if it sleeps and has work (the caller holds ``_lock``): a
        record the loop already wrote itself (``_write_inline``) leaves none."""
        if self._w_idle and (self._queue or self._sync_wanted or self._stopping
                             or self._resume is not None):
            self._w_idle = False
            self._wake.put(None)

    def _release_held(self) -> None:
        """Queue the deletions no page read holds back, oldest first; stop at the first
        pinned segment so that no younger segment goes before it."""
        held = self._held
        while held and held[0] not in self._pins:
            seg = held.popleft()
            self._held_bytes.pop(seg, None)
            self._enqueue_delete(seg)

    def _enqueue_delete(self, seg: int) -> None:
        self._batch_no += 1
        with self._lock:
            self._queue.append(_Item(self._batch_no, delete=seg))
        self._wake_writer()

    async def sync(self) -> None:
        await self.sync_at_once()

    def sync_at_once(self) -> asyncio.Future[None]:
        """A future done once every batch written before this call is durable
        (store.base.SyncsAtOnce: the target is taken now, and waiting costs no task)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        failed = self._failed
        if failed is not None or not self._opened or self._closed:
            fut.set_exception(StoreError(f"journal store failed: {failed.message}"
                                         if failed is not None else
                                         "journal store is not open"))
            return fut
        target = self._batch_no
        if self._plan is not None:
            self.compact_step()  # keep reclaiming between syncs; not waited for here
        with self._lock:
            if self._failed is not None:
                fut.set_exception(StoreError(f"journal store failed: "
                                             f"{self._failed.message}"))
                return fut
            if self._durable_no >= target:
                fut.set_result(None)
                return fut
            # Targets only grow (batch numbers), so the writer takes waiters from the left.
            self._waiters.append((target, loop, fut))
            # Written lazily and not synced yet: ask the writer for a sync pass.
            wake = self._written_no >= target
        if self._inline_ok and self._sync_cost < INLINE_SYNC_MAX_S \
                and self._inline_pass is not loop and self._write_inline(loop, sync_only=wake):
            return fut  # done now (or failed), unless the disk filled meanwhile
        if wake:
            with self._lock:
                self._sync_wanted = True
                self._kick()
        return fut

    def _end_inline_pass(self) -> None:
        self._inline_pass = None

    def _write_inline(self, loop: asyncio.AbstractEventLoop, *, sync_only: bool) -> bool:
        """On the event loop: write and sync what is queued (or, ``sync_only``, sync what
        was written lazily) here instead of on the writer thread, if the writer is idle
        and what is queued is small and goes to the open segment. Waiters of this loop
        are resolved at once. False: nothing done, the writer takes it as usual.

        Why: at a confirmation window of 1 every message is one sync; handing it to the
        writer thread and back costs two cross-thread wake-ups (a futex, an eventfd and
        the loop's poll) whose CPU exceeds the sync's own. Blocking the loop for one
        quick sync (``INLINE_SYNC_MAX_S``) is cheaper; a slower disk keeps the thread."""
        if self._disk_full or not self._io_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if not self._w_idle or self._stopping or self._failed is not None \
                        or self._resume is not None or self._w_fd is None:
                    return False
                queue_ = self._queue
                if sync_only:
                    if queue_:
                        return False
                    items: list[_Item] = []
                else:
                    if not queue_:
                        return False
                    nbytes = 0
                    for item in queue_:
                        nbytes += item.size
                        if item.delete is not None or item.seg != self._w_seg \
                                or nbytes > _INLINE_MAX_BYTES:
                            return False
                    items = list(queue_)
                    queue_.clear()
                self._sync_wanted = False
                self._inline_syncs += 1
            self._inline_pass = loop
            loop.call_soon(self._end_inline_pass)
            self._inline = loop
            handed = False
            try:
                if items:
                    handed = self._write_group_unfenced(items)
                else:
                    self._sync_written()
            except BaseException as exc:  # the writer thread's policy: the store fails
                self._fail(exc, loop)
            finally:
                self._inline = None
            if handed:
                with self._lock:
                    self._kick()
            return True
        finally:
            self._io_lock.release()

    # ------------------------------------------------------------------ read path

    def _reap_deleted(self) -> None:
        if self._deleted:
            with self._lock:
                gone, self._deleted = self._deleted, []
            for seg in gone:
                fd = self._read_fds.pop(seg, None)
                if fd is not None:
                    os.close(fd)

    def _read_fd(self, seg: int) -> int:
        fd = self._read_fds.get(seg)
        if fd is None:
            fd = self._read_fds[seg] = os.open(self._segment_path(seg), os.O_RDONLY)
        return fd

    def _read_message(self, seg: int, off: int, length: int) -> Message:
        """Bytes written to ``seg`` (FileNotFoundError passes through for ``_fetch``)."""
        try:
            data = os.pread(self._read_fd(seg), length, off)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {self._segment_path(seg)}: {exc}") from exc
        if len(data) != length:
            raise CorruptStoreError(f"{self._segment_path(seg)}: message at offset {off} "
                                    f"is truncated")
        return codec.decode_message(data)

    def _fetch(self, seg: int, off: int, length: int) -> Message:
        # The writer pops an _unwritten entry only after writing it, and unlinks a
        # compacted segment only after its copies are written (and popped). So: an entry
        # absent from _unwritten is in its file; a redirect whose source vanished has
        # been written at its new place, found on the next look.
        while True:
            found = self._unwritten.get((seg, off))
            if found is None:
                return self._read_message(seg, off, length)
            if not isinstance(found, tuple):
                return found
            try:
                return self._fetch(found[0], found[1], length)
            except FileNotFoundError:
                if (seg, off) in self._unwritten:  # pragma: no cover - impossible by ordering
                    raise StoreError(f"journal lost segment {found[0]} while still needed")\
                        from None

    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        idx = self._index.get(key)
        out: list[StoredEntry] = []
        if idx is None or max_count <= 0 or not idx.live:
            return out
        self._reap_deleted()
        total = 0
        for seq, seg, off, length, size, dc in idx.iter_after(after_seq):
            try:
                msg = self._fetch(seg, off, length)
            except FileNotFoundError as exc:
                raise StoreError(f"journal segment missing: {exc}") from exc
            out.append(StoredEntry(seq, msg, dc))
            total += size
            if len(out) >= max_count or total >= max_bytes:
                break
        return out

    async def load_async(self, key: str, after_seq: int,
                         max_count: int) -> list[StoredEntry]:
        """``load`` with the file reads and decoding on a reader thread (store.base.
        LoadsAsync): the locations are taken from the index now, on the loop, and their
        segments stay pinned until the thread is done with them."""
        if self._closed or not self._opened:
            raise StoreError("journal store is not open")
        idx = self._index.get(key)
        if idx is None or max_count <= 0 or not idx.live:
            return []
        page: list[tuple[int, int, int, int, int]] = []  # seq, seg, off, length, dc
        for seq, seg, off, length, _size, dc in idx.iter_after(after_seq):
            page.append((seq, seg, off, length, dc))
            if len(page) >= max_count:
                break
        segs = {seg for _, seg, _, _, _ in page}
        for seg in segs:
            self._pins[seg] = self._pins.get(seg, 0) + 1
        loop = asyncio.get_running_loop()
        if self._readers is None:
            self._readers = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="journal-read")
        try:
            job = self._readers.submit(self._read_page, page)
        except RuntimeError:
            self._unpin(segs)
            raise StoreError("journal store is closing") from None

        def finished(_: concurrent.futures.Future[list[StoredEntry]]) -> None:
            # Unpinned when the thread is done, not when the caller stops waiting: a
            # cancelled await leaves the read running.
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to free
                loop.call_soon_threadsafe(self._unpin, segs)

        job.add_done_callback(finished)
        return await asyncio.wrap_future(job)

    def _unpin(self, segs: set[int]) -> None:
        pins = self._pins
        for seg in segs:
            left = pins[seg] - 1
            if left:
                pins[seg] = left
            else:
                del pins[seg]
        if self._held and not self._closed and self._failed is None:
            self._release_held()

    def _read_page(self, page: list[tuple[int, int, int, int, int]]) -> list[StoredEntry]:
        """Reader thread: the messages of ``page``. Every segment it names is pinned; a
        redirect (a compaction copy not written yet) may point into a segment being
        deleted, which is then found written at its new place on the next look."""
        fds: dict[int, int] = {}
        try:
            out: list[StoredEntry] = []
            for seq, seg, off, length, dc in page:
                out.append(StoredEntry(seq, self._fetch_from(fds, seg, off, length), dc))
            return out
        except FileNotFoundError as exc:  # pragma: no cover - pinned segments stay
            raise StoreError(f"journal segment missing: {exc}") from exc
        finally:
            for fd in fds.values():
                os.close(fd)

    def _fetch_from(self, fds: dict[int, int], seg: int, off: int, length: int) -> Message:
        while True:
            found = self._unwritten.get((seg, off))
            if found is None:
                return self._pread(fds, seg, off, length)
            if not isinstance(found, tuple):
                return found
            try:
                return self._pread(fds, found[0], found[1], length)
            except FileNotFoundError:
                if (seg, off) in self._unwritten:  # pragma: no cover - impossible by ordering
                    raise StoreError(f"journal lost segment {found[0]} while still needed")\
                        from None

    def _pread(self, fds: dict[int, int], seg: int, off: int, length: int) -> Message:
        fd = fds.get(seg)
        path = self._segment_path(seg)
        try:
            if fd is None:
                fd = fds[seg] = os.open(path, os.O_RDONLY)
            data = os.pread(fd, length, off)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if len(data) != length:
            raise CorruptStoreError(f"{path}: message at offset {off} is truncated")
        return codec.decode_message(data)

    def key_names(self) -> list[str]:
        """Every key with live references or a ``last_seq`` (for replication snapshots)."""
        return [k for k, idx in self._index.items() if idx.live or idx.last_seq]

    def durable_subscriptions(self) -> list[DurableSubscription]:
        return list(self._subs.values())

    def key_info(self, key: str) -> KeyInfo:
        idx = self._index.get(key)
        if idx is None:
            return KeyInfo()
        return KeyInfo(idx.live, idx.bytes, idx.first_seq(), idx.last_seq, idx.dispatched)

    # ------------------------------------------------------------------ compaction

    def _compaction_candidate(self) -> int | None:
        if len(self._segs) < 2:
            return None
        oldest = next(iter(self._segs))
        if oldest == self._active:  # pragma: no cover - the active segment is the newest
            return None
        info = self._segs[oldest]
        if info.live_refs == 0 or info.live_bytes < self._ratio * info.total_bytes:
            return oldest
        # Mostly-dead younger segments pinned behind a live oldest one: copying the
        # oldest forward lets the dead ones go too.
        live = total = 0
        for seg, si in self._segs.items():
            if seg != self._active:
                live += si.live_bytes
                total += si.size
        return oldest if live < self._ratio * total else None

    def compact_step(self) -> bool:
        """Do a bounded slice of space reclaim; True while more work is pending.

        Called from ``write``/``sync``; the broker may also call it from a timer. One step
        copies at most ``_COMPACT_STEP_BYTES`` of live messages but releases up to
        ``_COMPACT_SEGMENTS_PER_STEP`` segments: a segment with nothing live costs no copy,
        and under churn most are like that, so space is reclaimed as fast as it is freed."""
        self._check_writable()
        self._writes_since_check = 0
        self._flush_unwritten_last()
        budget = min(_COMPACT_STEP_BYTES, self._max_batch_bytes)
        for _ in range(_COMPACT_SEGMENTS_PER_STEP):
            budget = self._compact_slice(budget)
            if budget < 0:
                return True  # the budget ran out part-way through a segment
            if self._plan is None and self._compaction_candidate() is None:
                return False
            if budget == 0:
                return True
        return True

    def _compact_slice(self, budget: int) -> int:
        """Copy live messages of the segment being compacted, up to ``budget`` bytes, and
        release the segment once it holds nothing live. Returns the budget left, or -1
        when it ran out with the segment still in progress."""
        plan = self._plan
        if plan is None:
            seg = self._compaction_candidate()
            if seg is None:
                return budget
            plan = self._plan = self._make_plan(seg)
        self._roll_if_full()
        src = plan.seg
        seg = self._active
        parts: list[Part] = [b"\x01"]
        pos = 1
        new_defs: set[int] = set()
        moves: list[tuple[str, int, int, int, int]] = []  # key, seq, old off, new off, len

        def kid_for(key: str) -> int:
            nonlocal pos
            kid = self._key_id(key)
            if kid not in self._defined and kid not in new_defs:
                raw = key.encode("utf-8")
                piece = fmt.OP_U32.pack(fmt.OP_KEY, kid) + fmt.U32.pack(len(raw)) + raw
                parts.append(piece)
                pos += len(piece)
                new_defs.add(kid)
            return kid

        if not plan.carried:
            plan.carried = True
            for key, sseg in list(self._sub_seg.items()):
                if sseg == src:
                    piece = self._sub_bytes(self._subs[key], kid_for(key))
                    parts.append(piece)
                    pos += len(piece)
                    self._sub_seg[key] = seg
            # Per-key watermarks whose newest record is in the segment: written again.
            for segs, code in ((self._last_seq_seg, fmt.OP_LAST_SEQ),
                               (self._dispatched_seg, fmt.OP_DISPATCHED)):
                for key, wseg in list(segs.items()):
                    if wseg == src:
                        mark = self._index[key]
                        value = mark.last_seq if code == fmt.OP_LAST_SEQ else mark.dispatched
                        piece = fmt.OP_KEY_SEQ.pack(code, kid_for(key), value)
                        parts.append(piece)
                        pos += len(piece)
                        segs[key] = seg
        copied = 0
        rec_base = self._tail + fmt.RECORD_HEADER_SIZE
        while plan.pos < len(plan.messages) and copied < budget:
            off, length, refs = plan.messages[plan.pos]
            plan.pos += 1
            live: list[tuple[str, int, int]] = []
            for key, seq in refs:
                idx = self._index.get(key)
                entry = idx.get(seq) if idx is not None else None
                if entry is not None and entry[1] == src and entry[2] == off:
                    live.append((key, seq, entry[5]))
            if not live:
                continue
            packed = b"".join([fmt.KEY_SEQ_DC.pack(kid_for(k), q, dc) for k, q, dc in live])
            # After kid_for: key definitions go before this operation.
            moves.extend((k, q, off, rec_base + pos + 5, length) for k, q, _ in live)
            parts.append(fmt.OP_U32.pack(fmt.OP_COPY, length))
            parts.append((src, off, length))
            tail = fmt.U32.pack(len(live)) + packed
            parts.append(tail)
            pos += 5 + length + len(tail)
            copied += length
        if pos > 1:
            self._defined |= new_defs
            unwritten_keys: list[tuple[int, int]] = []
            for key, seq, old_off, new_off, length in moves:
                idx = self._index[key]
                if idx.relocate(seq, src, old_off, seg, new_off):
                    self._unaccount(key, src, length)
                    info = self._segs[seg]
                    info.live_refs += 1
                    info.live_bytes += length
                    info.total_bytes += length
                    info.keys[key] = info.keys.get(key, 0) + 1
                    if (seg, new_off) not in self._unwritten:
                        self._unwritten[(seg, new_off)] = (src, old_off)
                        unwritten_keys.append((seg, new_off))
            self._bytes_copied += copied
            self._enqueue_record(seg, self._tail, parts, pos, unwritten_keys)
        if plan.pos < len(plan.messages):
            return -1
        info = self._segs[src]
        self._plan = None
        if info.live_refs:  # pragma: no cover - a bug, never delete live data
            log.error("journal: segment %d still has %d live refs after compaction; kept",
                      src, info.live_refs)
            return 0
        del self._segs[src]
        self._held.append(src)
        self._held_bytes[src] = info.size
        self._release_held()
        self._segments_deleted += 1
        return max(0, budget - copied)

    def _make_plan(self, seg: int) -> _Plan:
        by_offset: dict[int, tuple[int, list[tuple[str, int]]]] = {}
        for key, count in self._segs[seg].keys.items():
            idx = self._index[key]
            found = 0
            for seq, eseg, off, length, _size, _dc in idx.entries():
                if eseg == seg:
                    slot = by_offset.get(off)
                    if slot is None:
                        by_offset[off] = (length, [(key, seq)])
                    else:
                        slot[1].append((key, seq))
                    found += 1
                    if found == count:
                        break
        messages = [(off, length, refs) for off, (length, refs) in sorted(by_offset.items())]
        return _Plan(seg, messages)

    # ------------------------------------------------------------------ writer thread

    def _writer_main(self) -> None:
        try:
            while True:
                with self._io_lock:  # taken before the queue: groups keep their order
                    with self._lock:
                        resume, self._resume = self._resume, None
                        idle = resume is None and not self._queue and not self._stopping \
                            and not self._sync_wanted
                        if idle:
                            self._w_idle = True  # from now on a _kick() puts a token
                        elif resume is None:
                            sync_only = self._sync_wanted and not self._queue
                            self._sync_wanted = False
                            if sync_only:
                                items = []
                            elif not self._queue:
                                self._trim_tail()  # stopping: the file ends at its data
                                return
                            else:
                                items = [self._queue.popleft()]
                                nbytes = items[0].size
                                while self._queue and nbytes + self._queue[0].size \
                                        <= self._max_batch_bytes:
                                    nbytes += self._queue[0].size
                                    items.append(self._queue.popleft())
                    if resume is not None:
                        resume()
                    elif not idle:
                        if sync_only:
                            self._sync_written()
                            self._after_write()
                        else:
                            self._write_group(items)
                if idle:
                    self._wake.get()  # the token of a _kick() since the flag was set
        except BaseException as exc:
            self._fail(exc)
        finally:
            if self._w_fd is not None:
                os.close(self._w_fd)
                self._w_fd = None
            for fd in self._w_read_fds.values():
                os.close(fd)
            self._w_read_fds.clear()

    def _materialize(self, item: _Item) -> bytes:
        chunks: list[bytes] = []
        for part in item.parts:
            if isinstance(part, bytes):
                chunks.append(part)
            else:
                seg, off, length = part
                fd = self._w_read_fds.get(seg)
                if fd is None:
                    fd = self._w_read_fds[seg] = os.open(self._segment_path(seg), os.O_RDONLY)
                data = os.pread(fd, length, off)
                if len(data) != length:
                    raise CorruptStoreError(f"{self._segment_path(seg)}: short read at {off}")
                chunks.append(data)
        body = b"".join(chunks)
        if len(body) != item.size:
            raise StoreError("internal error: record size changed while queued")
        return body

    def _write_all(self, chunks: list[bytes]) -> None:
        if not chunks or self._w_fd is None:
            return
        buf = memoryview(b"".join(chunks))
        while buf:
            try:
                n = os.write(self._w_fd, buf)
            except OSError as exc:
                if exc.errno not in _SPACE_ERRNOS:
                    raise
                if self._inline is not None:
                    chunks.clear()
                    raise _HandOverError(bytes(buf)) from None
                self._wait_for_space(exc)
                continue  # the same bytes again, from where the short write stopped
            buf = buf[n:]
        chunks.clear()

    # ------------------------------------------------------------------ disk space

    def _make_reserve(self) -> None:
        if self._reserve_bytes <= 0:
            return
        try:
            with open(self._reserve_path, "wb") as f:
                left = self._reserve_bytes
                while left > 0:
                    left -= f.write(bytes(min(left, MIB)))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._reserve_path.unlink()
            log.warning("journal: could not reserve %d bytes of disk space for "
                        "acknowledgements (%s)", self._reserve_bytes, exc.strerror)

    def _wait_for_space(self, exc: OSError) -> None:
        """The disk is full: give back the reserve, or wait for space (writer thread).

        The writer keeps the batch and retries it; nothing is lost or reordered. The event
        loop meanwhile refuses new persistent messages (``persistent_refusal``) while
        acknowledgements go on being applied and queued."""
        if not self._disk_full:
            self._disk_full = True
            if self.space_listener is not None:
                self.space_listener()
            log.error("journal: disk full in %s (%s); refusing persistent messages, keeping "
                      "acknowledgements until space returns", self.directory, exc.strerror)
        if self._reserve_path.exists():
            with contextlib.suppress(OSError):
                self._reserve_path.unlink()
            return
        if self._abandon:
            raise StoreError(f"journal: disk still full when the broker stopped ({exc})")
        self._space_delay = min(_SPACE_RETRY_MAX_S, max(0.05, self._space_delay * 2))
        self._space_wake.wait(self._space_delay)
        self._space_wake.clear()

    def _after_write(self) -> None:
        """Writer thread, after a group was written: leave the disk-full state once the
        filesystem has room for the reserve and the free-space floor again."""
        self._space_delay = 0.0
        if not self._disk_full:
            return
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return
        if st.f_bavail * st.f_frsize >= 2 * self._reserve_bytes + self._min_free_disk:
            self._make_reserve()
            self._disk_full = False
            if self.space_listener is not None:
                self.space_listener()
            log.warning("journal: disk space available again in %s", self.directory)

    def disk_bytes(self) -> int:
        # Segments whose deletion a page read holds back are still on disk.
        return sum(si.size for si in self._segs.values()) + sum(self._held_bytes.values())

    def persistent_refusal(self) -> str | None:
        """Why new persistent messages must be refused now, or None (event loop)."""
        if self._failed is not None:
            return f"the journal failed: {self._failed.message}"
        if self._disk_full:
            # An idle writer looks again for space (and rebuilds the reserve) on its own
            # thread; the answer shows on the next call.
            with self._lock:
                self._sync_wanted = True
                self._kick()
            return f"the journal's disk is full ({self.directory})"
        if self._max_disk_bytes:
            used = self.disk_bytes()
            if used >= self._max_disk_bytes:
                return (f"the journal holds {used} bytes, its limit "
                        f"(store.max_disk_bytes) is {self._max_disk_bytes}")
        if self._min_free_disk:
            try:
                st = os.statvfs(self.directory)
            except OSError as exc:
                return f"the journal's directory is not usable ({exc.strerror})"
            free = st.f_bavail * st.f_frsize
            if free < self._min_free_disk:
                return (f"{free} bytes free on the journal's disk, below store.min_free_disk "
                        f"({self._min_free_disk})")
        return None

    def _sync_fd(self, fd: int, *, timed: bool = False) -> None:
        """``timed``: a sync of appended records, the kind the loop may do itself; its
        duration feeds ``_sync_cost`` (a segment's creation or end is slower, and rare)."""
        if self._fsync:
            if not timed:
                os.fdatasync(fd)
            else:
                start = time.monotonic()
                os.fdatasync(fd)
                took = time.monotonic() - start
                # A moving average: one sync delayed by a busy machine does not move the
                # syncs off the loop, a disk that is slow does within a few syncs.
                self._sync_cost = self._sync_cost * 0.8 + took * 0.2
        if fd == self._w_fd:
            self._w_unsynced = False

    def _take_ready_waiters(self) -> list[Waiter]:
        """Remove and return the waiters whose batch is durable (caller holds _lock):
        the oldest ones, since targets ascend."""
        waiters, durable = self._waiters, self._durable_no
        ready: list[Waiter] = []
        while waiters and waiters[0][0] <= durable:
            ready.append(waiters.popleft())
        return ready

    def _sync_written(self) -> None:
        """Make lazily written removals durable because somebody now waits for them."""
        if self._w_unsynced and self._w_fd is not None:
            self._sync_fd(self._w_fd, timed=True)
            with self._lock:
                self._syncs += 1
        self._confirm()
        with self._lock:
            self._durable_no = max(self._durable_no, self._written_no)
            ready = self._take_ready_waiters()
        notify_waiters(ready, None, self._inline)

    def _confirm(self) -> None:
        """Writer thread, once written data is durable and before it is confirmed: the
        lease must still be this broker's (raises FencedError otherwise)."""
        if self._fence is not None:
            self._fence.end_write()

    def _sync_directory(self) -> None:
        if self._fsync:
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _write_group(self, items: list[_Item]) -> None:
        fence = self._fence
        if fence is None:
            self._write_group_unfenced(items)
            return
        # Checked before the group touches a file; checked again once it is durable,
        # before it is confirmed or any segment is unlinked (_confirm). FencedError
        # fails the store; nothing of the group is confirmed then.
        fence.begin_write()
        self._write_group_unfenced(items)

    def _write_group_unfenced(self, items: list[_Item]) -> bool:
        """False once done; True when a full disk handed the rest to the writer thread
        (an inline write only: ``_HandOverError``)."""
        chunks: list[bytes] = []
        deletes: list[int] = []
        created = False
        nbytes = 0
        records = 0
        for item in items:
            if item.delete is not None:
                deletes.append(item.delete)
                continue
            if item.seg != self._w_seg:
                if self._w_fd is not None:
                    # The old segment must be complete on disk before a newer one exists,
                    # so only the newest segment can ever have a torn tail (or a zero one).
                    self._write_all(chunks)
                    self._trim_tail(sync=False)  # synced next
                    self._sync_fd(self._w_fd)
                    os.close(self._w_fd)
                    self._w_fd = None
                path = self._segment_path(item.seg)
                self._w_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                self._w_seg = item.seg
                chunks.append(fmt.pack_segment_header(item.seg))
                nbytes += fmt.HEADER_SIZE
                self._w_off = fmt.HEADER_SIZE
                self._w_alloc = 0
                created = True
            if item.off != self._w_off:
                raise StoreError(f"internal error: record for offset {item.off} "
                                 f"arrived at {self._w_off}")
            body = self._materialize(item)
            chunks.append(fmt.RECORD_HEADER.pack(len(body), zlib.crc32(body)))
            chunks.append(body)
            self._w_off += fmt.RECORD_HEADER_SIZE + len(body)
            nbytes += fmt.RECORD_HEADER_SIZE + len(body)
            records += 1
        try:
            self._write_all(chunks)
        except _HandOverError as exc:
            rest = exc.rest

            def resume() -> None:  # on the writer thread, which may wait for space
                self._write_all([rest])
                self._finish_group(items, created, deletes, nbytes, records)

            with self._lock:
                self._resume = resume
            return True
        if records and nbytes <= _PREALLOC_GROUP:
            self._preallocate()
        self._finish_group(items, created, deletes, nbytes, records)
        return False

    def _preallocate(self) -> None:
        """Zero-fill the open segment up to _PREALLOC_BYTES past its records (never past
        its size limit), once fewer than a quarter of that are left. Synced with the
        group just written. Optional: on any error the file simply grows as it goes."""
        fd = self._w_fd
        if not self._fsync or fd is None or self._disk_full \
                or self._w_alloc - self._w_off >= _PREALLOC_BYTES // 4:
            return
        start = max(self._w_off, self._w_alloc)
        end = min(self._w_off + _PREALLOC_BYTES, self._segment_size)
        if end <= start:
            return
        try:
            done = os.pwrite(fd, bytes(end - start), start)
        except OSError:
            return  # a full disk is the next write's to meet, with its own handling
        self._w_alloc = start + done

    def _trim_tail(self, *, sync: bool = True) -> None:
        """Cut the zero-filled tail off the open segment (before it is left for a newer
        one, and at a clean stop), so only the newest segment of a crash has one."""
        fd = self._w_fd
        if fd is not None and self._w_alloc > self._w_off:
            os.ftruncate(fd, self._w_off)
            self._w_alloc = self._w_off
            if sync:
                self._sync_fd(fd)

    def _finish_group(self, items: list[_Item], created: bool, deletes: list[int],
                      nbytes: int, records: int) -> None:
        """After a group's bytes are in the file: sync, confirm, unlink, resolve."""
        # Written: reads now find the data in the file.
        for item in items:
            for k in item.unwritten:
                self._unwritten.pop(k, None)
        last = items[-1].batch_no
        if self._w_fd is not None and records:
            lazy = not created and not deletes and all(
                item.lazy for item in items if item.delete is None)
            if lazy:
                with self._lock:
                    # Publish "written" and look for waiters atomically: a sync() that
                    # starts after this sees _written_no and asks for a sync pass.
                    self._written_no = last
                    lazy = not (self._waiters and self._waiters[0][0] <= last)
            if lazy:
                self._w_unsynced = True
            else:
                self._sync_fd(self._w_fd, timed=not created)
        if created:
            self._sync_directory()
        if deletes and self._w_unsynced and self._w_fd is not None:
            self._sync_fd(self._w_fd)  # never unlink ahead of unsynced records
        if not self._w_unsynced:
            self._confirm()
        for seg in deletes:
            fd = self._w_read_fds.pop(seg, None)
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                self._segment_path(seg).unlink()
            # Deletions must reach the disk oldest first: a crash may then leave an old
            # segment that was meant to go, never a hole before a surviving older one.
            self._sync_directory()
        with self._lock:
            self._written_no = last
            if not self._w_unsynced:
                self._durable_no = last
            self._syncs += 1 if records and not self._w_unsynced else 0
            self._groups += 1
            self._records_written += records
            self._bytes_written += nbytes
            self._deleted.extend(deletes)
            ready = self._take_ready_waiters()
        notify_waiters(ready, None, self._inline)
        self._after_write()

    def _fail(self, exc: BaseException,
              here: asyncio.AbstractEventLoop | None = None) -> None:
        """``here``: the loop running in this thread (an inline write failed)."""
        log.error("journal: write failed, store now refuses writes: %r", exc)
        with self._lock:
            self._failed = StoreError(f"journal write failed: {exc!r}")
            waiters, self._waiters = list(self._waiters), deque()
            self._queue.clear()
        notify_waiters(waiters, self._failed, here)

    # ------------------------------------------------------------------ close / stats

    async def close(self) -> None:
        if self._closed:
            return
        error: StoreError | None = None
        if self._opened and self._failed is None:
            # Deletions held back by reads still in flight stay undone: replay after a
            # lost deletion is safe (docs/store-format.md).
            self._release_held()
            self._flush_unwritten_last()
            try:
                await asyncio.wait_for(self.sync_at_once(), self._close_timeout)
            except StoreError as exc:
                error = exc
            except TimeoutError:
                pending = self._batch_no - self._durable_no
                error = StoreError(f"journal: {pending} batches were still unwritten after "
                                   f"{self._close_timeout:.0f} s (disk full?); stopped "
                                   "without them (none of them had been confirmed)")
        self._closed = True
        if self._readers is not None:
            # Reads in flight finish on their own descriptors; queued ones are dropped.
            self._readers.shutdown(wait=False, cancel_futures=True)
        self._abandon = True
        self._space_wake.set()
        if self._thread is not None:
            with self._lock:
                self._stopping = True
                self._kick()
            # Bounded: a writer stuck in the kernel (a hung disk) must not hold the stop.
            self._thread.join(self._close_timeout)
        self._release_files()
        if error is not None:
            raise error
        if self._failed is not None:
            raise StoreError(f"journal store failed: {self._failed.message}")

    def _release_files(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def index_bytes(self) -> int:
        return sum(idx.memory_bytes() for idx in self._index.values())

    def stats(self) -> dict[str, int | float | str]:
        with self._lock:
            syncs, groups, records = self._syncs, self._groups, self._records_written
            written, durable = self._bytes_written, self._durable_no
        return {
            "kind": "journal",
            "directory": str(self.directory),
            "segments": len(self._segs),
            "active_segment": self._active,
            "disk_bytes": sum(si.size for si in self._segs.values()),
            "keys": len(self._index),
            "live_refs": sum(idx.live for idx in self._index.values()),
            "syncs": syncs,
            "write_groups": groups,
            "bytes_written": written,
            "records_written": records,
            "mean_batch_size": records / syncs if syncs else 0.0,
            "mean_sync_bytes": written / syncs if syncs else 0.0,
            "pending_batches": self._batch_no - durable,
            "segments_deleted": self._segments_deleted,
            "bytes_copied": self._bytes_copied,
            "compacting": self._plan.seg if self._plan is not None else 0,
            "pinned_segments": len(self._pins),
            "held_deletions": len(self._held),
            "inline_syncs": self._inline_syncs,
            "disk_full": self._disk_full,
        }


def _raised(marks: Mapping[str, int] | None, more: Mapping[str, int]) -> dict[str, int]:
    """``marks`` with each key of ``more`` raised to at least its value there."""
    out = dict(marks or {})
    for key, seq in more.items():
        out[key] = max(seq, out.get(key, 0))
    return out


def _undropped(last: Mapping[str, int], ops: Sequence[StoreOp]) -> Mapping[str, int]:
    """``last`` less the keys ``ops`` drop: a last_seq written after a DropKey in the same
    record would bring the dropped key back on replay."""
    dropped = {op.key for op in ops if isinstance(op, DropKey)}
    if not dropped:
        return last
    return {k: v for k, v in last.items() if k not in dropped}


def _key(names: dict[int, str], kid: int) -> str:
    key = names.get(kid)
    if key is None:
        raise CorruptStoreError(f"key id {kid} used before its definition in this segment")
    return key
