"""A small table written from the driver reads back as Spark's own writer's copy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _frame(spark: Any) -> Any:
    # The column kinds the audit's small tables hold: strings, longs, doubles,
    # booleans, timestamps, string arrays, nulls in each.
    rows = [("west>east", 3, 1.5, True, dt.datetime(2026, 1, 2, 3, 4, 5, 123456),
             ["west", "east"]),
            (None, None, None, None, None, None),
            ("b0", 7, 0.25, False, dt.datetime(2026, 1, 2, 3, 4, 15), [])]
    return spark.createDataFrame(
        rows, "path_text string, messages long, p50_ms double, consumed boolean, "
              "window_start timestamp, served_by array<string>")


def test_driver_write_matches_spark_writer(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from meshmq.pipeline import small_tables

    frame = _frame(spark)
    frame.write.parquet(str(tmp_path / "by_spark"))
    target = tmp_path / "by_driver"
    target.mkdir()
    (target / "stale.parquet").write_bytes(b"an earlier table's file")
    small_tables.write(frame, str(target), target)

    files = sorted(p.name for p in target.iterdir())
    assert files[0] == "_SUCCESS" and len(files) == 2 and files[1].startswith("part-")
    by_spark = spark.read.parquet(str(tmp_path / "by_spark"))
    by_driver = spark.read.parquet(str(target))
    assert by_driver.schema == by_spark.schema
    assert sorted(by_driver.collect(), key=str) == sorted(by_spark.collect(), key=str)
    # Readers without Spark see the same types and values too.
    arrow_spark = pq.read_table(tmp_path / "by_spark")
    arrow_driver = pq.read_table(target)
    assert arrow_driver.schema.remove_metadata() == arrow_spark.schema.remove_metadata()
    assert sorted(arrow_driver.to_pylist(), key=str) == sorted(arrow_spark.to_pylist(),
                                                               key=str)


def test_remote_location_is_uploaded_through_hadoop(spark: Any, tmp_path: Path) -> None:
    # A file: URI with no local directory given takes the Hadoop upload path.
    from meshmq.pipeline import small_tables

    frame = _frame(spark)
    target = tmp_path / "remote"
    target.mkdir()
    (target / "stale.parquet").write_bytes(b"an earlier table's file")
    small_tables.write(frame, target.as_uri(), None)
    assert not (target / "stale.parquet").exists()
    assert sorted(spark.read.parquet(target.as_uri()).collect(), key=str) == sorted(
        frame.collect(), key=str)
