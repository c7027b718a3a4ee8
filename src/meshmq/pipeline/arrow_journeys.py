"""The journeys computed in Python workers over Arrow batches (the audit's default path).

The JVM scans the trace for the columns the journeys read and hash-partitions the
message events by message id into a few partitions; ``mapInArrow`` hands each
partition to a Python worker, which groups the events per message and computes every
journey column and verdict with numpy and pyarrow (``meshmq.pipeline.journey_arrays``)
and returns the rows as Arrow batches in the journeys' schema.

Why not the integer-coded aggregation (``meshmq.pipeline.coded``) any more: there the
per-message work runs in code Spark generates for each query, and the JVM's compilers
compiled it again in every audit (about 7 of its 18-19 CPU seconds for 1M events);
the array operations here are compiled once, in numpy and Arrow. The coded and the
reference paths stay: ``audit_job.compute(journeys=...)`` picks one, and traces this
path does not support (``supported``) take the coded one (or the reference).

Resends (``audit.delivered_copies``: per dedup id, the first message id that reached
a consumer) span messages of different partitions: when the catalog pass saw
deliveries carrying a dedup id, they are collected once on the driver (up to
``MAX_COPIES``) and travel with the plan.
"""

from __future__ import annotations

import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling

from meshmq.core import trace as tr
from meshmq.pipeline import audit, catalog, journey_arrays

# Executors need not have meshmq installed: the worker code travels with the task.
cloudpickle.register_pickle_by_value(journey_arrays)  # type: ignore[no-untyped-call]

MAX_BROKERS = 64  # a (messages x brokers) matrix per partition for paths
MAX_RUNS = 10_000  # a pass over the messages per run, for the holder's and peer's run
MAX_COPIES = 1_000_000


def supported(cat: catalog.Catalog) -> bool:
    """Whether this path takes the trace: few enough brokers and runs."""
    return len(cat.brokers) <= MAX_BROKERS and len(cat.boots) <= MAX_RUNS


def copies(events: DataFrame, cat: catalog.Catalog) -> dict[str, str] | None:
    """``audit.delivered_copies`` as a dict, or None when there are more than
    ``MAX_COPIES`` (the caller then takes another path)."""
    if not cat.dedup_deliveries:
        return {}
    rows = audit.delivered_copies(events).limit(MAX_COPIES + 1).collect()
    if len(rows) > MAX_COPIES:
        return None
    return {r["_copy_of"]: r["_copy"] for r in rows}


def plan(cat: catalog.Catalog, copies: dict[str, str]) -> journey_arrays.Plan:
    return journey_arrays.Plan(
        kinds=tuple(tr.EVENT_KINDS),
        ranks=tuple(audit.RANK.get(k, 9) for k in tr.EVENT_KINDS),
        brokers=tuple(cat.brokers),
        destinations=tuple(d for d in cat.destinations if d is not None),
        runs=tuple((b["broker"], b["boot"], b["started_ts"], b["next_started_ts"],
                    b["next_broker"], b["clean_stop"], b["exact"]) for b in cat.boots),
        copies=copies)


def _by_message(events: DataFrame, partitions: int | None,
                fn: Callable[[Iterator[Any]], Iterator[Any]], ddl: str) -> DataFrame:
    spark = events.sparkSession
    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or "4")
    msgs = events.where(F.col("message_id") != "").select(*journey_arrays.INPUT_COLUMNS)
    with warnings.catch_warnings():
        # mapInArrow checks the pandas version although this path uses no pandas.
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas",
                                FutureWarning)
        return msgs.repartition(partitions, "message_id").mapInArrow(fn, ddl)


def journeys(events: DataFrame, cat: catalog.Catalog, copies: dict[str, str],
             partitions: int | None = None) -> DataFrame:
    """The journeys table, as ``audit.journeys`` computes it (``supported`` traces).
    ``partitions``: how many groups of messages (Python tasks); by default
    ``spark.sql.shuffle.partitions``."""
    return _by_message(events, partitions,
                       journey_arrays.map_partition(plan(cat, copies)),
                       journey_arrays.JOURNEYS_DDL)


def write_local(events: DataFrame, cat: catalog.Catalog, copies: dict[str, str],
                directory: Path, partitions: int | None = None) -> int:
    """The journeys written by the Python workers themselves into ``directory`` (a
    local path the executors share with the driver), replacing it, in the layout
    Spark's writer makes (``part-*.parquet`` files, ``_SUCCESS``, Spark's schema in
    each footer): the rows never pass through the JVM's Parquet writer. Returns the
    number of journeys."""
    spark = events.sparkSession
    schema_json = spark.createDataFrame([], journey_arrays.JOURNEYS_DDL).schema.json()
    staging = directory.parent / f".{directory.name}.{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        written = _by_message(
            events, partitions,
            journey_arrays.write_partition(plan(cat, copies), str(staging), schema_json),
            journey_arrays.WRITTEN_DDL).collect()
        if not written:  # Spark's writer leaves one file with the schema
            pq.write_table(journey_arrays.SCHEMA.empty_table().replace_schema_metadata(
                {journey_arrays.SPARK_SCHEMA_KEY: schema_json}),
                staging / "part-00000.snappy.parquet", compression="snappy",
                store_schema=False)
        (staging / "_SUCCESS").touch()
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sum(r["rows"] for r in written)
