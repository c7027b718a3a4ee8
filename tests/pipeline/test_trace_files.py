"""A real broker with tracing on writes the documented trace files (no Spark needed)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.config.model import TraceConfig
from meshmq.core import trace as tr
from meshmq.transport import trace_files as tf
from tests.support.brokers import ThreadBroker, make_config, poll


def rows(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob("*.jsonl*")):
        out += [tr.decode_jsonl_line(line) for line in path.read_text().splitlines()]
    return out


def test_broker_traces_a_message_journey_and_its_own_lifecycle(tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    config = make_config(tmp_path / "data", broker_name="tb",
                         trace=TraceConfig(enabled=True, directory=trace_dir,
                                           flush_interval_ms=1))
    broker = ThreadBroker(config).start()
    try:
        with SimpleStompClient("127.0.0.1", broker.port) as client:
            client.send("/queue/orders", b"hello", {"persistent": "true", "dedup-id": "o-1"})
            client.subscribe("/queue/orders", ack="client-individual")
            frame = client.receive(timeout=10)
            assert frame is not None
            client.ack(frame)
            message_id = frame.get("message-id")
            # Flushed by the timer within flush_interval, while the broker runs.
            poll(lambda: any(r["event"] == "acked" for r in rows(trace_dir)), 10,
                 "the acked event in the trace file")
    finally:
        broker.stop()
    (path,) = trace_dir.glob("trace-*")
    assert path.name.startswith("trace-tb-") and path.suffix == ".jsonl"  # sealed at stop
    got = [r for r in rows(trace_dir) if r["event"] != "heartbeat"]
    assert [r["event"] for r in got] == ["broker_started", "received", "stored", "dispatched",
                                         "acked", "broker_stopped"]
    journey = got[1:5]
    assert {r["message_id"] for r in journey} == {message_id}
    assert all(r["destination"] == "queue://orders" and r["dedup_id"] == "o-1"
               and r["size"] == 5 and r["persistent"] and r["broker"] == "tb"
               for r in journey)
    assert len({r["boot"] for r in got}) == 1
    ts = [int(str(r["ts"])) for r in got]
    assert ts == sorted(ts)


def test_parquet_trace_files_and_recovered_messages(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    trace = TraceConfig(enabled=True, directory=tmp_path / "trace", format="parquet")
    config = make_config(tmp_path / "data", broker_name="pb", trace=trace)
    broker = ThreadBroker(config).start()
    with SimpleStompClient("127.0.0.1", broker.port) as client:
        for i in range(3):
            client.send("/queue/backlog", f"m{i}".encode(), {"persistent": "true"})
    broker.stop()
    broker = ThreadBroker(dataclasses.replace(config)).start()
    broker.stop()
    files = sorted((tmp_path / "trace").glob("*.parquet"))
    assert len(files) == 2
    first, second = ([r for r in pq.read_table(f).to_pylist() if r["event"] != "heartbeat"]
                     for f in files)
    assert [r["event"] for r in first] == ["broker_started"] + ["received", "stored"] * 3 + [
        "broker_stopped"]
    assert [r["event"] for r in second] == ["broker_started", "recovered", "recovered",
                                            "recovered", "broker_stopped"]
    assert [r["message_id"] for r in second[1:4]] == [r["message_id"] for r in first[1:7:2]]


def test_heartbeats_bound_a_run_and_the_next_start_names_the_last_one(tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    trace = TraceConfig(enabled=True, directory=trace_dir, flush_interval_ms=60_000,
                        heartbeat_interval_ms=50, exact=True)
    config = make_config(tmp_path / "data", broker_name="hb", trace=trace)
    broker = ThreadBroker(config).start()
    try:
        # Heartbeats reach the file although the periodic flush is a minute away.
        poll(lambda: sum(r["event"] == "heartbeat" for r in rows(trace_dir)) >= 3, 10,
             "three heartbeats in the trace file")
        with SimpleStompClient("127.0.0.1", broker.port) as client:
            client.send("/queue/x", b"a", {"persistent": "true"})
            # exact: the receipt (and the delivery) left only after the trace was
            # flushed, so the events are in the file the moment the client sees them.
            assert [r["event"] for r in rows(trace_dir) if r["message_id"]] == [
                "received", "stored"]
            client.subscribe("/queue/x", ack="client-individual")
            assert client.receive(timeout=10) is not None
            assert "dispatched" in [r["event"] for r in rows(trace_dir)]
    finally:
        broker.stop()
    first = rows(trace_dir)
    hb = tf.HeartbeatFile(trace_dir, "hb").read()
    assert hb is not None and hb[0] == first[0]["boot"]
    assert hb[1] == first[-1]["ts"]  # a clean stop leaves its broker_stopped time
    assert first[0]["reason"] == "heartbeat_ms=50 exact=1"
    broker = ThreadBroker(dataclasses.replace(config)).start()
    broker.stop()
    started = [r for r in rows(trace_dir) if r["event"] == "broker_started"]
    assert started[1]["reason"] == (f"heartbeat_ms=50 exact=1 previous_boot={hb[0]} "
                                    f"last_heartbeat={hb[1]}")


def test_heartbeats_and_flushes_keep_intervals_below_the_housekeeping_tick(
        tmp_path: Path) -> None:
    """A 50 ms heartbeat (each one flushed) reaches the file every ~50 ms, not every
    housekeeping tick (500 ms): the audit's crash bound is the configured interval."""
    trace_dir = tmp_path / "trace"
    config = make_config(tmp_path / "data", broker_name="hb",
                         trace=TraceConfig(enabled=True, directory=trace_dir,
                                           flush_interval_ms=20, heartbeat_interval_ms=50))
    broker = ThreadBroker(config).start()
    try:
        beats = poll(lambda: [r["ts"] for r in rows(trace_dir) if r["event"] == "heartbeat"]
                     if sum(r["event"] == "heartbeat" for r in rows(trace_dir)) >= 8 else [],
                     10, "8 heartbeats in the file")
    finally:
        broker.stop()
    gaps = [(b - a) / 1000 for a, b in itertools.pairwise(beats)]
    assert sorted(gaps)[len(gaps) // 2] < 250, gaps  # median gap: ~50 ms, never ~500
