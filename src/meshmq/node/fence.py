"""The write fence of a shard's store when its node is one of a ``shared`` or
``database`` master/slave pair (docs/ha.md, "A node of shards as master or slave").

``database``: the supervisor holds the node's lease row (ha/pg_lease.py) in
``<prefix>lease``; each shard's PostgreSQL store reads that row ``FOR SHARE`` in every
write transaction and rolls back unless it still names the supervisor's epoch and
holder id (store/postgres.py), exactly as one broker's store does with its own lease.
:class:`DatabaseShardFence` only tells the store those three things.

``shared``: the supervisor holds the node's lease file (ha/file_lease.py); each shard's
journal checks that lease file before and after every write group, as one broker's
journal does, with the supervisor's holder id and epoch: once another node took the
lease over, a shard of this node (paused, or outliving its supervisor for a moment)
never confirms a write again.

A shard that dies is restarted under the same lease epoch, but a journal opens each
epoch's directory once (store/journal/epochs.py refuses an existing one: it was made by
another master). So the directory a shard's journal writes in is named by a *store
epoch* that grows with every start of that shard: ``lease epoch * STARTS_PER_EPOCH +
start``. It keeps the journal's rules: every start of a shard gets a fresh directory,
snapshot of the one before (its dead predecessor's), and a later lease epoch is above
every start of an earlier one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshmq.ha.file_lease import FileLease

__all__ = ["STARTS_PER_EPOCH", "DatabaseShardFence", "ShardFence", "ShardLease",
           "shard_fence"]

# Starts of one shard under one lease epoch (at the 5 s restart backoff, two months of
# a shard failing); the supervisor stops restarting a shard that reaches it.
STARTS_PER_EPOCH = 1_000_000


@dataclass(frozen=True, slots=True)
class ShardLease:
    """What a shard is told of its node's lease: where the lease file is, who holds it,
    at which epoch, and how many times this shard started before under that epoch."""

    directory: str
    holder: str
    epoch: int
    start: int
    # ``database`` mode: the table prefix of the node's lease row (``directory`` unused).
    table_prefix: str | None = None

    @property
    def store_epoch(self) -> int:
        if not 0 <= self.start < STARTS_PER_EPOCH:
            raise ValueError(f"shard start {self.start} out of range")
        return self.epoch * STARTS_PER_EPOCH + self.start


class ShardFence:
    """A shard journal's ``WriteFence``: the node's lease, read only."""

    def __init__(self, lease: ShardLease) -> None:
        self.lease = lease
        self._file = FileLease(Path(lease.directory), lease.holder)
        self._file.follow(lease.epoch)

    @property
    def epoch(self) -> int:
        """The journal's directory epoch (see the module's docstring)."""
        return self.lease.store_epoch

    def begin_write(self) -> None:
        self._file.begin_write()

    def end_write(self) -> None:
        self._file.end_write()

    def close(self) -> None:
        self._file.close()


class DatabaseShardFence:
    """A shard's PostgreSQL store's ``WriteFence``: the node's lease row is checked inside
    each write transaction by the store itself (epoch, ``holder``, in the table named by
    ``lease_prefix``), so nothing happens around the writes here."""

    def __init__(self, lease: ShardLease) -> None:
        assert lease.table_prefix is not None
        self.lease = lease
        self.holder = lease.holder
        self.lease_prefix = lease.table_prefix
        # Called (from the store's writer thread) once a write transaction was refused:
        # the shard stops then, not at its next write (node/shard.py).
        self.on_refused: Callable[[str], None] | None = None

    def refused(self, why: str) -> None:
        if self.on_refused is not None:
            self.on_refused(why)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def begin_write(self) -> None:
        pass

    def end_write(self) -> None:
        pass

    def close(self) -> None:
        pass


def shard_fence(lease: ShardLease) -> ShardFence | DatabaseShardFence:
    """The fence of a shard whose node holds ``lease``."""
    if lease.table_prefix is not None:
        return DatabaseShardFence(lease)
    return ShardFence(lease)
