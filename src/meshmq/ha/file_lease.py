"""The shared-store lease: a small file next to the journal, plus the fence the journal's
writer passes through. Thin I/O around ``meshmq.ha.lease``.

Files in the store directory:

``ha-lease``
    Two 128-byte slots, written alternately, each ``magic "MMQL" | u8 version |
    u8 holder length | u16 0 | u64 epoch | u64 counter | holder (<= 64 bytes) | zero pad |
    u32 crc32 of bytes 0..123``. The valid slot with the highest ``(epoch, counter)``
    is the lease, so a crash in the middle of a write leaves the previous record
    readable. Changes (takeover, renewal, release) are made under ``flock(LOCK_EX)`` on
    this file, one at a time; nobody else locks it. Readers (slaves looking, the journal's
    writer checking its epoch) read without a lock: a slot being written fails its crc
    and the other slot, the previous record, is read instead.
``ha-alive/<sha1 of holder>``
    Locked (``LOCK_EX``) by the holder for as long as its process lives. A slave that can
    lock it knows the holder is dead and takes over at once, without waiting for the
    lease to run out; a paused (SIGSTOP) holder still holds it, so then the lease
    timeout decides.

Fencing without a lock a paused process could hold: the journal's writer thread checks
the lease (epoch and holder) before it writes a group (``begin_write``) and again once the
group is durable, before anything in it is confirmed to a client or a segment is unlinked
(``end_write``). A takeover therefore never waits for the old master: it needs only the
lease to have expired. A check that passed was made before the takeover's record was
written, so the group it covers was durable before the new master began to read the
store. Writes a paused old master makes after a takeover are never confirmed, and they
cannot reach the new master's files: each epoch writes its journal in a directory of its
own, taken over as a snapshot of the previous epoch's (``meshmq.store.journal.epochs``).
Requires ``flock`` between the brokers for lease changes (one host, or a network file
system with working locks, as ActiveMQ's shared file locker does).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
import zlib
from pathlib import Path

from meshmq.errors import StoreError
from meshmq.ha.lease import LeaseRecord, LeaseView, release, renewal, takeover
from meshmq.store.fence import FencedError
from meshmq.store.journal.epochs import highest_epoch

log = logging.getLogger("meshmq.ha")

SLOT_SIZE = 128
MAGIC = b"MMQL"
VERSION = 1
MAX_HOLDER = 64
_HEAD = struct.Struct("<4sBBHQQ")  # magic, version, holder length, 0, epoch, counter
_CRC = struct.Struct("<I")
LEASE_FILE = "ha-lease"
_UNLOCKED_READ_TRIES = 5
ALIVE_DIR = "ha-alive"


def encode_slot(record: LeaseRecord) -> bytes:
    holder = (record.holder or "").encode()
    if len(holder) > MAX_HOLDER:
        raise ValueError(f"lease holder id longer than {MAX_HOLDER} bytes")
    body = _HEAD.pack(MAGIC, VERSION, len(holder), 0, record.epoch, record.counter) + holder
    body = body.ljust(SLOT_SIZE - _CRC.size, b"\0")
    return body + _CRC.pack(zlib.crc32(body))


def decode_slot(data: bytes) -> LeaseRecord | None:
    """The record in one slot, or None when the slot is empty or damaged."""
    if len(data) != SLOT_SIZE:
        return None
    body, (crc,) = data[:-_CRC.size], _CRC.unpack(data[-_CRC.size:])
    if zlib.crc32(body) != crc:
        return None
    magic, version, hlen, _, epoch, counter = _HEAD.unpack_from(body)
    if magic != MAGIC or version != VERSION or hlen > MAX_HOLDER:
        return None
    raw = body[_HEAD.size:_HEAD.size + hlen]
    try:
        holder = raw.decode() if hlen else None
    except UnicodeDecodeError:
        return None
    return LeaseRecord(epoch, holder, counter)


def newest(data: bytes) -> tuple[LeaseRecord | None, int]:
    """The newest valid record in a lease file's bytes and the slot it is in (-1: none)."""
    best: LeaseRecord | None = None
    slot = -1
    for i in range(2):
        rec = decode_slot(data[i * SLOT_SIZE:(i + 1) * SLOT_SIZE])
        if rec is not None and (best is None
                                or (rec.epoch, rec.counter) > (best.epoch, best.counter)):
            best, slot = rec, i
    if best is None and data.strip(b"\0"):
        # A lease file that exists but holds no valid slot cannot be trusted to carry the
        # highest epoch ever issued; reusing an epoch would break fencing.
        raise StoreError("the lease file is damaged (no valid slot); refusing to guess the "
                         "epoch. Stop all brokers and remove it to start a new history.")
    return best, slot


