"""The lease file's two slots (what a torn or foreign write reads as) and one broker's
handle on the file: what it refuses to do with a lease that is not, or no longer, its."""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.errors import StoreError
from meshmq.ha.file_lease import (
    ALIVE_DIR,
    LEASE_FILE,
    MAGIC,
    SLOT_SIZE,
    VERSION,
    FileLease,
    decode_slot,
    encode_slot,
    newest,
)
from meshmq.ha.lease import LeaseRecord
from meshmq.store.fence import FencedError

_HEAD = struct.Struct("<4sBBHQQ")


def slot(magic: bytes = MAGIC, version: int = VERSION, holder: bytes = b"a",
         hlen: int | None = None, epoch: int = 3, counter: int = 1) -> bytes:
    """A slot with a valid crc over whatever fields it is given."""
    body = _HEAD.pack(magic, version, len(holder) if hlen is None else hlen, 0, epoch,
                      counter) + holder
    body = body.ljust(SLOT_SIZE - 4, b"\0")
    return body + struct.pack("<I", zlib.crc32(body))


def test_a_well_formed_slot_is_read() -> None:
    assert decode_slot(slot()) == LeaseRecord(3, "a", 1)


@pytest.mark.parametrize("data", [
    slot(magic=b"XXXX"),  # another file
    slot(version=VERSION + 1),  # written by a newer meshmq
    slot(holder=b"a", hlen=65),  # a holder longer than the format allows
    slot(holder=b"\xff\xfe"),  # a holder that is not UTF-8
    slot()[:-1],  # a short read
    slot() + b"\0",
], ids=["magic", "version", "holder-length", "holder-utf8", "short", "long"])
def test_a_slot_with_a_valid_crc_but_bad_contents_is_no_record(data: bytes) -> None:
    assert decode_slot(data) is None


def test_an_empty_holder_reads_as_a_released_lease() -> None:
    assert decode_slot(encode_slot(LeaseRecord(9, None, 4))) == LeaseRecord(9, None, 4)


def test_at_the_same_epoch_the_higher_counter_wins_in_either_slot() -> None:
    older, newer = encode_slot(LeaseRecord(4, "a", 7)), encode_slot(LeaseRecord(4, "a", 8))
    assert newest(older + newer) == (LeaseRecord(4, "a", 8), 1)
    assert newest(newer + older) == (LeaseRecord(4, "a", 8), 0)


def test_a_new_epoch_wins_over_a_higher_counter_of_the_old_one() -> None:
    old, new = encode_slot(LeaseRecord(4, "a", 900)), encode_slot(LeaseRecord(5, "b", 0))
    assert newest(new + old) == (LeaseRecord(5, "b", 0), 0)


def test_a_file_with_only_its_first_slot_written_is_read() -> None:
    assert newest(encode_slot(LeaseRecord(1, "a", 0))) == (LeaseRecord(1, "a", 0), 0)


def test_a_torn_first_record_with_no_older_one_is_damage() -> None:
    """Nothing to fall back on: guessing epoch 0 could reuse an epoch."""
    with pytest.raises(StoreError, match="refusing to guess the epoch"):
        newest(encode_slot(LeaseRecord(1, "a", 0))[:60] + bytes(SLOT_SIZE - 60))


@given(st.lists(st.builds(LeaseRecord, st.integers(0, 2**40), st.none() | st.just("h"),
                          st.integers(0, 2**40)), min_size=2, max_size=2))
def test_the_newest_slot_is_the_highest_epoch_then_counter(pair: list[LeaseRecord]) -> None:
    data = encode_slot(pair[0]) + encode_slot(pair[1])
    record, index = newest(data)
    best = max(pair, key=lambda r: (r.epoch, r.counter))
    assert record is not None and (record.epoch, record.counter) == (best.epoch, best.counter)
    assert pair[index] == record


# ------------------------------------------------------------------ FileLease


@pytest.mark.parametrize("holder", ["", "x" * 65, "é" * 33])
def test_holder_ids_must_be_one_to_64_bytes(tmp_path: Path, holder: str) -> None:
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        FileLease(tmp_path, holder)


def test_a_fresh_directory_has_no_lease_and_the_broker_no_epoch(tmp_path: Path) -> None:
    lease = FileLease(tmp_path / "new", "a")
    assert lease.look().record is None
    assert lease.epoch == 0
    assert (tmp_path / "new" / LEASE_FILE).exists()
    lease.close()


def test_a_broker_that_never_took_the_lease_may_not_write(tmp_path: Path) -> None:
    a = FileLease(tmp_path, "a")
    a.try_acquire(None)
    b = FileLease(tmp_path, "b")
    with pytest.raises(FencedError, match="epoch 0"):
        b.begin_write()
    a.close()
    b.close()


def test_a_takeover_based_on_a_stale_look_is_refused(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    seen = b.look().record
    assert a.renew()  # the master renewed after b looked
    assert b.try_acquire(seen) is None
    assert a.look().record == LeaseRecord(1, "a", 1)
    a.close()
    b.close()


def test_a_takeover_is_refused_while_another_broker_changes_the_lease(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    seen = b.look().record
    fd = os.open(tmp_path / LEASE_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a renewal in progress
    try:
        assert b.try_acquire(seen) is None
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert b.try_acquire(seen) == 2
    a.close()
    b.close()


def test_renewals_alternate_slots_so_a_torn_write_leaves_the_previous_record(
        tmp_path: Path) -> None:
    a = FileLease(tmp_path, "a")
    a.try_acquire(None)
    assert a.renew()
    data = (tmp_path / LEASE_FILE).read_bytes()
    assert newest(data) == (LeaseRecord(1, "a", 1), 1)
    assert decode_slot(data[:SLOT_SIZE]) == LeaseRecord(1, "a", 0)
    # The next renewal is torn halfway through slot 0: the reader falls back to slot 1.
    torn = encode_slot(LeaseRecord(1, "a", 2))[:64] + data[64:SLOT_SIZE]
    (tmp_path / LEASE_FILE).write_bytes(torn + data[SLOT_SIZE:])
    assert FileLease(tmp_path, "b").look().record == LeaseRecord(1, "a", 1)
    a.close()


def test_a_released_lease_can_be_released_or_renewed_no_more(tmp_path: Path) -> None:
    a = FileLease(tmp_path, "a")
    a.try_acquire(None)
    assert a.release()
    assert not a.release()
    assert not a.renew()
    with pytest.raises(FencedError):
        a.begin_write()
    a.close()


def test_the_master_does_not_judge_its_own_liveness(tmp_path: Path) -> None:
    a = FileLease(tmp_path, "a")
    a.try_acquire(None)
    assert a.look().holder_alive is None
    a.close()


def test_a_live_holder_is_seen_alive_and_a_closed_one_gone(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    assert b.look().holder_alive is True
    a.close()
    assert not any((tmp_path / ALIVE_DIR).iterdir())
    assert b.look().holder_alive is False
    b.close()


def test_a_group_written_before_a_takeover_is_not_confirmed_after_it(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path, "a"), FileLease(tmp_path, "b")
    a.try_acquire(None)
    a.begin_write()
    assert b.try_acquire(b.look().record) == 2
    with pytest.raises(FencedError, match=r"not confirmed.*epoch 2 \(b\)"):
        a.end_write()
    a.close()
    b.close()
