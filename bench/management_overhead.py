"""What scraping ``GET /metrics`` costs a broker: one queue's throughput with and without
a scraper polling every second.

Starts one ``meshmq broker`` subprocess (journal without fsync, so the broker's CPU is what
is measured), creates ``--destinations`` extra queues holding one message each (so every
scrape carries that many destinations' series), then runs the project's load generator
(bench/loadgen.py: 1 producer, 1 consumer, one queue) in rounds that alternate between
no scraper and a scraper thread doing ``GET /metrics`` every ``--interval`` seconds.
Alternating rounds spread the drift of a shared machine over both sides. Results are
appended to ``bench/results/<date>-management-overhead.md``.

    python bench/management_overhead.py                  # 3 rounds each, 50k messages
    python bench/management_overhead.py --rounds 5 --count 100000
"""

from __future__ import annotations

import argparse
import datetime as dt
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

from brokers import free_ports, port_accepts
from loadgen import LoadSpec, install_uvloop, run_load

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


def start_broker(data: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    stomp, mgmt = free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshmq.cli.main", "--log-level", "WARNING", "broker",
         "--data", str(data), "--stomp", f"127.0.0.1:{stomp}", "--mqtt", "127.0.0.1:0",
         "--management", f"127.0.0.1:{mgmt}", "--no-fsync"])
    deadline = time.monotonic() + 30
    while not (port_accepts(stomp) and port_accepts(mgmt)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the broker did not start")
        time.sleep(0.05)
    return proc, stomp, mgmt


def fill_destinations(port: int, n: int) -> None:
    from meshmq.client.simple_stomp import SimpleStompClient

    with SimpleStompClient("127.0.0.1", port) as client:
        for i in range(n):
            client.send(f"/queue/bench.idle.{i:04d}", b"x", confirm=i == n - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side")
    ap.add_argument("--count", type=int, default=50_000, help="messages per round")
    ap.add_argument("--destinations", type=int, default=200,
                    help="extra queues whose series every scrape carries")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    a = ap.parse_args()
    loop = install_uvloop()
    rates: dict[bool, list[float]] = {False: [], True: []}
    scrape_s: list[float] = []
    size = 0
    with tempfile.TemporaryDirectory(prefix="meshmq-mgmt-bench-") as tmp:
        proc, stomp, mgmt = start_broker(Path(tmp) / "data")
        try:
            fill_destinations(stomp, a.destinations)
            run_load(LoadSpec(port=stomp, count=a.count // 5, procs_per_role=1))  # warm-up
            for i in range(2 * a.rounds):
                scraped = i % 2 == 1
                scraper = Scraper(mgmt, a.interval) if scraped else None
                if scraper is not None:
                    scraper.start()
                result = run_load(LoadSpec(port=stomp, count=a.count, procs_per_role=1))
                if scraper is not None:
                    scraper.done.set()
                    scraper.join()
                    scrape_s += scraper.seconds
                    size = scraper.size
                if not result.complete:
                    raise SystemExit(f"round {i} incomplete: {result.error}")
                rates[scraped].append(result.e2e_rate)
                print(f"round {i + 1}: scraped={scraped} {result.e2e_rate:,.0f} msg/s"
                      + (f" ({scraper.scrapes} scrapes)" if scraper else ""), flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    base, with_scrape = statistics.median(rates[False]), statistics.median(rates[True])
    cost = (base - with_scrape) / base * 100
    scrape_s.sort()
    lines = [
        f"## {dt.datetime.now().isoformat(timespec='seconds')}",
        "",
        f"`python bench/management_overhead.py --rounds {a.rounds} --count {a.count} "
        f"--destinations {a.destinations} --interval {a.interval}` on {os.cpu_count()} "
        f"CPUs ({loop}); one queue, 1 producer, 1 consumer, 256-byte non-persistent "
        f"messages; {a.destinations} extra queues in every scrape ({size:,} bytes).",
        "",
        "| scraping | rounds (msg/s) | median msg/s |",
        "|---|---|---|",
        f"| off | {', '.join(f'{r:,.0f}' for r in rates[False])} | {base:,.0f} |",
        f"| every {a.interval:g} s | {', '.join(f'{r:,.0f}' for r in rates[True])} | "
        f"{with_scrape:,.0f} |",
        "",
        f"Throughput cost of scraping: {cost:.1f}% (target < 3%). Scrape time seen by the "
        f"scraper: median {statistics.median(scrape_s) * 1000:.1f} ms, max "
        f"{scrape_s[-1] * 1000:.1f} ms over {len(scrape_s)} scrapes.",
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{dt.date.today().isoformat()}-management-overhead.md"
    with out.open("a") as fh:
        if fh.tell() == 0:
            fh.write("# Cost of scraping GET /metrics\n\n")
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
