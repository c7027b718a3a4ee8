"""Persistent sends and their RECEIPTs against one meshmq broker (a subprocess): the broker's
CPU per message at a confirmation window of 1, and how receipts keep pace with a client
that pipelines receipted persistent sends.

    python bench/persist_confirm.py window1 --count 5000
    python bench/persist_confirm.py pipeline --count 50000
    python bench/persist_confirm.py both --build compiled --out bench/results/x.json

``window1``: one producer sends persistent 256 B messages to a queue, each with a receipt,
and waits for it before the next; one ack:auto consumer drains the queue (``--no-consumer``:
none, so every message is written and synced; ``--non-persistent``: the same traffic
without the store, the floor). Reported: msg/s,
the broker's CPU seconds per message (user+system of every thread, /proc/<pid>/stat), its
journal syncs per message (GET /metrics) and its wake-ups per message (every thread's
voluntary context switches: the writer thread's and the loop's sleeps and wake-ups),
and the receipt round trip p50/p99.

``pipeline``: one client writes ``count`` receipted persistent SENDs as fast as the socket
takes them (a writer thread) while a reader thread timestamps each RECEIPT; a consumer
drains the queue. Reported: time to write everything, time to the first receipt and to
each 10% of receipts, the most sends written but not yet confirmed, receipt latency
p50/p99 (receipt arrival minus the moment its SEND was handed to the kernel) and the
consumer's end-to-end latency p50/p99.

``--build compiled`` runs the mypyc-compiled modules of ``--lib`` (``build/compiled-lib``,
from dev/build-compiled) with every other module from ``--src`` (this tree's ``src/``), so
a before/after pair can share one compiled build where only pure-Python modules changed;
``python`` runs ``--src`` alone. Compare CPU per message, not rates, on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from meshmq.protocol.stomp import StompParser  # noqa: E402

_TS = struct.Struct("<d")
HZ = os.sysconf("SC_CLK_TCK")


def compiled_overlay(dest: Path, src_root: Path, lib: Path) -> Path:
    """A copy of the compiled build ``lib`` whose pure-Python modules are ``src_root``'s."""
    if not (lib / "meshmq").is_dir():
        raise SystemExit(f"no compiled build in {lib}: run dev/build-compiled, or "
                         "--build python")
    shutil.copytree(lib / "meshmq", dest / "meshmq", symlinks=True)
    shutil.copy2(next(lib.glob("meshmq__mypyc*.so")), dest)
    src = src_root / "meshmq"
    for py in src.rglob("*.py"):
        rel = py.relative_to(src)
        target = dest / "meshmq" / rel
        if not list(target.parent.glob(f"{py.stem}.cpython-*.so")):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(py, target)
    return dest


class Broker(bk.Meshmq):
    def __init__(self, pythonpath: Path) -> None:
        super().__init__()
        self.pythonpath = pythonpath
        self.protocols = frozenset({"stomp"})

    def configure(self) -> None:
        self.ports["stomp"], self.ports["http"] = bk.free_ports(2)
        self.config = self.workdir / "meshmq.toml"
        self.config.write_text(f"""[broker]
name = "bench"
data_directory = "{self.workdir / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://{bk.HOST}:{self.ports['stomp']}"

[store]
fsync = true

[management]
port = {self.ports['http']}
""")

    def command(self) -> tuple[list[str], dict[str, str]]:
        # Any PYTHONPATH given to the bench (a dependency folder) stays behind the build.
        path = os.pathsep.join(p for p in (str(self.pythonpath),
                                           os.environ.get("PYTHONPATH", "")) if p)
        return ([sys.executable, "-m", "meshmq.cli.main", "--log-level", "WARNING", "broker",
                 "--config", str(self.config)], {"PYTHONPATH": path})

    def metric(self, name: str) -> float:
        url = f"http://{bk.HOST}:{self.ports['http']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.split(" ", 1)[0].split("{", 1)[0] in (name, name + "_total"):
                    return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def usage(self) -> tuple[float, float, int]:
        """(user CPU seconds, system CPU seconds, voluntary context switches), every
        thread: each voluntary switch is a thread blocking (epoll, a lock, the GIL, an
        fsync), so a wake-up later; preemptions, which other load causes, are left out."""
        pid = self.pid()
        assert pid is not None
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = int(fields[11]) / HZ, int(fields[12]) / HZ
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        switches += int(line.split()[1])
            except OSError:
                pass  # a thread that ended meanwhile
        return user, system, switches


def _connect(port: int, sndbuf: int = 0) -> tuple[socket.socket, StompParser]:
    s = socket.create_connection((bk.HOST, port))
    if sndbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    parser = StompParser(version="1.2", max_frame_size=1 << 26)
    while True:
        frames = parser.feed(s.recv(65536))
        if frames:
            assert frames[0].command == "CONNECTED", frames[0]
            return s, parser


class Consumer(threading.Thread):
    """ack:auto on the queue; end-to-end latency from each body's send timestamp."""

    def __init__(self, port: int, dest: str, expect: int) -> None:
        super().__init__(daemon=True)
        self.sock, self.parser = _connect(port)
        self.sock.sendall(f"SUBSCRIBE\ndestination:{dest}\nid:1\nack:auto\nreceipt:s\n\n\x00"
                          .encode())
        self.expect = expect
        self.latencies: list[float] = []
        self.subscribed = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        unpack = _TS.unpack_from
        lat = self.latencies
        while len(lat) < self.expect:
            data = self.sock.recv(1 << 20)
            if not data:
                break
            now = time.time()
            for f in self.parser.feed(data):
                if f.command == "MESSAGE":
                    lat.append((now - unpack(f.body)[0]) * 1000.0)
                elif f.command == "RECEIPT":
                    self.subscribed.set()
                elif f.command == "ERROR":
                    raise RuntimeError(f"consumer got ERROR: {f.get('message')}")
        self.done.set()


PERSISTENT = "true"  # --non-persistent: the same traffic without the store (a floor)


def _send_frame(dest: str, receipt: int, size: int) -> bytes:
    head = f"SEND\ndestination:{dest}\npersistent:{PERSISTENT}\nreceipt:{receipt}\n" \
           f"content-length:{size}\n\n".encode()
    return head + _TS.pack(time.time()) + bytes(size - 8) + b"\x00"


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))], 3)


