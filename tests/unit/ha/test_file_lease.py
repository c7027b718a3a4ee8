"""The shared-store lease file and the journal's fence, with real files and real flocks.

Two ``FileLease`` objects in one process behave like two brokers: ``flock`` locks
belong to open file descriptions, so they exclude each other as processes would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.store.helpers import msg

from meshmq.errors import StoreError
from meshmq.ha.file_lease import ALIVE_DIR, LEASE_FILE, FileLease
from meshmq.ha.lease import LeaseRecord
from meshmq.store.base import AddMessage
from meshmq.store.fence import FencedError
from meshmq.store.journal import JournalStore


def test_first_broker_takes_a_fresh_lease(tmp_path: Path) -> None:
    a = FileLease(tmp_path, "a")
    view = a.look()
    assert view.record is None
    assert a.try_acquire(None) == 1
    assert a.epoch == 1
    assert a.look().record == LeaseRecord(1, "a", 0)
    assert a.renew() and a.renew()
    assert a.look().record == LeaseRecord(1, "a", 2)
    a.close()


def test_takeover_needs_the_record_unchanged_since_it_was_judged(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    seen = b.look().record
    assert b.look().holder_alive is True  # a's process (this one) holds its alive lock
    assert a.renew()  # a renews after b looked: b's decision is stale
    assert b.try_acquire(seen) is None
    assert b.epoch == 0
    a.close()
    b.close()


def test_deposed_holder_can_neither_renew_nor_write(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    a.begin_write()
    a.end_write()
    seen = b.look().record
    assert b.try_acquire(seen) == 2  # e.g. a's lease expired while it was paused
    assert not a.renew()
    with pytest.raises(FencedError, match=r"epoch 1.*epoch 2"):
        a.begin_write()
    assert not a.release()  # nothing to hand over: it is b's now
    assert b.look().record == LeaseRecord(2, "b", 0)
    b.begin_write()
    b.end_write()
    a.close()
    b.close()


def test_a_takeover_never_waits_for_the_old_masters_writer(tmp_path: Path) -> None:
    """The writer holds no lock across a write: a master paused between its check and
    its fsync cannot hold a takeover up, and what it wrote is then not confirmed."""
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    seen = b.look().record
    a.begin_write()  # the journal writer is between its check and its fsync
    assert b.try_acquire(seen) == 2
    with pytest.raises(FencedError, match="not confirmed"):
        a.end_write()
    with pytest.raises(FencedError, match="refused"):
        a.begin_write()
    a.close()
    b.close()


def test_a_takeover_starts_above_every_epoch_that_wrote_the_store(tmp_path: Path) -> None:
    """A lease file removed (a damaged one, say) restarts the record, never the epochs
    the store's directories were written under."""
    (tmp_path / "epoch-7").mkdir(parents=True)
    (tmp_path / "epoch-9.tmp").mkdir()
    a = FileLease(tmp_path, "a")
    assert a.try_acquire(None) == 10
    a.close()


def test_release_lets_the_next_broker_in_at_once(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    assert a.release()
    view = b.look()
    assert view.record == LeaseRecord(1, None, 1)
    assert b.try_acquire(view.record) == 2
    a.close()
    b.close()


def test_a_dead_holder_is_detected_through_its_alive_lock(tmp_path: Path) -> None:
    # A real process takes the lease and is killed: its flock goes with it.
    code = (f"import os,sys; from meshmq.ha.file_lease import FileLease; "
            f"from pathlib import Path; l = FileLease(Path({str(tmp_path)!r}), 'gone'); "
            f"assert l.try_acquire(None) == 1; print('held', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"held\n"
            b = FileLease(tmp_path, "b")
            assert b.look().holder_alive is True
        finally:
            proc.kill()
            proc.wait(10)
    view = b.look()
    assert view.record == LeaseRecord(1, "gone", 0)
    assert view.holder_alive is False
    assert b.try_acquire(view.record) == 2
    assert len(os.listdir(tmp_path / ALIVE_DIR)) == 1  # the dead holder's file is gone
    b.close()
    assert os.listdir(tmp_path / ALIVE_DIR) == []


def test_holder_ids_must_be_unique_among_live_brokers(tmp_path: Path) -> None:
    a, a2 = FileLease(tmp_path, "same"), FileLease(tmp_path, "same")
    a.try_acquire(None)
    with pytest.raises(StoreError, match="unique"):
        a2.try_acquire(a2.look().record)
    a.close()
    a2.close()


def test_a_damaged_lease_file_stops_the_broker_instead_of_reusing_an_epoch(
        tmp_path: Path) -> None:
    (tmp_path / LEASE_FILE).write_bytes(b"\xff" * 256)
    with pytest.raises(StoreError, match="damaged"):
        FileLease(tmp_path, "a").look()


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_journal_writes_stop_at_the_fence(tmp_path: Path) -> None:
    """A deposed master's journal refuses the next group commit and leaves the files
    exactly as they were; the new master recovers only what was confirmed."""
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)

    async def run() -> None:
        store = JournalStore(tmp_path / "j", fence=a)
        store.open()
        store.write([AddMessage(msg(1), (("queue://q", 1),))])
        await store.sync()
        assert b.try_acquire(b.look().record) == 2
        before = files(tmp_path / "j")
        store.write([AddMessage(msg(2), (("queue://q", 2),))])
        with pytest.raises(StoreError, match="epoch 1"):
            await store.sync()
        with pytest.raises(StoreError, match="refuses writes"):
            store.write([AddMessage(msg(3), (("queue://q", 3),))])
        assert files(tmp_path / "j") == before
        with pytest.raises(StoreError):
            await store.close()
        # The new master opens the same directory while the old one is still "alive":
        # no directory lock is involved any more, the lease decides.
        newer = JournalStore(tmp_path / "j", fence=b)
        recovery = newer.open()
        assert recovery.keys["queue://q"].count == 1
        assert [e.message.message_id for e in newer.load("queue://q", 0, 10)] == \
            ["ID:test-1"]
        newer.write([AddMessage(msg(4), (("queue://q", 4),))])
        await newer.sync()
        await newer.close()

    asyncio.run(run())
    a.close()
    b.close()


def test_a_broker_without_ha_cannot_share_an_ha_directory(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)

    async def run() -> None:
        ha_master = JournalStore(tmp_path / "j", fence=a)
        ha_master.open()
        with pytest.raises(StoreError, match="locked by another broker"):
            JournalStore(tmp_path / "j").open()
        # A new master next to a paused old one: the lease orders them, not the lock.
        b.try_acquire(b.look().record)
        newer = JournalStore(tmp_path / "j", fence=b)
        newer.open()
        await newer.close()
        await ha_master.close()  # it had nothing left to write
        alone = JournalStore(tmp_path / "j")
        alone.open()
        with pytest.raises(StoreError, match="running without HA"):
            JournalStore(tmp_path / "j", fence=b).open()
        await alone.close()

    asyncio.run(run())
    a.close()
    b.close()


def test_a_deleted_lease_file_never_lets_the_old_master_write(tmp_path: Path) -> None:
    """Deleting the lease restarts epochs at 1, but under another holder id."""
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    assert a.try_acquire(None) == 1
    a.begin_write()  # the writer's descriptor is open on the file about to be deleted
    a.end_write()
    (tmp_path / LEASE_FILE).unlink()
    assert b.try_acquire(None) == 1
    with pytest.raises(FencedError):
        a.begin_write()
    assert not a.renew()
    b.begin_write()
    b.end_write()
    a.close()
    b.close()
