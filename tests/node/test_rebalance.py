"""``meshmq shards rebalance`` end to end: a real node of two shards stores persistent
messages on many queues and for a durable topic subscription, is stopped, and its
stores are rebalanced by the real command (to 3 shards, then to one broker process);
the node started with the new count delivers every message exactly once, in order per
queue. A rebalance killed half-way is finished by the next run; a running node is
refused in one line; a rebalance to numbered placement moves each queue of a numbered
family to its place."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.core.destinations import queue
from meshmq.core.shards import NUMBERED_NAME, owner
from tests.interop.stomp_helpers import Address, RawClient
from tests.support.brokers import ProcessBroker, write_broker_toml
from tests.support.nodes import NodeProcess, stomp_on, write_node_toml

pytestmark = pytest.mark.slow

QUEUES = [f"rb.q{i}" for i in range(12)]
PER_QUEUE = 6
TOPIC = "rb.news"
DURABLE = ("rb-client", "rb-sub")
NEWS = 5
LISTENER = '[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n'


def _send(client: RawClient, dest: str, body: str) -> None:
    client.send_frame("SEND", [("destination", dest), ("persistent", "true"),
                               ("receipt", f"r-{body}")], body.encode())
    client.read_until_receipt(f"r-{body}")


def _durable(port: int) -> RawClient:
    client = RawClient(Address(port))
    client.connect(extra=[("client-id", DURABLE[0])])
    client.send_frame("SUBSCRIBE", [("destination", f"/topic/{TOPIC}"), ("id", "d"),
                                    ("ack", "client-individual"),
                                    ("activemq.subscriptionName", DURABLE[1]),
                                    ("receipt", "sub-d")])
    client.read_until_receipt("sub-d")
    return client


def _node(tmp: Path, data: Path, shards: int, extra: str = "") -> NodeProcess:
    config = write_node_toml(tmp / f"node{shards}.toml", data=data, shards=shards,
                             listeners=LISTENER, extra=extra)
    return NodeProcess(config, tmp / "node.log").start()


def _populate(tmp: Path) -> Path:
    """A stopped node of 2 shards holding PER_QUEUE messages on every queue and NEWS
    for an offline durable subscription."""
    data = tmp / "data"
    node = _node(tmp, data, 2)
    try:
        _durable(node.port).close()  # made, then its client goes away
        producer = stomp_on(node, 0)
        for i in range(PER_QUEUE):
            for q in QUEUES:
                _send(producer, f"/queue/{q}", f"{q}-{i}")
        for i in range(NEWS):
            _send(producer, f"/topic/{TOPIC}", f"news-{i}")
        producer.close()
    finally:
        assert node.terminate() == 0
    return data


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _populate(tmp_path_factory.mktemp("populated"))


@pytest.fixture
def data(populated: Path, tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "data"
    shutil.copytree(populated, copy, ignore=shutil.ignore_patterns("run", "node.lock"))
    yield copy


def _rebalance(data: Path, to: int, *args: str, **env: str
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--data",
         str(data), "--to", str(to), *args], check=False, capture_output=True, text=True,
        timeout=120, env=dict(os.environ, **env))


def _depths(management: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{management}/api/stat",
                                timeout=10) as resp:
        stat: dict[str, Any] = json.loads(resp.read())
    return {d["name"]: int(d["depth"]) for d in stat["destinations"]
            if d.get("type") == "queue"}


def _drain(port: int) -> None:
    """Every queue gives its messages exactly once and in order; the durable
    subscription gets what was published while it was away."""
    client = RawClient(Address(port))
    client.connect()
    for q in QUEUES:
        client.send_frame("SUBSCRIBE", [("destination", f"/queue/{q}"), ("id", q),
                                        ("ack", "client-individual")])
        got = []
        for _ in range(PER_QUEUE):
            frame, _ = client.read_until("MESSAGE")
            got.append(frame.body.decode())
            client.send_frame("ACK", [("id", frame.get("ack") or "")])
        assert got == [f"{q}-{i}" for i in range(PER_QUEUE)]
        client.send_frame("UNSUBSCRIBE", [("id", q), ("receipt", f"u-{q}")])
        extra = [f for f in client.read_until_receipt(f"u-{q}") if f.command == "MESSAGE"]
        assert extra == []
    client.close()
    durable = _durable(port)
    news = []
    for _ in range(NEWS):
        frame, _ = durable.read_until("MESSAGE")
        news.append(frame.body.decode())
        durable.send_frame("ACK", [("id", frame.get("ack") or "")])
    assert news == [f"news-{i}" for i in range(NEWS)]
    durable.close()


def _check_node(tmp: Path, data: Path, shards: int, extra: str = "") -> None:
    node = _node(tmp, data, shards, extra)
    try:
        depths = _depths(node.ports["management"])
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
        _drain(node.port)
    finally:
        assert node.terminate() == 0


def test_rebalance_to_three_then_to_one_process_keeps_every_message(
        data: Path, tmp_path: Path) -> None:
    done = _rebalance(data, 3)
    assert done.returncode == 0, done.stderr
    assert "rebalance 2 -> 3 shard(s) done" in done.stdout
    assert "shard 0 -> shard 2" in done.stdout or "shard 1 -> shard 2" in done.stdout
    assert json.loads((data / "shards.json").read_text())["shards"] == 3
    assert not (data / "rebalance.json").exists()
    # Started with 3 shards, it holds every message once (depths), and nothing was
    # consumed: now down to one broker process.
    node = _node(tmp_path, data, 3)
    try:
        depths = _depths(node.ports["management"])
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
    finally:
        assert node.terminate() == 0
    back = _rebalance(data, 1)
    assert back.returncode == 0, back.stderr
    assert "-> one process" in back.stdout
    assert not (data / "shards.json").exists()
    assert not any((data / f"shard-{k}" / "journal").exists() for k in range(3))
    config = write_broker_toml(tmp_path / "one.toml", name="node", data=data,
                               management=True)
    broker = ProcessBroker(config, tmp_path / "one.log").start()
    try:
        found = re.search(r"management endpoint on http://[\d.]+:(\d+)/",
                          (tmp_path / "one.log").read_text())
        assert found is not None
        depths = _depths(int(found.group(1)))
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
        _drain(broker.port)
    finally:
        assert broker.terminate() == 0


def test_a_rebalance_killed_half_way_is_finished_by_the_next_run(
        data: Path, tmp_path: Path) -> None:
    killed = _rebalance(data, 3, MESHMQ_REBALANCE_KILL_AFTER="1")
    assert killed.returncode == -9
    assert (data / "rebalance.json").exists()
    # Until it is finished, no node starts on the half-moved stores.
    refused = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
         str(write_node_toml(tmp_path / "n.toml", data=data, shards=3,
                             listeners=LISTENER))],
        check=False, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "unfinished shard rebalance" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    again = _rebalance(data, 3)
    assert again.returncode == 0, again.stderr
    assert "resumed and finished" in again.stdout
    assert not (data / "rebalance.json").exists()
    _check_node(tmp_path, data, 3)


NUMBERED = '[shards]\nplacement = "numbered"\n'


def _destination_shards(management: int) -> dict[str, int]:
    """Which shard keeps each queue, as the node's /api/destinations says."""
    with urllib.request.urlopen(f"http://127.0.0.1:{management}/api/destinations",
                                timeout=10) as resp:
        rows: list[dict[str, Any]] = json.loads(resp.read())["destinations"]
    return {r["name"]: int(r["shard"]) for r in rows if r.get("type") == "queue"}


