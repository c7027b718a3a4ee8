"""A shared store's journal per lease epoch: what a paused old master writes after a
takeover never reaches the new master's files, and the layout moves back and forth between
HA and a broker alone. Real files, real flocks; two stores in one process stand for two
brokers (see tests/unit/ha/test_file_lease.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from meshmq.errors import StoreError
from meshmq.ha.file_lease import FileLease
from meshmq.store.base import AddMessage, RemoveRef
from meshmq.store.journal import JournalStore
from tests.store.helpers import msg

Q = "queue://q"


class PausedAfterItsCheck:
    """The fence of a master that was paused after checking the lease for a write and
    before making it: that check passed before the takeover, the one after is real."""

    def __init__(self, lease: FileLease) -> None:
        self.lease = lease

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def begin_write(self) -> None:
        pass

    def end_write(self) -> None:
        self.lease.end_write()


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.name.startswith("seg")}


def ids(store: JournalStore) -> list[str]:
    return [e.message.message_id for e in store.load(Q, 0, 100)]


def test_late_writes_of_a_paused_master_never_reach_the_new_masters_journal(
        tmp_path: Path) -> None:
    base = tmp_path / "store"
    a, b, c = (FileLease(base, name) for name in "abc")
    assert a.try_acquire(None) == 1

    async def run() -> None:
        old = JournalStore(base, segment_size=4096, fence=PausedAfterItsCheck(a))
        old.open()
        old.write([AddMessage(msg(1), ((Q, 1),))])
        await old.sync()

        assert b.try_acquire(b.look().record) == 2
        new = JournalStore(base, segment_size=4096, fence=b)
        assert new.open().keys[Q].count == 1
        new.write([AddMessage(msg(2), ((Q, 2),))])
        await new.sync()
        assert not (base / "epoch-1").exists(), "the old epoch's directory is removed"
        before = files(base / "epoch-2")

        # The old master wakes up: it appends to the segment it had open, then fills it
        # and creates the next one, and acks message 1. None of it is confirmed.
        old.write([AddMessage(msg(2, body=b"x" * 3000), ((Q, 2),))])
        old.write([AddMessage(msg(3, body=b"y" * 3000), ((Q, 3),)), RemoveRef(Q, 1)])
        with pytest.raises(StoreError):
            await old.sync()
        with pytest.raises(StoreError):
            await old.close()
        assert files(base / "epoch-2") == before
        assert ids(new) == ["ID:test-1", "ID:test-2"]
        await new.close()

        assert c.try_acquire(c.look().record) == 3
        third = JournalStore(base, segment_size=4096, fence=c)
        third.open()
        assert ids(third) == ["ID:test-1", "ID:test-2"]
        assert [e.message.body for e in third.load(Q, 0, 10)] == [b"body 1", b"body 2"]
        await third.close()

    asyncio.run(run())
    for lease in (a, b, c):
        lease.close()


def test_a_write_confirmed_before_the_takeover_is_in_the_new_masters_journal(
        tmp_path: Path) -> None:
    """The old master's check after its fsync passed, then it was paused before it told
    the client: the new master, whose snapshot started after the takeover, has it."""
    base = tmp_path / "store"
    a, b = FileLease(base, "a"), FileLease(base, "b")
    a.try_acquire(None)

    async def run() -> None:
        old = JournalStore(base, segment_size=4096, fence=a)
        old.open()
        for n in range(1, 40):  # several segments: sealed ones are linked, the newest copied
            old.write([AddMessage(msg(n, body=b"z" * 500), ((Q, n),))])
        await old.sync()
        assert b.try_acquire(b.look().record) == 2
        new = JournalStore(base, segment_size=4096, fence=b)
        new.open()
        assert ids(new) == [f"ID:test-{n}" for n in range(1, 40)]
        segments = sorted((base / "epoch-2").iterdir())
        assert len(segments) > 3
        await new.close()
        await old.close()  # it had nothing left to write

    asyncio.run(run())
    a.close()
    b.close()


def test_a_store_moves_between_ha_and_a_broker_alone_with_its_messages(
        tmp_path: Path) -> None:
    base = tmp_path / "store"

    async def run() -> None:
        alone = JournalStore(base)
        alone.open()
        alone.write([AddMessage(msg(1), ((Q, 1),))])
        await alone.sync()
        await alone.close()

        a = FileLease(base, "a")
        assert a.try_acquire(a.look().record) == 1
        ha = JournalStore(base, fence=a)
        ha.open()  # adopts the segments of the broker alone
        assert ids(ha) == ["ID:test-1"]
        assert not [p for p in base.iterdir() if p.name.startswith("seg")]
        ha.write([AddMessage(msg(2), ((Q, 2),))])
        await ha.sync()
        await ha.close()
        a.release()
        a.close()

        again = JournalStore(base)
        again.open()  # back to the layout of a broker alone
        assert ids(again) == ["ID:test-1", "ID:test-2"]
        assert not [p for p in base.iterdir() if p.name.startswith("epoch-")]
        await again.close()

    asyncio.run(run())
