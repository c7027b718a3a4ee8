"""What meshmq holds in front of a STOMP consumer when the producer never waits.

The matrix's ``q1x1`` and ``t1x1`` (one producer sending 256 B non-persistent messages
flat out, no receipts, one ack:auto consumer) measured end to end, plus what the broker
buffers meanwhile: every 50 ms it reads ``GET /api/broker`` (``memory.bytes``: message
bodies held in memory, the backlog of queues and topic subscriptions alike), the queue's
depth (``GET /api/destinations/queue/NAME``) and the broker's RSS, and keeps the peaks.
A broker that reads the producer far ahead of the consumer queues the difference:
seconds of latency and memory. Reports p50/p99/max latency, msg/s end to end, the
broker's CPU per delivered message and those peaks.

Builds are compared in interleaved rounds (A B A B ...): ``--build NAME=PATH`` runs the
broker with ``PYTHONPATH=PATH`` (a compiled build unpacked by ``dev/build-compiled``, or
a ``src`` directory for the pure-Python build); without it the build
``bench/brokers.py`` picks (``MESHMQ_BENCH_BUILD``).

    PYTHONPATH=bench .venv/bin/python bench/stomp_pipelined_latency.py \\
        [--mode queue topic] [--rounds 3] [--count 200000] [--duration 8] \\
        [--build before=/tmp/before-lib --build after=build/compiled-lib] [--consumers 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
from loadgen import LoadSpec, run_load


class ManagedMeshmq(bk.Meshmq):
    """meshmq as the matrix starts it, with the management endpoint on and a chosen
    ``PYTHONPATH``."""

    def __init__(self, pythonpath: str | None) -> None:
        super().__init__()
        self.pythonpath = pythonpath

    def configure(self) -> None:
        super().configure()
        (self.ports["management"],) = bk.free_ports(1)
        assert self.config is not None
        text = self.config.read_text().replace(
            "[management]\nenabled = false\n",
            f'[management]\nhost = "{bk.HOST}"\nport = {self.ports["management"]}\n')
        self.config.write_text(text)

    def command(self) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command()
        if self.pythonpath is not None:
            env = {"PYTHONPATH": self.pythonpath}
        return cmd, env


def _get(port: int, path: str) -> Any:
    # A broker busy with the load answers late: wait, or a peak goes unseen.
    with urllib.request.urlopen(f"http://{bk.HOST}:{port}{path}", timeout=30) as resp:
        return json.loads(resp.read())


class Watch:
    """Peaks of the broker's memory-held message bytes, queue depth and RSS."""

    def __init__(self, broker: ManagedMeshmq, queue: str | None) -> None:
        self.port = broker.ports["management"]
        pid = broker.pid()
        assert pid is not None
        self.proc = psutil.Process(pid)
        self.queue = queue
        self.mem = self.depth = self.rss = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.rss = max(self.rss, self.proc.memory_info().rss)
                self.mem = max(self.mem, int(_get(self.port, "/api/broker")["memory"]["bytes"]))
                if self.queue is not None:
                    d = _get(self.port, f"/api/destinations/queue/{self.queue}")
                    self.depth = max(self.depth, int(d["depth"]))
            except Exception:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def one_run(pythonpath: str | None, mode: str, count: int, duration: float,
            consumers: int = 1) -> dict[str, Any]:
    broker = ManagedMeshmq(pythonpath)
    try:
        broker.start()
        spec = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], producers=1,
                        consumers=consumers,
                        size=256, count=count, duration=duration, mode=mode)
        spec.name = f"lat{os.getpid()}x{int(time.time() * 1000) % 10**8}"
        queue = f"bench.{spec.name}.0" if mode == "queue" else None
        watch = Watch(broker, queue)
        cpu: dict[str, Any] = {}

        def on_start() -> None:
            cpu["before"] = bk.tree_cpu([broker.pid()])

        def on_end() -> None:
            cpu["after"] = bk.tree_cpu([broker.pid()])

        res = run_load(spec, hard_timeout=300, on_start=on_start, on_end=on_end)
        watch.close()
        spent = bk.cpu_spent(cpu["before"], cpu["after"]) if "after" in cpu else 0.0
        return {"received": res.received, "sent": res.sent, "complete": res.complete,
                "msg_s": res.e2e_rate, "p50_ms": res.p50_ms, "p99_ms": res.p99_ms,
                "max_ms": res.max_ms,
                "cpu_us": spent * 1e6 / res.received if res.received else None,
                "peak_mem_mib": watch.mem / 2**20, "peak_depth": watch.depth,
                "peak_rss_mib": watch.rss / 2**20, "error": res.error}
    finally:
        broker.close()


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", nargs="+", default=["queue", "topic"], choices=["queue", "topic"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--build", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--consumers", type=int, default=1,
                    help="consumers (a topic's subscribers each get every message)")
    args = ap.parse_args()
    builds: list[tuple[str, str | None]] = [
        (b.split("=", 1)[0], str(Path(b.split("=", 1)[1]).resolve())) for b in args.build
    ] or [(bk.meshmq_build(), None)]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        for mode in args.mode:
            for name, path in builds:
                r = one_run(path, mode, args.count, args.duration, args.consumers)
                rows.setdefault((mode, name), []).append(r)
                print(f"round {rnd + 1} {mode:5} {name:8} {r['received']:>7} msgs "
                      f"{_fmt(r['msg_s'], ',.0f'):>7}/s p50 {_fmt(r['p50_ms'], '.0f'):>5} ms "
                      f"p99 {_fmt(r['p99_ms'], '.0f'):>5} ms max {_fmt(r['max_ms'], '.0f'):>5} "
                      f"ms cpu {_fmt(r['cpu_us'], '.1f'):>5} µs/msg peak mem "
                      f"{r['peak_mem_mib']:.1f} MiB depth {r['peak_depth']} rss "
                      f"{r['peak_rss_mib']:.0f} MiB{'' if r['complete'] else ' INCOMPLETE'}"
                      f"{' ' + r['error'] if r['error'] else ''}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    print("medians:")
    for (mode, name), rs in rows.items():
        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            vals = [r[key] for r in rs if r[key] is not None]
            return statistics.median(vals) if vals else float("nan")
        print(f"  {mode:5} {name:8} {med('msg_s'):>7,.0f}/s p50 {med('p50_ms'):.0f} ms "
              f"p99 {med('p99_ms'):.0f} ms cpu {med('cpu_us'):.1f} µs/msg peak mem "
              f"{med('peak_mem_mib'):.1f} MiB depth {med('peak_depth'):.0f} rss "
              f"{med('peak_rss_mib'):.0f} MiB")


if __name__ == "__main__":
    main()
