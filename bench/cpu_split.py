"""A meshmq broker's CPU per delivered message, split into user and system time, with
its minor page faults, for one STOMP scenario run a few times on one broker.

    .venv/bin/python bench/cpu_split.py 1m --runs 3            # queue 1/1, 1 MB bodies
    .venv/bin/python bench/cpu_split.py t1x10 --lib /tmp/old-compiled-lib
    .venv/bin/python bench/cpu_split.py q1x1 --build python

The matrix (run_matrix.py) reports user + system together; with large bodies most of
the broker's time is the kernel's (socket copies, and page faults when big buffers are
allocated and freed per message), so this splits them and counts the faults. Starts the
broker as the matrix does (bench/brokers.py: journal store, compiled build unless
``--build python``; ``--lib`` names another compiled build) and drives it with
loadgen.py. Prints one line per run; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
import psutil
from loadgen import LoadSpec, run_load

SCENARIOS: dict[str, dict[str, Any]] = {
    "1m": {"size": 1024 * 1024, "count": 1000},
    "t1x10": {"mode": "topic", "consumers": 10, "count": 20_000},
    "q1x1": {"count": 100_000},
}


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (/proc/<pid>/stat, field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", choices=("compiled", "python"), default="compiled")
    ap.add_argument("--lib", type=Path, default=None,
                    help="a compiled build other than build/compiled-lib")
    args = ap.parse_args()
    os.environ["MESHMQ_BENCH_BUILD"] = args.build
    if args.lib is not None:
        bk.COMPILED_LIB = args.lib.resolve()
    broker = bk.Meshmq()
    broker.configure()
    broker.start()
    try:
        pid = broker.pid()
        assert pid is not None
        proc = psutil.Process(pid)
        marks: dict[str, Any] = {}

        def on_start() -> None:
            marks["cpu0"], marks["flt0"] = proc.cpu_times(), minor_faults(pid)

        def on_end() -> None:
            marks["cpu1"], marks["flt1"] = proc.cpu_times(), minor_faults(pid)

        for run in range(args.runs):
            spec = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], duration=30.0,
                            **SCENARIOS[args.scenario])
            marks.clear()
            res = run_load(spec, hard_timeout=300.0, on_start=on_start, on_end=on_end)
            n = max(1, res.received)
            user = (marks["cpu1"].user - marks["cpu0"].user) * 1e6 / n
            system = (marks["cpu1"].system - marks["cpu0"].system) * 1e6 / n
            faults = (marks["flt1"] - marks["flt0"]) / n
            print(f"{args.scenario} run {run + 1}: e2e {res.e2e_rate:,.0f} msg/s, "
                  f"{res.received} received; broker µs/delivery user {user:.1f} system "
                  f"{system:.1f} total {user + system:.1f}, minor faults/delivery "
                  f"{faults:.1f}; generator µs/delivery "
                  f"{(res.gen_cpu_s or 0.0) * 1e6 / n:.1f}", flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
