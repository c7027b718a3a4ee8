"""Scaling benchmark: many clients over many destinations against one meshmq broker.

    .venv/bin/python bench/scaling.py [--quick] [--shards 1 2 4] [--clients 64] [--count N]

64 producers and 64 consumers (``--clients``) over 64 queues (``--destinations``),
256 B, non-persistent, against one ``meshmq broker``; reports end-to-end msg/s and the
broker's and the generator's CPU per delivered message (as bench/run_matrix.py does).
``--shards N`` is passed to ``meshmq broker --shards N``; a broker without that option
runs one shard only, and the harness says so and skips the other values. msg/s on a
machine with few cores mostly measures how the generator and the broker share them:
the results name the host's core count (``bench/results/<date>-scaling-<N>cores.md``
and ``.json``), and CPU per delivery is the figure to compare across hosts.
``--placement numbered`` runs the node with ``[shards] placement = "numbered"`` (the
file name says so): the queues, ``bench.<stem>.0`` to ``.63``, then fall evenly on the
shards, where a hash of each name leaves the busiest shard about twice the mean.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
from loadgen import LoadSpec, run_load
from run_matrix import RESULTS, _fmt, _git_rev, cpu_per_message, log

from meshmq.core.destinations import queue
from meshmq.core.shards import PLACEMENTS, owner


class ShardedMeshmq(bk.Meshmq):
    """meshmq with ``--shards N`` on its command line (left off for one shard, so this
    runs against brokers that do not have the option yet) and, for ``numbered``,
    ``[shards] placement`` in its configuration."""

    def __init__(self, shards: int, placement: str = "hash") -> None:
        super().__init__()
        self.shards = shards
        self.placement = placement

    def configure(self) -> None:
        super().configure()
        if self.placement != "hash":
            with self.config.open("a") as f:
                f.write(f'\n[shards]\nplacement = "{self.placement}"\n')

    def command(self) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command()
        if self.shards > 1:
            cmd += ["--shards", str(self.shards)]
        return cmd, env


def generator_procs() -> int:
    """Generator processes per role: on many cores, two producer and two consumer
    processes were what a run of 16 shards measured (each near a whole core), so they
    grow with the host, leaving most cores to the shards."""
    return max(2, (os.cpu_count() or 2) // 4)


def placement(stem: str, destinations: int, shards: int, scheme: str = "hash"
              ) -> dict[str, Any]:
    """How a run's queues fall on the shards. Under hash placement a queue's owner is a
    hash of its name (docs/shards.md), so a few dozen queues spread unevenly: 64 over 16
    shards give the busiest shard about twice the mean (1.25x to 3x, by the names).
    Each producer sends the same count, so the busiest owner finishes last and bounds
    the run's msg/s at about ``shards / busiest_x_mean`` one-shard rates: read msg/s
    beside this figure. The queues are a numbered family (``bench.<stem>.<n>``), so
    numbered placement (``--placement numbered``) spreads them within one."""
    per = [0] * shards
    for d in range(destinations):
        per[owner(queue(f"bench.{stem}.{d}"), shards, placement=PLACEMENTS[scheme])] += 1
    busiest = max(per)
    return {"queues_per_shard": per, "busiest_owns": busiest,
            "busiest_x_mean": round(busiest * shards / destinations, 2)}


def shards_supported() -> bool:
    """Whether ``meshmq broker`` takes ``--shards``, from its help text."""
    out = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "broker", "--help"],
                         capture_output=True, text=True, check=False)
    return "--shards" in out.stdout


def run_one(shards: int, args: argparse.Namespace) -> dict[str, Any]:
    broker = ShardedMeshmq(shards, args.placement)
    row: dict[str, Any] = {"shards": shards}
    try:
        row["startup_s"] = round(broker.start(), 2)
        spec = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], producers=args.clients,
                        consumers=args.clients, destinations=args.destinations, size=256,
                        count=args.count, duration=args.duration,
                        procs_per_role=args.gen_procs)
        cpu: dict[str, Any] = {}

        def on_start() -> None:
            cpu["t0"], cpu["before"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

        def on_end() -> None:
            cpu["t1"], cpu["after"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

        res = run_load(spec, hard_timeout=max(120.0, args.duration * 20),
                       on_start=on_start, on_end=on_end)
        row.update(res.row())
        row.update(placement(spec.name, args.destinations, shards, args.placement))
        if "after" in cpu:
            row.update(cpu_per_message(bk.cpu_spent(cpu["before"], cpu["after"]),
                                       cpu["t1"] - cpu["t0"], res))
        row["status"] = "ok" if res.complete else ("error" if res.error else "incomplete")
    except Exception as exc:
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    finally:
        broker.close()
    log(f"shards {shards}: {row.get('status')} e2e {row.get('e2e_rate')} msg/s, broker "
        f"{row.get('broker_cpu_us_per_delivery')} µs/delivery, busiest shard owns "
        f"{row.get('busiest_owns')} queues ({row.get('busiest_x_mean')}x the mean) "
        f"{row.get('error') or ''}")
    return row


def write_markdown(path: Path, data: dict[str, Any]) -> None:
    env = data["env"]
    lines = [f"# Scaling: {env['clients']} clients over {env['destinations']} queues "
             f"({env['date']}{', quick' if env['quick'] else ''})", "",
             f"Command: `{env['command']}` on {env['cpus']} CPUs, Python {env['python']}, "
             f"meshmq at git {env['git']}, {env['meshmq_build']} build, "
             f"[shards] placement = \"{env.get('placement', 'hash')}\", "
             f"{env.get('generator_procs', 2)} load generator processes for the producers "
             "and as many for the consumers. Generated by "
             "bench/scaling.py; see docs/benchmarks.md, *CPU per message*.", ""]
    lines += [f"- {n}" for n in env["notes"]]
    lines += ["", "| shards | e2e msg/s | send msg/s | broker CPU µs/delivery "
              "| generator CPU µs/delivery | broker CPU % | busiest shard's queues (x mean) "
              "| p99 ms | received/expected | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(
            f"| {r['shards']} | {_fmt(r.get('e2e_rate'))} | {_fmt(r.get('send_rate'))} "
            f"| {_fmt(r.get('broker_cpu_us_per_delivery'), 1)} "
            f"| {_fmt(r.get('gen_cpu_us_per_delivery'), 1)} | {_fmt(r.get('broker_cpu_pct'))} "
            f"| {r.get('busiest_owns', '—')} ({_fmt(r.get('busiest_x_mean'), 2)}) "
            f"| {_fmt(r.get('p99_ms'), 2)} | {_fmt(r.get('received'))}/"
            f"{_fmt(r.get('expected'))} | {r.get('status')} {r.get('error') or ''} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    ap.add_argument("--shards", type=int, nargs="+", default=[1],
                    help="values for `meshmq broker --shards` (default: 1)")
    ap.add_argument("--clients", type=int, default=64, help="producers, and as many consumers")
    ap.add_argument("--destinations", type=int, default=64)
    ap.add_argument("--placement", choices=tuple(PLACEMENTS), default="hash",
                    help="the node's [shards] placement (default: hash, the broker's "
                         "default); the queues are a numbered family, which numbered "
                         "placement spreads evenly")
    ap.add_argument("--meshmq-build", choices=("compiled", "python"), default=None)
    ap.add_argument("--gen-procs", type=int, default=generator_procs(),
                    help="load generator processes for the producers, and as many for the "
                         "consumers (default: a quarter of the cores, at least 2)")
    ap.add_argument("--count", type=int, default=None,
                    help="messages per run (default 400,000; --quick 20,000): a machine with "
                         "many cores needs more for a run of several seconds")
    args = ap.parse_args()
    if args.meshmq_build:
        os.environ["MESHMQ_BENCH_BUILD"] = args.meshmq_build
    if args.count is None:
        args.count = 20_000 if args.quick else 400_000
    args.duration = 3.0 if args.quick else 20.0
    notes: list[str] = []
    shards = sorted(set(args.shards))
    if any(n > 1 for n in shards) and not shards_supported():
        notes.append("`meshmq broker` has no --shards option yet: one shard only")
        shards = [1]
    elif shards == [1]:
        notes.append("one shard only (--shards to compare more)")
    date = dt.date.today().isoformat()
    data: dict[str, Any] = {
        "env": {"date": date, "quick": args.quick, "cpus": os.cpu_count(),
                "python": platform.python_version(), "git": _git_rev(),
                "meshmq_build": bk.meshmq_build(), "clients": args.clients,
                "destinations": args.destinations, "generator_procs": args.gen_procs,
                "placement": args.placement,
                "notes": notes,
                "command": " ".join(["python bench/scaling.py", *sys.argv[1:]])},
        "runs": [],
    }
    for note in notes:
        log(note)
    for n in shards:
        data["runs"].append(run_one(n, args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = (f"{date}-scaling-{os.cpu_count()}cores"
            f"{'' if args.placement == 'hash' else '-' + args.placement}"
            f"{'-quick' if args.quick else ''}")
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    write_markdown(RESULTS / f"{stem}.md", data)
    log(f"wrote {RESULTS / (stem + '.md')} and .json")


if __name__ == "__main__":
    main()
