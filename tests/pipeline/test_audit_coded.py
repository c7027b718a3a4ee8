"""The integer-coded journeys and the driver-built small tables against the reference
transforms of ``meshmq.pipeline.audit``, row for row, on hand-made traces."""

from __future__ import annotations

from typing import Any

import pytest

from meshmq.core import trace as tr
from tests.pipeline import test_audit_crash_verdicts as verdicts
from tests.pipeline import test_audit_transforms as transforms
from tests.pipeline.test_audit_transforms import ev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LOOSE = "heartbeat_ms=500 exact=0"

# What the other traces do not have: deliveries to several consumers on several
# brokers after a recovery, a dedup id missing from a bridged copy, drop reasons,
# ties within a microsecond, a message with no traced arrival and no destination.
ODD = [
    ev(0, "broker_started", broker="a", boot="a1", reason=LOOSE),
    ev(0, "broker_started", broker="b", boot="b1", reason=LOOSE),
    # r1: received on a, delivered to c1 and c2 on a, forwarded, delivered on b (twice),
    # a restarts and recovers it with a dispatch mark; c2 on a acks.
    ev(1, "received", broker="a", boot="a1", mid="r1", persistent=True, dedup_id="k"),
    ev(1.1, "dispatched", broker="a", boot="a1", mid="r1", consumer="c1", dedup_id="k"),
    ev(1.1, "dispatched", broker="a", boot="a1", mid="r1", consumer="c2", dedup_id="k"),
    ev(1.2, "forwarded", broker="a", boot="a1", mid="r1", peer="b", connector="n",
       dedup_id="k"),
    ev(1.3, "received_from_bridge", broker="b", boot="b1", mid="r1", peer="a"),
    ev(1.4, "dispatched", broker="b", boot="b1", mid="r1", consumer="c1"),
    ev(2, "broker_started", broker="a", boot="a2",
       reason=LOOSE + " previous_boot=a1 last_heartbeat=1900000"),
    ev(2, "recovered", broker="a", boot="a2", mid="r1", delivery_count=3, dedup_id="k"),
    ev(2.1, "dispatched", broker="a", boot="a2", mid="r1", consumer="c2", dedup_id="k"),
    ev(2.1, "redelivered", broker="b", boot="b1", mid="r1", consumer="c1"),
    ev(2.2, "acked", broker="a", boot="a2", mid="r1", consumer="c2", dedup_id="k"),
    ev(2.3, "dispatched", broker="b", boot="b1", mid="r1", consumer="c1"),
    # r2: resent under r1's dedup id, delivered once on b.
    ev(3, "received", broker="b", boot="b1", mid="r2", dedup_id="k", persistent=True),
    ev(3.1, "delivered", broker="b", boot="b1", mid="r2", consumer="c3", dedup_id="k"),
    # r3, r4: dropped and denied, with reasons; r3 received on a and b in the same
    # microsecond.
    ev(4, "received", broker="b", boot="b1", mid="r3", dest="topic://t"),
    ev(4, "received", broker="a", boot="a2", mid="r3", dest="topic://u"),
    ev(4, "dropped", broker="a", boot="a2", mid="r3", dest="topic://t",
       reason="no subscriber"),
    ev(4.5, "denied", broker="b", boot="b1", mid="r4", reason="user x may not send"),
    ev(4.6, "dropped", broker="b", boot="b1", mid="r4", reason="a later reason"),
    # r5: only a dispatch and an ack traced (sampling), no destination.
    ev(5, "dispatched", broker="b", boot="b1", mid="r5", dest=None, consumer="c9"),
    ev(5.1, "acked", broker="b", boot="b1", mid="r5", dest=None, consumer="c9"),
    ev(6, "heartbeat", broker="b", boot="b1"),
    ev(7, "broker_stopped", broker="b", boot="b1"),
]

TRACES = {"transforms": transforms.ROWS, "verdicts": verdicts.ROWS, "odd": ODD}


def _types(frame: Any) -> list[tuple[str, str]]:
    """Column names and types (nullability aside: the written files do not keep it)."""
    return [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]


def _sorted_rows(frame: Any) -> list[dict[str, Any]]:
    return sorted((r.asDict(recursive=True) for r in frame.collect()), key=str)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_coded_journeys_equal_the_reference(spark: Any, name: str) -> None:
    from meshmq.pipeline import audit, catalog, coded

    events = spark.createDataFrame(TRACES[name], tr.SPARK_DDL)
    cat = catalog.build([r.asDict() for r in
                         catalog.catalog_rows(events, "10 seconds").collect()])
    assert coded.supported(cat)
    boot_table = spark.createDataFrame(cat.boots, catalog.BOOTS_DDL)
    reference = audit.journeys(events, audit.boots(events))
    got = coded.journeys(events, cat, boot_table)
    assert _types(got) == _types(reference)
    assert _sorted_rows(got) == _sorted_rows(reference)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_driver_built_small_tables_equal_the_reference(spark: Any, name: str) -> None:
    from meshmq.pipeline import audit, audit_job

    events = spark.createDataFrame(TRACES[name], tr.SPARK_DDL)
    tables = audit_job.compute(events, window="10 seconds")
    reference_boots = audit.boots(events)
    stats = audit.event_stats(events, "10 seconds")
    reference = {"boots": reference_boots, "failovers": audit.failover_windows(reference_boots),
                 "throughput": audit.throughput(events, "10 seconds", stats),
                 "bridges": audit.bridges(events, "10 seconds", stats)}
    for table, frame in reference.items():
        mine = getattr(tables, table)
        assert _types(mine) == _types(frame), table
        # Sorted tables keep their order; boots is a set of runs.
        want = [r.asDict() for r in frame.collect()]
        have = [r.asDict() for r in mine.collect()]
        if table == "boots":
            want, have = sorted(want, key=str), sorted(have, key=str)
        assert have == want, table


def test_traces_the_codes_do_not_fit_take_the_reference_path(
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from meshmq.pipeline import audit_job, coded

    events = spark.createDataFrame(ODD, tr.SPARK_DDL)
    coded_tables = audit_job.compute(events)
    monkeypatch.setattr(coded, "MAX_BROKERS", 1)
    reference_tables = audit_job.compute(events)
    for table in ("journeys", "duplicates", "lost", "summary", "paths", "latency"):
        assert _sorted_rows(getattr(coded_tables, table)) == \
            _sorted_rows(getattr(reference_tables, table)), table
