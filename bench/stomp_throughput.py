"""First STOMP throughput benchmark: one queue, 1 producer / 1 consumer.

Drives any STOMP broker on host:port with raw asyncio sockets and meshmq's own
codec (so the client side is cheap), or starts a meshmq broker subprocess
itself. Reports end-to-end throughput (first send to last receive), send
throughput, latency percentiles from a timestamp in each body, and the
broker's peak RSS when it runs the broker. Results are appended to
``bench/results/<date>-stomp-queue.md`` and ``.json``.

    python bench/stomp_throughput.py                 # starts meshmq, runs the matrix
    python bench/stomp_throughput.py --port 61613    # an already running broker
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from meshmq.protocol.stomp import StompParser, encode_frame

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Result:
    scenario: str
    messages: int
    size: int
    persistent: bool
    window: int
    e2e_msgs_per_s: float
    send_msgs_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    broker_peak_rss_mb: float | None


class StompConn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = StompParser(version="1.2")

    @classmethod
    async def open(cls, host: str, port: int) -> StompConn:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        conn = cls(reader, writer)
        writer.write(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", host)]))
        frames = await conn.read()
        assert frames and frames[0].command == "CONNECTED", frames
        return conn

    async def read(self) -> list:  # type: ignore[type-arg]
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                raise ConnectionError("broker closed the connection")
            frames = self.parser.feed(data)
            if frames:
                return frames


async def produce(conn: StompConn, dest: str, count: int, size: int, persistent: bool,
                  window: int) -> float:
    pad = b"x" * max(0, size - 8)
    headers = [("destination", dest)]
    if persistent:
        headers.append(("persistent", "true"))
    outstanding = 0
    start = time.perf_counter()
    batch: list[bytes] = []
    for i in range(count):
        body = struct.pack("<d", time.time()) + pad
        hdrs = headers
        want_receipt = window > 0 or i == count - 1
        if want_receipt:
            hdrs = [*headers, ("receipt", str(i))]
        batch.append(encode_frame("SEND", hdrs, body))
        if want_receipt:
            outstanding += 1
        if len(batch) >= 64 or want_receipt:
            conn.writer.write(b"".join(batch))
            batch.clear()
        limit = window if window > 0 else 1
        while outstanding >= limit or (i == count - 1 and outstanding):
            for f in await conn.read():
                if f.command == "RECEIPT":
                    outstanding -= 1
                elif f.command == "ERROR":
                    raise RuntimeError(f.get("message"))
        if window == 0 and len(batch) == 0:
            await conn.writer.drain()
    return time.perf_counter() - start


async def consume(conn: StompConn, dest: str, count: int, latencies: list[float]) -> float:
    conn.writer.write(encode_frame("SUBSCRIBE", [("destination", dest), ("id", "1"),
                                                 ("ack", "auto"), ("receipt", "sub")]))
    got = 0
    first = None
    while got < count:
        for f in await conn.read():
            if f.command == "MESSAGE":
                now = time.time()
                if first is None:
                    first = time.perf_counter()
                (sent,) = struct.unpack_from("<d", f.body)
                latencies.append((now - sent) * 1000)
                got += 1
            elif f.command == "ERROR":
                raise RuntimeError(f.get("message"))
    return time.perf_counter()


async def run_scenario(host: str, port: int, name: str, count: int, size: int,
                       persistent: bool, window: int, rss: RssSampler | None) -> Result:
    dest = f"/queue/bench.{name}.{int(time.time() * 1000)}"
    consumer = await StompConn.open(host, port)
    producer = await StompConn.open(host, port)
    latencies: list[float] = []
    consume_task = asyncio.create_task(consume(consumer, dest, count, latencies))
    await asyncio.sleep(0.2)  # let SUBSCRIBE land (benchmark, not a test)
    if rss:
        rss.reset()
    t0 = time.perf_counter()
    send_time = await produce(producer, dest, count, size, persistent, window)
    end = await consume_task
    e2e = end - t0
    for c in (consumer, producer):
        c.writer.close()
    latencies.sort()
    return Result(name, count, size, persistent, window, round(count / e2e),
                  round(count / send_time), round(latencies[len(latencies) // 2], 2),
                  round(latencies[int(len(latencies) * 0.99)], 2), round(latencies[-1], 2),
                  rss.peak_mb() if rss else None)


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        path = Path(f"/proc/{self.pid}/status")
        while not self._stop.wait(0.05):
            try:
                m = re.search(r"VmRSS:\s+(\d+) kB", path.read_text())
            except OSError:
                return
            if m:
                self.peak = max(self.peak, int(m.group(1)))

    def reset(self) -> None:
        self.peak = 0

    def peak_mb(self) -> float:
        return round(self.peak / 1024, 1)

    def stop(self) -> None:
        self._stop.set()


def start_meshmq(data_dir: Path, fsync: bool) -> tuple[subprocess.Popen[bytes], int]:
    cfg = data_dir / "meshmq.toml"
    cfg.write_text(f"""
