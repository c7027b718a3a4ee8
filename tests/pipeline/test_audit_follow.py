"""The streaming audit follows trace directories with Spark's file source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshmq.core import destinations as dst
from meshmq.core import trace as tr
from meshmq.core.message import Message
from meshmq.transport import trace_files as tf

# Spark jobs on a shared 2-core machine: allow more than the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def write_trace(directory: Path, boot: str, events: list[tr.Event]) -> None:
    sink = tf.JsonLinesSink(directory, "b1", boot)
    sink.write(events)
    sink.close()


def summary(spark: Any, out: Path) -> dict[str, int]:
    return {r["status"]: r["messages"] for r in spark.read.parquet(str(out / "summary"))
            .collect() if r["messages"]}


def test_follow_keeps_the_tables_up_to_date_and_reads_each_file_once(spark: Any,
                                                                      tmp_path: Path) -> None:
    from meshmq.pipeline.audit_job import follow

    trace_dir, out = tmp_path / "trace", tmp_path / "audit"
    q = dst.queue("q")
    m1, m2 = Message("m1", q, b"a"), Message("m2", q, b"b")
    write_trace(trace_dir, "x", [(1000, tr.RECEIVED, m1, None, 0, None, None, None, None),
                                 (2000, tr.DELIVERED, m1, None, 1, "c", None, None, None),
                                 (3000, tr.RECEIVED, m2, None, 0, None, None, None, None)])
    # A file still being written is not followed (Spark would read it half-done).
    (trace_dir / "trace-b1-y-000001.jsonl.open").write_text('{"v":1,"event":"acked"}\n')
    follow(spark, [trace_dir], out, once=True)
    assert summary(spark, out) == {"consumed": 1, "pending": 1}
    assert "1 messages" not in (out / "report.md").read_text()

    write_trace(trace_dir, "z", [(4000, tr.DELIVERED, m2, None, 1, "c", None, None, None)])
    follow(spark, [trace_dir], out, once=True)  # a restarted follower: the checkpoint
    assert summary(spark, out) == {"consumed": 2}
    events = spark.read.parquet(str(out / "events"))
    assert events.count() == 4  # the first file was not read again
    assert sorted(r["batch"] for r in events.select("batch").distinct().collect()) == [0, 1]


def test_audit_errors_name_the_bad_path(spark: Any, tmp_path: Path) -> None:
    from meshmq.pipeline.paths import LocationError, trace_files

    with pytest.raises(LocationError, match="does not exist"):
        trace_files(spark, [str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LocationError, match=r"no trace files .* under .*empty"):
        trace_files(spark, [(tmp_path / "empty").as_uri()])


def test_import_meshmq_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = ("import sys, meshmq, meshmq.cli.main, meshmq.core.trace, meshmq.core.broker, "
            "meshmq.transport.runtime, meshmq.pipeline\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', "
            "'py4j', 'matplotlib')]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
