"""``meshmq shards rebalance`` of a node on PostgreSQL, end to end: a real node of two
shards keeps persistent messages on many queues and for a durable subscription in its
shards' tables (``<prefix>s<k>_``) of a real PostgreSQL database, is stopped, and the
real command moves them (to 3 shards, then to one broker process's tables); the node
started with the new count delivers every message exactly once, in order per queue. A
rebalance killed half-way leaves its plan in ``<prefix>rebalance``: no node starts on
the half-moved tables until the next run has finished it. A running node is refused in
one line. A node configured for numbered placement is refused on tables placed by hash
until the rebalance (placement from the configuration) has moved them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from meshmq.core.destinations import queue
from meshmq.core.shards import NUMBERED_NAME, owner
from tests.node.test_node_database_ha import write_node
from tests.node.test_rebalance import (
    NEWS,
    NUMBERED,
    PER_QUEUE,
    QUEUES,
    TOPIC,
    _depths,
    _destination_shards,
    _drain,
    _durable,
    _send,
)
from tests.support.brokers import ProcessBroker
from tests.support.nodes import NodeProcess, stomp_on
from tests.support.ports import free_port
from tests.support.postgres import cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def dsn() -> str:
    return cluster().create_database()


def _config(tmp: Path, dsn: str, shards: int) -> Path:
    return write_node(tmp / f"node{shards}.toml", name="node", data=tmp / "data",
                      port=free_port(), dsn=dsn, shards=shards)


def _node(tmp: Path, dsn: str, shards: int) -> NodeProcess:
    return NodeProcess(_config(tmp, dsn, shards), tmp / f"node{shards}.log").start()


def _rebalance(config: Path, to: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "shards", "rebalance", "--config",
         str(config), "--to", str(to)], check=False, capture_output=True, text=True,
        timeout=120, env=dict(os.environ, **env))


def _rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _refs(dsn: str, prefix: str) -> int:
    found = _rows(dsn, f"SELECT to_regclass('{prefix}refs') IS NOT NULL")[0][0]
    return int(_rows(dsn, f"SELECT count(*) FROM {prefix}refs")[0][0]) \
        if found else 0  # type: ignore[call-overload]


def _populate(tmp: Path, dsn: str) -> Path:
    """A stopped node of 2 shards whose tables hold PER_QUEUE messages on every queue
    and NEWS for an offline durable subscription; its configuration."""
    node = _node(tmp, dsn, 2)
    try:
        _durable(node.port).close()
        producer = stomp_on(node, 0)
        for i in range(PER_QUEUE):
            for q in QUEUES:
                _send(producer, f"/queue/{q}", f"{q}-{i}")
        for i in range(NEWS):
            _send(producer, f"/topic/{TOPIC}", f"news-{i}")
        producer.close()
    finally:
        assert node.terminate() == 0
    assert _refs(dsn, "meshmq_s0_") > 0 and _refs(dsn, "meshmq_s1_") > 0
    return _config(tmp, dsn, 2)


def test_rebalance_to_three_then_to_one_process_keeps_every_message(
        tmp_path: Path, dsn: str) -> None:
    config = _populate(tmp_path, dsn)
    stored = sum(_refs(dsn, f"meshmq_s{k}_") for k in range(2))
    done = _rebalance(config, 3)
    assert done.returncode == 0, done.stderr
    assert "rebalance 2 -> 3 shard(s) done" in done.stdout
    assert "-> shard 2" in done.stdout
    assert _rows(dsn, "SELECT shards, node FROM meshmq_node") == [(3, "node")]
    assert _rows(dsn, "SELECT count(*) FROM meshmq_rebalance") == [(0,)]
    assert _refs(dsn, "meshmq_s2_") > 0
    assert sum(_refs(dsn, f"meshmq_s{k}_") for k in range(3)) == stored
    node = _node(tmp_path, dsn, 3)
    try:
        depths = _depths(node.ports["management"])
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
    finally:
        assert node.terminate() == 0

    back = _rebalance(_config(tmp_path, dsn, 3), 1)
    assert back.returncode == 0, back.stderr
    assert "-> one process" in back.stdout
    assert _rows(dsn, "SELECT count(*) FROM meshmq_node") == [(0,)]
    assert [_refs(dsn, f"meshmq_s{k}_") for k in range(3)] == [0, 0, 0]
    assert _refs(dsn, "meshmq_") == stored
    one = _config(tmp_path, dsn, 1)
    broker = ProcessBroker(one, tmp_path / "one.log").start()
    try:
        found = re.search(r"management endpoint on http://[\d.]+:(\d+)/",
                          (tmp_path / "one.log").read_text())
        assert found is not None
        depths = _depths(int(found.group(1)))
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
        _drain(broker.port)
    finally:
        assert broker.terminate() == 0


def test_a_rebalance_killed_half_way_holds_off_the_node_until_the_next_run(
        tmp_path: Path, dsn: str) -> None:
    config = _populate(tmp_path, dsn)
    killed = _rebalance(config, 3, MESHMQ_REBALANCE_KILL_AFTER="1")
    assert killed.returncode == -9
    assert len(_rows(dsn, "SELECT body FROM meshmq_rebalance")) == 1
    refused = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
         str(_config(tmp_path, dsn, 3))],
        check=False, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert "a rebalance of the PostgreSQL store 'meshmq_' to 3 shard(s) was " \
        "interrupted: run 'meshmq shards rebalance --config FILE --to 3' to finish it " \
        "first" in lines[0]
    wrong = _rebalance(config, 4)
    assert wrong.returncode == 1
    assert "a rebalance to 3 shard(s) was interrupted" in wrong.stderr
    again = _rebalance(config, 3)
    assert again.returncode == 0, again.stderr
    assert "resumed and finished" in again.stdout
    assert _rows(dsn, "SELECT count(*) FROM meshmq_rebalance") == [(0,)]
    node = _node(tmp_path, dsn, 3)
    try:
        depths = _depths(node.ports["management"])
        assert {q: depths.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, PER_QUEUE)
        _drain(node.port)
    finally:
        assert node.terminate() == 0


def test_a_running_node_is_refused_in_one_line(tmp_path: Path, dsn: str) -> None:
    config = _populate(tmp_path, dsn)
    node = NodeProcess(config, tmp_path / "again.log").start()
    try:
        refused = _rebalance(config, 3)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            "meshmq: a node or broker runs on the PostgreSQL store 'meshmq_' (host=127.0.0.1 "
            f"port={cluster().port} user=postgres dbname={dsn.split('dbname=')[1]}): stop "
            "it first, then run the rebalance again"]
    finally:
        assert node.terminate() == 0
    assert _rows(dsn, "SELECT shards FROM meshmq_node") == [(2,)]
    assert _refs(dsn, "meshmq_s2_") == 0


def test_numbered_placement_from_the_configuration_moves_the_tables(
        tmp_path: Path, dsn: str) -> None:
    config = _populate(tmp_path, dsn)
    stored = sum(_refs(dsn, f"meshmq_s{k}_") for k in range(2))
    config.write_text(config.read_text() + "\n" + NUMBERED)
    refused = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "broker", "--config", str(config)],
        check=False, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "placed by 'hash'" in refused.stderr and "--placement numbered" in refused.stderr
    done = _rebalance(config, 2)
    assert done.returncode == 0, done.stderr
    assert "placement hash -> numbered" in done.stdout
    assert _rows(dsn, "SELECT shards, hash FROM meshmq_node") == [(2, NUMBERED_NAME)]
    assert sum(_refs(dsn, f"meshmq_s{k}_") for k in range(2)) == stored
    node = NodeProcess(config, tmp_path / "numbered.log").start()
    try:
        kept = _destination_shards(node.ports["management"])
        assert {q: kept.get(q) for q in QUEUES} == {
            q: owner(queue(q), 2, placement=NUMBERED_NAME) for q in QUEUES}
        _drain(node.port)
    finally:
        assert node.terminate() == 0