[broker]
name = "bench"
data_directory = "{data_dir / 'data'}"
[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"
[store]
fsync = {"true" if fsync else "false"}
[management]
enabled = false
""")
    log = data_dir / "broker.log"
    proc = subprocess.Popen([sys.executable, "-m", "meshmq.cli.main", "--log-level", "INFO",
                             "broker", "--config", str(cfg)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        m = re.search(r"listening for stomp on \S+://[\d.]+:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not start: " + log.read_text())


MATRIX = [
    # name, count, size, persistent, window (0 = no confirmations until the end)
    ("nonpersistent-256B", 100_000, 256, False, 0),
    ("persistent-256B-window100", 30_000, 256, True, 100),
    ("persistent-256B-window1", 3_000, 256, True, 1),
]


async def main_async(args: argparse.Namespace) -> list[Result]:
    results = []
    proc = None
    tmp = None
    rss = None
    host, port = args.host, args.port
    if port is None:
        tmp = Path(tempfile.mkdtemp(prefix="meshmq-bench-"))
        proc, port = start_meshmq(tmp, fsync=not args.no_fsync)
        rss = RssSampler(proc.pid)
    try:
        for name, count, size, persistent, window in MATRIX:
            n = max(100, int(count * args.scale))
            r = await run_scenario(host, port, name, n, size, persistent, window, rss)
            print(json.dumps(asdict(r)))
            results.append(r)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if rss is not None:
            rss.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def write_results(results: list[Result], label: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    base = RESULTS / f"{stamp}-stomp-queue"
    env = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "label": label,
           "when": dt.datetime.now().isoformat(timespec="seconds")}
    with open(base.with_suffix(".json"), "a") as fh:
        fh.write(json.dumps({"env": env, "results": [asdict(r) for r in results]}) + "\n")
    lines = [f"\n## {label} ({env['when']}, Python {env['python']}, {env['cpus']} CPUs)\n",
             "| scenario | msgs | size | persistent | window | e2e msg/s | send msg/s | "
             "p50 ms | p99 ms | max ms | broker peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.scenario} | {r.messages} | {r.size} | {r.persistent} | "
                     f"{r.window} | {r.e2e_msgs_per_s} | {r.send_msgs_per_s} | {r.p50_ms} | "
                     f"{r.p99_ms} | {r.max_ms} | {r.broker_peak_rss_mb} |")
    md = base.with_suffix(".md")
    if not md.exists():
        md.write_text("# STOMP queue throughput, 1 producer / 1 consumer\n\n"
                      "Command: `python bench/stomp_throughput.py` (see its docstring).\n")
    with open(md, "a") as fh:
        fh.write("\n".join(lines) + "\n")
    return md


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="an already running broker")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--label", default="meshmq")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = asyncio.run(main_async(args))
    if not args.no_write:
        print(f"results written to {write_results(results, args.label)}")


if __name__ == "__main__":
    main()
