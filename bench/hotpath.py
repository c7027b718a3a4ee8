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

``mqtt-q0-8x8`` feeds eight producers of one topic with eight subscribers;
``mqtt-q0-1x1-slow`` gives the subscriber a transport that drains half a read per loop
turn (pausing and resuming writing at the adapter's marks) and prints how many messages
the broker held back for it.

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


class SlowSink(SinkTransport):
    """A consumer's transport that drains ``drain`` bytes per event-loop turn (slower
    than the producer is fed) with a write buffer that tells the protocol to pause and
    resume writing at the adapter's marks, as a socket to a slow reader does. ``peak``
    is the most bytes the broker held back for it (buffer plus what the broker queued
    but had not written)."""

    def __init__(self, drain: int) -> None:
        super().__init__(b"")
        self.drain = drain
        self.buffered = 0
        self.delivered = 0
        self.paused = False
        self.protocol: Any = None
        self.high = 4 * 1024 * 1024
        self.low = 1024 * 1024

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high if high is not None else self.high
        self.low = low if low is not None else self.low

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.buffered += len(data)
        if not self.paused and self.buffered > self.high:
            self.paused = True
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def tick(self) -> None:
        n = min(self.drain, self.buffered)
        self.buffered -= n
        self.delivered += n
        if self.paused and self.buffered <= self.low:
            self.paused = False
            self.protocol.resume_writing()


class ProducerSink(SinkTransport):
    """A producer's transport: the feeder reads no more while the broker paused it."""

    def __init__(self) -> None:
        super().__init__(b"")
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


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


async def stomp_backlog_case(messages: int) -> float:
    """One queue, one auto-ack subscriber that arrives only once every message is
    queued: the whole load waits as a backlog of pending entries, then drains (the
    queue's pending order under depth, as when consumers fall behind)."""
    from meshmq.transport.stomp_server import StompProtocol

    runtime = await start_runtime()
    prod = StompProtocol(runtime)
    prod.connection_made(SinkTransport(b""))  # type: ignore[arg-type]
    prod.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    await asyncio.sleep(0)
    one = stomp_frame("SEND", {"destination": "/queue/deep", "content-type": "text/plain",
                               "content-length": str(BODY)}, b"x" * BODY)
    data = chunks(one * messages)
    sink = SinkTransport(b"MESSAGE\n")

    def subscribe() -> None:
        proto = StompProtocol(runtime)
        proto.connection_made(sink)  # type: ignore[arg-type]
        proto.data_received(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        proto.data_received(stomp_frame("SUBSCRIBE", {"id": "0", "destination": "/queue/deep",
                                                      "ack": "auto"}))

    return await timed(runtime, prod.data_received, [*data, b""],
                       lambda: sink.frames >= messages, before_last=subscribe)


async def mqtt_case(messages: int, *, consumers: int, qos: int, producers: int = 1,
                    slow: bool = False) -> float:
    """``producers`` publish ``messages`` in all to one topic, fed round robin one chunk
    per event-loop turn; each of ``consumers`` subscribers gets every message. ``slow``:
    the subscriber drains half a chunk per turn (:class:`SlowSink`), so the broker must
    hold back or push back on the producer; the most it held is printed."""
    # QoS 0 only as a case: a QoS 1 subscriber would need this sink to send PUBACKs.
    from meshmq.transport.mqtt_server import MqttProtocol

    runtime = await start_runtime()
    sinks: list[SinkTransport] = []
    for n in range(consumers):
        sink = SlowSink(CHUNK // 2) if slow else SinkTransport(b"")
        proto = MqttProtocol(runtime)
        if isinstance(sink, SlowSink):
            sink.protocol = proto
        proto.connection_made(sink)  # type: ignore[arg-type]
        proto.data_received(mw.encode_connect(f"sub{n}"))
        proto.data_received(mw.encode_subscribe(1, [("hot/t", qos)]))
        sinks.append(sink)
    prods = []
    for n in range(producers):
        prod = MqttProtocol(runtime)
        psink = ProducerSink()
        prod.connection_made(psink)  # type: ignore[arg-type]
        prod.data_received(mw.encode_connect(f"pub{n}"))
        prods.append((prod, psink))
    await asyncio.sleep(0)
    base = [s.bytes for s in sinks]
    body = b"x" * BODY
    each = messages // producers
    if qos:
        wire = b"".join(mw.encode_publish("hot/t", body, qos, (i % 65535) + 1)
                        for i in range(each))
    else:
        wire = mw.encode_publish("hot/t", body) * each
    # A delivered PUBLISH is at least the topic and body long: count by bytes.
    per = len(mw.encode_publish("hot/t", body, qos, 1 if qos else 0))
    need = [b + per * each * producers for b in base]
    feeds = [(prod.data_received, psink, chunks(wire)) for prod, psink in prods]
    if slow:
        slow_sinks = [s for s in sinks if isinstance(s, SlowSink)]
        fed = [0]
        peak = [0]

        def tick() -> None:
            for s in slow_sinks:
                s.tick()
            held = fed[0] - min(s.delivered for s in slow_sinks)
            peak[0] = max(peak[0], held)

        def done() -> bool:
            return all(s.delivered >= n - b for s, n, b in zip(slow_sinks, need, base,
                                                               strict=True))

        elapsed = await timed_feeds(runtime, feeds, done, tick, fed)
        print(f"  held back at most {peak[0] / per:,.0f} messages "
              f"({peak[0] / 2**20:.1f} MiB) for the slow subscriber", flush=True)
        return elapsed
    return await timed_feeds(runtime, feeds,
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
                done: Callable[[], bool],
                before_last: Callable[[], None] | None = None) -> float:
    gc.collect()
    t0 = time.process_time()
    for i, chunk in enumerate(data):
        if before_last is not None and i == len(data) - 1:
            before_last()
        feed(chunk)
        await asyncio.sleep(0)  # the runtime's pump runs once per loop turn, as in service
    await settle(done)
    elapsed = time.process_time() - t0
    await runtime.stop()
    return elapsed


async def timed_feeds(runtime: BrokerRuntime,
                      feeds: list[tuple[Callable[[bytes], None], ProducerSink, list[bytes]]],
                      done: Callable[[], bool], tick: Callable[[], None] | None = None,
                      fed: list[int] | None = None) -> float:
    """Feed each producer its next chunk per event-loop turn while the broker reads it
    (a paused producer waits, as a socket would); ``tick`` runs once per turn."""
    gc.collect()
    t0 = time.process_time()
    pos = [0] * len(feeds)
    end = time.monotonic() + 60.0
    while True:
        more = False
        for i, (feed, psink, data) in enumerate(feeds):
            if pos[i] < len(data):
                more = True
                if psink.reading:
                    feed(data[pos[i]])
                    if fed is not None:
                        fed[0] += len(data[pos[i]])
                    pos[i] += 1
        if tick is not None:
            tick()
        if not more and done():
            break
        if time.monotonic() > end:
            raise TimeoutError("broker did not finish in time")
        await asyncio.sleep(0)  # the runtime's pump runs once per loop turn, as in service
    elapsed = time.process_time() - t0
    await runtime.stop()
    return elapsed


CASES: dict[str, Callable[[int], Any]] = {
    "stomp-q1x1": lambda n: stomp_case(n, consumers=1, topic=False),
    "stomp-q1x4": lambda n: stomp_case(n, consumers=4, topic=False),
    "stomp-q1x1-backlog": stomp_backlog_case,
    "stomp-t1x10": lambda n: stomp_case(n // 10, consumers=10, topic=True),
    # 1 MB bodies, one message per 1,000 of --messages: the per-byte work (copies).
    "stomp-q1x1-1m": lambda n: stomp_case(max(1, n // 1000), consumers=1, topic=False,
                                          size=1024 * 1024),
    "mqtt-q0-1x1": lambda n: mqtt_case(n, consumers=1, qos=0),
    "mqtt-q0-1x10": lambda n: mqtt_case(n // 10, consumers=10, qos=0),
    "mqtt-q0-8x8": lambda n: mqtt_case(n // 8, consumers=8, qos=0, producers=8),
    "mqtt-q0-1x1-slow": lambda n: mqtt_case(n, consumers=1, qos=0, slow=True),
}
DELIVERIES = {"stomp-t1x10": 10, "mqtt-q0-1x10": 10, "mqtt-q0-8x8": 8}
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
