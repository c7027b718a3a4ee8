"""A node of shards on the PostgreSQL store, alone and as one member of a ``database``
master/slave pair, with a real PostgreSQL server and real ``--shards 2`` processes: each
shard's own tables, the shard count recorded in the database, the master's supervisor
killed with SIGKILL under failover producers and consumers, and a paused master node
whose shards' writes are refused after the takeover."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.ha.support import FailoverProducer, accepts, connect
from tests.node.test_node_ha import (
    HaNode,
    RecordingConsumer,
    check,
    drain,
    queue_owned_by,
)
from tests.support.brokers import poll
from tests.support.nodes import pid_gone
from tests.support.ports import free_port
from tests.support.postgres import cluster

pytestmark = pytest.mark.slow

DATABASE = 'mode = "database"\nlease_ms = 1500\nkeepalive_ms = 300\nacquire_interval_ms = 50'


@pytest.fixture
def postgres_dsn() -> str:
    """A DSN of a fresh, empty database on the session's private PostgreSQL cluster."""
    return cluster().create_database()


def write_node(path: Path, *, name: str, data: Path, port: int, dsn: str, ha: str = "",
               shards: int = 2) -> Path:
    path.write_text(f"""
[broker]
name = "{name}"
data_directory = "{data}"
shards = {shards}

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{port}"

[store]
kind = "postgres"
dsn = "{dsn}"

[management]
host = "127.0.0.1"
port = 0

[ha]
{ha}
""")
    return path


def pair(tmp_path: Path, dsn: str) -> tuple[dict[str, HaNode], list[int]]:
    """Two nodes, each with its own data directory: only the database is shared."""
    ports = [free_port(), free_port()]
    nodes = {name: HaNode(write_node(tmp_path / f"{name}.toml", name=name,
                                     data=tmp_path / name, port=port, dsn=dsn, ha=DATABASE),
                          tmp_path / f"{name}.log")
             for name, port in zip("ab", ports, strict=True)}
    return nodes, ports


def own_ports(proc: psutil.Process) -> set[int]:
    """The TCP ports the process listens on or holds bound (not its connections out, such
    as its lease connection to PostgreSQL)."""
    return {c.laddr.port for c in proc.net_connections("tcp") if c.laddr and not c.raddr}


def rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql).fetchall())


def bodies_in(dsn: str, table: str) -> int:
    return int(rows(dsn, f"SELECT count(*) FROM {table}")[0][0])  # type: ignore[call-overload]


