"""The journeys computed in Python workers over Arrow batches against the reference
transforms of ``meshmq.pipeline.audit`` and the integer-coded path, row for row, on
hand-made traces (those of the coded path's tests and a few more)."""

from __future__ import annotations

from typing import Any

import pytest

from meshmq.core import trace as tr
from tests.pipeline.test_audit_coded import TRACES, _sorted_rows, _types
from tests.pipeline.test_audit_transforms import ev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXACT = "heartbeat_ms=1000 exact=1"

# What the array code treats apart: a stored event without a reason as a message's
# only event (the reference's "streamed" is null, not false), a stream destination's
# store, null sizes and persistence at the origin, an ack by a consumer without an id,
# a drop without a reason, a delivery after a recovery on another broker, and a
# forward to a peer that restarted cleanly.
EDGE = [
    ev(0, "broker_started", broker="a", boot="a1", reason=EXACT),
    ev(0, "broker_started", broker="b", boot="b1", reason="heartbeat_ms=1000 exact=0"),
    ev(1, "stored", broker="a", boot="a1", mid="s1"),
    ev(1, "received", broker="a", boot="a1", mid="s2", dest="queue://stream"),
    ev(1.1, "stored", broker="a", boot="a1", mid="s2", dest="queue://stream", reason="stream"),
    ev(2, "received", broker="a", boot="a1", mid="n1", size=None, persistent=None),
    ev(2, "received", broker="b", boot="b1", mid="n1", size=7, persistent=True),
    ev(2.1, "dispatched", broker="a", boot="a1", mid="n1", consumer=None),
    ev(2.2, "acked", broker="a", boot="a1", mid="n1", consumer=None),
    ev(3, "dropped", broker="b", boot="b1", mid="d0", reason=None),
    ev(4, "received", broker="a", boot="a1", mid="f1", persistent=True),
    ev(4.1, "forwarded", broker="a", boot="a1", mid="f1", peer="b", connector="n"),
    ev(4.5, "received", broker="b", boot="b1", mid="g1", persistent=True),
    ev(4.6, "dispatched", broker="b", boot="b1", mid="g1", consumer="c1"),
    ev(5, "broker_stopped", broker="b", boot="b1"),
    ev(6, "broker_started", broker="b", boot="b2", reason=EXACT + " previous_boot=b1"),
    ev(6, "recovered", broker="b", boot="b2", mid="g1", delivery_count=2),
    ev(6.1, "dispatched", broker="b", boot="b2", mid="g1", consumer="c1"),
    ev(6.2, "dispatched", broker="a", boot="a1", mid="g1", consumer="c2"),
    ev(6.3, "acked", broker="b", boot="b2", mid="g1", consumer="c1"),
    ev(7, "broker_stopped", broker="a", boot="a1"),
    ev(8, "broker_started", broker="a", boot="a2", reason=EXACT + " previous_boot=a1"),
]

ALL = {**TRACES, "edge": EDGE}


