"""What an MQTT broker holds in front of a slow subscriber, and what that costs.

One QoS 0 producer sends flat out to one topic; its one subscriber reads at a fixed
rate (``--rate`` messages/s), below what the broker delivers. A broker that keeps
reading the producer queues the difference for the subscriber: the end-to-end latency
and the broker's memory grow with the run, and so does its CPU per message (a queued
message costs more than one handed straight on). A broker that pushes back (stops
reading the producer while the subscriber's socket is full) holds about a socket
buffer's worth. Reports p50/p99/max latency, the broker's peak RSS and its CPU per
delivered message. Starts meshmq as bench/run_matrix.py does (``MESHMQ_BENCH_BUILD``:
compiled or python).

    PYTHONPATH=bench .venv/bin/python bench/mqtt_slow_consumer.py [--messages 200000]
                                                                  [--rate 50000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
import mqtt_wire as mw

_TS = struct.Struct("<d")
TOPIC = "bench/slow"
BODY = 256


def _connect(port: int, client_id: str) -> tuple[socket.socket, mw.MqttParser]:
    sock = socket.create_connection((bk.HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(mw.encode_connect(client_id))
    parser = mw.MqttParser()
    while not any(p[0] == mw.CONNACK for p in parser.feed(sock.recv(4096))):
        pass
    return sock, parser


def consume(port: int, n: int, rate: float, ready: Any, out: Any) -> None:
    sock, parser = _connect(port, "slow-sub")
    sock.sendall(mw.encode_subscribe(1, [(TOPIC, 0)]))
    while not any(p[0] == mw.SUBACK for p in parser.feed(sock.recv(4096))):
        pass
    ready.set()
    lat: list[float] = []
    t0 = None
    while len(lat) < n:
        data = sock.recv(65536)
        if not data:
            break
        now = time.time()
        for ptype, flags, payload in parser.feed(data):
            if ptype != mw.PUBLISH:
                continue
            _, _, body = mw.parse_publish(flags, payload)
            lat.append(now - _TS.unpack_from(body)[0])
        if t0 is None:
            t0 = now
        ahead = len(lat) / rate - (time.time() - t0)
        if ahead > 0:
            time.sleep(ahead)  # read no faster than ``rate``
    sock.close()
    lat.sort()
    out.put({"received": len(lat), "p50_ms": lat[len(lat) // 2] * 1e3,
             "p99_ms": lat[int(len(lat) * 0.99)] * 1e3, "max_ms": lat[-1] * 1e3})


def produce(port: int, n: int) -> None:
    sock, _ = _connect(port, "fast-pub")
    t = TOPIC.encode()
    prefix = bytes((mw.PUBLISH << 4,)) + mw.varint(2 + len(t) + BODY) + \
        struct.pack(">H", len(t)) + t
    pad = b"x" * (BODY - 8)
    sent = 0
    while sent < n:
        k = min(64, n - sent)
        stamp = _TS.pack(time.time())
        sock.sendall((prefix + stamp + pad) * k)  # blocks while the broker pushes back
        sent += k
    sock.sendall(mw.encode_pingreq())
    parser = mw.MqttParser()
    while not any(p[0] == mw.PINGRESP for p in parser.feed(sock.recv(4096))):
        pass
    sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=50_000, help="subscriber reads/s")
    args = ap.parse_args()
    broker = bk.Meshmq()
    try:
        broker.start()
        port = broker.ports["mqtt"]
        pid = broker.pid()
        assert pid is not None
        proc = psutil.Process(pid)
        ready, out = mp.Event(), mp.Queue()
        sub = mp.Process(target=consume, args=(port, args.messages, args.rate, ready, out))
        sub.start()
        ready.wait(30)
        peak = [proc.memory_info().rss]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], proc.memory_info().rss)

        threading.Thread(target=watch, daemon=True).start()
        cpu0 = sum(proc.cpu_times()[:2])
        t0 = time.time()
        produce(port, args.messages)
        res = out.get(timeout=600)
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        done.set()
        sub.join(30)
        print(f"meshmq ({bk.meshmq_build()}): {res['received']:,} of {args.messages:,} "
              f"messages in {time.time() - t0:.1f}s, subscriber at {args.rate:,.0f}/s; "
              f"latency p50 {res['p50_ms']:.0f} ms, p99 {res['p99_ms']:.0f} ms, max "
              f"{res['max_ms']:.0f} ms; broker peak RSS {peak[0] / 2**20:.0f} MiB, CPU "
              f"{cpu / max(1, res['received']) * 1e6:.2f} µs/message")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
