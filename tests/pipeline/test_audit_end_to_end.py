"""End to end: real broker subprocesses write traces, one is killed with SIGKILL, and
``meshmq audit`` (the real command, its own Spark) finds exactly the planted losses and
duplicates, and none anywhere else.

Planted on broker "alpha" before the kill:
* 5 non-persistent messages waiting on queue a.volatile: lost with the process;
* 3 persistent messages delivered to a client-ack consumer and not acked: redelivered
  after the restart, so each is delivered twice;
* one dedup-id sent twice (a producer retry): the broker's idempotent-producer window
  drops the second copy, which the audit reports as dropped, not as a duplicate.
Everything else (persistent messages waiting across the crash, normal traffic on
alpha and on a second broker "beta" that stops cleanly, and 20 messages that cross a
network bridge from "west" to "east") must come out clean; the bridged ones with
their path, one hop and the bridge's throughput.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.core import trace as tr
from tests.support.brokers import ProcessBroker, poll
from tests.support.network import Node

# Spark jobs on a shared 2-core machine: allow more than the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "audit-report"


def config(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[broker]
name = "{name}"
data_directory = "{tmp / name}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"

[store]
fsync = false

[management]
enabled = false

[trace]
enabled = true
directory = "{tmp / 'trace' / name}"
flush_interval_ms = 1
exact = true
""")
    return path


class TracedNode(Node):
    """A network node (subprocess broker) with tracing on."""

    def write_config(self) -> Path:
        path = super().write_config()
        with path.open("a") as f:
            f.write(f'\n[trace]\nenabled = true\ndirectory = "{self.root / "trace"}"\n'
                    "flush_interval_ms = 1\n")
        return path


def bridged_traffic(tmp: Path) -> list[Path]:
    """20 messages produced on west, consumed on east over west's bridge."""
    east = TracedNode("east", tmp / "east").start()
    west = TracedNode("west", tmp / "west").connect_to(f"static:({east.uri})",
                                                       name="west-east").start()
    try:
        west.wait_forwarding()
        with SimpleStompClient("127.0.0.1", east.port) as consumer:
            consumer.subscribe("/queue/net.orders", "n", ack="client-individual")
            poll(lambda: west.destination("net.orders")["consumers"] >= 1, 30,
                 "east's demand on west")
            with SimpleStompClient("127.0.0.1", west.port) as producer:
                for i in range(20):
                    producer.send("/queue/net.orders", f"n{i}".encode(),
                                  {"persistent": "true"})
            for _ in range(20):
                frame = consumer.receive(timeout=20)
                assert frame is not None
                consumer.ack(frame)
    finally:
        west.stop()
        east.stop()
    return [tmp / "east" / "trace", tmp / "west" / "trace"]


def traced(directory: Path) -> list[dict[str, object]]:
    rows = []
    for path in sorted(directory.glob("*.jsonl*")):
        for line in path.read_text().splitlines():
            try:
                rows.append(tr.decode_jsonl_line(line))
            except ValueError:
                pass  # a line still being written
    return rows


def count(rows: list[dict[str, object]], event: str, dest: str) -> int:
    return sum(1 for r in rows if r["event"] == event and r["destination"] == dest)


def consume(client: SimpleStompClient, dest: str, n: int, sub_id: str, *,
            ack: bool = True) -> list[str]:
    client.subscribe(dest, sub_id, ack="client-individual")
    ids = []
    for _ in range(n):
        frame = client.receive(timeout=10)
        assert frame is not None, f"only {len(ids)} of {n} messages from {dest}"
        ids.append(frame.get("message-id") or "")
        if ack:
            client.ack(frame)
    return ids


