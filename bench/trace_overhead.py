"""Throughput cost of the message trace: the same STOMP runs with tracing off and on.

Starts a meshmq broker subprocess per setting (tracing off; JSON lines at sample
rate 1; Parquet at sample rate 1; JSON lines at 10%), runs the one-queue 1/1
scenarios of ``stomp_throughput.py`` against each, alternating settings so
machine noise hits all of them alike, and reports the median end-to-end
throughput of each setting and its cost against "off". Results go to
``bench/results/<date>-trace-overhead.md`` and ``.json``.

    python bench/trace_overhead.py [--rounds 3] [--scale 1.0]
    python bench/trace_overhead.py --settings jsonl,jsonl-exact --name trace-exact
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stomp_throughput import run_scenario

RESULTS = Path(__file__).resolve().parent / "results"

SETTINGS = {
    "off": "",
    "jsonl": '[trace]\nenabled = true\nformat = "jsonl"\n',
    "parquet": '[trace]\nenabled = true\nformat = "parquet"\n',
    "jsonl-10%": '[trace]\nenabled = true\nformat = "jsonl"\nsample_rate = 0.1\n',
    "jsonl-exact": '[trace]\nenabled = true\nformat = "jsonl"\nexact = true\n',
}
# The settings a run compares (--settings); "off" is always the baseline.
DEFAULT_SETTINGS = ("off", "jsonl", "parquet", "jsonl-10%")
SCENARIOS = [
    # name, count, size, persistent, window (0 = confirm only the last)
    ("nonpersistent-256B", 100_000, 256, False, 0),
    ("persistent-256B-window100", 30_000, 256, True, 100),
]


def start(tmp: Path, setting: str) -> tuple[subprocess.Popen[bytes], int]:
    cfg = tmp / f"{setting}.toml"
    cfg.write_text(f"""
[broker]
name = "bench"
data_directory = "{tmp / ('data-' + setting)}"
[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"
[store]
fsync = false
[management]
enabled = false
{SETTINGS[setting]}""")
    log = tmp / f"{setting}.log"
    proc = subprocess.Popen([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                             str(cfg)], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"listening for stomp on \S+://[\d.]+:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not start: " + log.read_text())


def trace_bytes(tmp: Path, setting: str) -> int:
    return sum(p.stat().st_size for p in (tmp / f"data-{setting}").glob("trace/*"))


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    runs: dict[str, dict[str, list[float]]] = {s: {} for s in args.settings}
    tmp = Path(tempfile.mkdtemp(prefix="meshmq-trace-bench-"))
    try:
        for rnd in range(args.rounds):
            for setting in args.settings:
                proc, port = start(tmp, setting)
                try:
                    for name, count, size, persistent, window in SCENARIOS:
                        n = max(100, int(count * args.scale))
                        r = await run_scenario("127.0.0.1", port, name, n, size, persistent,
                                               window, None)
                        runs[setting].setdefault(name, []).append(r.e2e_msgs_per_s)
                        print(f"round {rnd} {setting:10s} {name:28s} {r.e2e_msgs_per_s:>8} "
                              "msg/s", flush=True)
                finally:
                    proc.terminate()
                    proc.wait(30)
        for setting in args.settings:
            if setting != "off":
                print(f"{setting}: {trace_bytes(tmp, setting) / 1e6:.1f} MB of trace files")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def report(runs: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    lines = [f"# Trace overhead, {dt.date.today()} (meshmq {commit})", "",
             f"`python bench/trace_overhead.py --rounds {args.rounds} --scale {args.scale} "
             f"--settings {','.join(args.settings)} --name {args.name}`; "
             "broker subprocess, fsync off, 1 producer / 1 consumer on one queue, "
             "median end-to-end msg/s over the rounds; cost = throughput lost against off.",
             "", "| scenario | " + " | ".join(args.settings) + " |",
             "|---|" + "---|" * len(args.settings)]
    for name, *_ in SCENARIOS:
        base = statistics.median(runs["off"][name])
        cells = []
        for setting in args.settings:
            med = statistics.median(runs[setting][name])
            cost = "" if setting == "off" else f" ({(1 - med / base) * 100:+.1f}% cost)"
            cells.append(f"{med:,.0f}{cost}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                        help=f"comma-separated, from {', '.join(SETTINGS)}")
    parser.add_argument("--name", default="trace-overhead", help="results file name")
    args = parser.parse_args()
    args.settings = ["off", *(s for s in args.settings.split(",") if s and s != "off")]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings: {', '.join(unknown)}")
    runs = asyncio.run(main_async(args))
    text = report(runs, args)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        stem = RESULTS / f"{dt.date.today()}-{args.name}"
        stem.with_suffix(".md").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
        print(f"written {stem}.md")


if __name__ == "__main__":
    main()
