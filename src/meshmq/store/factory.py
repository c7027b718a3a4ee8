"""Build the configured store."""

from __future__ import annotations

from meshmq.config.model import BrokerConfig
from meshmq.errors import ConfigError
from meshmq.store.base import Store
from meshmq.store.fence import WriteFence
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore


def create_store(config: BrokerConfig, fence: WriteFence | None = None) -> Store:
    """Memory when the broker is not persistent or ``store.kind == "memory"``, otherwise
    the journal in ``config.store_directory`` or PostgreSQL. The store is returned
    unopened. ``fence``: the HA lease every write must pass (docs/ha.md)."""
    store = config.store
    if not config.persistent or store.kind == "memory":
        return MemoryStore()
    if store.kind == "journal":
        return JournalStore(config.store_directory, segment_size=store.segment_size,
                            fsync=store.fsync, max_batch_bytes=store.max_batch_bytes,
                            compact_live_ratio=store.compact_live_ratio, fence=fence,
                            accept_data_loss=store.accept_data_loss,
                            max_disk_bytes=store.max_disk_bytes,
                            min_free_disk=store.min_free_disk, disk_reserve=store.disk_reserve)
    if store.kind == "postgres":
        from meshmq.store.postgres import PostgresStore

        if not store.dsn:
            raise ConfigError("store kind 'postgres' needs store.dsn", option="store.dsn")
        return PostgresStore(store.dsn, table_prefix=store.table_prefix, fence=fence)
    raise ConfigError(f"unknown store kind {store.kind!r}", option="store.kind")
