"""A node on the PostgreSQL store, without a database: each shard's table prefix, the
fence a shard of a ``database`` master node is given, and how its store reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, HaConfig, StoreConfig
from meshmq.node.fence import DatabaseShardFence, ShardFence, ShardLease, shard_fence
from meshmq.node.supervisor import shard_config
from meshmq.store.fence import FencedError
from meshmq.store.postgres import PostgresStore, shard_prefix


def test_each_shard_has_its_own_tables_under_the_configured_prefix(tmp_path: Path) -> None:
    config = BrokerConfig(
        data_directory=tmp_path, shards=3,
        store=StoreConfig(kind="postgres", dsn="dbname=x", table_prefix="Orders_"),
        ha=HaConfig(mode="database"))
    prefixes = [shard_config(config, k).store.table_prefix for k in range(3)]
    assert prefixes == ["orders_s0_", "orders_s1_", "orders_s2_"]
    assert shard_prefix("meshmq_", 12) == "meshmq_s12_"
    # The supervisor holds the lease; a shard runs without HA of its own.
    assert {shard_config(config, k).ha.mode for k in range(3)} == {"none"}
    # A journal node's shards keep the configured prefix (it names no tables there).
    journal = dataclasses.replace(config, store=StoreConfig(table_prefix="orders_"))
    assert shard_config(journal, 1).store.table_prefix == "orders_"


def test_a_database_shard_fence_names_the_node_s_lease_and_hears_of_a_refusal() -> None:
    lease = ShardLease("", "a@host:1:abc", 7, start=2, table_prefix="meshmq_")
    fence = shard_fence(lease)
    assert isinstance(fence, DatabaseShardFence)
    # The lease epoch itself: the database has no per-start directories.
    assert (fence.epoch, fence.holder, fence.lease_prefix) == (7, "a@host:1:abc", "meshmq_")
    fence.begin_write()
    fence.end_write()
    heard: list[str] = []
    fence.refused("epoch 8")  # nobody listening: nothing happens
    fence.on_refused = heard.append
    fence.refused("epoch 8")
    assert heard == ["epoch 8"]


def test_a_shared_lease_gives_the_journal_s_file_fence(tmp_path: Path) -> None:
    from meshmq.ha.file_lease import FileLease

    node = FileLease(tmp_path, "n")
    epoch = node.try_acquire(node.look().record)
    assert epoch is not None
    fence = shard_fence(ShardLease(str(tmp_path), "n", epoch, start=0))
    assert isinstance(fence, ShardFence)
    fence.close()
    node.close()


class _Cursor:
    """Answers the store's fence query with one lease row, and records the query."""

    def __init__(self, row: tuple[int, str] | None) -> None:
        self.row = row
        self.sql: list[str] = []

    def execute(self, sql: str) -> None:
        self.sql.append(sql)

    def fetchone(self) -> tuple[int, str] | None:
        return self.row


def test_a_shard_s_store_checks_the_node_s_lease_row_not_one_of_its_own() -> None:
    fence = DatabaseShardFence(ShardLease("", "a", 3, start=0, table_prefix="meshmq_"))
    store = PostgresStore("dbname=x", table_prefix=shard_prefix("meshmq_", 1), fence=fence)
    ok = _Cursor((3, "a"))
    store._check_fence(ok)  # type: ignore[arg-type]
    assert ok.sql == ["SELECT epoch, holder FROM meshmq_lease WHERE id = 1 FOR SHARE"]
    for row in ((4, "b"), (3, "b"), None):
        with pytest.raises(FencedError, match="store write refused"):
            store._check_fence(_Cursor(row))  # type: ignore[arg-type]
    # One broker's store (its fence, the lease backend, names no prefix): its own table.
    assert PostgresStore("dbname=x", table_prefix="solo_")._lease_table == "solo_lease"
