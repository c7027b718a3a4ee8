"""The audit's verdicts after unclean stops, on hand-made trace frames: what the trace
cannot decide is ``unknown`` (with a reason), never lost or in transit; failover
windows start at the last heartbeat; end-to-end latency ends at the delivery the
consumer acked."""

from __future__ import annotations

from typing import Any

import pytest

from meshmq.core import trace as tr
from tests.pipeline.test_audit_transforms import S, ev, rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXACT = "heartbeat_ms=1000 exact=1"
LOOSE = "heartbeat_ms=1000 exact=0"

ROWS = [
    ev(0, "broker_started", broker="east", boot="e1", reason=LOOSE),
    ev(0, "broker_started", broker="west", boot="w1", reason=LOOSE),
    ev(0, "broker_started", broker="x", boot="x1", reason=EXACT),
    # u1: forwarded east -> west; west's run crashed before its trace was flushed.
    ev(1, "received", broker="east", boot="e1", mid="u1", persistent=True),
    ev(1.001, "forwarded", broker="east", boot="e1", mid="u1", peer="west", connector="n"),
    # u3: accepted by west, which crashed (not exact); not recovered.
    ev(2, "received", broker="west", boot="w1", mid="u3", persistent=True),
    # d1: delivered on west, then (bridged copy) delivered on east: two deliveries.
    ev(3, "received", broker="west", boot="w1", mid="d1"),
    ev(3.01, "dispatched", broker="west", boot="w1", mid="d1", consumer="c1",
       delivery_count=1),
    ev(3.02, "delivered", broker="east", boot="e1", mid="d1", consumer="c2"),
    # p1: recovered after west's crash with a dispatch mark, delivered once (traced).
    ev(4, "received", broker="west", boot="w1", mid="p1", persistent=True),
    # e2e: send on east at 5 s; west delivered to c1 (not acked), redelivered to c2 at
    # 5.05 s, which acked at 5.06 s.
    ev(5, "received", broker="east", boot="e1", mid="e2e", msg_ts=4_999),
    ev(5.001, "forwarded", broker="east", boot="e1", mid="e2e", peer="west", connector="n"),
    ev(5.01, "received_from_bridge", broker="west", boot="w1", mid="e2e", peer="east"),
    ev(5.02, "dispatched", broker="west", boot="w1", mid="e2e", consumer="c1",
       delivery_count=1),
    ev(5.04, "redelivered", broker="west", boot="w1", mid="e2e", consumer="c1"),
    ev(5.05, "dispatched", broker="west", boot="w1", mid="e2e", consumer="c2",
       delivery_count=2),
    ev(5.06, "acked", broker="west", boot="w1", mid="e2e", consumer="c2"),
    ev(10, "heartbeat", broker="west", boot="w1"),
    # west's next run: the heartbeat file says w1 was alive at 12.5 s (its trace after
    # 10 s died with it).
    ev(13, "broker_started", broker="west", boot="w2",
       reason=LOOSE + " previous_boot=w1 last_heartbeat=12500000"),
    ev(13, "recovered", broker="west", boot="w2", mid="p1", delivery_count=1),
    ev(13.5, "dispatched", broker="west", boot="w2", mid="p1", consumer="c3",
       delivery_count=2),
    ev(13.6, "acked", broker="west", boot="w2", mid="p1", consumer="c3"),
    # x: an exact run. l1 accepted, never dispatched: lost. k1 dispatched, no ack
    # traced: unknown. f1 forwarded to west after west's restart, and west (running,
    # its trace intact) never saw it arrive: lost with x's crash.
    ev(20, "received", broker="x", boot="x1", mid="l1"),
    ev(20, "received", broker="x", boot="x1", mid="k1"),
    ev(20.1, "dispatched", broker="x", boot="x1", mid="k1", consumer="c4", delivery_count=1),
    ev(20.2, "received", broker="x", boot="x1", mid="f1"),
    ev(20.3, "forwarded", broker="x", boot="x1", mid="f1", peer="west", connector="n"),
    # r1: accepted by x with a dedup-id, taken by the crash before it was stored or
    # delivered; its producer sent it again to x's next run as r2, which was consumed:
    # delivered, so not lost. u4 the same on west's run, which was not exact (its own
    # trace cannot decide, but the copy's delivery does).
    ev(20.25, "received", broker="x", boot="x1", mid="r1", dedup_id="order-7"),
    ev(8, "received", broker="west", boot="w1", mid="u4", dedup_id="order-8"),
    ev(30, "broker_started", broker="x", boot="x2", reason=EXACT),
    ev(30.1, "received", broker="x", boot="x2", mid="r2", dedup_id="order-7"),
    ev(30.2, "dispatched", broker="x", boot="x2", mid="r2", consumer="c5", delivery_count=1,
       dedup_id="order-7"),
    ev(30.3, "acked", broker="x", boot="x2", mid="r2", consumer="c5", dedup_id="order-7"),
    ev(30.4, "received", broker="x", boot="x2", mid="u5", dedup_id="order-8"),
    ev(30.5, "delivered", broker="x", boot="x2", mid="u5", consumer="c6",
       dedup_id="order-8"),
    # A shared-store pair whose brokers have different names: pa's run ends when pb
    # takes its lease over, not at a later start of pa (there is none). t1 was taken
    # before it was stored and resent to pb as t2; t3 was delivered, no ack traced;
    # t4 was accepted and neither stored nor resent; t5 was stored and pb recovered it.
    ev(40, "broker_started", broker="pa", boot="a1", reason=EXACT + " holder=pa%40h%3A1"),
    ev(41, "received", broker="pa", boot="a1", mid="t1", dedup_id="order-9"),
    ev(41.1, "received", broker="pa", boot="a1", mid="t3"),
    ev(41.2, "dispatched", broker="pa", boot="a1", mid="t3", consumer="c7", delivery_count=1),
    ev(41.3, "received", broker="pa", boot="a1", mid="t4"),
    ev(41.4, "received", broker="pa", boot="a1", mid="t5", persistent=True),
    ev(45, "heartbeat", broker="pa", boot="a1"),
    ev(50, "broker_started", broker="pb", boot="b1",
       reason=EXACT + " holder=pb%40h%3A2 took_over=pa%40h%3A1"),
    ev(50, "recovered", broker="pb", boot="b1", mid="t5"),
    ev(50.1, "received", broker="pb", boot="b1", mid="t2", dedup_id="order-9"),
    ev(50.2, "dispatched", broker="pb", boot="b1", mid="t2", consumer="c8", delivery_count=1,
       dedup_id="order-9"),
    ev(50.3, "acked", broker="pb", boot="b1", mid="t2", consumer="c8", dedup_id="order-9"),
    ev(50.4, "dispatched", broker="pb", boot="b1", mid="t5", consumer="c8", delivery_count=1),
    ev(50.5, "acked", broker="pb", boot="b1", mid="t5", consumer="c8"),
]


