"""How one client's many subscriptions affect everybody else.

One STOMP connection creates N topic subscriptions (pipelined SUBSCRIBE frames, the
last with a receipt), then disconnects; with ``--protocol mqtt`` it is an MQTT 3.1.1
connection (pipelined SUBSCRIBE packets of 1000 filters each; ``--mqtt-persistent``: a
persistent session, so durable subscriptions) that goes away without DISCONNECT.
Meanwhile a probe connects, sends one receipted persistent message and disconnects,
over and over; its worst latency while the big client subscribes and while it leaves is
what every other client of the broker felt.

    .venv/bin/python bench/subscriptions.py --subs 2500 5000 10000 100000
    .venv/bin/python bench/subscriptions.py --protocol mqtt --subs 10000 100000

Writes bench/results/<date>-subscriptions.{md,json}. The broker runs as a subprocess
(bench/brokers.py; the compiled build if dev/build-compiled made one, unless
``--meshmq-build python``). Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import HOST, Meshmq, meshmq_build
from bench.mqtt_wire import SUBACK, MqttParser, encode_connect, encode_subscribe

MQTT_FILTERS_PER_SUBSCRIBE = 1000

RESULTS = Path(__file__).resolve().parent / "results"


def frame(command: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    head = "\n".join([command, *(f"{k}:{v}" for k, v in headers)])
    return head.encode() + b"\n\n" + body + b"\x00"


def read_until(sock: socket.socket, marker: bytes, deadline: float) -> bytes:
    buf = b""
    while marker not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {marker!r} from the broker")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        buf += chunk
    return buf


def stomp_connect(port: int, deadline: float) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=max(0.1, deadline - time.monotonic()))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost")]))
    read_until(sock, b"CONNECTED", deadline)
    return sock


@dataclass
class Probe:
    """Connect + receipted persistent send + close, in a loop, tagged by phase."""

    port: int
    phase: str = "idle"
    samples: dict[str, list[float]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            phase = self.phase
            t0 = time.monotonic()
            try:
                sock = stomp_connect(self.port, t0 + 300)
                with sock:
                    sock.sendall(frame("SEND", [("destination", "/queue/probe"),
                                                ("persistent", "true"), ("receipt", f"p{n}")],
                                       b"probe"))
                    read_until(sock, b"RECEIPT", t0 + 300)
            except OSError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latency = time.monotonic() - t0
            # A probe counts for the phase it started in.
            self.samples.setdefault(phase, []).append(latency)
            if os.environ.get("BENCH_VERBOSE"):
                print(f"probe {phase}->{self.phase} {latency * 1000:.1f} ms", flush=True)
            n += 1
            self.stop.wait(0.02)

    def worst(self, phase: str) -> float:
        return max(self.samples.get(phase, [0.0]))


@dataclass
class Row:
    subscriptions: int
    subscribe_s: float
    subscriptions_per_s: float
    worst_probe_subscribing_ms: float
    leave_s: float
    worst_probe_leaving_ms: float
    probes: int
    probe_errors: int


def stomp_subscribe(port: int, n: int, deadline: float) -> socket.socket:
    big = stomp_connect(port, deadline)
    data = b"".join(frame("SUBSCRIBE", [("destination", f"/topic/bench.subs.{i}"),
                                        ("id", str(i))]) for i in range(n - 1))
    data += frame("SUBSCRIBE", [("destination", f"/topic/bench.subs.{n - 1}"),
                                ("id", str(n - 1)), ("receipt", "all")])
    sender = threading.Thread(target=big.sendall, args=(data,), daemon=True)
    sender.start()
    read_until(big, b"receipt-id:all", deadline)
    sender.join()
    return big


def mqtt_subscribe(port: int, n: int, persistent: bool, deadline: float) -> socket.socket:
    """An MQTT 3.1.1 client holding ``n`` QoS 0 (persistent: QoS 1) subscriptions."""
    big = socket.create_connection((HOST, port), timeout=max(0.1, deadline - time.monotonic()))
    big.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    parser = MqttParser()
    big.sendall(encode_connect("bench-subs", clean=not persistent))  # a fresh broker
    mqtt_read(big, parser, 1, deadline)  # CONNACK
    qos = 1 if persistent else 0
    batches = range(0, n, MQTT_FILTERS_PER_SUBSCRIBE)
    data = b"".join(encode_subscribe(
        k + 1, [(f"bench/subs/{i}", qos)
                for i in range(start, min(n, start + MQTT_FILTERS_PER_SUBSCRIBE))])
        for k, start in enumerate(batches))
    sender = threading.Thread(target=big.sendall, args=(data,), daemon=True)
    sender.start()
    got = mqtt_read(big, parser, len(batches), deadline)
    sender.join()
    if any(ptype != SUBACK or any(c >= 0x80 for c in payload[2:])
           for ptype, _, payload in got):
        raise RuntimeError("a subscription was refused (broker.max_subscriptions_per_connection?)")
    return big


def mqtt_read(sock: socket.socket, parser: MqttParser, count: int,
              deadline: float) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer from the broker")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        got += parser.feed(chunk)
    return got


def abort(sock: socket.socket) -> None:
    """Close with a TCP reset: the client is gone, no goodbye."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def one_run(n: int, timeout: float, protocol: str = "stomp", persistent: bool = False) -> Row:
    broker = Meshmq()
    broker.start()
    port = broker.ports["stomp"]
    probe = Probe(port)
    thread = threading.Thread(target=probe.run, daemon=True)
    try:
        thread.start()
        # Warm: the probe has completed at least one round trip.
        deadline = time.monotonic() + 30
        while not probe.samples and time.monotonic() < deadline:
            time.sleep(0.01)
        probe.phase = "subscribing"
        t0 = time.monotonic()
        if protocol == "mqtt":
            big = mqtt_subscribe(broker.ports["mqtt"], n, persistent, t0 + timeout)
        else:
            big = stomp_subscribe(port, n, t0 + timeout)
        subscribe_s = time.monotonic() - t0
        probe.phase = "leaving"
        t1 = time.monotonic()
        if protocol == "mqtt":
            abort(big)
        else:
            big.close()
        # The cleanup is over when a connection that arrived after the close has been
        # served: a fresh probe round trip that starts now.
        probe_sock = stomp_connect(port, t1 + timeout)
        with probe_sock:
            probe_sock.sendall(frame("SEND", [("destination", "/queue/probe"),
                                              ("persistent", "true"), ("receipt", "after")]))
            read_until(probe_sock, b"RECEIPT", t1 + timeout)
        leave_s = time.monotonic() - t1
        # Let the probe loop finish its round that straddles the leave.
        count = sum(len(v) for v in probe.samples.values())
        deadline = time.monotonic() + timeout
        while sum(len(v) for v in probe.samples.values()) <= count + 1 \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        probe.phase = "idle"
    finally:
        probe.stop.set()
        thread.join(10)
        broker.close()
    return Row(n, round(subscribe_s, 3), round(n / subscribe_s),
               round(probe.worst("subscribing") * 1000, 1), round(leave_s, 3),
               round(probe.worst("leaving") * 1000, 1),
               sum(len(v) for v in probe.samples.values()), len(probe.errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subs", type=int, nargs="+", default=[2500, 5000, 10000, 100000])
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="give up on one run after this many seconds")
    parser.add_argument("--meshmq-build", choices=["compiled", "python"])
    parser.add_argument("--label", default="", help="suffix for the result files")
    parser.add_argument("--protocol", choices=["stomp", "mqtt"], default="stomp",
                        help="the protocol of the client with many subscriptions")
    parser.add_argument("--mqtt-persistent", action="store_true",
                        help="MQTT: a persistent session (durable subscriptions)")
    args = parser.parse_args()
    if args.meshmq_build:
        os.environ["MESHMQ_BENCH_BUILD"] = args.meshmq_build
    rows = []
    for n in args.subs:
        row = one_run(n, args.timeout, args.protocol, args.mqtt_persistent)
        print(json.dumps(asdict(row)), flush=True)
        rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-subscriptions{args.label}"
    meta = {"build": meshmq_build(), "cpus": os.cpu_count(), "protocol": args.protocol
            + (" persistent" if args.mqtt_persistent else ""),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    lines = [f"# One {meta['protocol']} client's subscriptions ({meta['build']} build, "
             f"{meta['cpus']} CPUs, "
             f"{meta['date']})", "",
             "`" + " ".join(["bench/subscriptions.py", *sys.argv[1:]]) + "`", "",
             "| subscriptions | subscribe s | subs/s | worst probe while subscribing ms "
             "| leave s | worst probe while leaving ms | probes |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.subscriptions} | {r.subscribe_s} | {r.subscriptions_per_s} | "
              f"{r.worst_probe_subscribing_ms} | {r.leave_s} | {r.worst_probe_leaving_ms} | "
              f"{r.probes} |" for r in rows]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / stem}.md")


if __name__ == "__main__":
    main()
