"""``meshmq audit``: read trace files, run the audit transforms, write the results.

Batch mode reads every trace file under the given paths once (sealed files and
files left ``.open``), writes one Parquet table per result under ``--out`` and a
Markdown report with PNG charts. Streaming mode (``--follow``) watches the trace
directories with Spark's file source (sealed files only: ``*.jsonl`` and
``*.parquet``); every micro-batch stores its new events under ``out/events`` (one
directory per batch id, so a replayed batch overwrites itself) and rebuilds the same
tables and report from all events seen so far. The checkpoint in
``out/_checkpoint`` makes a restarted follower carry on where it stopped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling

from meshmq.core import trace as tr
from meshmq.errors import MeshmqError
from meshmq.pipeline import audit

log = logging.getLogger("meshmq.audit")

DEFAULT_MASTER = "local[2]"


class AuditError(MeshmqError):
    code = "audit-error"


def spark_session(master: str | None = DEFAULT_MASTER, app: str = "meshmq-audit"
                  ) -> SparkSession:
    """A Spark session for the audit. ``master=None`` keeps what ``spark-submit`` set.

    Python workers use this interpreter (so they find pyarrow) unless PYSPARK_PYTHON
    says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    spark = (builder.config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


# ----------------------------------------------------------------------------- input

JSONL_PATTERNS = ("*.jsonl", "*.jsonl.open")
PARQUET_PATTERNS = ("*.parquet",)


def trace_files(paths: Iterable[Path]) -> tuple[list[str], list[str]]:
    """The JSON-lines and Parquet trace files under ``paths`` (files or directories)."""
    jsonl: list[str] = []
    parquet: list[str] = []
    for path in paths:
        if path.is_file():
            (parquet if path.suffix == ".parquet" else jsonl).append(str(path))
        elif path.is_dir():
            for pattern in JSONL_PATTERNS:
                jsonl += sorted(str(p) for p in path.rglob(pattern))
            for pattern in PARQUET_PATTERNS:
                parquet += sorted(str(p) for p in path.rglob(pattern))
        else:
            raise AuditError(f"trace path {path} does not exist")
    if not jsonl and not parquet:
        shown = ", ".join(str(p) for p in paths)
        raise AuditError(f"no trace files (*.jsonl, *.jsonl.open, *.parquet) under {shown}")
    return jsonl, parquet


def clean(events: DataFrame) -> DataFrame:
    """Rows of the supported schema version; a line cut short by a crash reads as
    nulls (the JSON reader is permissive) and is dropped here."""
    return events.where((F.col("v") == tr.SCHEMA_VERSION) & F.col("event").isNotNull()
                        & F.col("ts").isNotNull() & F.col("broker").isNotNull())


def read_traces(spark: SparkSession, paths: Sequence[Path]) -> DataFrame:
    return _read(spark, *trace_files(paths))


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

    def items(self) -> list[tuple[str, DataFrame]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


def compute(events: DataFrame, *, stuck_after_ms: int = 60_000,
            window: str = "10 seconds", cache_events: bool = True) -> AuditTables:
    """Every table. ``cache_events``: keep the events in memory between tables (worth
    it for JSON, which is slow to parse; Parquet is faster to read again)."""
    if cache_events:
        events = events.cache()
    boot_table = audit.boots(events).cache()
    journeys = audit.journeys(events, boot_table).cache()
    return AuditTables(
        journeys=journeys, summary=audit.summary(journeys), lost=audit.lost(journeys),
        duplicates=audit.duplicates(journeys, events), paths=audit.paths(journeys),
        latency=audit.latency(journeys),
        stuck=audit.stuck(journeys, events, older_than_ms=stuck_after_ms),
        throughput=audit.throughput(events, window), bridges=audit.bridges(events, window),
        boots=boot_table, failovers=audit.failover_windows(boot_table))


def write_tables(tables: AuditTables, out: Path) -> None:
    for name, frame in tables.items():
        frame.write.mode("overwrite").parquet(str(out / name))


# ----------------------------------------------------------------------------- report

def _rows(frame: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in frame.limit(limit).collect()]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, dt.datetime):
        return value.strftime("%H:%M:%S")
    return str(value).replace("|", "\\|")


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return [*out, ""]


def _ts(micros: int | None) -> str:
    if micros is None:
        return ""
    return dt.datetime.fromtimestamp(micros / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def write_report(tables: AuditTables, out: Path, *, title: str = "meshmq delivery audit",
                 limit: int = 50) -> Path:
    """The Markdown report (and its PNG charts) a person reads; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    summary = {r["status"]: r["messages"] for r in _rows(tables.summary, 100)}
    total = sum(summary.values())
    lost = _rows(tables.lost, limit)
    dups = _rows(tables.duplicates, limit)
    failovers = _rows(tables.failovers, limit)
    for row in lost:
        row["last_time"] = _ts(row["last_ts"])
    for row in failovers:
        row["down_from"] = _ts(row["down_from_ts"])
        row["up_again"] = _ts(row["up_again_ts"])
    n_dups = tables.duplicates.count()
    n_lost = summary.get("lost", 0)
    stuck = _rows(tables.stuck, limit)
    lines = [f"# {title}", "",
             f"{total} messages traced; **{n_lost} lost**, **{n_dups} delivered more than "
             f"once**, {len(failovers)} failover window(s).", "",
             "## Messages by final status", ""]
    lines += _table([{"status": s, "messages": summary.get(s, 0)} for s in audit.STATUSES],
                    ["status", "messages"])
    lines += ["## Lost messages", "",
              "Accepted by a broker, never consumed, dead-lettered, expired or dropped, and "
              "not pending anywhere: the broker that last held them restarted and they did "
              "not come back.", ""]
    lines += _table(lost, ["message_id", "destination", "persistent", "last_event",
                           "last_broker", "last_time"])
    lines += ["## Duplicate deliveries", "",
              "`redelivered`: one message dispatched more than once; `resent`: one dedup-id "
              "sent as several messages, more than one of them delivered.", ""]
    lines += _table(dups, ["kind", "key", "destination", "deliveries", "acks", "message_ids"])
    lines += ["## Failover windows", ""]
    lines += _table(failovers, ["broker", "kind", "down_from", "up_again", "down_ms"])
    lines += ["## Paths and hops", ""]
    lines += _table(_rows(tables.paths, limit), ["path_text", "hops", "messages", "consumed"])
    latency = _rows(tables.latency, limit)
    lines += ["## Delivery latency (accepted -> first dispatch)", ""]
    lines += _table(latency, ["destination", "path_text", "messages", "p50_ms", "p95_ms",
                              "p99_ms", "max_ms"])
    if latency:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f"{r['destination']}\n{r['path_text']}" for r in latency[:12]]
        xs = range(len(labels))
        for i, (key, name) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"),
                                         ("p99_ms", "p99"))):
            ax.bar([x + (i - 1) * 0.27 for x in xs], [r[key] or 0 for r in latency[:12]],
                   width=0.27, label=name)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title("Delivery latency per destination and path")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=90)
        plt.close(fig)
        lines += ["![latency](latency.png)", ""]
    lines += ["## Stuck messages", "",
              "Pending longer than the threshold; `consumers_elsewhere`: consumers of the "
              "destination were served on another broker meanwhile.", ""]
    lines += _table(stuck, ["message_id", "last_broker", "last_destination", "age_ms",
                            "consumers_elsewhere", "served_by"])
    through = _rows(tables.throughput, 5000)
    lines += ["## Throughput over time", ""]
    if through:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        series: dict[tuple[str, str], list[tuple[dt.datetime, int]]] = {}
        for r in through:
            if r["event"] in (tr.RECEIVED, tr.ACKED, tr.DELIVERED, tr.FORWARDED):
                kind = "consumed" if r["event"] in (tr.ACKED, tr.DELIVERED) else r["event"]
                series.setdefault((r["broker"], kind), []).append(
                    (r["window_start"], r["events"]))
        t0 = min(r["window_start"] for r in through)
        for (broker, kind), points in sorted(series.items()):
            merged: dict[dt.datetime, int] = {}
            for t, n in points:
                merged[t] = merged.get(t, 0) + n
            ts = sorted(merged)
            ax.plot([(t - t0).total_seconds() for t in ts], [merged[t] for t in ts],
                    marker="o", label=f"{broker} {kind}")
        ax.set_xlabel(f"seconds since {t0:%Y-%m-%d %H:%M:%S} UTC")
        ax.set_ylabel("events per window")
        ax.set_title("Messages in and consumed per broker")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=90)
        plt.close(fig)
        lines += ["![throughput](throughput.png)", ""]
    lines += ["### Per bridge", ""]
    lines += _table(_rows(tables.bridges, limit), ["window_start", "broker", "peer",
                                                   "connector", "messages"])
    lines += ["Tables (Parquet) beside this report: " + ", ".join(
        f"`{name}/`" for name, _ in tables.items()) + ".", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------- entry points

def run_audit(spark: SparkSession, paths: Sequence[Path], out: Path, *,
              stuck_after_ms: int = 60_000, window: str = "10 seconds") -> dict[str, int]:
    """Batch audit; returns the message count per status (and ``duplicates``)."""
    jsonl, parquet = trace_files(paths)
    tables = compute(_read(spark, jsonl, parquet), stuck_after_ms=stuck_after_ms,
                     window=window, cache_events=bool(jsonl))
    write_tables(tables, out)
    write_report(tables, out)
    counts = {r["status"]: r["messages"] for r in _rows(tables.summary, 100)}
    counts["duplicates"] = tables.duplicates.count()
    return counts


def follow(spark: SparkSession, dirs: Sequence[Path], out: Path, *, once: bool = False,
           interval: str = "10 seconds", stuck_after_ms: int = 60_000,
           window: str = "10 seconds", timeout_s: float | None = None) -> None:
    """Streaming audit over sealed trace files; ``once``: process what is there, stop."""
    for d in dirs:
        if not d.is_dir():
            raise AuditError(f"--follow needs trace directories; {d} is not one")
    streams = []
    for d in dirs:
        streams.append(spark.readStream.schema(tr.SPARK_DDL)
                       .option("pathGlobFilter", "*.jsonl").json(str(d)))
        streams.append(spark.readStream.schema(tr.SPARK_DDL)
                       .option("pathGlobFilter", "*.parquet").parquet(str(d)))
    stream = streams[0]
    for other in streams[1:]:
        stream = stream.unionByName(other)
    events_dir = out / "events"

    def batch(frame: DataFrame, batch_id: int) -> None:
        # One directory per batch: a batch replayed after a crash overwrites itself.
        clean(frame).write.mode("overwrite").parquet(str(events_dir / f"batch={batch_id}"))
        events = spark.read.parquet(str(events_dir)).drop("batch")
        tables = compute(events, stuck_after_ms=stuck_after_ms, window=window,
                         cache_events=False)
        write_tables(tables, out)
        write_report(tables, out, title="meshmq delivery audit (streaming)")
        # The next batch reads the same path: drop the cached frames, or Spark would
        # match the identical plan to this batch's cached (now stale) data.
        spark.catalog.clearCache()
        log.info("audit batch %d written to %s", batch_id, out)

    writer = (stream.writeStream.foreachBatch(batch)
              .option("checkpointLocation", str(out / "_checkpoint")))
    writer = writer.trigger(availableNow=True) if once else \
        writer.trigger(processingTime=interval)
    query = writer.start()
    if timeout_s is None:
        query.awaitTermination()
    elif not query.awaitTermination(max(1, int(timeout_s))):
        query.stop()