def window1(broker: Broker, count: int, size: int, with_consumer: bool = True
            ) -> dict[str, Any]:
    port = broker.ports["stomp"]
    dest = "/queue/bench.w1"
    consumer = Consumer(port, dest, count) if with_consumer else None
    if consumer is not None:
        consumer.start()
        consumer.subscribed.wait(10)
    prod, parser = _connect(port)
    for i in range(200):  # warm-up (not measured); the consumer sees these too
        prod.sendall(_send_frame(dest, i, size))
        while not parser.feed(prod.recv(65536)):
            pass
    if consumer is not None:
        consumer.expect += 200
    syncs0 = broker.metric("meshmq_store_syncs")
    inline0 = broker.metric("meshmq_store_inline_syncs")
    user0, sys0, sw0 = broker.usage()
    rtts: list[float] = []
    t0 = time.perf_counter()
    for i in range(count):
        sent = time.perf_counter()
        prod.sendall(_send_frame(dest, i, size))
        while not parser.feed(prod.recv(65536)):
            pass
        rtts.append((time.perf_counter() - sent) * 1000.0)
    elapsed = time.perf_counter() - t0
    user1, sys1, sw1 = broker.usage()
    syncs1 = broker.metric("meshmq_store_syncs")
    inline1 = broker.metric("meshmq_store_inline_syncs")
    latencies: list[float] = []
    if consumer is not None:
        consumer.done.wait(30)
        consumer.sock.close()
        latencies = consumer.latencies[200:]
    prod.close()
    return {
        "scenario": "window1", "count": count, "size": size, "consumer": with_consumer,
        "msg_per_s": round(count / elapsed),
        "cpu_us_per_msg": round((user1 + sys1 - user0 - sys0) / count * 1e6, 1),
        "user_us_per_msg": round((user1 - user0) / count * 1e6, 1),
        "sys_us_per_msg": round((sys1 - sys0) / count * 1e6, 1),
        "syncs_per_msg": round((syncs1 - syncs0) / count, 3),
        # Syncs the event loop did itself (NaN: a build without them).
        "inline_syncs_per_msg": round((inline1 - inline0) / count, 3),
        "wakeups_per_msg": round((sw1 - sw0) / count, 2),
        "receipt_rtt_ms_p50": _pct(rtts, 50), "receipt_rtt_ms_p99": _pct(rtts, 99),
        "e2e_ms_p50": _pct(latencies, 50), "e2e_ms_p99": _pct(latencies, 99),
        "consumed": len(latencies),
    }


