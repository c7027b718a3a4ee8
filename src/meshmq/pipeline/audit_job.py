"""``meshmq audit``: read trace files, run the audit transforms, write the results.

Locations are paths or URIs that Spark resolves (``meshmq.pipeline.paths``), so the
same command runs on a laptop and on a cluster reading ``hdfs://`` or ``s3a://``.
Batch mode reads every trace file under the given locations (sealed files and
files left ``.open``; a JSON trace is parsed once into a cached events frame, a
Parquet one is scanned for the columns each table needs), writes the journeys (by
default computed, and written when the output is local, by Python workers over Arrow
batches: ``meshmq.pipeline.arrow_journeys``) and computes the tables derived from
them from that written copy or from what the workers sent back, writes one Parquet
table per result under ``--out`` and a Markdown report with PNG charts
(``meshmq.pipeline.report``). Streaming mode
(``--follow``) watches the trace directories with Spark's file source (sealed files
only: ``*.jsonl`` and ``*.parquet``); every micro-batch stores its new events under
``out/events`` (one directory per batch id, so a replayed batch overwrites itself)
and rebuilds the same tables and report from all events seen so far. The checkpoint
in ``out/_checkpoint`` makes a restarted follower carry on where it stopped.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling
from pyspark.sql.types import StructType

from meshmq.core import trace as tr
from meshmq.errors import MeshmqError
from meshmq.pipeline import arrow_journeys, audit, catalog, coded, paths, report, small_tables

log = logging.getLogger("meshmq.audit")

DEFAULT_MASTER = "local[2]"


class AuditError(MeshmqError):
    code = "audit-error"


def spark_session(master: str | None = DEFAULT_MASTER, app: str = "meshmq-audit",
                  *, progress_bar: bool = False) -> SparkSession:
    """A Spark session for the audit. ``master=None`` keeps what ``spark-submit`` set;
    ``progress_bar``: Spark's console progress bar on stderr (for a terminal).

    Python workers use this interpreter (so they find pyarrow) unless PYSPARK_PYTHON
    says otherwise. The JVM keeps its default options (tiered compilation, G1, 1 GB
    heap): the alternatives measured (C1 only, the parallel or serial GC;
    bench/results/2026-11-26-pipeline-audit-redesign.md) saved CPU on 1M events and
    cost more on 10M, or made no difference; set them with PYSPARK_SUBMIT_ARGS or
    ``spark-submit --driver-java-options``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    # Input splits: a trace is a few files, one per broker and run, far below the
    # 128 MB split size, so by default each file is one task and the busiest broker's
    # file keeps one core busy while the other idles. Several splits per core (of row
    # groups) spread the scan and the journeys' partial aggregation.
    spark = (builder.config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.files.openCostInBytes", str(1 << 20))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", str(progress_bar).lower())
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    if spark.conf.get("spark.sql.files.minPartitionNum", None) is None:
        spark.conf.set("spark.sql.files.minPartitionNum",
                       str(4 * spark.sparkContext.defaultParallelism))
    spark.sparkContext.setLogLevel("WARN")
    return spark


# ----------------------------------------------------------------------------- input

def clean(events: DataFrame) -> DataFrame:
    """Rows of the supported schema version; a line cut short by a crash reads as
    nulls (the JSON reader is permissive) and is dropped here."""
    return events.where((F.col("v") == tr.SCHEMA_VERSION) & F.col("event").isNotNull()
                        & F.col("ts").isNotNull() & F.col("broker").isNotNull())


def read_traces(spark: SparkSession, locations: Sequence[str | os.PathLike[str]]
                ) -> DataFrame:
    """Every trace event under ``locations`` (paths or URIs, files or directories)."""
    return _read(spark, *paths.trace_files(spark, [str(p) for p in locations]))


def _read(spark: SparkSession, jsonl: list[str], parquet: list[str]) -> DataFrame:
    frames = []
    if jsonl:
        frames.append(spark.read.schema(tr.SPARK_DDL).json(jsonl))
    if parquet:
        frames.append(spark.read.schema(tr.SPARK_DDL).parquet(*parquet))
    events = frames[0]
    for other in frames[1:]:
        events = events.unionByName(other)
    return clean(events)


# ----------------------------------------------------------------------------- tables