def _removed(fd: int) -> bool:
    """Whether the file open as ``fd`` was unlinked (deleted, or replaced by a rename)."""
    return os.fstat(fd).st_nlink == 0


def _alive_name(holder: str) -> str:
    return hashlib.sha1(holder.encode()).hexdigest()


class FileLease:
    """One broker's handle on the lease file of a shared store directory."""

    def __init__(self, directory: Path, holder: str) -> None:
        if not 0 < len(holder.encode()) <= MAX_HOLDER:
            raise ValueError(f"holder id must be 1 to {MAX_HOLDER} bytes")
        self.directory = Path(directory)
        self.holder = holder
        self._epoch = 0
        self._fd: int | None = None  # lease management (event loop side, via threads)
        self._fence_fd: int | None = None  # a second open file: the journal writer's locks
        self._alive_fd: int | None = None
        self._mutex = threading.Lock()  # one management operation at a time

    # ------------------------------------------------------------ plumbing
    @property
    def path(self) -> Path:
        return self.directory / LEASE_FILE

    @property
    def epoch(self) -> int:
        return self._epoch

    def _open(self) -> int:
        if self._fd is not None and _removed(self._fd):
            os.close(self._fd)
            self._fd = None
        if self._fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    @staticmethod
    def _read(fd: int) -> tuple[LeaseRecord | None, int]:
        return newest(os.pread(fd, 2 * SLOT_SIZE, 0))

    @staticmethod
    def _read_unlocked(fd: int) -> LeaseRecord | None:
        """The lease, read without a lock. Only the very first record can be caught half
        written with no older slot to fall back on: read again before calling it damaged."""
        for _ in range(_UNLOCKED_READ_TRIES - 1):
            try:
                return newest(os.pread(fd, 2 * SLOT_SIZE, 0))[0]
            except StoreError:
                time.sleep(0.001)
        return newest(os.pread(fd, 2 * SLOT_SIZE, 0))[0]

    def _write(self, fd: int, record: LeaseRecord, current_slot: int, *,
               sync: bool = True) -> None:
        slot = 1 - current_slot if current_slot >= 0 else 0
        data = encode_slot(record)
        if os.pwrite(fd, data, slot * SLOT_SIZE) != len(data):
            raise StoreError(f"{self.path}: short write of the lease record")
        if sync:
            os.fsync(fd)

    # ------------------------------------------------------------ observing
    def look(self) -> LeaseView:
        """The lease as it is now, and whether its holder's process still lives."""
        with self._mutex:
            # No lock: a slave paused here must not hold up the master's renewals.
            record = self._read_unlocked(self._open())
        alive = None
        if record is not None and record.holder is not None and record.holder != self.holder:
            alive = self._holder_alive(record.holder)
        return LeaseView(record, holder_alive=alive)

    def _holder_alive(self, holder: str) -> bool:
        path = self.directory / ALIVE_DIR / _alive_name(holder)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            # Holders lock their alive file before naming themselves in the lease.
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        finally:
            os.close(fd)
        return False

    # ------------------------------------------------------------ changing
    def _hold_alive(self) -> None:
        if self._alive_fd is not None:
            return
        alive_dir = self.directory / ALIVE_DIR
        alive_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(alive_dir / _alive_name(self.holder), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"another live broker uses holder id {self.holder!r}; "
                             "holder ids must be unique") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.holder}\n".encode())
        self._alive_fd = fd

    def try_acquire(self, seen: LeaseRecord | None) -> int | None:
        """Take the lease if it is still exactly as ``seen`` (what the takeover decision
        was based on). Returns the new epoch, or None if it changed or is being written."""
        with self._mutex:
            self._hold_alive()
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return None  # a renewal or a write in progress: look again later
                raise
            try:
                record, slot = self._read(fd)
                if record != seen:
                    return None
                new = takeover(record, self.holder)
                # Above every epoch that ever wrote here, even when the lease file was
                # removed and its history restarted: an epoch is never reused.
                floor = highest_epoch(self.directory)
                if new.epoch <= floor:
                    new = LeaseRecord(floor + 1, self.holder)
                self._write(fd, new, slot)
                self._epoch = new.epoch
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        if record is not None and record.holder is not None:
            with contextlib.suppress(OSError):
                (self.directory / ALIVE_DIR / _alive_name(record.holder)).unlink()
        return new.epoch

    def renew(self) -> bool:
        """Bump the counter; False when the lease now belongs to another epoch or holder.

        Not fsynced: a renewal only shows slaves that the master lives, and a lost one
        costs nothing after a crash. So the lock is held for microseconds, and a master
        paused in a renewal almost never holds up a takeover."""
        with self._mutex:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                record, slot = self._read(fd)
                new = renewal(record, self.holder, self._epoch)
                if new is None:
                    return False
                self._write(fd, new, slot, sync=False)
                return True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def release(self) -> bool:
        """Hand the lease back (graceful shutdown); False if it was not ours any more."""
        with self._mutex:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                record, slot = self._read(fd)
                new = release(record, self.holder, self._epoch)
                if new is not None:
                    self._write(fd, new, slot)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return new is not None

    def follow(self, epoch: int) -> None:
        """Fence writes under ``epoch``, a lease that another process took under this
        holder id (a node's supervisor, for its shards' stores). Such a handle is only a
        fence: it never acquires, renews nor releases."""
        self._epoch = epoch

    # ------------------------------------------------------------ fence (writer thread)
    def _check_epoch(self, when: str) -> None:
        if self._fence_fd is not None and _removed(self._fence_fd):
            # Someone removed or replaced the lease file: read the one that is there now.
            os.close(self._fence_fd)
            self._fence_fd = None
        if self._fence_fd is None:
            try:
                self._fence_fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise FencedError(f"store write {when}: the lease file is gone") from None
        record = self._read_unlocked(self._fence_fd)
        # The holder too: should the lease file ever be deleted, a new history would
        # start again at epoch 1, but never under this process's holder id.
        if self._epoch == 0 or record is None or record.epoch != self._epoch \
                or record.holder != self.holder:
            raise FencedError(
                f"store write {when}: this broker wrote under lease epoch {self._epoch}, "
                f"the lease is now at epoch {record.epoch if record else 0} "
                f"({record.holder if record else None}); another broker is master")

    def begin_write(self) -> None:
        """Before a group is written: refuse to touch the store for an old epoch."""
        self._check_epoch("refused")

    def end_write(self) -> None:
        """The group is durable: it may be confirmed only if the lease is still ours."""
        self._check_epoch("not confirmed")

    # ------------------------------------------------------------ close
    def close(self) -> None:
        with self._mutex:
            for name in ("_fd", "_fence_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    os.close(fd)
                    setattr(self, name, None)
            if self._alive_fd is not None:
                with contextlib.suppress(OSError):
                    (self.directory / ALIVE_DIR / _alive_name(self.holder)).unlink()
                os.close(self._alive_fd)
                self._alive_fd = None
