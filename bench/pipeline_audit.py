"""Audit throughput on local[2]: trace events per second through the whole audit.

Generates a synthetic trace of three brokers (JSON lines or Parquet, written by
meshmq's own trace sinks): messages produced on b0, a share forwarded over bridges
to b1 and on to b2, consumed there or on b0, with planted losses (forwarded to b2
and held there, undelivered, when b2 crashes) and duplicates (delivered twice). Then runs
the audit in one warm Spark session: read, every table computed and written as
Parquet (the report is left out: it is a few small collects). Prints events/s and
checks the planted counts; appends to ``bench/results/<date>-pipeline-audit.md``.

    python bench/pipeline_audit.py [--events 1000000] [--format parquet|jsonl]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshmq.core import destinations as dst
from meshmq.core import trace as tr
from meshmq.core.message import Message
from meshmq.transport import trace_files as tf

RESULTS = Path(__file__).resolve().parent / "results"


def generate(directory: Path, n_events: int, fmt: str) -> dict[str, int]:
    """About ``n_events`` events; returns the planted counts."""
    sinks = {b: tf.open_sink(directory, b, "boot1", fmt=fmt, max_file_bytes=1 << 40,
                             roll_interval_ms=0, max_files=0) for b in ("b0", "b1", "b2")}
    batches: dict[str, list[tr.Event]] = {b: [] for b in sinks}
    queues = [dst.queue(f"orders.{i}") for i in range(8)]
    planted = {"lost": 0, "duplicates": 0, "messages": 0}
    t = 1_700_000_000_000_000_000  # ns
    # Every run traces in exact mode, so the crash of b2's first run leaves a complete
    # trace: what it held and never delivered is lost, not unknown.
    started = tr.start_reason(heartbeat_ms=1000, exact=True, previous=None)
    for events in batches.values():
        events.append((t - 1000, tr.BROKER_STARTED, None, None, 0, None, None, None, started))
    count = 0
    i = 0
    while count < n_events:
        i += 1
        q = queues[i % len(queues)]
        msg = Message(f"ID:b0-1-c1-{i}", q, b"x" * 200, timestamp=t // 1_000_000,
                      persistent=i % 2 == 0)
        ev = batches["b0"]
        ev.append((t, tr.RECEIVED, msg, None, 0, None, None, None, None))
        if msg.persistent:
            ev.append((t + 1000, tr.STORED, msg, None, 0, None, None, None, None))
        kind = i % 10
        if kind < 6:  # consumed on b0
            ev.append((t + 300_000, tr.DISPATCHED, msg, None, 1, "c1", None, None, None))
            ev.append((t + 900_000, tr.ACKED, msg, None, 1, "c1", None, None, None))
            if i % 400 == 3:  # a duplicate: redelivered and acked again
                ev.append((t + 2_000_000, tr.DISPATCHED, msg, None, 2, "c2", None, None,
                           None))
                planted["duplicates"] += 1
        else:  # over the bridges
            ev.append((t + 200_000, tr.FORWARDED, msg, None, 0, None, "b1", "n01", None))
            m1 = msg.copy_to(q, broker_path=("b0",))
            e1 = batches["b1"]
            e1.append((t + 700_000, tr.RECEIVED_FROM_BRIDGE, m1, None, 0, None, "b0", "n01",
                       None))
            if kind < 8:
                e1.append((t + 1_200_000, tr.DELIVERED, m1, None, 1, "c3", None, None, None))
            else:
                e1.append((t + 900_000, tr.FORWARDED, m1, None, 0, None, "b2", "n12", None))
                m2 = m1.copy_to(q, broker_path=("b0", "b1"))
                e2 = batches["b2"]
                if i % 800 == 9:  # lost: b2 crashes before delivering it
                    planted["lost"] += 1
                    e1[-1] = (t + 900_000, tr.FORWARDED, m1, None, 0, None, "b2", "n12",
                              None)
                    e2.append((t + 1_400_000, tr.RECEIVED_FROM_BRIDGE, m2, None, 0, None,
                               "b1", "n12", None))
                else:
                    e2.append((t + 1_400_000, tr.RECEIVED_FROM_BRIDGE, m2, None, 0, None,
                               "b1", "n12", None))
                    e2.append((t + 2_000_000, tr.DELIVERED, m2, None, 1, "c4", None, None,
                               None))
        planted["messages"] += 1
        t += 20_000  # 50k messages/s
        if i % 20_000 == 0:
            for b, events in batches.items():
                count += len(events)
                sinks[b].write(events)
                events.clear()
    for b, events in batches.items():
        count += len(events)
        sinks[b].write(events)
    for sink in sinks.values():
        sink.close()
    # b2 restarts: its earlier run ends (crash) and a new boot begins.
    restart = tf.open_sink(directory, "b2", "boot2", fmt=fmt, max_file_bytes=1 << 40,
                           roll_interval_ms=0, max_files=0)
    restarted = tr.start_reason(heartbeat_ms=1000, exact=True,
                                previous=("boot1", t // 1000 + 500_000))
    restart.write([(t + 10_000_000_000, tr.BROKER_STARTED, None, None, 0, None, None, None,
                    restarted)])
    restart.close()
    planted["events"] = count + 1
    return planted


def jvm_cpu(spark: Any) -> Callable[[], float]:
    """The Spark JVM's CPU seconds so far (user + system, every thread: tasks, GC, the
    driver), read from /proc: what a step costs, much less sensitive to the load of a
    shared machine than its wall time. NaN where /proc is not there."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat")

    def read() -> float:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / tick

    return read


