from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, StoreConfig
from meshmq.errors import ConfigError
from meshmq.store.factory import create_store
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore


def test_memory_when_not_persistent_or_asked(tmp_path: Path) -> None:
    assert isinstance(create_store(BrokerConfig(data_directory=tmp_path, persistent=False)),
                      MemoryStore)
    cfg = BrokerConfig(data_directory=tmp_path, store=StoreConfig(kind="memory"))
    assert isinstance(create_store(cfg), MemoryStore)


def test_journal_uses_store_directory_and_options(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_directory=tmp_path,
                       store=StoreConfig(segment_size=1 << 20, fsync=False))
    store = create_store(cfg)
    assert isinstance(store, JournalStore)
    assert store.directory == tmp_path / "journal"
    custom = create_store(replace(cfg, store=StoreConfig(directory=tmp_path / "elsewhere")))
    assert isinstance(custom, JournalStore)
    assert custom.directory == tmp_path / "elsewhere"
    assert not (tmp_path / "journal").exists()  # nothing touched before open()


def test_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        create_store(BrokerConfig(data_directory=tmp_path, store=StoreConfig(kind="nope")))
