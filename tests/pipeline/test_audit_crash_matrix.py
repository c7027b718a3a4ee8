"""Crash matrix: real ``meshmq broker`` subprocesses with exact tracing, killed with
SIGKILL mid-stream; the test's own clients record the ground truth (every message
id delivered, how often) and the audit must agree with it: nothing delivered is
called lost, every duplicate delivery is found, and what the trace cannot decide is
``unknown``."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from tests.pipeline.test_audit_end_to_end import TracedNode
from tests.support.brokers import poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 200


class ExactNode(TracedNode):
    def write_config(self) -> Path:
        path = super().write_config()
        with path.open("a") as f:
            f.write("exact = true\nheartbeat_interval_ms = 100\n")
        return path


def audit(spark: Any, *dirs: Path) -> dict[str, dict[str, Any]]:
    from meshmq.pipeline.audit_job import compute, read_traces

    tables = compute(read_traces(spark, list(dirs)), cache_events=False)
    journeys = {r["message_id"]: r.asDict() for r in tables.journeys.collect()}
    dups = {r["key"] for r in tables.duplicates.collect() if r["kind"] == "redelivered"}
    return {"journeys": journeys, "dups": {k: {} for k in dups}}


def test_receiving_broker_killed_mid_stream(tmp_path: Path, spark: Any) -> None:
    west = ExactNode("west", tmp_path / "west").start()
    east = ExactNode("east", tmp_path / "east").connect_to(
        f"static:({west.uri})", name="east-west").start()
    received: collections.Counter[str] = collections.Counter()
    try:
        east.wait_forwarding()
        consumer = SimpleStompClient("127.0.0.1", west.port)
        consumer.subscribe("/queue/m.orders", "c", ack="client-individual")
        poll(lambda: east.destination("m.orders")["consumers"] >= 1, 30, "west's demand")

        def produce() -> None:
            with SimpleStompClient("127.0.0.1", east.port) as producer:
                for i in range(N):
                    producer.send("/queue/m.orders", f"o{i}".encode(), {"persistent": "true"})

        sender = threading.Thread(target=produce)
        sender.start()
        while sum(received.values()) < N // 3:
            frame = consumer.receive(timeout=20)
            assert frame is not None
            received[frame.get("message-id") or ""] += 1
            consumer.ack(frame)
        west.kill9()
        consumer.sock.close()
        sender.join(60)
        west.start()
        with SimpleStompClient("127.0.0.1", west.port) as again:
            again.subscribe("/queue/m.orders", "c2", ack="client-individual")
            while len(received) < N:
                frame = again.receive(timeout=30)
                assert frame is not None, f"only {len(received)} of {N} delivered"
                received[frame.get("message-id") or ""] += 1
                again.ack(frame)
            assert again.receive(timeout=1) is None
    finally:
        east.stop()
        west.stop()
    got = audit(spark, tmp_path / "east" / "trace", tmp_path / "west" / "trace")
    journeys = got["journeys"]
    assert set(journeys) == set(received)
    status = collections.Counter(r["status"] for r in journeys.values())
    assert status["lost"] == 0 and status["in_transit"] == 0 and status["pending"] == 0
    assert status["consumed"] + status["unknown"] == N
    truth_dups = {mid for mid, n in received.items() if n > 1}
    assert truth_dups <= set(got["dups"])
