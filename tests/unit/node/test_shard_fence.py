"""A shard's store fence when its node is the master of a shared pair: the node's lease
file, checked with the supervisor's holder id and epoch; one journal directory per start
of a shard, above every start of an earlier lease epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.ha.file_lease import FileLease
from meshmq.node.fence import STARTS_PER_EPOCH, ShardFence, ShardLease
from meshmq.store.fence import FencedError


def test_a_shard_writes_while_its_node_holds_the_lease_and_never_after(
        tmp_path: Path) -> None:
    node = FileLease(tmp_path, "node-a")
    epoch = node.try_acquire(node.look().record)
    assert epoch == 1
    fence = ShardFence(ShardLease(str(tmp_path), "node-a", epoch, start=3))
    fence.begin_write()
    fence.end_write()
    assert node.renew()
    fence.begin_write()  # renewals keep the epoch

    other = FileLease(tmp_path, "node-b")
    assert other.try_acquire(other.look().record) == 2  # a takeover
    with pytest.raises(FencedError):
        fence.begin_write()
    with pytest.raises(FencedError):
        fence.end_write()
    for lease in (other, node):
        lease.close()
    fence.close()


def test_another_holder_at_the_same_epoch_is_fenced(tmp_path: Path) -> None:
    node = FileLease(tmp_path, "node-a")
    assert node.try_acquire(node.look().record) == 1
    with pytest.raises(FencedError):
        ShardFence(ShardLease(str(tmp_path), "node-b", 1, start=0)).begin_write()
    node.close()


@given(st.integers(1, 10**6), st.integers(0, STARTS_PER_EPOCH - 2),
       st.integers(0, STARTS_PER_EPOCH - 1))
def test_store_epochs_grow_with_every_start_and_every_takeover(
        epoch: int, start: int, later: int) -> None:
    lease = ShardLease("d", "h", epoch, start)
    assert lease.store_epoch < ShardLease("d", "h", epoch, start + 1).store_epoch
    assert lease.store_epoch < ShardLease("d", "h", epoch + 1, later).store_epoch


def test_starts_beyond_the_range_are_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        _ = ShardLease("d", "h", 1, STARTS_PER_EPOCH).store_epoch
