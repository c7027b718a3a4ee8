"""The journeys computed in Python workers over Arrow batches (the audit's default path).

The JVM scans the trace for the columns the journeys read and hash-partitions the
message events by message id into a few partitions; ``mapInArrow`` hands each
partition to a Python worker, which groups the events per message and computes every
journey column and verdict with numpy and pyarrow (``meshmq.pipeline.journey_arrays``)
and returns the rows as Arrow batches in the journeys' schema.

When the output is a local directory (``write_local``), the workers also write the
journeys' Parquet files themselves (the rows never pass through the JVM's writer) and
send back per partition what summary, paths, lost, duplicates and stuck need: counts
per status and per path, and the few lost, repeated and stuck-candidate rows. The
driver finishes those tables in Python (``derived``); only latency (Spark's
``percentile_approx``) is computed by Spark, from the written journeys. A whole audit
is then 8 Spark jobs instead of 40-42.

Why: on the integer-coded path (``meshmq.pipeline.coded``) the per-message work runs
in code Spark generates for each query, and the JVM's compilers compiled it again in
every audit (about 7 of its 18-19 CPU seconds for 1M events); the array operations
here are compiled once, in numpy and Arrow
(``bench/results/2026-11-26-pipeline-audit-arrow.md``).

The coded path stays, and so does the reference (``audit.journeys``):
``audit_job.compute(journeys=...)`` picks one. The coded path needs no Python workers
(for clusters whose executors lack numpy or pyarrow) and takes the traces this one
does not (``supported``: more than ``MAX_BROKERS`` brokers or ``MAX_RUNS`` runs), and
those with more than ``MAX_COPIES`` resent dedup ids: resends (``audit.delivered_copies``:
per dedup id, the first message id that reached a consumer) span messages of
different partitions, so when the catalog pass saw deliveries carrying a dedup id
they are collected once on the driver and travel with the plan.
"""

from __future__ import annotations

import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
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
# A worker holds its whole partition (the events' columns and a few arrays per event):
# at most about this many events each, so large traces get more partitions.
EVENTS_PER_PARTITION = 1_000_000


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


def plan(cat: catalog.Catalog, copies: dict[str, str], stuck_after_ms: int = 60_000
         ) -> journey_arrays.Plan:
    return journey_arrays.Plan(
        kinds=tuple(tr.EVENT_KINDS),
        ranks=tuple(audit.RANK.get(k, 9) for k in tr.EVENT_KINDS),
        brokers=tuple(cat.brokers),
        destinations=tuple(d for d in cat.destinations if d is not None),
        runs=tuple((b["broker"], b["boot"], b["started_ts"], b["next_started_ts"],
                    b["next_broker"], b["clean_stop"], b["exact"]) for b in cat.boots),
        copies=copies, now_ts=cat.now_ts, stuck_after_ms=stuck_after_ms)


