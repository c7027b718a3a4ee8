"""The audit transforms on small hand-made trace frames with a real local Spark."""

from __future__ import annotations

from typing import Any

import pytest

from meshmq.core import trace as tr

# Spark jobs on a shared 2-core machine: allow more than the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

S = 1_000_000  # one second in trace microseconds


def ev(ts: float, event: str, broker: str = "b1", boot: str = "1", mid: str = "",
       dest: str = "queue://q", **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in tr.COLUMN_NAMES}
    row.update(v=1, ts=round(ts * S), event=event, broker=broker, boot=boot, message_id=mid,
               destination=dest if mid else "", msg_ts=0, size=3, persistent=False, path=[])
    row.update(extra)
    return row


ROWS = [
    # b1's first run traces in exact mode: what it did not trace, it did not do.
    ev(0, "broker_started", reason="heartbeat_ms=1000 exact=1"),
    ev(0, "broker_started", broker="b2"),
    ev(0, "broker_started", broker="b3"),
    # m1: a normal journey on b1, 2 ms from accepted to dispatched.
    ev(1, "received", mid="m1", persistent=True), ev(1.001, "stored", mid="m1"),
    ev(1.002, "dispatched", mid="m1", delivery_count=1, consumer="c1"),
    ev(1.003, "acked", mid="m1", consumer="c1"),
    # m2: accepted by b1, which then crashed (exact trace: never delivered); it never
    # came back: lost.
    ev(2, "received", mid="m2"),
    # m3: stored on b1 and recovered after the restart: still pending there.
    ev(2, "received", mid="m3", persistent=True), ev(2, "stored", mid="m3"),
    # m4: dispatched before the crash, recovered and delivered again: a duplicate.
    ev(2, "received", mid="m4", persistent=True),
    ev(2.5, "dispatched", mid="m4", delivery_count=1, consumer="c1"),
    # b1 crashes at ~2.5 s and comes back at 5 s as boot 2.
    ev(5, "broker_started", boot="2"), ev(5, "recovered", boot="2", mid="m3"),
    ev(5, "recovered", boot="2", mid="m4", delivery_count=1),
    ev(5.1, "dispatched", boot="2", mid="m4", delivery_count=2, consumer="c9"),
    ev(5.2, "acked", boot="2", mid="m4", consumer="c9"),
    # m5 and m6: one dedup id sent twice, both consumed (auto-ack): resent.
    ev(3, "received", broker="b2", mid="m5", dedup_id="d-1"),
    ev(3.01, "delivered", broker="b2", mid="m5", dedup_id="d-1", consumer="c2"),
    ev(3.1, "received", broker="b2", mid="m6", dedup_id="d-1"),
    ev(3.13, "delivered", broker="b2", mid="m6", dedup_id="d-1", consumer="c2"),
    # m7: b1 -> b2 over a bridge, consumed on b2.
    ev(4, "received", mid="m7"), ev(4.001, "forwarded", mid="m7", peer="b2", connector="n1"),
    ev(4.002, "received_from_bridge", broker="b2", mid="m7", peer="b1", connector="n1",
       path=["b1"]),
    ev(4.010, "delivered", broker="b2", mid="m7", path=["b1"], consumer="c2"),
    # m8: forwarded b2 -> b3 and not arrived yet: in transit.
    ev(6, "received", broker="b2", mid="m8"),
    ev(6.001, "forwarded", broker="b2", mid="m8", peer="b3", connector="n2"),
    # m9: a topic message nobody subscribed to.
    ev(6, "received", broker="b3", mid="m9", dest="topic://t"),
    ev(6, "dropped", broker="b3", mid="m9", dest="topic://t", reason="no subscriber"),
    # m12: appended to a stream on b1 before the crash: retained, not lost.
    ev(2, "received", mid="m12", dest="queue://stream.s"),
    ev(2, "stored", mid="m12", dest="queue://stream.s", reason="stream"),
    # m10: pending on b3 for 100 s while b2 serves consumers of the same queue.
    ev(7, "received", broker="b3", mid="m10"),
    ev(50, "received", broker="b2", mid="m11"),
    ev(107, "delivered", broker="b2", mid="m11", consumer="c2"),
]