@pytest.fixture(scope="module")
def tables(spark: Any) -> Any:
    from meshmq.pipeline.audit_job import compute

    return compute(spark.createDataFrame(ROWS, tr.SPARK_DDL), window="10 seconds")


@pytest.fixture(scope="module")
def journeys(tables: Any) -> dict[str, dict[str, Any]]:
    return {r["message_id"]: r for r in rows(tables.journeys)}


def test_what_the_trace_cannot_decide_is_unknown_with_a_reason(
        journeys: dict[str, dict[str, Any]]) -> None:
    verdicts = {mid: (r["status"], r["reason"]) for mid, r in journeys.items()}
    assert verdicts == {
        "u1": ("unknown", "forwarded to west, which crashed before its trace was complete"),
        "u3": ("unknown", "west crashed; its trace was not exact, so a delivery after its "
                          "last flush is missing"),
        "d1": ("consumed", None), "p1": ("consumed", None), "e2e": ("consumed", None),
        "l1": ("lost", None),
        "k1": ("unknown", "delivered to a consumer; no ack traced before x restarted"),
        "f1": ("lost", None),
        "r1": ("resent", "taken by x's restart; sent again with its dedup-id as r2, "
                         "which was delivered"),
        "r2": ("consumed", None),
        "u4": ("resent", "taken by west's restart; sent again with its dedup-id as u5, "
                         "which was delivered"),
        "u5": ("consumed", None),
        "t1": ("resent", "taken by pb's takeover from pa; sent again with its dedup-id as "
                         "t2, which was delivered"),
        "t2": ("consumed", None),
        "t3": ("unknown", "delivered to a consumer; no ack traced before pb took over from "
                          "pa"),
        "t4": ("lost", None), "t5": ("consumed", None)}


