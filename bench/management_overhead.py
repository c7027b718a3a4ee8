"""What watching a broker costs it: one queue's throughput, and the broker's CPU per
message, with nobody watching, with ``GET /metrics`` scraped every second, with the web
console open on the network map (``GET /api/events``: a snapshot with the map every
second), and with both.

Starts two ``meshmq broker`` subprocesses (journal without fsync, so the broker's CPU is
what is measured): the measured broker A and a peer B that A bridges to, so the map walks
a real network (A asks B's endpoint every second). A gets ``--destinations`` extra queues
holding one message each (so every scrape and snapshot carries that many destinations).
Then the project's load generator (bench/loadgen.py: 1 producer, 1 consumer, one queue
on A) runs in rounds that cycle through the four sides, which spreads the drift of a
shared machine over all of them. CPU per message is A's user+system CPU seconds over the
round divided by the messages delivered: it does not depend on how many cores the load
generator takes. Results are appended to ``bench/results/<date>-management-overhead.md``.

    python bench/management_overhead.py                  # 3 rounds per side, 200k messages
    python bench/management_overhead.py --rounds 5 --count 300000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from brokers import free_ports, port_accepts
from loadgen import LoadSpec, install_uvloop, run_load

SIDES = ("none", "metrics", "console", "both")

RESULTS = Path(__file__).resolve().parent / "results"


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` seconds until stopped; counts scrapes and time."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.done = threading.Event()
        self.scrapes = 0
        self.seconds: list[float] = []
        self.size = 0

    def run(self) -> None:
        while not self.done.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                self.size = len(resp.read())
            self.seconds.append(time.perf_counter() - started)
            self.scrapes += 1
            self.done.wait(self.interval)


class ConsoleWatcher(threading.Thread):
    """What an open console on the network page does: reads ``GET /api/events`` (a
    snapshot with the network map every second) until stopped; counts snapshots."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.done = threading.Event()
        self.snapshots = 0
        self.size = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/api/events")
            resp = conn.getresponse()
            while not self.done.is_set():
                line = resp.fp.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    self.snapshots += 1
                    self.size = len(line)
        finally:
            with contextlib.suppress(OSError):
                conn.close()


def start_broker(data: Path, name: str, extra: str = ""
                 ) -> tuple[subprocess.Popen[bytes], int, int, int]:
    """A broker subprocess: (process, STOMP port, management port, broker-link port)."""
    stomp, mgmt, tcp = free_ports(3)
    data.mkdir(parents=True)
    config = data / "meshmq.toml"
    config.write_text(f"""[broker]
name = "{name}"
data_directory = "{data}"

[store]
fsync = false

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{stomp}"

[[listeners]]
name = "tcp"
url = "tcp://127.0.0.1:{tcp}"
allow_anonymous_links = true

[management]
host = "127.0.0.1"
port = {mgmt}
{extra}""")
    proc = subprocess.Popen([sys.executable, "-m", "meshmq.cli.main", "--log-level",
                             "WARNING", "broker", "--config", str(config)])
    deadline = time.monotonic() + 30
    while not (port_accepts(stomp) and port_accepts(mgmt)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"broker {name} did not start")
        time.sleep(0.05)
    return proc, stomp, mgmt, tcp


def wait_bridge(mgmt: int) -> None:
    import json
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{mgmt}/api/network", timeout=5) as r:
            net = json.loads(r.read())
        if any(b["state"] == "forwarding" for c in net["connectors"] for b in c["bridges"]):
            return
        time.sleep(0.1)
    raise SystemExit("the bridge A->B never came up")