@dataclasses.dataclass
class AuditTables:
    journeys: DataFrame
    summary: DataFrame
    lost: DataFrame
    duplicates: DataFrame
    paths: DataFrame
    latency: DataFrame
    stuck: DataFrame
    throughput: DataFrame
    bridges: DataFrame
    boots: DataFrame
    failovers: DataFrame
    # Builds the journey-derived tables from another copy of the journeys (the written
    # one); not a table.
    from_journeys: Callable[..., dict[str, DataFrame]] | None = \
        dataclasses.field(default=None, repr=False, compare=False)
    # Writes the journeys into a local directory without Spark's writer (the Arrow
    # path's workers write them) and returns the rows of the tables derived from them
    # but latency, built on the driver from what the workers sent back; not a table.
    write_journeys: Callable[[Path], dict[str, list[dict[str, Any]]]] | None = \
        dataclasses.field(default=None, repr=False, compare=False)
    # The tables built on the driver: their rows and schema, written without a Spark
    # job; not tables.
    driver_rows: dict[str, tuple[list[dict[str, Any]], str]] = \
        dataclasses.field(default_factory=dict, repr=False, compare=False)

    def items(self) -> list[tuple[str, DataFrame]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name not in ("from_journeys", "write_journeys", "driver_rows")]


def _parquet_only(events: DataFrame) -> bool:
    files = events.inputFiles()
    return bool(files) and all(f.endswith(".parquet") for f in files)


JourneysPath = Literal["arrow", "coded", "reference"]


def compute(events: DataFrame, *, stuck_after_ms: int = 60_000,
            window: str = "10 seconds", cache_events: bool | None = None,
            journeys: JourneysPath = "arrow") -> AuditTables:
    """Every table: the small ones built on the driver, the journeys and the tables
    derived from them as lazy frames.

    Two scans of the events: the catalog pass (``meshmq.pipeline.catalog``: one
    aggregation, collected once) gives boots, failovers, throughput, bridges, the
    served destinations, "now" and the dictionaries; the journeys are then a hash
    aggregation over integer-coded events (``meshmq.pipeline.coded``; the reference
    ``audit.journeys`` when the codes do not fit the trace). ``cache_events``: keep a
    copy of the events in memory (spilling to disk), so a JSON trace is parsed once
    rather than twice; by default only when the input is not all Parquet files. The
    journeys are not cached: ``write_tables`` writes them first and builds the tables
    derived from them from the written copy (``from_journeys``)."""
    if cache_events is None:
        cache_events = not _parquet_only(events)
    if cache_events:
        events = events.persist(StorageLevel.MEMORY_AND_DISK)
    spark = events.sparkSession
    cat = catalog.build([r.asDict() for r in
                         catalog.catalog_rows(events, window).collect()])
    boot_table = spark.createDataFrame(cat.boots, catalog.BOOTS_DDL)
    served = spark.createDataFrame(
        cat.served, "served_broker string, served_destination string, served_ts bigint")

    def from_journeys(journeys: DataFrame, latency_only: bool = False
                      ) -> dict[str, DataFrame]:
        if latency_only:  # the messages with a latency are the only ones it counts
            timed = audit.journey_stats(journeys.where(F.col("latency_ms").isNotNull()))
            return {"latency": audit.latency(journeys, timed.cache())}
        # Summary, paths and latency: one pass over the journeys, kept.
        stats = audit.journey_stats(journeys).cache()
        return {"summary": audit.summary(journeys, stats), "lost": audit.lost(journeys),
                "duplicates": audit.duplicates(journeys),
                "paths": audit.paths(journeys, stats),
                "latency": audit.latency(journeys, stats),
                "stuck": audit.stuck(journeys, events, older_than_ms=stuck_after_ms,
                                     now_ts=cat.now_ts, served_table=served)}

    journey_table = None
    write_journeys: Callable[[Path], dict[str, list[dict[str, Any]]]] | None = None
    if journeys == "arrow" and arrow_journeys.supported(cat):
        copies = arrow_journeys.copies(events, cat)
        if copies is not None:
            journey_table = arrow_journeys.journeys(events, cat, copies)

            def write_journeys(directory: Path) -> dict[str, list[dict[str, Any]]]:
                _, parts = arrow_journeys.write_local(events, cat, copies, directory,
                                                      stuck_after_ms=stuck_after_ms)
                return arrow_journeys.derived(parts, cat, stuck_after_ms=stuck_after_ms)
    if journey_table is None and journeys != "reference" and coded.supported(cat):
        journey_table = coded.journeys(events, cat, boot_table)
    if journey_table is None:
        journey_table = audit.journeys(events, boot_table)
    return AuditTables(
        journeys=journey_table, **from_journeys(journey_table),
        throughput=spark.createDataFrame(cat.throughput, catalog.THROUGHPUT_DDL),
        bridges=spark.createDataFrame(cat.bridges, catalog.BRIDGES_DDL),
        boots=boot_table, failovers=spark.createDataFrame(cat.failovers,
                                                          catalog.FAILOVERS_DDL),
        from_journeys=from_journeys, write_journeys=write_journeys,
        driver_rows={"throughput": (cat.throughput, catalog.THROUGHPUT_DDL),
                     "bridges": (cat.bridges, catalog.BRIDGES_DDL),
                     "boots": (cat.boots, catalog.BOOTS_DDL),
                     "failovers": (cat.failovers, catalog.FAILOVERS_DDL)})


