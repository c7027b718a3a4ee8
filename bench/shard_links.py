"""Where a node of shards spends and waits: per-process CPU and each shard link's counters.

Runs the scaling load (``bench/scaling.py``: 64 producers and 64 consumers over 64
queues, 256 B, non-persistent; ``--protocol mqtt``: over 64 topics, QoS 0, clean
sessions, each client with its client id) against ``meshmq broker --shards N`` with its management
endpoint on, then reads ``GET /api/shards``: per shard link, the sends forwarded to
owners, deliveries relayed, relay windows that filled, link writes and pauses, and the
sends an owner parked at its memory limit (producer flow control across shards) or
refused. Prints one line per shard count with msg/s, broker CPU per delivery and each
process's share of a core (a shard well under 100% while messages wait is waiting),
and writes ``bench/results/<date>-shard-links-<cores>cores.md``.

    PYTHONPATH=src:. .venv/bin/python bench/shard_links.py [--shards 2 4] [--count N]
        [--protocol stomp|mqtt] [--handoff on|off|both] [--rounds N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers as bk
from loadgen import LoadSpec, run_load
from scaling import ShardedMeshmq, generator_procs
from tests.support.ports import free_port

LINK_TOTALS = ("sent", "delivered_out", "window_full", "writes", "link_pauses",
               "parked_total", "refused", "retried")


HANDOFF_TOTALS = ("offered", "handed", "declined", "adopted")


def run_one(shards: int, count: int, handoff: bool = True,
            protocol: str = "stomp") -> dict[str, Any]:
    broker = ShardedMeshmq(shards)
    mport = free_port()
    broker.configure()
    broker.config.write_text(broker.config.read_text().replace(
        "[management]\nenabled = false", f"[management]\nenabled = true\nport = {mport}")
        + f"\n[shards]\nhandoff = {'true' if handoff else 'false'}\n")
    broker.start()
    try:
        spec = LoadSpec(protocol=protocol, host=bk.HOST, port=broker.ports[protocol],
                        producers=64, consumers=64, destinations=64, size=256, count=count,
                        duration=20.0, procs_per_role=generator_procs())
        cpu: dict[str, Any] = {}

        def on_start() -> None:
            cpu["t0"], cpu["before"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

        def on_end() -> None:
            cpu["t1"], cpu["after"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

        res = run_load(spec, hard_timeout=300, on_start=on_start, on_end=on_end)
        wall = cpu["t1"] - cpu["t0"]
        spent = {k: v - cpu["before"].get(k, 0.0) for k, v in cpu["after"].items()}
        row: dict[str, Any] = {
            "protocol": protocol, "shards": shards, "handoff": handoff,
            "e2e_rate": round(res.e2e_rate),
            "send_rate": round(res.send_rate),
            "cpu_us_per_delivery": round(1e6 * sum(spent.values()) / max(1, res.received), 1),
            "process_cpu_pct": sorted((round(100 * v / wall) for v in spent.values()),
                                      reverse=True),
            "p50_ms": res.p50_ms, "received": res.received}
        links: dict[str, int] = dict.fromkeys(LINK_TOTALS, 0)
        handoffs: dict[str, int] = dict.fromkeys(HANDOFF_TOTALS, 0)
        if shards > 1:
            url = f"http://127.0.0.1:{mport}/api/shards"
            with urllib.request.urlopen(url, timeout=10) as resp:
                for shard in json.loads(resp.read())["shards"]:
                    for link in shard.get("links") or []:
                        for key in LINK_TOTALS:
                            links[key] += int(link.get(key, 0))
                    for key in HANDOFF_TOTALS:
                        handoffs[key] += int((shard.get("handoffs") or {}).get(key, 0))
        row["links"] = links
        row["handoffs"] = handoffs
        return row
    finally:
        broker.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--count", type=int, default=400_000)
    ap.add_argument("--handoff", choices=("on", "off", "both"), default="on",
                    help="connection handoff to the owning shard ([shards] handoff)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each row, interleaved")
    ap.add_argument("--protocol", choices=("stomp", "mqtt"), default="stomp",
                    help="the clients' protocol (mqtt: topics, QoS 0)")
    args = ap.parse_args()
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.handoff]
    rows = []
    for _ in range(args.rounds):
        for n in args.shards:
            for handoff in (modes if n > 1 else [True]):
                row = run_one(n, args.count, handoff, args.protocol)
                print(json.dumps(row), flush=True)
                rows.append(row)
    date = dt.date.today().isoformat()
    stem = "shard-links" if args.protocol == "stomp" else "shard-links-mqtt"
    out = Path(__file__).parent / "results" / f"{date}-{stem}-{os.cpu_count()}cores.md"
    what = "" if args.protocol == "stomp" else ", MQTT QoS 0 over topics"
    lines = [f"# Shard links under the scaling load{what} ({date}, {os.cpu_count()} CPUs)",
             "",
             f"Command: `python bench/shard_links.py --shards {' '.join(map(str, args.shards))}"
             f" --count {args.count} --handoff {args.handoff} --rounds {args.rounds}"
             f" --protocol {args.protocol}`, "
             f"{bk.meshmq_build()} build, {generator_procs()} load generator processes "
             "for the producers and as many for the consumers. Link and handoff counters "
             "are summed over every "
             "shard link (both directions) and every shard.", "",
             "| shards | handoff | e2e msg/s | CPU µs/delivery | process CPU % | "
             + " | ".join(LINK_TOTALS + HANDOFF_TOTALS) + " |",
             "|---" * (5 + len(LINK_TOTALS) + len(HANDOFF_TOTALS)) + "|"]
    for r in rows:
        lines.append(f"| {r['shards']} | {'on' if r['handoff'] else 'off'} | "
                     f"{r['e2e_rate']:,} | {r['cpu_us_per_delivery']} | "
                     f"{' '.join(map(str, r['process_cpu_pct']))} | "
                     + " | ".join(f"{r['links'][k]:,}" for k in LINK_TOTALS) + " | "
                     + " | ".join(f"{r['handoffs'][k]:,}" for k in HANDOFF_TOTALS) + " |")
    out.write_text("\n".join(lines) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