def python_workers_cpu(spark: Any) -> Callable[[], float]:
    """The CPU seconds of the Spark JVM's descendants (the Python daemon and its
    workers, which run ``mapInArrow`` and other Python code): user + system of every
    live descendant and of the children they reaped. Work moved out of the JVM into
    Python workers shows up here, not in ``jvm_cpu``. NaN where /proc is not there."""
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        parents: dict[int, int] = {}
        cpu: dict[int, int] = {}
        try:
            entries = list(Path("/proc").iterdir())
        except OSError:
            return math.nan
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry.name)] = int(fields[1])
            cpu[int(entry.name)] = sum(int(f) for f in fields[11:15])
        total = 0
        for pid, ticks in cpu.items():
            ancestor = parents.get(pid)
            while ancestor is not None and ancestor not in (jvm, 0, 1):
                ancestor = parents.get(ancestor)
            if ancestor == jvm:
                total += ticks
        return total / tick

    return read


def jvm_peak_rss_mb(spark: Any) -> float:
    """The Spark JVM's peak resident set so far (VmHWM in /proc), in MB; NaN where
    /proc is not there."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    found = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(found[0]) / 1024 if found else math.nan


def breakdown(spark: Any, trace: Path, out: Path) -> None:
    """One audit with the tables written one at a time: seconds, JVM CPU seconds and
    Spark jobs per step (what the Spark UI would show, which local runs here do not
    have)."""
    from meshmq.pipeline import audit_job

    tracker = spark.sparkContext.statusTracker()
    cpu = jvm_cpu(spark)
    py_cpu = python_workers_cpu(spark)
    marks: list[tuple[str, float, float, int, float]] = []

    def mark(text: str) -> None:
        marks.append((text, time.perf_counter(), cpu(), len(tracker.getJobIdsForGroup(None)),
                      py_cpu() + time.process_time()))

    class Timed(audit_job.Progress):
        def stage(self, text: str) -> None:
            mark(text)

    spark.catalog.clearCache()
    mark("start")
    tables = audit_job.compute(audit_job.read_traces(spark, [trace]))
    mark("compute (boots, now)")
    audit_job.write_tables(tables, out, Timed(), parallel=1)
    mark("end")
    total = marks[-1][1] - marks[0][1]
    print(f"breakdown: {total:.1f}s in all, {marks[-1][2] - marks[0][2]:.1f} s JVM CPU, "
          f"{marks[-1][4] - marks[0][4]:.1f} s Python CPU (workers and driver), "
          f"{marks[-1][3] - marks[0][3]} Spark jobs")
    for (_, t0, c0, j0, p0), (text, t1, c1, j1, p1) in itertools.pairwise(marks):
        print(f"  {t1 - t0:6.2f}s {c1 - c0:6.2f}s JVM CPU {p1 - p0:6.2f}s Python CPU "
              f"{j1 - j0:3d} jobs  {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--trace", type=Path, default=None,
                        help="keep the generated trace in this directory and reuse it "
                        "when it is already there (same --events and --format)")
    parser.add_argument("--breakdown", action="store_true",
                        help="after the runs, one more run writing one table at a time, "
                        "printing each step's seconds and Spark job count")
    args = parser.parse_args()

    from meshmq.pipeline import audit_job

    tmp = Path(tempfile.mkdtemp(prefix="meshmq-audit-bench-"))
    trace = args.trace or tmp / "trace"
    try:
        planted_file = trace / f"planted-{args.events}-{args.format}.json"
        if planted_file.exists():
            planted = json.loads(planted_file.read_text())
            print(f"reusing the trace in {trace}")
        else:
            if trace.exists() and any(trace.iterdir()):
                parser.error(f"{trace} holds other files: name an empty or new directory")
            t0 = time.perf_counter()
            planted = generate(trace, args.events, args.format)
            print(f"generated in {time.perf_counter() - t0:.1f}s")
            # Beside the trace files: the audit reads only *.jsonl and *.parquet.
            planted_file.write_text(json.dumps(planted))
        n = planted["events"]
        size = sum(p.stat().st_size for p in trace.iterdir() if p.suffix != ".json")
        print(f"{n} events ({planted['messages']} messages); {size / 1e6:.1f} MB")
        t0 = time.perf_counter()
        spark = audit_job.spark_session("local[2]", app="meshmq-audit-bench")
        start_s = time.perf_counter() - t0
        tracker = spark.sparkContext.statusTracker()
        cpu = jvm_cpu(spark)
        py_cpu = python_workers_cpu(spark)
        times = []
        core = []
        from meshmq.pipeline import audit

        for run in range(args.runs):
            # The journey query alone (what the research note measured): statuses
            # (the catalog pass included: the journeys' dictionaries come from it).
            spark.catalog.clearCache()
            t0 = time.perf_counter()
            events = audit_job.read_traces(spark, [trace])
            audit.summary(audit_job.compute(events).journeys).collect()
            core.append(time.perf_counter() - t0)
            print(f"run {run}: journeys + statuses only {core[-1]:.1f}s = "
                  f"{n / core[-1]:,.0f} events/s")
            spark.catalog.clearCache()
            jobs0 = len(tracker.getJobIdsForGroup(None))
            load0 = os.getloadavg()[0]
            t0, c0 = time.perf_counter(), cpu()
            w0, d0 = py_cpu(), time.process_time()
            tables = audit_job.compute(audit_job.read_traces(spark, [trace]))
            audit_job.write_tables(tables, tmp / f"out{run}")
            times.append(time.perf_counter() - t0)
            cpu_s = cpu() - c0
            workers_s, driver_s = py_cpu() - w0, time.process_time() - d0
            jobs = len(tracker.getJobIdsForGroup(None)) - jobs0
            lost = tables.lost.count()
            dups = tables.duplicates.count()
            print(f"run {run}: {times[-1]:.1f}s = {n / times[-1]:,.0f} events/s, "
                  f"{cpu_s:.1f} s JVM CPU, {workers_s:.1f} s Python workers' CPU, "
                  f"{driver_s:.1f} s driver Python CPU, total "
                  f"{cpu_s + workers_s + driver_s:.1f} s CPU, {jobs} Spark jobs, load "
                  f"{load0:.1f} -> {os.getloadavg()[0]:.1f}; "
                  f"lost {lost} (planted {planted['lost']}), duplicates {dups} "
                  f"(planted {planted['duplicates']})")
            assert lost == planted["lost"] and dups == planted["duplicates"]
        if args.breakdown:
            breakdown(spark, trace, tmp / "out-breakdown")
        print(f"JVM peak resident memory (VmHWM): {jvm_peak_rss_mb(spark):,.0f} MB")
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    line = (f"| {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} | {commit} | {args.format} | {n:,} | "
            f"{start_s:.1f} | {times[0]:.1f} | {min(times):.1f} | "
            f"{n / times[0]:,.0f} | {n / min(times):,.0f} | {n / min(core):,.0f} |")
    print(line)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{dt.date.today()}-pipeline-audit.md"
        if not path.exists():
            path.write_text(
                "# Audit throughput on local[2]\n\n`python bench/pipeline_audit.py "
                "--events N --format F`: synthetic 3-broker trace, whole audit (read, all "
                "tables computed and written as Parquet), one warm session; the machine "
                "has 2 cores shared with other work.\n\n"
                "| when (UTC) | commit | format | events | session start s | first run s | "
                "best run s | events/s first | events/s best | journeys-only events/s best |"
                "\n|---|---|---|---|---|---|---|---|---|---|\n")
        with path.open("a") as f:
            f.write(line + "\n")
        print(f"appended to {path}")


if __name__ == "__main__":
    main()