def test_numbered_placement_needs_a_rebalance_that_moves_each_queue_to_its_number(
        data: Path, tmp_path: Path) -> None:
    """The stores were placed by hash; a node asking for numbered placement is refused
    until `--placement numbered` has moved them. Then rb.q0 ... rb.q11 alternate
    between the two shards, and every message is delivered once, in order."""
    refused = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
         str(write_node_toml(tmp_path / "n.toml", data=data, shards=2, listeners=LISTENER,
                             extra=NUMBERED))],
        check=False, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--to 2 --placement numbered" in refused.stderr
    done = _rebalance(data, 2, "--placement", "numbered")
    assert done.returncode == 0, done.stderr
    assert "rebalance 2 -> 2 shard(s), placement hash -> numbered done" in done.stdout
    assert json.loads((data / "shards.json").read_text())["hash"] == NUMBERED_NAME
    expected = {q: owner(queue(q), 2, placement=NUMBERED_NAME) for q in QUEUES}
    assert sorted(expected.values()) == [0] * 6 + [1] * 6
    node = _node(tmp_path, data, 2, NUMBERED)
    try:
        kept = _destination_shards(node.ports["management"])
        assert {q: kept.get(q) for q in QUEUES} == expected
        assert node.api("/api/shards")["placement"] == "numbered"
    finally:
        assert node.terminate() == 0
    _check_node(tmp_path, data, 2, NUMBERED)
    again = _rebalance(data, 2, "--placement", "numbered")
    assert again.stdout.strip() == ("the stores are already laid out for 2 shard(s): "
                                    "nothing to move")


def test_a_running_node_is_refused_in_one_line(data: Path, tmp_path: Path) -> None:
    node = _node(tmp_path, data, 2)
    try:
        refused = _rebalance(data, 3)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"meshmq: a node runs on {data}: stop it first, then run the rebalance again"]
        assert refused.stdout == ""
    finally:
        assert node.terminate() == 0
    assert json.loads((data / "shards.json").read_text())["shards"] == 2


def test_a_replicated_node_is_refused_in_one_line(data: Path) -> None:
    """A replicated node's shards each have a stream copied on the other nodes: moving
    messages under them would make the copies differ, so nothing is touched."""
    (data / "replication").mkdir()
    (data / "replication" / "node-state.json").write_text('{"term": 3, "voted_for": null}')
    def files() -> dict[Path, bytes]:  # the lock file aside: every run takes the lock
        return {p: p.read_bytes() for p in data.rglob("*")
                if p.is_file() and p.name != "node.lock"}

    before = files()
    refused = _rebalance(data, 3)
    assert refused.returncode == 1 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"meshmq: {data} is a node of a replicated cluster"), lines
    assert "network connector" in lines[0]
    assert files() == before
