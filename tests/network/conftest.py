from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.conftest import client
from tests.support.shard_pair import ShardPair

__all__ = ["client", "pair"]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ShardPair]:
    """Two linked in-process shards of one node (tests/support/shard_pair.py)."""
    shards = ShardPair(tmp_path).start()
    shards.wait_linked()
    yield shards
    shards.stop()