def broker(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``meshmq broker`` that is expected to refuse to start."""
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                           str(config), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return lines[-1]


def test_each_shard_keeps_its_own_tables_and_another_count_is_refused(
        postgres_dsn: str, tmp_path: Path) -> None:
    port = free_port()
    config = write_node(tmp_path / "n.toml", name="n", data=tmp_path / "n", port=port,
                        dsn=postgres_dsn)
    node = HaNode(config, tmp_path / "n.log").start().wait_master()
    queues = [queue_owned_by(0, "pg"), queue_owned_by(1, "pg")]
    conn, rec = connect(port)
    for i, queue in enumerate(queues):
        conn.send(queue, f"m{i}", headers={"persistent": "true"}, receipt=f"r{i}")
    poll(lambda: {"r0", "r1"} <= rec.receipts, 30, "both receipts")
    conn.disconnect()
    # One message in each shard's own tables; none in the configured prefix's.
    assert bodies_in(postgres_dsn, "meshmq_s0_refs") == 1
    assert bodies_in(postgres_dsn, "meshmq_s1_refs") == 1
    assert rows(postgres_dsn, "SELECT key FROM meshmq_s0_refs")[0][0] == \
        "queue://" + queues[0].removeprefix("/queue/")
    assert rows(postgres_dsn, "SELECT to_regclass('meshmq_refs')") == [(None,)]
    assert rows(postgres_dsn, "SELECT shards, hash, node FROM meshmq_node") == [
        (2, "jump-blake2b-1", "n")]
    # While the node runs, one broker process cannot open its tables.
    alone = error_line(broker(config, "--shards", "1"))
    assert "locked" in alone or "in use" in alone, alone
    assert node.terminate() == 0

    for other in ("3", "1"):
        line = error_line(broker(config, "--shards", other))
        assert "meshmq shards rebalance" in line and "--shards 2" in line, line
        assert "node of 2 shards" in line, line
    # The same count again: every message is where it was.
    node = HaNode(config, tmp_path / "n.log").start().wait_master()
    for i, queue in enumerate(queues):
        assert [body for _, body, _ in drain(port, queue)] == [f"m{i}"]
    assert node.terminate() == 0


def test_a_node_refuses_the_tables_of_one_broker_process(postgres_dsn: str,
                                                          tmp_path: Path) -> None:
    port = free_port()
    config = write_node(tmp_path / "one.toml", name="one", data=tmp_path / "one", port=port,
                        dsn=postgres_dsn, shards=1)
    one = HaNode(config, tmp_path / "one.log").start()
    poll(lambda: "listening for stomp" in one.text(), 30, "the broker to start")
    conn, rec = connect(port)
    conn.send("/queue/plain", "kept", headers={"persistent": "true"}, receipt="r")
    poll(lambda: "r" in rec.receipts, 30, "the receipt")
    conn.disconnect()
    assert one.terminate() == 0
    line = error_line(broker(config, "--shards", "2"))
    assert "one-process store" in line and "meshmq shards rebalance" in line, line
    assert rows(postgres_dsn, "SELECT count(*) FROM meshmq_node") == [(0,)]  # not recorded


def test_master_node_killed_the_slave_node_takes_over_its_shards_tables(
        postgres_dsn: str, tmp_path: Path) -> None:
    nodes, ports = pair(tmp_path, postgres_dsn)
    a = nodes["a"].start().wait_master()
    b = nodes["b"].start().wait_slave()
    assert "took the database lease at epoch 1" in a.text()

    # The slave node: its management endpoint only, no shard, no client port.
    assert b.proc is not None
    slave = psutil.Process(b.proc.pid)
    assert b.shard_processes() == []
    assert own_ports(slave) == {b.management_port}
    assert ports[1] not in {c.laddr.port for c in slave.net_connections("tcp") if c.laddr}
    assert not accepts(ports[1])
    stat = b.stat()
    assert (stat["ha"]["role"], stat["ha"]["mode"]) == ("slave", "database")
    assert str(stat["ha"]["lease_holder"]).startswith("a@")

    queues = [queue_owned_by(0, "dbha"), queue_owned_by(1, "dbha")]
    producers = [FailoverProducer(lambda: ports, q, prefix=f"p{i}")
                 for i, q in enumerate(queues)]
    consumers = [RecordingConsumer(lambda: ports, q) for q in queues]
    for thread in (*producers, *consumers):
        thread.start()

    def confirmed(at_least: int) -> bool:
        assert all(p.fatal is None for p in producers), [p.fatal for p in producers]
        return all(len(p.report.confirmed) >= at_least for p in producers)

    poll(lambda: confirmed(150), 60, "150 receipted sends per queue on the master node")
    shards = a.shard_processes()
    assert len(shards) == 2
    # Until the takeover the slave node opened no client port.
    assert own_ports(slave) == {b.management_port}
    a.kill9()
    killed = time.monotonic()
    poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the old shards to exit")
    poll(lambda: accepts(ports[1]), 60, "the slave node to accept clients")
    took = time.monotonic() - killed
    b.wait_master()
    assert "took the database lease at epoch 2" in b.text()
    assert "is gone)" in b.text()  # its database session ended: no wait for expiry
    assert len(b.shard_processes()) == 2

    before = [len(p.report.confirmed) for p in producers]
    poll(lambda: all(len(p.report.confirmed) >= n + 150
                     for p, n in zip(producers, before, strict=True))
         or any(p.fatal for p in producers), 60, "150 more receipted sends per queue")
    acked = [len(c.report.acked) for c in consumers]
    poll(lambda: all(len(c.report.acked) >= n + 20
                     for c, n in zip(consumers, acked, strict=True))
         or any(c.fatal for c in consumers), 60, "the consumers to carry on")
    for thread in (*producers, *consumers):
        thread.stop.set()
    for thread in (*producers, *consumers):
        thread.join(30)
    assert all(t.fatal is None for t in (*producers, *consumers))
    assert all(any(port == ports[1] for _, port in p.report.failovers) for p in producers)
    assert all(c.connections >= 2 for c in consumers)
    assert b.stat()["ha"]["epoch"] == 2
    for producer, consumer, queue in zip(producers, consumers, queues, strict=True):
        check(producer, consumer, drain(ports[1], queue))
    assert b.terminate() == 0
    print(f"database node takeover after SIGKILL of the supervisor: {took:.3f}s")


def test_paused_master_node_shards_cannot_write_after_the_takeover(
        postgres_dsn: str, tmp_path: Path) -> None:
    nodes, ports = pair(tmp_path, postgres_dsn)
    a = nodes["a"].start().wait_master()
    b = nodes["b"].start().wait_slave()
    queues = [queue_owned_by(0, "fence"), queue_owned_by(1, "fence")]
    old, old_rec = connect(ports[0])
    for i, queue in enumerate(queues):
        old.send(queue, f"before-{i}", headers={"persistent": "true"}, receipt=f"b{i}")
    poll(lambda: {"b0", "b1"} <= old_rec.receipts, 30, "the receipts before the pause")

    shards = a.shard_processes()
    supervisor = psutil.Process(a.proc.pid if a.proc else 0)
    for process in (supervisor, *shards):
        process.send_signal(signal.SIGSTOP)
    try:
        b.wait_master()  # after the lease ran out: the paused holder's session lives on
        assert "let it expire" in b.text()
        # The paused node's client sends to both shards; the frames wait in its socket.
        for i, queue in enumerate(queues):
            old.send(queue, f"from-the-deposed-{i}", headers={"persistent": "true"},
                     receipt=f"d{i}")
        new, new_rec = connect(ports[1])
        for i, queue in enumerate(queues):
            new.send(queue, f"on-new-master-{i}", headers={"persistent": "true"},
                     receipt=f"n{i}")
        poll(lambda: {"n0", "n1"} <= new_rec.receipts, 30, "the new master's receipts")
        # The old shards wake first, their supervisor still paused (it cannot kill them,
        # and their pipe to it stays open): the lease row refuses their write
        # transactions, so the client is dropped without a receipt, and a shard whose
        # write was refused stops on its own. (A shard that had nothing to write, the
        # client's shard having stopped before forwarding to it, is not fenced: it
        # serves nothing durable, and its supervisor kills it on waking.)
        for process in shards:
            process.send_signal(signal.SIGCONT)
        poll(lambda: old_rec.disconnected or bool(old_rec.errors), 30,
             "the deposed shards to drop their client")
        poll(lambda: any(pid_gone(p.pid) for p in shards), 30, "a fenced shard to exit")
        assert not {"d0", "d1"} & old_rec.receipts
        assert "store write refused" in a.text() and "epoch 2" in a.text()
        # Nothing the deposed shards were sent reached their tables.
        for k in (0, 1):
            stored = rows(postgres_dsn, f"SELECT count(*) FROM meshmq_s{k}_messages")[0][0]
            assert stored == 2, (k, stored)
    finally:
        for process in (*shards, supervisor):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)
    # The supervisor wakes: its renewal fails, it is deposed, kills what is left of its
    # shards and waits as a slave again.
    poll(lambda: "restarting the node as a slave" in a.text(), 30, "the deposed node")
    poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the old shards to exit")
    poll(lambda: a.role() == "slave", 30, "the old master to be a slave")
    assert not accepts(ports[0])
    new.disconnect()
    for i, queue in enumerate(queues):
        assert [body for _, body, _ in drain(ports[1], queue)] == [
            f"before-{i}", f"on-new-master-{i}"]
    assert b.terminate() == 0
    a.wait_master(times=2)
    assert a.terminate() == 0
