"""The scaling benchmark reports how its queues fall on the shards (bench/scaling.py,
``placement``): the counts must be the owners that the broker computes, so that a
reader can tell a run bound by one busy owner from one bound by the shards' work."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from meshmq.core.destinations import queue
from meshmq.core.shards import NUMBERED_NAME, owner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from loadgen import LoadSpec, dest_name
from scaling import placement


def test_the_counts_are_the_owners_of_the_queues_the_generator_uses() -> None:
    spec = LoadSpec(name="r123x456", destinations=64)
    owners = Counter(owner(queue(dest_name(spec, d).removeprefix("/queue/")), 16)
                     for d in range(64))
    got = placement(spec.name, 64, 16)
    assert got["queues_per_shard"] == [owners[i] for i in range(16)]
    assert got["busiest_owns"] == max(owners.values())
    assert got["busiest_x_mean"] == round(max(owners.values()) / 4, 2)


def test_one_shard_owns_every_queue() -> None:
    assert placement("any", 64, 1) == {"queues_per_shard": [64], "busiest_owns": 64,
                                       "busiest_x_mean": 1.0}


def test_under_numbered_placement_the_generator_s_queues_fall_evenly() -> None:
    """The generator's queues are a numbered family: the node's numbered placement
    gives each of 16 shards four of 64, as the benchmark reports."""
    spec = LoadSpec(name="r123x456", destinations=64)
    owners = Counter(owner(queue(dest_name(spec, d).removeprefix("/queue/")), 16,
                           placement=NUMBERED_NAME) for d in range(64))
    assert sorted(owners.values()) == [4] * 16
    got = placement(spec.name, 64, 16, "numbered")
    assert got["queues_per_shard"] == [owners[i] for i in range(16)]
    assert got["busiest_x_mean"] == 1.0