def write_tables(tables: AuditTables, out: str | os.PathLike[str],
                 progress: Progress | None = None, *, parallel: int = 4) -> None:
    """One Parquet directory per table under ``out`` (a path or URI).

    The journeys go first (on the Arrow path, into a local directory, written by the
    Python workers that compute them), and the tables derived from them are then
    built from the written copy (a columnar file read for the few columns each needs, cheaper than
    keeping the journeys in memory). The other tables are small aggregations: each is
    collected once and written from the driver (``small_tables``: one job, not Spark's
    writer's several and its commit), ``parallel`` at a time, which keeps the cores
    busy while one waits on the driver. Every table but the journeys stays cached, so
    the report collects it without computing it again."""
    progress = progress or Progress()
    items = tables.items()
    done = 0
    lock = threading.Lock()

    def write(name: str, frame: DataFrame, small: bool = True) -> None:
        nonlocal done
        if progress.spark is not None:
            progress.spark.sparkContext.setJobDescription(f"writing table {name}")
        location = _join(str(out), name)
        if not small and local is not None and tables.write_journeys is not None:
            derived.update(tables.write_journeys(local / name))
        elif local is not None and name in derived:
            write_rows(frame.sparkSession, derived[name], frame.schema, local / name)
        elif local is not None and name in tables.driver_rows:
            write_rows(frame.sparkSession, *tables.driver_rows[name], local / name)
        elif small:
            small_tables.write(frame, location, None if local is None else local / name)
        else:
            frame.write.mode("overwrite").parquet(location)
        with lock:
            done += 1
            progress.stage(f"writing tables ({done}/{len(items)}): {name} written")

    first, rest = items[0], items[1:]
    spark = first[1].sparkSession
    local = paths.output_local_dir(spark, str(out))
    derived: dict[str, list[dict[str, Any]]] = {}
    progress.stage(f"writing tables (0/{len(items)}): {first[0]}")
    write(*first, small=False)
    if tables.from_journeys is not None:
        # The schema is known: no job to read it from a footer.
        written = spark.read.schema(first[1].schema).parquet(_join(str(out), first[0]))
        tables.journeys = written
        for name, frame in tables.from_journeys(written, bool(derived)).items():
            setattr(tables, name, frame)
        # Built on the driver: local frames, which the report reads without a job.
        for name, rows in derived.items():
            setattr(tables, name, spark.createDataFrame(rows, getattr(tables, name).schema))
        rest = tables.items()[1:]
    cached = [(name, frame if name in derived else frame.cache()) for name, frame in rest]
    for name, frame in cached:
        setattr(tables, name, frame)
    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
        for future in [pool.submit(write, name, frame) for name, frame in cached]:
            future.result()