@pytest.fixture(scope="module")
def tables(spark: Any) -> Any:
    from meshmq.pipeline.audit_job import compute

    events = spark.createDataFrame(ROWS, tr.SPARK_DDL)
    return compute(events, stuck_after_ms=60_000, window="10 seconds")


def rows(frame: Any) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in frame.collect()]


def by_id(tables: Any) -> dict[str, dict[str, Any]]:
    return {r["message_id"]: r for r in rows(tables.journeys)}


def test_final_status_of_every_message(tables: Any) -> None:
    status = {mid: r["status"] for mid, r in by_id(tables).items()}
    assert status == {"m1": "consumed", "m2": "lost", "m3": "pending", "m4": "consumed",
                      "m5": "consumed", "m6": "consumed", "m7": "consumed",
                      "m8": "in_transit", "m9": "dropped", "m10": "pending",
                      "m11": "consumed", "m12": "retained"}
    summary = {r["status"]: r["messages"] for r in rows(tables.summary)}
    assert summary == {"consumed": 6, "dead_lettered": 0, "expired": 0, "dropped": 1,
                       "retained": 1, "pending": 2, "in_transit": 1, "resent": 0,
                       "lost": 1, "unknown": 0}


def test_lost_messages_name_where_they_were_last_seen(tables: Any) -> None:
    (lost,) = rows(tables.lost)
    assert lost["message_id"] == "m2" and lost["last_broker"] == "b1"
    assert lost["last_event"] == "received" and lost["holder_restarted_ts"] == 5 * S


def test_duplicates_are_redeliveries_and_resends(tables: Any) -> None:
    got = [(r["kind"], r["key"], r["message_ids"], r["deliveries"]) for r in
           rows(tables.duplicates)]
    assert got == [("redelivered", "m4", ["m4"], 2), ("resent", "d-1", ["m5", "m6"], 2)]


def test_paths_hops_and_latency(tables: Any) -> None:
    journeys = by_id(tables)
    assert journeys["m7"]["path"] == ["b1", "b2"] and journeys["m7"]["hops"] == 1
    assert journeys["m7"]["latency_ms"] == pytest.approx(10.0)
    assert journeys["m1"]["latency_ms"] == pytest.approx(2.0)
    assert journeys["m1"]["ack_latency_ms"] == pytest.approx(3.0)
    paths = {(r["path_text"], r["hops"]): r["messages"] for r in rows(tables.paths)}
    assert paths[("b1>b2", 1)] == 1 and paths[("b2", 0)] == 3
    assert paths[("b2", 1)] == 1  # m8, forwarded on but not arrived yet
    latency = {(r["destination"], r["path_text"]): r for r in rows(tables.latency)}
    assert latency[("queue://q", "b1>b2")]["p50_ms"] == pytest.approx(10.0)
    assert latency[("queue://q", "b2")]["messages"] == 3  # m5, m6, m11
    assert latency[("queue://q", "b2")]["max_ms"] == pytest.approx(57_000.0)


def test_stuck_messages_and_consumers_elsewhere(tables: Any) -> None:
    # m3 waits on b1 since its restart, m10 on b3; b2 served queue://q at 107 s.
    m3, m10 = rows(tables.stuck)
    assert (m3["message_id"], m3["last_broker"], m3["age_ms"]) == ("m3", "b1", 102_000.0)
    assert (m10["message_id"], m10["last_broker"], m10["age_ms"]) == ("m10", "b3", 100_000.0)
    assert m10["consumers_elsewhere"] and m10["served_by"] == ["b2"]
    assert m3["consumers_elsewhere"] and m3["served_by"] == ["b2"]


def test_failover_windows_and_boots(tables: Any) -> None:
    (window,) = rows(tables.failovers)
    assert (window["broker"], window["kind"], window["down_from_ts"], window["up_again_ts"]) \
        == ("b1", "crash", round(4.001 * S), 5 * S)
    assert len(rows(tables.boots)) == 4


def test_throughput_and_bridges_per_window(tables: Any) -> None:
    through = {(r["broker"], r["event"]): r["events"] for r in rows(tables.throughput)
               if r["window_start"].second == 0}
    assert through[("b1", "received")] == 6 and through[("b2", "delivered")] == 3
    (bridge, second) = rows(tables.bridges)
    assert (bridge["broker"], bridge["peer"], bridge["connector"], bridge["messages"]) == \
        ("b1", "b2", "n1", 1)
    assert second["peer"] == "b3"