def fill_destinations(port: int, n: int) -> None:
    from meshmq.client.simple_stomp import SimpleStompClient

    with SimpleStompClient("127.0.0.1", port) as client:
        for i in range(n):
            client.send(f"/queue/bench.idle.{i:04d}", b"x", confirm=i == n - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side")
    ap.add_argument("--count", type=int, default=200_000, help="messages per round")
    ap.add_argument("--destinations", type=int, default=200,
                    help="extra queues every scrape and snapshot carries")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    a = ap.parse_args()
    loop = install_uvloop()
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu_us: dict[str, list[float]] = {side: [] for side in SIDES}
    scrape_s: list[float] = []
    scrape_size = snapshot_size = 0
    with tempfile.TemporaryDirectory(prefix="meshmq-mgmt-bench-") as tmp:
        peer, _, _, peer_tcp = start_broker(Path(tmp) / "b", "B")
        proc, stomp, mgmt, _ = start_broker(Path(tmp) / "a", "A", f"""
[[network_connectors]]
name = "to-b"
uri = "static:(tcp://127.0.0.1:{peer_tcp})"
""")
        try:
            wait_bridge(mgmt)
            measured = psutil.Process(proc.pid)
            fill_destinations(stomp, a.destinations)
            run_load(LoadSpec(port=stomp, count=a.count // 5, procs_per_role=1))  # warm-up
            for i in range(len(SIDES) * a.rounds):
                side = SIDES[i % len(SIDES)]
                scraper = Scraper(mgmt, a.interval) if side in ("metrics", "both") else None
                watcher = ConsoleWatcher(mgmt) if side in ("console", "both") else None
                for t in (scraper, watcher):
                    if t is not None:
                        t.start()
                before = measured.cpu_times()
                result = run_load(LoadSpec(port=stomp, count=a.count, procs_per_role=1))
                after = measured.cpu_times()
                if scraper is not None:
                    scraper.done.set()
                    scraper.join()
                    scrape_s += scraper.seconds
                    scrape_size = scraper.size
                if watcher is not None:
                    watcher.done.set()
                    watcher.join(5)
                    snapshot_size = watcher.size
                if not result.complete:
                    raise SystemExit(f"round {i} incomplete: {result.error}")
                cpu = (after.user + after.system) - (before.user + before.system)
                rates[side].append(result.e2e_rate)
                cpu_us[side].append(cpu / max(result.received, 1) * 1e6)
                extra = (f" ({scraper.scrapes} scrapes)" if scraper else "") + \
                    (f" ({watcher.snapshots} snapshots)" if watcher else "")
                print(f"round {i + 1}: {side:8} {result.e2e_rate:,.0f} msg/s "
                      f"{cpu_us[side][-1]:.2f} us CPU/msg{extra}", flush=True)
        finally:
            for p in (proc, peer):
                p.terminate()
                p.wait(30)
    base_rate = statistics.median(rates["none"])
    base_cpu = statistics.median(cpu_us["none"])
    scrape_s.sort()
    lines = [
        f"## {dt.datetime.now().isoformat(timespec='seconds')}",
        "",
        f"`python bench/management_overhead.py --rounds {a.rounds} --count {a.count} "
        f"--destinations {a.destinations} --interval {a.interval}` on {os.cpu_count()} "
        f"CPUs ({loop}); one queue, 1 producer, 1 consumer, 256-byte non-persistent "
        f"messages on broker A, which bridges to broker B; {a.destinations} extra queues "
        f"on A (a scrape: {scrape_size:,} bytes; a console snapshot with the map: "
        f"{snapshot_size:,} bytes).",
        "",
        "| watching | rounds (msg/s) | median msg/s | throughput cost | broker CPU/msg "
        "(median) | CPU cost |",
        "|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        rate, cpu = statistics.median(rates[side]), statistics.median(cpu_us[side])
        label = {"none": "nobody", "metrics": f"/metrics every {a.interval:g} s",
                 "console": "console on the network map", "both": "both"}[side]
        lines.append(
            f"| {label} | {', '.join(f'{r:,.0f}' for r in rates[side])} | {rate:,.0f} | "
            f"{(base_rate - rate) / base_rate * 100:+.1f}% | {cpu:.2f} us | "
            f"{(cpu - base_cpu) / base_cpu * 100:+.1f}% |")
    if scrape_s:
        lines += ["", f"Scrape time seen by the scraper: median "
                      f"{statistics.median(scrape_s) * 1000:.1f} ms, max "
                      f"{scrape_s[-1] * 1000:.1f} ms over {len(scrape_s)} scrapes."]
    lines.append("")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{dt.date.today().isoformat()}-management-overhead.md"
    with out.open("a") as fh:
        if fh.tell() == 0:
            fh.write("# What watching a broker costs it\n\n")
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
