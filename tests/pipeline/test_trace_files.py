"""A real broker with tracing on writes the documented trace files (no Spark needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.config.model import TraceConfig
from meshmq.core import trace as tr
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
    (path,) = trace_dir.iterdir()
    assert path.name.startswith("trace-tb-") and path.suffix == ".jsonl"  # sealed at stop
    got = rows(trace_dir)
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
    first, second = (pq.read_table(f).to_pylist() for f in files)
    assert [r["event"] for r in first] == ["broker_started"] + ["received", "stored"] * 3 + [
        "broker_stopped"]
    assert [r["event"] for r in second] == ["broker_started", "recovered", "recovered",
                                            "recovered", "broker_stopped"]
    assert [r["message_id"] for r in second[1:4]] == [r["message_id"] for r in first[1:7:2]]