def _catalog(spark: Any, rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    from meshmq.pipeline import catalog

    events = spark.createDataFrame(rows, tr.SPARK_DDL)
    return events, catalog.build([r.asDict() for r in
                                  catalog.catalog_rows(events, "10 seconds").collect()])


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("name", sorted(ALL))
def test_arrow_journeys_equal_the_reference_and_the_coded_path(
        spark: Any, name: str, partitions: int) -> None:
    from meshmq.pipeline import arrow_journeys, audit, catalog, coded

    events, cat = _catalog(spark, ALL[name])
    assert arrow_journeys.supported(cat)
    copies = arrow_journeys.copies(events, cat)
    assert copies is not None
    got = arrow_journeys.journeys(events, cat, copies, partitions=partitions)
    reference = audit.journeys(events, audit.boots(events))
    assert _types(got) == _types(reference)
    want = _sorted_rows(reference)
    assert _sorted_rows(got) == want
    assert _sorted_rows(coded.journeys(events, cat, spark.createDataFrame(
        cat.boots, catalog.BOOTS_DDL))) == want


def test_resends_are_looked_up_only_when_deliveries_carry_a_dedup_id(spark: Any) -> None:
    from meshmq.pipeline import arrow_journeys

    _, edge = _catalog(spark, EDGE)
    assert edge.dedup_deliveries == 0
    assert arrow_journeys.copies(spark.createDataFrame([], tr.SPARK_DDL), edge) == {}
    events, odd = _catalog(spark, TRACES["odd"])
    assert odd.dedup_deliveries > 0
    assert arrow_journeys.copies(events, odd) == {"k": "r1"}


def test_the_audit_takes_the_arrow_path_and_falls_back_to_the_coded_one(
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from meshmq.pipeline import arrow_journeys, audit_job

    events = spark.createDataFrame(TRACES["verdicts"], tr.SPARK_DDL)
    arrow = audit_job.compute(events)
    assert "MapInArrow" in arrow.journeys._jdf.queryExecution().executedPlan().toString()
    coded_tables = audit_job.compute(events, journeys="coded")
    monkeypatch.setattr(arrow_journeys, "MAX_BROKERS", 1)
    fallback = audit_job.compute(events)
    assert "MapInArrow" not in fallback.journeys._jdf.queryExecution().executedPlan() \
        .toString()
    for table in ("journeys", "summary", "lost", "duplicates", "paths", "latency", "stuck"):
        want = _sorted_rows(getattr(coded_tables, table))
        assert _sorted_rows(getattr(arrow, table)) == want, table
        assert _sorted_rows(getattr(fallback, table)) == want, table


def test_an_empty_partition_gives_no_rows() -> None:
    import pyarrow as pa

    from meshmq.pipeline import journey_arrays

    plan = journey_arrays.Plan(kinds=tuple(tr.EVENT_KINDS), ranks=(0,) * 16, brokers=(),
                               destinations=(), runs=(), copies={})
    assert list(journey_arrays.map_partition(plan)(iter([]))) == []
    empty = pa.table({c: pa.array([], pa.string()) for c in journey_arrays.INPUT_COLUMNS})
    assert journey_arrays.journeys(empty, plan).schema == journey_arrays.SCHEMA


def test_journeys_written_by_the_workers_read_back_as_spark_wrote_them(
        spark: Any, tmp_path: Any) -> None:
    from meshmq.pipeline import arrow_journeys, audit

    events, cat = _catalog(spark, TRACES["verdicts"])
    target = tmp_path / "journeys"
    target.mkdir()
    (target / "stale.parquet").write_bytes(b"an earlier table's file")
    written, _ = arrow_journeys.write_local(
        events, cat, arrow_journeys.copies(events, cat) or {}, target, partitions=3)
    reference = audit.journeys(events, audit.boots(events))
    reference.write.parquet(str(tmp_path / "by_spark"))
    by_spark = spark.read.parquet(str(tmp_path / "by_spark"))
    by_workers = spark.read.parquet(str(target))
    assert "stale.parquet" not in {p.name for p in target.iterdir()}
    assert (target / "_SUCCESS").exists()
    assert by_workers.schema == by_spark.schema
    assert written == by_spark.count()
    assert _sorted_rows(by_workers) == _sorted_rows(by_spark)
    # No messages: one file with the schema, as Spark's writer leaves.
    none = tmp_path / "none"
    assert arrow_journeys.write_local(events.where("message_id = ''"), cat, {}, none)[0] == 0
    assert spark.read.parquet(str(none)).schema == by_spark.schema


def test_driver_built_tables_written_without_spark_read_back_as_spark_wrote_them(
        spark: Any, tmp_path: Any) -> None:
    from meshmq.pipeline import audit_job

    events = spark.createDataFrame(TRACES["odd"], tr.SPARK_DDL)
    tables = audit_job.compute(events)
    assert set(tables.driver_rows) == {"throughput", "bridges", "boots", "failovers"}
    for name, (rows, ddl) in tables.driver_rows.items():
        assert rows, name
        audit_job.write_rows(spark, rows, ddl, tmp_path / name)
        getattr(tables, name).write.parquet(str(tmp_path / f"{name}-spark"))
        by_spark = spark.read.parquet(str(tmp_path / f"{name}-spark"))
        mine = spark.read.parquet(str(tmp_path / name))
        assert mine.schema == by_spark.schema, name
        assert _sorted_rows(mine) == _sorted_rows(by_spark), name


@pytest.mark.parametrize("name", sorted(ALL))
def test_written_tables_equal_those_of_the_coded_path(spark: Any, tmp_path: Any,
                                                      name: str) -> None:
    # Summary, paths, lost, duplicates and stuck are built on the driver from what the
    # workers send back; the coded path computes them with Spark from the journeys.
    from meshmq.pipeline import audit_job

    events = spark.createDataFrame(ALL[name], tr.SPARK_DDL)
    arrow = audit_job.compute(events, stuck_after_ms=1)
    coded_tables = audit_job.compute(events, stuck_after_ms=1, journeys="coded")
    audit_job.write_tables(arrow, tmp_path / "arrow")
    audit_job.write_tables(coded_tables, tmp_path / "coded")
    assert arrow.write_journeys is not None and coded_tables.write_journeys is None
    for table, _ in arrow.items():
        mine = spark.read.parquet(str(tmp_path / "arrow" / table))
        want = spark.read.parquet(str(tmp_path / "coded" / table))
        assert mine.schema == want.schema, table
        if table == "journeys":
            assert _sorted_rows(mine) == _sorted_rows(want)
        elif table == "paths":  # ordered by messages (descending) and path only
            have = [r.asDict() for r in mine.collect()]
            assert have == sorted(have, key=lambda r: (-r["messages"], r["path_text"]))
            assert sorted(have, key=str) == _sorted_rows(want)
        else:  # one file each, in the table's order
            assert [r.asDict(recursive=True) for r in mine.collect()] == \
                [r.asDict(recursive=True) for r in want.collect()], table
        # The frames the report reads hold the same rows as the written tables.
        assert _sorted_rows(getattr(arrow, table)) == _sorted_rows(mine), table
    assert spark.read.parquet(str(tmp_path / "arrow" / "stuck")).count() > 0 or \
        name != "transforms"