def _by_message(events: DataFrame, cat: catalog.Catalog, partitions: int | None,
                fn: Callable[[Iterator[Any]], Iterator[Any]], ddl: str) -> DataFrame:
    spark = events.sparkSession
    if partitions is None:
        message_events = sum(b["events"] or 0 for b in cat.boots)
        partitions = max(int(spark.conf.get("spark.sql.shuffle.partitions") or "4"),
                         -(-message_events // EVENTS_PER_PARTITION))
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
    ``spark.sql.shuffle.partitions``, or one per ``EVENTS_PER_PARTITION`` message
    events when that is more."""
    return _by_message(events, cat, partitions,
                       journey_arrays.map_partition(plan(cat, copies)),
                       journey_arrays.JOURNEYS_DDL)


def write_local(events: DataFrame, cat: catalog.Catalog, copies: dict[str, str],
                directory: Path, partitions: int | None = None, *,
                stuck_after_ms: int = 60_000) -> tuple[int, dict[str, pa.Table]]:
    """The journeys written by the Python workers themselves into ``directory`` (a
    local path the executors share with the driver), replacing it, in the layout
    Spark's writer makes (``part-*.parquet`` files, ``_SUCCESS``, Spark's schema in
    each footer): the rows never pass through the JVM's Parquet writer. Returns the
    number of journeys and the partitions' ``journey_arrays.partials``, concatenated
    (for ``derived``)."""
    spark = events.sparkSession
    schema_json = spark.createDataFrame([], journey_arrays.JOURNEYS_DDL).schema.json()
    staging = directory.parent / f".{directory.name}.{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        written = _by_message(
            events, cat, partitions,
            journey_arrays.write_partition(plan(cat, copies, stuck_after_ms), str(staging),
                                           schema_json),
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
    parts = {name: [journey_arrays.read_partial(r[name]) for r in written]
             for name in journey_arrays.PARTIALS}
    return sum(r["rows"] for r in written), {
        name: pa.concat_tables(tables) if tables else None
        for name, tables in parts.items()}


def _rows(table: pa.Table | None) -> list[dict[str, Any]]:
    return [] if table is None else table.to_pylist()


def derived(parts: dict[str, pa.Table], cat: catalog.Catalog, *, stuck_after_ms: int
            ) -> dict[str, list[dict[str, Any]]]:
    """Summary, paths, lost, duplicates and stuck from the partitions' partials, as
    ``audit.summary``, ``paths``, ``lost``, ``duplicates`` and ``stuck`` compute them
    from the journeys (the same rows, in the same order)."""
    counts: dict[str, int] = {}
    for r in _rows(parts.get("summary")):
        counts[r["status"]] = counts.get(r["status"], 0) + r["messages"]
    per_path: dict[tuple[str, int], list[int]] = {}
    for r in _rows(parts.get("paths")):
        acc = per_path.setdefault((r["path_text"], r["hops"]), [0, 0])
        acc[0] += r["messages"]
        acc[1] += r["consumed"]
    lost = sorted(_rows(parts.get("lost")), key=lambda r: (r["last_ts"], r["message_id"]))
    candidates = _rows(parts.get("duplicates"))
    duplicates = [{"key": r["message_id"], "kind": "redelivered",
                   "message_ids": [r["message_id"]], "destination": r["destination"],
                   "deliveries": r["deliveries"], "acks": r["acks"],
                   "delivered_by": r["delivered_by"]}
                  for r in candidates if r["deliveries"] > 1]
    by_dedup: dict[str, list[dict[str, Any]]] = {}
    for r in candidates:
        if r["dedup_id"] is not None and r["deliveries"] > 0:
            by_dedup.setdefault(r["dedup_id"], []).append(r)
    for dedup_id, group in by_dedup.items():
        if len(group) > 1:
            group.sort(key=lambda r: r["message_id"])
            duplicates.append({
                "key": dedup_id, "kind": "resent",
                "message_ids": [r["message_id"] for r in group],
                "destination": group[0]["destination"],
                "deliveries": sum(r["deliveries"] for r in group),
                "acks": sum(r["acks"] for r in group),
                "delivered_by": sorted({b for r in group for b in r["delivered_by"]})})
    duplicates.sort(key=lambda r: (r["kind"], r["key"]))
    stuck = []
    for r in sorted(_rows(parts.get("stuck")), key=lambda r: (r["last_ts"], r["message_id"])):
        served_by = sorted({s["served_broker"] for s in cat.served
                            if r["last_destination"] is not None
                            and s["served_destination"] == r["last_destination"]
                            and s["served_broker"] != r["last_broker"]
                            and s["served_ts"] > r["last_ts"]})
        stuck.append({**r, "age_ms": (cat.now_ts - r["last_ts"]) / 1000.0,
                      "served_by": served_by, "consumers_elsewhere": bool(served_by)})
    return {
        "summary": [{"status": s, "messages": counts.get(s, 0)} for s in audit.STATUSES],
        "paths": [{"path_text": k[0], "hops": k[1], "messages": v[0], "consumed": v[1]}
                  for k, v in sorted(per_path.items(),
                                    key=lambda kv: (-kv[1][0], kv[0][0], kv[0][1]))],
        "lost": lost, "duplicates": duplicates, "stuck": stuck}
