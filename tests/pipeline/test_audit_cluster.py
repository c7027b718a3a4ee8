"""``meshmq audit`` against a real Spark standalone cluster, with the trace and the
output addressed only as ``file://`` URIs: the executors on the worker read the trace
and write the tables; the driver lists the files through Hadoop and writes the report
beside the tables. The commands are the worked example in docs/pipeline.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshmq.core import destinations as dst
from meshmq.core import trace as tr
from meshmq.core.message import Message
from meshmq.transport import trace_files as tf
from tests.support.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

S = 1_000_000_000  # ns per second


def write_trace(root: Path) -> None:
    """Broker a: m1 consumed, m2 (non-persistent) pending when a crashes at 20 s (a
    new boot at 60 s: m2 lost), m3 dispatched twice; broker b: m4 consumed, in
    Parquet."""
    q = dst.queue("orders")
    m1, m2, m3, m4 = (Message(f"m{i}", q, b"x", persistent=i != 2) for i in range(1, 5))
    first = tf.JsonLinesSink(root / "a", "a", "boot1")
    # Broker a's first run traces in exact mode, so after its crash what it did not
    # trace it did not do: m2 is lost, not unknown.
    first.write([(0, tr.BROKER_STARTED, None, None, 0, None, None, None,
                  "heartbeat_ms=1000 exact=1"),
                 (1 * S, tr.RECEIVED, m1, None, 0, None, None, None, None),
                 (2 * S, tr.DELIVERED, m1, None, 1, "c", None, None, None),
                 (3 * S, tr.RECEIVED, m3, None, 0, None, None, None, None),
                 (4 * S, tr.DISPATCHED, m3, None, 1, "c", None, None, None),
                 (5 * S, tr.DISPATCHED, m3, None, 2, "c", None, None, None),
                 (6 * S, tr.ACKED, m3, None, 2, "c", None, None, None),
                 (20 * S, tr.RECEIVED, m2, None, 0, None, None, None, None)])
    first.close()
    second = tf.JsonLinesSink(root / "a", "a", "boot2")
    second.write([(60 * S, tr.BROKER_STARTED, None, None, 0, None, None, None, None)])
    second.close()
    other = tf.ParquetSink(root / "b", "b", "boot1")
    other.write([(1 * S, tr.RECEIVED, m4, None, 0, None, None, None, None),
                 (2 * S, tr.DELIVERED, m4, None, 1, "c", None, None, None)])
    other.close()


def test_audit_on_a_standalone_cluster_with_file_uris(tmp_path: Path) -> None:
    trace, out = tmp_path / "trace", tmp_path / "audit"
    write_trace(trace)
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
        result = subprocess.run(
            [sys.executable, "-m", "meshmq.cli.main", "audit", trace.as_uri(),
             "--master", cluster.url, "--out", out.as_uri()],
            capture_output=True, text=True, env=env, timeout=400, check=False,
            cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        apps = cluster.status().get("completedapps", []) + cluster.status().get(
            "activeapps", [])
        assert [a["name"] for a in apps] == ["meshmq-audit"]  # it ran on this cluster
    counts = dict(kv.split("=") for kv in result.stdout.split())
    assert counts == {"consumed": "3", "dead_lettered": "0", "expired": "0",
                      "dropped": "0", "retained": "0", "pending": "0", "in_transit": "0",
                      "resent": "0",
                      "lost": "1", "unknown": "0", "duplicates": "1"}
    # Progress: the stages, with how far the table writing is.
    for stage in ("listing trace files", "reading traces (3 files)",
                  "writing tables (1/11): journeys written", "writing tables (11/11)",
                  "writing the report"):
        assert stage in result.stderr
    import pyarrow.parquet as pq

    (lost,) = pq.read_table(out / "lost").to_pylist()
    assert (lost["message_id"], lost["last_broker"]) == ("m2", "a")
    report = (out / "report.md").read_text().splitlines()
    assert report[0] == ("# meshmq delivery audit: 1 message lost, 1 delivered more than "
                         "once")
    assert (out / "throughput.png").stat().st_size > 0


def test_a_location_spark_cannot_open_is_one_line(spark: Any, tmp_path: Path) -> None:
    from meshmq.pipeline.paths import LocationError, trace_files

    with pytest.raises(LocationError, match=r"^cannot open nosuchfs://x/traces: .*"
                                            r"nosuchfs") as info:
        trace_files(spark, ["nosuchfs://x/traces"])
    assert "\n" not in str(info.value)
    write_trace(tmp_path / "trace")
    jsonl, parquet = trace_files(spark, [(tmp_path / "trace").as_uri()])
    assert [Path(p).name.split("-")[1] for p in jsonl] == ["a", "a"]
    assert len(parquet) == 1 and all(p.startswith("file:/") for p in jsonl + parquet)