def test_a_resent_copy_is_neither_lost_nor_a_duplicate(tables: Any) -> None:
    summary = {r["status"]: r["messages"] for r in rows(tables.summary)}
    assert summary["resent"] == 3 and summary["lost"] == 3  # l1, f1, t4
    assert {r["message_id"] for r in rows(tables.lost)} == {"l1", "f1", "t4"}
    # One copy delivered: not a duplicate delivery.
    assert not [r for r in rows(tables.duplicates) if r["kind"] == "resent"]


def test_deliveries_count_across_brokers_and_recovery_marks(
        tables: Any, journeys: dict[str, dict[str, Any]]) -> None:
    dups = {r["key"]: (r["kind"], r["deliveries"], sorted(r["delivered_by"]))
            for r in rows(tables.duplicates)}
    assert dups == {"d1": ("redelivered", 2, ["east", "west"]),
                    "e2e": ("redelivered", 2, ["west"])}
    # p1 was traced once; the store's dispatch mark says a delivery before the crash
    # may have gone untraced.
    assert (journeys["p1"]["deliveries"], journeys["p1"]["possible_deliveries"]) == (1, 2)
    assert journeys["d1"]["possible_deliveries"] == 2


def test_end_to_end_latency_ends_at_the_delivery_that_was_acked(
        tables: Any, journeys: dict[str, dict[str, Any]]) -> None:
    e2e = journeys["e2e"]
    assert e2e["latency_ms"] == pytest.approx(20.0)  # send -> first dispatch
    assert e2e["e2e_latency_ms"] == pytest.approx(50.0)  # send -> delivery to c2
    assert e2e["ack_latency_ms"] == pytest.approx(60.0)
    assert e2e["consumed_on"] == "west"
    latency = {(r["destination"], r["path_text"]): r for r in rows(tables.latency)}
    assert latency[("queue://q", "east>west")]["e2e_p50_ms"] == pytest.approx(50.0)


def test_failover_windows_start_at_the_last_heartbeat(tables: Any) -> None:
    windows = {r["broker"]: r for r in rows(tables.failovers)}
    west = windows["west"]
    assert (west["kind"], west["down_from_ts"], west["up_again_ts"], west["down_ms"]) == \
        ("crash", round(12.5 * S), 13 * S, 500.0)
    assert west["uncertainty_ms"] == 1000.0 and west["first_service_ts"] == round(13.5 * S)
    # x's crashed run left no heartbeat file: its last traced event bounds it.
    assert windows["x"]["down_from_ts"] == round(20.3 * S)
    boots = {r["boot"]: r for r in rows(tables.boots)}
    assert boots["x1"]["exact"] and not boots["w1"]["exact"]


def test_a_takeover_by_a_differently_named_broker_ends_the_masters_run(tables: Any) -> None:
    boots = {r["boot"]: r for r in rows(tables.boots)}
    assert (boots["a1"]["holder"], boots["b1"]["took_over"]) == ("pa%40h%3A1", "pa%40h%3A1")
    assert (boots["a1"]["next_started_ts"], boots["a1"]["next_broker"]) == (50 * S, "pb")
    assert boots["b1"]["next_started_ts"] is None
    # x's restart is its own: the next run is x's.
    assert boots["x1"]["next_broker"] == "x"
    window = {r["broker"]: r for r in rows(tables.failovers)}["pa"]
    assert (window["kind"], window["down_from_ts"], window["up_again_ts"], window["up_on"],
            window["first_service_ts"]) == ("crash", 45 * S, 50 * S, "pb", round(50.1 * S))
