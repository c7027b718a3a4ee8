"""``meshmq shards rebalance`` at the store level (node/rebalance.py on real journal
stores, no broker): what a moved key holds arrives whole on its new owner (seqs,
priorities, expirations, redelivery counts, dispatch marks, the durable record), a
wildcard durable subscription kept on every shard is split by message destination, and
a run stopped after any number of keys (the crash hook) is finished by the next run
with the same result as an uninterrupted one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.shards import HASH_NAME, owner
from meshmq.node.layout import NodeLayout, write_shards_file
from meshmq.node.rebalance import KILL_AFTER_ENV, rebalance
from meshmq.store.base import (
    AddMessage,
    DurableSubscription,
    MarkDispatched,
    PutDurableSubscription,
    SetDeliveryCount,
)
from meshmq.store.journal import JournalStore

NODE = "node"
Snapshot = dict[str, dict[str, object]]


def _store(data: Path, shard: int | None) -> JournalStore:
    path = data / "journal" if shard is None else data / f"shard-{shard}" / "journal"
    return JournalStore(path, fsync=False)


def _owner(uri: str, count: int) -> int:
    return owner(Destination.parse_uri(uri), count, node=NODE)


def _fill(data: Path, count: int) -> None:
    """A node of ``count`` shards: 10 queues with varied messages, one wildcard
    durable subscription kept on every shard."""
    write_shards_file(data, NodeLayout(count, HASH_NAME, NODE))
    stores = {k: _store(data, k) for k in range(count)}
    for s in stores.values():
        s.open()
    wild = DurableSubscription("durable://c:all", "c", "all", "topic://t.>")
    for s in stores.values():
        s.write([PutDurableSubscription(wild)])
    for q in range(10):
        uri = f"queue://q{q}"
        store = stores[_owner(uri, count)]
        for i in range(1, 6):
            msg = Message(f"m-{q}-{i}", Destination.parse_uri(uri), f"{q}/{i}".encode(),
                          persistent=True, priority=i % 10, expiration=4_000_000_000_000 + i,
                          properties={"n": i})
            store.write([AddMessage(msg, ((uri, i),))])
            if i % 2:
                store.write([SetDeliveryCount(uri, i, i)])
        store.write([MarkDispatched(uri, 3)])
    for t in range(8):
        uri = f"topic://t.{t}"
        store = stores[_owner(uri, count)]
        msg = Message(f"n-{t}", Destination.parse_uri(uri), b"news", persistent=True)
        store.write([AddMessage(msg, (("durable://c:all", t + 1),))])

    async def close() -> None:
        for s in stores.values():
            await s.close()

    asyncio.run(close())


def _snapshot(data: Path, count: int) -> Snapshot:
    """Every key of every store the node of ``count`` shards uses: where it is and what
    it holds."""
    out: Snapshot = {}
    locations: list[int | None] = [None] if count == 1 else list(range(count))
    for loc in locations:
        store = _store(data, loc)
        recovery = store.open()
        subs = {d.key: d for d in recovery.durable_subscriptions}
        for key, info in recovery.keys.items():
            entries = [(e.message.message_id, e.message.priority, e.message.expiration,
                        e.message.properties, e.delivery_count, e.message.body)
                       for e in store.load(key, 0, 1000)]
            if key == "durable://c:all":
                out[f"{key}@{loc}"] = {"entries": entries, "sub": subs.get(key)}
                continue
            assert key not in out, f"{key} twice"
            out[key] = {"at": loc, "seqs": [e.seq for e in store.load(key, 0, 1000)],
                        "entries": entries, "dispatched": info.dispatched}
        for key, sub in subs.items():
            out.setdefault(f"{key}@{loc}", {"entries": [], "sub": sub})
        asyncio.run(store.close())
    return out


def _queues(snap: Snapshot) -> dict[str, dict[str, object]]:
    return {k: {f: v for f, v in val.items() if f != "at"} for k, val in snap.items()
            if k.startswith("queue://")}


def _news(snap: Snapshot) -> list[str]:
    return sorted(str(e[0]) for k, v in snap.items() if k.startswith("durable://")
                  for e in v["entries"])  # type: ignore[union-attr]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2), (2, 1), (4, 7)])
def test_moved_keys_arrive_whole_on_their_new_owner(tmp_path: Path, old: int,
                                                     new: int) -> None:
    _fill(tmp_path, old)
    before = _snapshot(tmp_path, old)
    report = rebalance(tmp_path, new)
    after = _snapshot(tmp_path, new)
    assert _queues(after) == _queues(before)
    for key, val in after.items():
        if key.startswith("queue://"):
            assert val["at"] == (None if new == 1 else _owner(key, new))
    assert _news(after) == _news(before)
    for key, val in after.items():  # each wildcard copy holds only what its shard owns
        if key.startswith("durable://"):
            assert val["sub"] is not None
            for entry in val["entries"]:  # type: ignore[attr-defined]
                topic = f"topic://t.{str(entry[0])[2:]}"
                assert key.endswith("@None") or key.endswith(f"@{_owner(topic, new)}")
    assert sum(m for _, m in report.moved.values()) > 0
    if new == 1:
        assert not (tmp_path / "shards.json").exists()
    else:
        assert json.loads((tmp_path / "shards.json").read_text())["shards"] == new


def test_one_process_to_shards_and_back(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    rebalance(tmp_path, 1)
    one = _snapshot(tmp_path, 1)
    rebalance(tmp_path, 3)
    rebalance(tmp_path, 1)
    again = _snapshot(tmp_path, 1)
    assert _queues(again) == _queues(one)
    assert _news(again) == _news(one)


@pytest.mark.parametrize("stop_after", [1, 4, 6])
def test_a_run_killed_after_some_keys_is_finished_by_the_next(tmp_path: Path,
                                                              stop_after: int) -> None:
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    for d in (clean, crashed):
        d.mkdir()
        _fill(d, 2)
    rebalance(clean, 3)
    killed = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--data",
         str(crashed), "--to", "3"], check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, KILL_AFTER_ENV: str(stop_after)})
    assert killed.returncode == -9
    assert (crashed / "rebalance.json").exists()
    wrong = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--data",
         str(crashed), "--to", "4"], check=False, capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines() == [
        "meshmq: a rebalance to 3 shard(s) was interrupted: run 'meshmq shards "
        "rebalance --to 3' to finish it first"]
    report = rebalance(crashed, 3)
    assert report.resumed
    assert _snapshot(crashed, 3) == _snapshot(clean, 3)


def test_the_same_count_writes_nothing(tmp_path: Path) -> None:
    _fill(tmp_path, 2)
    before = _snapshot(tmp_path, 2)
    report = rebalance(tmp_path, 2)
    assert report.lines() == ["the stores are already laid out for 2 shard(s): nothing "
                              "to move"]
    assert not (tmp_path / "rebalance.json").exists()
    assert _snapshot(tmp_path, 2) == before


def test_config_names_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _fill(data, 2)
    config = tmp_path / "node.toml"
    config.write_text(f'[broker]\nname = "{NODE}"\ndata_directory = "{data}"\nshards = 2\n')
    done = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--config",
         str(config), "--to", "3"], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("rebalance 2 -> 3 shard(s) done: ")
    assert " s" in done.stdout.splitlines()[-1]
    assert json.loads((data / "shards.json").read_text()) == {
        "shards": 3, "hash": HASH_NAME, "node": NODE}
    missing = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--to", "3"],
        check=False, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1