def pipeline(broker: Broker, count: int, size: int, timeout: float,
             sndbuf: int) -> dict[str, Any]:
    port = broker.ports["stomp"]
    dest = "/queue/bench.pipe"
    consumer = Consumer(port, dest, count)
    consumer.start()
    consumer.subscribed.wait(10)
    sock, parser = _connect(port, sndbuf)
    sent_at = [0.0] * count  # perf_counter when the chunk holding send i was accepted
    arrived: list[float] = []
    outstanding_max = 0
    written = 0
    syncs0 = broker.metric("meshmq_store_syncs")
    user0, sys0, _ = broker.usage()

    def reader() -> None:
        nonlocal outstanding_max
        while len(arrived) < count:
            data = sock.recv(1 << 20)
            if not data:
                return
            now = time.perf_counter()
            for f in parser.feed(data):
                if f.command == "RECEIPT":
                    arrived.append(now)
                elif f.command == "ERROR":
                    raise RuntimeError(f"producer got ERROR: {f.get('message')}")
            outstanding_max = max(outstanding_max, written - len(arrived))

    t0 = time.perf_counter()
    rd = threading.Thread(target=reader, daemon=True)
    rd.start()
    chunk = 64
    for start in range(0, count, chunk):
        # Built as they are written: the consumer's latency counts from this moment.
        batch = [_send_frame(dest, i, size) for i in range(start, min(count, start + chunk))]
        sock.sendall(b"".join(batch))
        t = time.perf_counter()
        for i in range(start, min(count, start + chunk)):
            sent_at[i] = t
        written = min(count, start + chunk)
    write_s = time.perf_counter() - t0
    rd.join(timeout)
    total = time.perf_counter() - t0
    user1, sys1, _ = broker.usage()
    syncs1 = broker.metric("meshmq_store_syncs")
    consumer.done.wait(timeout)
    sock.close()
    consumer.sock.close()
    got = len(arrived)
    marks = {f"{p}%": round(arrived[max(0, count * p // 100 - 1)] - t0, 3)
             if count * p // 100 <= got else None for p in range(10, 101, 10)}
    lat = [(arrived[i] - sent_at[i]) * 1000.0 for i in range(got)]
    return {
        "scenario": "pipeline", "count": count, "size": size, "sndbuf": sndbuf,
        "write_s": round(write_s, 3), "receipts": got, "total_s": round(total, 3),
        "first_receipt_s": round(arrived[0] - t0, 3) if arrived else None,
        "receipts_at": marks, "max_unconfirmed": outstanding_max,
        "receipt_ms_p50": _pct(lat, 50), "receipt_ms_p99": _pct(lat, 99),
        "e2e_ms_p50": _pct(consumer.latencies, 50), "e2e_ms_p99": _pct(consumer.latencies, 99),
        "consumed": len(consumer.latencies),
        "cpu_us_per_msg": round((user1 + sys1 - user0 - sys0) / count * 1e6, 1),
        "sys_us_per_msg": round((sys1 - sys0) / count * 1e6, 1),
        "syncs_per_msg": round((syncs1 - syncs0) / count, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=["window1", "pipeline", "both"])
    ap.add_argument("--count", type=int, default=0, help="messages (window1 5000, "
                    "pipeline 50000)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--build", choices=["compiled", "python"], default="compiled")
    ap.add_argument("--src", type=Path, default=ROOT / "src",
                    help="the sources to run (another checkout's src/: a before/after pair)")
    ap.add_argument("--lib", type=Path, default=ROOT / "build" / "compiled-lib",
                    help="the compiled build (dev/build-compiled's build/compiled-lib)")
    ap.add_argument("--sndbuf", type=int, default=0, help="pipeline: the producer's "
                    "SO_SNDBUF (0: the kernel's autotuning; small: what the client counts as "
                    "written is what the broker could read)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--no-consumer", action="store_true", help="window1 without the "
                    "consumer: every message stays in the queue (written and synced)")
    ap.add_argument("--non-persistent", action="store_true", help="send persistent:false "
                    "(the same receipts and consumer without the store: the floor)")
    ap.add_argument("--attach", help="a profiler to run against the broker while measuring, "
                    "stopped with SIGINT; {pid} is the broker's pid (e.g. 'py-spy record "
                    "--threads -f raw -o w1.txt -p {pid}' or 'perf record -g -p {pid}')")
    ap.add_argument("--out", type=Path, help="append the results (JSON lines) here")
    a = ap.parse_args()
    global PERSISTENT
    PERSISTENT = "false" if a.non_persistent else "true"
    a.src, a.lib = a.src.resolve(), a.lib.resolve()  # the broker runs in a temp directory
    if not (a.src / "meshmq").is_dir():
        raise SystemExit(f"no meshmq package in {a.src}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-persist-"))
    path = compiled_overlay(tmp, a.src, a.lib) if a.build == "compiled" else a.src
    results: list[dict[str, Any]] = []
    for scenario in (["window1", "pipeline"] if a.scenario == "both" else [a.scenario]):
        broker = Broker(path)
        try:
            broker.start()
            spy = None
            if a.attach:
                spy = subprocess.Popen(shlex.split(a.attach.format(pid=broker.pid())),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            if scenario == "window1":
                r = window1(broker, a.count or 5000, a.size, not a.no_consumer)
            else:
                r = pipeline(broker, a.count or 50_000, a.size, a.timeout, a.sndbuf)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
        finally:
            broker.close()
        r.update(persistent=not a.non_persistent, build=a.build, src=str(a.src),
                 lib=str(a.lib) if a.build == "compiled" else None,
                 load=round(os.getloadavg()[0], 2))
        print(json.dumps(r), flush=True)
        results.append(r)
    shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        with a.out.open("a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