def test_audit_finds_exactly_the_planted_losses_and_duplicates(tmp_path: Path) -> None:
    alpha_cfg, beta_cfg = config(tmp_path, "alpha"), config(tmp_path, "beta")
    alpha_dir, beta_dir = tmp_path / "trace" / "alpha", tmp_path / "trace" / "beta"
    alpha = ProcessBroker(alpha_cfg, tmp_path / "alpha.log").start()
    beta = ProcessBroker(beta_cfg, tmp_path / "beta.log").start()

    with SimpleStompClient("127.0.0.1", beta.port) as client:
        for i in range(10):
            client.send("/queue/b.orders", f"b{i}".encode(), {"persistent": "true"})
        consume(client, "/queue/b.orders", 10, "s")
    assert beta.terminate() == 0
    network_dirs = bridged_traffic(tmp_path / "net")

    producer = SimpleStompClient("127.0.0.1", alpha.port)
    for i in range(20):
        producer.send("/queue/a.ok", f"ok{i}".encode(), {"persistent": "true"})
    for _ in range(2):  # a producer retry: the same dedup-id twice
        producer.send("/queue/a.ok", b"retry", {"persistent": "true", "dedup-id": "order-7"})
    for i in range(5):
        producer.send("/queue/a.volatile", f"v{i}".encode())
    for i in range(5):
        producer.send("/queue/a.kept", f"k{i}".encode(), {"persistent": "true"})
    for i in range(3):
        producer.send("/queue/a.inflight", f"f{i}".encode(), {"persistent": "true"})
    consumer = SimpleStompClient("127.0.0.1", alpha.port)
    consume(consumer, "/queue/a.ok", 21, "ok")
    inflight_ids = consume(consumer, "/queue/a.inflight", 3, "inflight", ack=False)

    # Kill only once the planted events have reached the trace file (flushed by the
    # broker's timer): the audit can only see what was traced.
    poll(lambda: count(traced(alpha_dir), "dispatched", "queue://a.inflight") == 3
         and count(traced(alpha_dir), "acked", "queue://a.ok") == 21
         and count(traced(alpha_dir), "received", "queue://a.volatile") == 5, 15,
         "alpha's trace to hold the planted events")
    alpha.kill9()
    producer.sock.close()
    consumer.sock.close()

    alpha = ProcessBroker(alpha_cfg, tmp_path / "alpha.log").start()
    with SimpleStompClient("127.0.0.1", alpha.port) as client:
        consume(client, "/queue/a.kept", 5, "kept")
        again = consume(client, "/queue/a.inflight", 3, "inflight")
        assert sorted(again) == sorted(inflight_ids)
        client.subscribe("/queue/a.volatile", "v")
        assert client.receive(timeout=0.5) is None  # really gone
    assert alpha.terminate() == 0

    out = tmp_path / "audit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    result = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "--log-level", "WARNING", "audit",
         str(alpha_dir), str(beta_dir), *map(str, network_dirs), "--out", str(out),
         "--window", "100 milliseconds"],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = dict(kv.split("=") for kv in result.stdout.split())
    assert counts == {"consumed": "59", "dead_lettered": "0", "expired": "0",
                      "dropped": "1", "retained": "0", "pending": "0", "in_transit": "0",
                      "resent": "0",
                      "lost": "5", "unknown": "0", "duplicates": "3"}

    import pyarrow.parquet as pq

    lost = pq.read_table(out / "lost").to_pylist()
    assert len(lost) == 5
    assert {r["destination"] for r in lost} == {"queue://a.volatile"}
    assert {r["last_broker"] for r in lost} == {"alpha"} and not any(
        r["persistent"] for r in lost)
    dups = sorted((r["kind"], r["destination"], r["deliveries"])
                  for r in pq.read_table(out / "duplicates").to_pylist())
    assert dups == [("redelivered", "queue://a.inflight", 2)] * 3
    (dropped,) = [r for r in pq.read_table(out / "journeys").to_pylist()
                  if r["status"] == "dropped"]
    assert dropped["dedup_id"] == "order-7"
    assert dropped["drop_reason"] == "duplicate dedup-id (idempotent producer)"
    paths = {(r["path_text"], r["hops"]): (r["messages"], r["consumed"])
             for r in pq.read_table(out / "paths").to_pylist()}
    assert paths[("west>east", 1)] == (20, 20)
    bridges = pq.read_table(out / "bridges").to_pylist()
    assert {(r["broker"], r["peer"], r["connector"]) for r in bridges} == {
        ("west", "east", "west-east")}
    assert sum(r["messages"] for r in bridges) == 20
    failovers = pq.read_table(out / "failovers").to_pylist()
    assert [(r["broker"], r["kind"]) for r in failovers] == [("alpha", "crash")]
    report = (out / "report.md").read_text()
    assert "**5 lost**" in report and "**3 delivered more than once**" in report
    assert (out / "latency.png").stat().st_size > 0 and (out / "throughput.png").exists()
    if os.environ.get("MESHMQ_UPDATE_EXAMPLE"):  # refresh the example in docs/
        shutil.rmtree(EXAMPLE, ignore_errors=True)
        EXAMPLE.mkdir(parents=True)
        for name in ("report.md", "latency.png", "throughput.png"):
            shutil.copy(out / name, EXAMPLE / name)
        (EXAMPLE / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
