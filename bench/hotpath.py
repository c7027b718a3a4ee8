"""CPU cost per message of the broker's hot path, in one process, without sockets.

Drives a real ``BrokerRuntime`` (memory store, no listeners) through its real STOMP and
MQTT protocol objects over in-memory transports: a producer connection is fed
pre-encoded SEND / PUBLISH bytes in 64 KiB reads, an auto-ack subscriber's transport
counts what the broker writes. Everything the broker does per message runs (parse,
route, dispatch, encode, the pump, output buffering); only the kernel's socket work and
the load generator are missing. Much steadier than the end-to-end matrix on a shared
2-core machine, so it is the number to watch while optimising the hot path. Appends to
``bench/results/<date>-hotpath.md``.

    .venv/bin/python bench/hotpath.py [--messages 100000] [--rounds 5] [--only stomp-q1x1]
                                      [--authz 100]

``--authz N`` runs with an authorization map of N entries (the clients are anonymous,
and one entry grants their group the benchmark's destinations), to measure what
checking rights costs on the hot path.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_wire as mw

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    BrokerConfig,
    ManagementConfig,
)
from meshmq.store.memory import MemoryStore
from meshmq.transport.runtime import BrokerRuntime, tune_gc

CHUNK = 64 * 1024
BODY = 256
AUTHZ_ENTRIES = 0  # --authz


class SinkTransport:
    """Stands in for an asyncio transport: keeps a running count of bytes and frames."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.frames = 0
        self.bytes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        if self.marker:
            self.frames += data.count(self.marker)

    def writelines(self, parts: list[bytes]) -> None:
        for data in parts:
            self.write(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def stomp_frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


async def settle(done: Callable[[], bool], deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > end:
            raise TimeoutError("broker did not finish in time")
        await asyncio.sleep(0)


def chunks(data: bytes) -> list[bytes]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


async def stomp_case(messages: int, *, consumers: int, topic: bool, size: int = BODY) -> float:
    from meshmq.transport.stomp_server import StompProtocol

    runtime = await start_runtime()
    dest = "/topic/hot" if topic else "/queue/hot"
    sinks = []
    # Large bodies are counted by bytes: searching them for the marker would cost more
    # than the broker's work on them.
    marker = b"MESSAGE\n" if size < 4096 else b""
    for n in range(consumers):
        sink = SinkTransport(marker)
        proto = StompProtocol(runtime)
        proto.connection_made(sink)  # type: ignore[arg-type]
        proto.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        proto.data_received(stomp_frame("SUBSCRIBE", {"id": str(n), "destination": dest,
                                                      "ack": "auto"}))
        sinks.append(sink)
    prod = StompProtocol(runtime)
    prod.connection_made(SinkTransport(b""))  # type: ignore[arg-type]
    prod.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    await asyncio.sleep(0)
    body = b"x" * size
    one = stomp_frame("SEND", {"destination": dest, "content-type": "text/plain",
                               "content-length": str(size)}, body)
    data = chunks(one * messages)
    expected = messages * (consumers if topic else 1)
    if not marker:
        need = messages * size
        return await timed(runtime, prod.data_received, data,
                           lambda: all(s.bytes >= need for s in sinks))
    return await timed(runtime, prod.data_received, data,
                       lambda: sum(s.frames for s in sinks) >= expected)


async def mqtt_case(messages: int, *, consumers: int, qos: int) -> float:
    # QoS 0 only as a case: a QoS 1 subscriber would need this sink to send PUBACKs.
    from meshmq.transport.mqtt_server import MqttProtocol

    runtime = await start_runtime()
    sinks = []
    for n in range(consumers):
        sink = SinkTransport(b"")
        proto = MqttProtocol(runtime)
        proto.connection_made(sink)  # type: ignore[arg-type]
        proto.data_received(mw.encode_connect(f"sub{n}"))
        proto.data_received(mw.encode_subscribe(1, [("hot/t", qos)]))
        sinks.append(sink)
    prod = MqttProtocol(runtime)
    prod.connection_made(SinkTransport(b""))  # type: ignore[arg-type]
    prod.data_received(mw.encode_connect("pub"))
    await asyncio.sleep(0)
    base = [s.bytes for s in sinks]
    body = b"x" * BODY
    if qos:
        wire = b"".join(mw.encode_publish("hot/t", body, qos, (i % 65535) + 1)
                        for i in range(messages))
    else:
        wire = mw.encode_publish("hot/t", body) * messages
    # A delivered PUBLISH is at least the topic and body long: count by bytes.
    per = len(mw.encode_publish("hot/t", body, qos, 1 if qos else 0))
    need = [b + per * messages for b in base]
    return await timed(runtime, prod.data_received, chunks(wire),
                       lambda: all(s.bytes >= n for s, n in zip(sinks, need, strict=True)))


def authorization_map(entries: int) -> AuthorizationConfig:
    """``entries`` entries like a multi-tenant broker's: per-team queue and topic
    patterns for other groups, and one entry granting the (anonymous) benchmark clients
    the destinations they use (queue/topic ``hot``, MQTT ``hot/t``)."""
    own = AuthorizationEntry(queue="hot", read=("anonymous",), write=("anonymous",),
                             admin=("anonymous",))
    topics = AuthorizationEntry(topic="hot.>", read=("anonymous",), write=("anonymous",),
                                admin=("anonymous",))
    others = []
    for i in range(max(0, entries - 2)):
        team = f"team{i // 2}"
        if i % 2:
            others.append(AuthorizationEntry(topic=f"{team}.*.events", read=(team, "ops"),
                                             write=(team,), admin=(team,)))
        else:
            others.append(AuthorizationEntry(queue=f"{team}.>", read=(team,), write=(team,),
                                             admin=(team, "ops")))
    return AuthorizationConfig(entries=(*others, own, topics),
                               default=AuthorizationRights(read=("admins",)))


async def start_runtime() -> BrokerRuntime:
    config = BrokerConfig(persistent=False, listeners=(), advisory_support=False,
                          management=ManagementConfig(enabled=False))
    if AUTHZ_ENTRIES:
        config = dataclasses.replace(config, auth=AuthConfig(
            authorization=authorization_map(AUTHZ_ENTRIES)))
    runtime = BrokerRuntime(config, store=MemoryStore())
    await runtime.start()
    return runtime


async def timed(runtime: BrokerRuntime, feed: Callable[[bytes], None], data: list[bytes],
                done: Callable[[], bool]) -> float:
    gc.collect()
    t0 = time.process_time()
    for chunk in data:
        feed(chunk)
        await asyncio.sleep(0)  # the runtime's pump runs once per loop turn, as in service
    await settle(done)
    elapsed = time.process_time() - t0
    await runtime.stop()
    return elapsed


CASES: dict[str, Callable[[int], Any]] = {
    "stomp-q1x1": lambda n: stomp_case(n, consumers=1, topic=False),
    "stomp-q1x4": lambda n: stomp_case(n, consumers=4, topic=False),
    "stomp-t1x10": lambda n: stomp_case(n // 10, consumers=10, topic=True),
    # 1 MB bodies, one message per 1,000 of --messages: the per-byte work (copies).
    "stomp-q1x1-1m": lambda n: stomp_case(max(1, n // 1000), consumers=1, topic=False,
                                          size=1024 * 1024),
    "mqtt-q0-1x1": lambda n: mqtt_case(n, consumers=1, qos=0),
    "mqtt-q0-1x10": lambda n: mqtt_case(n // 10, consumers=10, qos=0),
}
DELIVERIES = {"stomp-t1x10": 10, "mqtt-q0-1x10": 10}
# Cases that send fewer messages than --messages: the divisor.
FEWER = {"stomp-q1x1-1m": 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to run")
    ap.add_argument("--label", default="", help="a note for the results row")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--authz", type=int, default=0, metavar="N",
                    help="with an authorization map of N entries")
    args = ap.parse_args()
    global AUTHZ_ENTRIES
    AUTHZ_ENTRIES = args.authz
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    tune_gc()  # as `meshmq broker` does
    rows = []
    for name in args.only or CASES:
        n = args.messages
        times = [asyncio.run(CASES[name](n)) for _ in range(args.rounds)]
        per_delivery = n // DELIVERIES.get(name, 1) * DELIVERIES.get(name, 1)
        if name in FEWER:
            per_delivery = max(1, n // FEWER[name])
        us = min(times) / per_delivery * 1e6
        rows.append((name, us, statistics.median(times) / per_delivery * 1e6))
        print(f"{name:14s} {us:6.2f} CPU µs/delivery (min of {args.rounds}), "
              f"median {rows[-1][2]:6.2f}, {1e6 / us:,.0f} deliveries/s of CPU", flush=True)
    if args.no_write:
        return
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                         text=True, cwd=Path(__file__).parent).stdout.strip()
    out = Path(__file__).parent / "results" / f"{dt.date.today()}-hotpath.md"
    new = not out.exists()
    with out.open("a") as f:
        if new:
            f.write("# Broker hot path, CPU per delivery (bench/hotpath.py)\n\n"
                    "In-process, no sockets: real runtime + protocol sessions, memory store, "
                    "256 B bodies, auto-ack subscribers. Lower is better.\n\n")
        authz = f" --authz {args.authz}" if args.authz else ""
        f.write(f"## git {rev} {args.label}\n\n`.venv/bin/python bench/hotpath.py "
                f"--messages {args.messages} --rounds {args.rounds}{authz}` on Python "
                f"{platform.python_version()}\n\n| case | CPU µs/delivery (min) | median |\n"
                "|---|---|---|\n")
        for name, us, med in rows:
            f.write(f"| {name} | {us:.2f} | {med:.2f} |\n")
        f.write("\n")
    print(f"appended to {out}")


if __name__ == "__main__":
    main()