def write_rows(spark: SparkSession, rows: list[dict[str, Any]], ddl: str | StructType,
               directory: Path) -> None:
    """Rows built on the driver written as Spark would write ``createDataFrame(rows,
    ddl)`` (``small_tables.write_local``), without a Spark job. Timestamps come as
    Spark collects them: naive datetimes in the driver's local time."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import TimestampType

    schema = ddl if isinstance(ddl, StructType) else spark.createDataFrame([], ddl).schema
    stamps = [f.name for f in schema.fields if isinstance(f.dataType, TimestampType)]
    if stamps:
        rows = [{**r, **{k: r[k].astimezone(dt.UTC) for k in stamps if r[k] is not None}}
                for r in rows]
    table = pa.Table.from_pylist(rows, to_arrow_schema(schema, timezone="UTC"))
    small_tables.write_local(spark, table, schema.json(), directory)


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


# ----------------------------------------------------------------------------- report

def _rows(frame: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in frame.limit(limit).collect()]


def report_data(tables: AuditTables, *, window: str = "10 seconds",
                limit: int = 50) -> report.ReportData:
    """The small results the report shows, collected from the (cached) tables."""
    summary = {r["status"]: r["messages"] for r in _rows(tables.summary, 100)}
    # Only the windows the chart draws: messages in and consumed.
    chart_events = (tr.RECEIVED, tr.FORWARDED, tr.ACKED, tr.DELIVERED)
    through = _rows(tables.throughput.where(F.col("event").isin(*chart_events)), 50_000)
    return report.ReportData(
        summary=summary, duplicates_total=tables.duplicates.count(),
        lost=_rows(tables.lost, limit), duplicates=_rows(tables.duplicates, limit),
        failovers=_rows(tables.failovers, 1000), paths=_rows(tables.paths, limit),
        latency=_rows(tables.latency, limit), stuck=_rows(tables.stuck, limit),
        throughput=through, bridges=_rows(tables.bridges, limit),
        window_s=report.window_seconds(window),
        table_names=[name for name, _ in tables.items()])


def write_report(spark: SparkSession, tables: AuditTables, out: str | os.PathLike[str], *,
                 title: str = "meshmq delivery audit", window: str = "10 seconds",
                 limit: int = 50) -> str:
    """``report.md`` and its charts beside the tables; returns the report's location.

    Rendered on the driver's local disk; when ``out`` is on another filesystem
    (``hdfs://``, ``s3a://``) the files are uploaded there through Hadoop."""
    data = report_data(tables, window=window, limit=limit)
    out = str(out)
    local = paths.output_local_dir(spark, out)
    if local is not None:
        report.render(data, local, title=title)
        return str(local / "report.md")
    with tempfile.TemporaryDirectory(prefix="meshmq-report-") as tmp:
        report.render(data, Path(tmp), title=title)
        paths.publish(spark, Path(tmp), out, ["report.md", *report.CHARTS])
    return _join(paths.qualified(spark, out), "report.md")


# ----------------------------------------------------------------------------- entry points

class Progress:
    """Names the stage the audit is in: a log line per stage (what a person watching
    a log or a CI job sees) and the Spark job description (what Spark's console
    progress bar and UI show beside their per-task counts)."""

    def __init__(self, spark: SparkSession | None = None) -> None:
        self.spark = spark
        self.started = time.monotonic()

    def stage(self, text: str) -> None:
        log.info("audit: %s (%.0f s)", text, time.monotonic() - self.started)
        if self.spark is not None:
            self.spark.sparkContext.setJobDescription(text)


def run_audit(spark: SparkSession, locations: Sequence[str | os.PathLike[str]],
              out: str | os.PathLike[str], *, stuck_after_ms: int = 60_000,
              window: str = "10 seconds") -> dict[str, int]:
    """Batch audit; returns the message count per status (and ``duplicates``).

    ``locations`` and ``out`` are paths or URIs (``file://``, ``hdfs://``, ``s3a://``)
    that the executors read and write; the trace is read once."""
    progress = Progress(spark)
    progress.stage("listing trace files")
    jsonl, parquet = paths.trace_files(spark, [str(p) for p in locations])
    progress.stage(f"reading traces ({len(jsonl) + len(parquet)} files) and computing "
                   "journeys")
    tables = compute(_read(spark, jsonl, parquet), stuck_after_ms=stuck_after_ms,
                     window=window)
    write_tables(tables, out, progress)
    progress.stage("writing the report")
    write_report(spark, tables, out, window=window)
    counts = {r["status"]: r["messages"] for r in _rows(tables.summary, 100)}
    counts["duplicates"] = tables.duplicates.count()
    spark.catalog.clearCache()
    progress.stage("done")
    return counts


def follow(spark: SparkSession, dirs: Sequence[str | os.PathLike[str]],
           out: str | os.PathLike[str], *, once: bool = False, interval: str = "10 seconds",
           stuck_after_ms: int = 60_000, window: str = "10 seconds",
           timeout_s: float | None = None) -> None:
    """Streaming audit over sealed trace files; ``once``: process what is there, stop."""
    for d in map(str, dirs):
        if not paths.is_dir(spark, d):
            raise AuditError(f"--follow needs trace directories; {d} is not one")
    streams = []
    for d in map(str, dirs):
        streams.append(spark.readStream.schema(tr.SPARK_DDL)
                       .option("pathGlobFilter", "*.jsonl").json(d))
        streams.append(spark.readStream.schema(tr.SPARK_DDL)
                       .option("pathGlobFilter", "*.parquet").parquet(d))
    stream = streams[0]
    for other in streams[1:]:
        stream = stream.unionByName(other)
    out = str(out)
    events_dir = _join(out, "events")

    def batch(frame: DataFrame, batch_id: int) -> None:
        # One directory per batch: a batch replayed after a crash overwrites itself.
        clean(frame).write.mode("overwrite").parquet(_join(events_dir, f"batch={batch_id}"))
        events = spark.read.parquet(events_dir).drop("batch")
        tables = compute(events, stuck_after_ms=stuck_after_ms, window=window,
                         cache_events=False)
        write_tables(tables, out)
        write_report(spark, tables, out, title="meshmq delivery audit (streaming)",
                     window=window)
        # The next batch reads the same path: drop the cached frames, or Spark would
        # match the identical plan to this batch's cached (now stale) data.
        spark.catalog.clearCache()
        log.info("audit batch %d written to %s", batch_id, out)

    writer = (stream.writeStream.foreachBatch(batch)
              .option("checkpointLocation", _join(out, "_checkpoint")))
    writer = writer.trigger(availableNow=True) if once else \
        writer.trigger(processingTime=interval)
    query = writer.start()
    if timeout_s is None:
        query.awaitTermination()
    elif not query.awaitTermination(max(1, int(timeout_s))):
        query.stop()
