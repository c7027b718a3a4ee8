"""Broker-neutral STOMP / MQTT 3.1.1 load generator (asyncio, raw sockets, uvloop if present).

Drives any broker on host:port with P producers and C consumers spread over
worker processes (so the generator is not the bottleneck on a small machine),
optionally holding M idle connections open. Every message body starts with an
8-byte send timestamp (``time.time()``, little-endian double) for latency.

Reports end-to-end throughput (first send to last receive), send throughput
(first send until the last confirmation: the last RECEIPT / PUBACK, or for
fire-and-forget a final receipted message / PINGRESP), and latency p50/p99/max.

    python bench/loadgen.py --protocol stomp --port 61613 -P 4 -C 4 --count 100000
    python bench/loadgen.py --protocol mqtt --port 1883 --qos 1 --window 100 -C 10 --topic

Library use: ``run_load(LoadSpec(...)) -> LoadResult``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import struct
import sys
import time
import traceback
from array import array
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mqtt_wire as mw

from meshmq.protocol.stomp import StompParser, encode_frame

HOST = "127.0.0.1"
_TS = struct.Struct("<d")
_U16 = struct.Struct(">H")
FLUSH_BYTES = 128 * 1024
FLUSH_FRAMES = 64


@dataclass
class LoadSpec:
    protocol: str = "stomp"          # "stomp" or "mqtt"
    host: str = HOST
    port: int = 61613
    producers: int = 1
    consumers: int = 1
    size: int = 256                  # body bytes (>= 8: the timestamp)
    persistent: bool = False         # STOMP persistent:true (MQTT: use qos)
    window: int = 0                  # outstanding confirmations per producer; 0 = none
    mode: str = "queue"              # "queue" or "topic" (MQTT is always topic)
    destinations: int = 1
    idle: int = 0                    # idle connections held open during the run
    count: int = 10_000              # total messages over all producers (0: duration only)
    duration: float = 0.0            # cap on sending time in seconds (0: none)
    rate: float = 0.0                # total target send rate, msg/s (0: flat out)
    qos: int = 0                     # MQTT QoS for PUBLISH and SUBSCRIBE
    drain: int = 0                   # with producers=0: messages the consumers must get
    name: str = ""                   # destination name stem (default: unique per run)
    stall: float = 30.0              # give up when nothing arrives for this long
    vhost: str = "/"                 # STOMP host header (coilmq wants its FQDN)
    login: str | None = None         # STOMP login/passcode (RabbitMQ wants guest/guest)
    passcode: str | None = None
    procs_per_role: int = 2          # worker processes for producers and for consumers


@dataclass
class LoadResult:
    sent: int = 0
    expected: int = 0
    received: int = 0
    complete: bool = False
    send_s: float = 0.0
    e2e_s: float = 0.0
    send_rate: float = 0.0
    e2e_rate: float = 0.0
    first_receive_s: float | None = None   # barrier release to first message
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    # CPU seconds of the generator's worker processes from the start of sending to the
    # last receive (or the give-up): per message, it shows when the generator is the limit.
    gen_cpu_s: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- helpers

def install_uvloop() -> str:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    except ImportError:
        return "asyncio"


def dest_name(spec: LoadSpec, d: int) -> str:
    if spec.protocol == "mqtt":
        return f"bench/{spec.name}/{d}"
    kind = "topic" if spec.mode == "topic" else "queue"
    return f"/{kind}/bench.{spec.name}.{d}"


class _Flow:
    """Write-side flow control shared by the client protocols."""

    def __init__(self) -> None:
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.waiter: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: str | None = None

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until the next wake-up (a confirmation arrived) or the connection dies."""
        if self.error:
            raise ConnectionError(self.error)
        self.waiter = asyncio.get_running_loop().create_future()
        done, _ = await asyncio.wait([self.waiter, self.closed],
                                     return_when=asyncio.FIRST_COMPLETED)
        if self.closed in done or self.error:
            raise ConnectionError(self.error or "connection closed by the broker")


def _fail_future(fut: asyncio.Future[Any], msg: str) -> None:
    if not fut.done():
        fut.set_exception(ConnectionError(msg))
        fut.exception()  # retrieved: nobody may be waiting (a producer never subscribes)


class Recorder:
    """Consumer-side counters of one worker process."""

    def __init__(self, shared_received: Any) -> None:
        self.shared = shared_received
        self.latencies = array("d")
        self.count = 0
        self.first: float | None = None
        self.last = 0.0

    def got(self, now: float, stamps: list[float]) -> None:
        if not stamps:
            return
        if self.first is None:
            self.first = now
        self.last = now
        lat = self.latencies
        for s in stamps:
            lat.append((now - s) * 1000.0)
        n = len(stamps)
        self.count += n
        with self.shared.get_lock():
            self.shared.value += n


class StompScanner:
    """What a consumer reads, at the least cost per MESSAGE: the generator must not be
    what a benchmark measures, and parsing every header of every MESSAGE into a frame
    was most of a consumer process's CPU. A MESSAGE whose head has LF line ends and a
    ``content-length`` yields only its body's timestamp (found with ``bytes.find``, no
    frame built); any other frame (CONNECTED, RECEIPT, ERROR, a MESSAGE without
    ``content-length`` or with CRLF lines) is cut out whole and parsed by
    ``StompParser``, which checks it fully."""

    def __init__(self) -> None:
        self.parser = StompParser(version="1.2", max_frame_size=256 * 1024 * 1024)
        self.buf = bytearray()

    def feed(self, data: bytes, stamps: list[float]) -> list[Any]:
        """Append each whole MESSAGE's timestamp to ``stamps``, in order; returns the
        other frames ``data`` completed. Raises what ``StompParser`` raises."""
        buf = self.buf
        buf += data  # (amortised: a large body arrives over many reads)
        end = len(buf)
        pos = 0
        frames: list[Any] = []
        find = buf.find
        unpack = _TS.unpack_from
        while pos < end:
            byte = buf[pos]
            if byte in {10, 13}:  # heart-beats between frames
                if byte == 13 and (pos + 1 == end or buf[pos + 1] != 10):
                    if pos + 1 == end:
                        break
                    raise ValueError("a CR not followed by LF between frames")
                pos += 1 if byte == 10 else 2
                continue
            head_end = find(b"\n\n", pos) if buf.startswith(b"MESSAGE\n", pos) else -1
            if head_end >= 0:
                cl = find(b"\ncontent-length:", pos, head_end)
                if cl >= 0 and find(b"\r", pos, head_end) < 0:
                    value_end = find(b"\n", cl + 16, head_end + 1)
                    body = head_end + 2
                    frame_end = body + int(buf[cl + 16:value_end])
                    if frame_end >= end:
                        break
                    if buf[frame_end] != 0:
                        raise ValueError("a MESSAGE body does not end with NUL at its "
                                         "content-length")
                    stamps.append(unpack(buf, body)[0])
                    pos = frame_end + 1
                    continue
            frame_end = self._frame_end(buf, pos)
            if frame_end < 0:
                break
            for frame in self.parser.feed(bytes(buf[pos:frame_end + 1])):
                if frame.command == "MESSAGE":
                    stamps.append(unpack(frame.body)[0])
                else:
                    frames.append(frame)
            pos = frame_end + 1
        del buf[:pos]
        return frames

    @staticmethod
    def _frame_end(buf: bytearray, pos: int) -> int:
        """Where the NUL that ends the frame at ``pos`` is (-1: not here yet), for a head
        with LF or CRLF line ends. The CRLF blank line is looked for only inside the
        head, so a stream of LF frames is not scanned to its end for each frame."""
        lf = buf.find(b"\n\n", pos)
        crlf = buf.find(b"\n\r\n", pos, lf + 2 if lf >= 0 else len(buf))
        if crlf >= 0:
            head_end, body = crlf, crlf + 3
        elif lf >= 0:
            head_end, body = lf, lf + 2
        else:
            return -1
        cl = buf.find(b"\ncontent-length:", pos, head_end)
        if cl < 0:
            return buf.find(b"\0", body)
        value_end = buf.find(b"\n", cl + 16, head_end + 1)
        frame_end = body + int(buf[cl + 16:value_end].strip())
        return frame_end if frame_end < len(buf) else -1


class StompClient(asyncio.Protocol):
    def __init__(self, recorder: Recorder | None = None) -> None:
        self.flow = _Flow()
        self.scanner = StompScanner()
        self.parser = self.scanner.parser
        self.connected: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.receipts = 0
        self.recorder = recorder
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        stamps: list[float] = []
        try:
            frames = self.scanner.feed(data, stamps)
        except Exception as exc:
            self._fail(f"unparsable data from the broker: {exc}")
            return
        for f in frames:
            c = f.command
            if c == "RECEIPT":
                self.receipts += 1
            elif c == "CONNECTED":
                version = f.get("version") or "1.0"
                self.parser.version = version
                if not self.connected.done():
                    self.connected.set_result(version)
            elif c == "ERROR":
                self._fail(f"ERROR frame: {f.get('message')} {f.body[:200]!r}")
        if stamps and self.recorder is not None:
            self.recorder.got(time.time(), stamps)
        self.flow.wake()

    def _fail(self, msg: str) -> None:
        self.flow.error = msg
        _fail_future(self.connected, msg)
        if not self.flow.closed.done():
            self.flow.closed.set_result(None)
        if self.transport:
            self.transport.close()

    def pause_writing(self) -> None:
        self.flow.can_write.clear()

    def resume_writing(self) -> None:
        self.flow.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.flow.error is None:
            self.flow.error = f"connection lost: {exc}" if exc else "connection closed"
        _fail_future(self.connected, self.flow.error)
        if not self.flow.closed.done():
            self.flow.closed.set_result(None)
        self.flow.can_write.set()


class MqttClient(asyncio.Protocol):
    def __init__(self, recorder: Recorder | None = None) -> None:
        self.flow = _Flow()
        self.parser = mw.MqttParser()
        loop = asyncio.get_running_loop()
        self.connected: asyncio.Future[int] = loop.create_future()
        self.subacked: asyncio.Future[bytes] = loop.create_future()
        self.acks = 0
        self.pongs = 0
        self.recorder = recorder
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.parser.feed(data)
        except ValueError as exc:
            self._fail(str(exc))
            return
        stamps: list[float] = []
        pubacks: list[bytes] = []
        unpack = _TS.unpack_from
        for ptype, flags, payload in packets:
            if ptype == mw.PUBLISH:
                pos = 2 + ((payload[0] << 8) | payload[1])
                if flags & 0x06:
                    pubacks.append(b"\x40\x02" + payload[pos:pos + 2])
                    pos += 2
                stamps.append(unpack(payload, pos)[0])
            elif ptype == mw.PUBACK:
                self.acks += 1
            elif ptype == mw.PINGRESP:
                self.pongs += 1
            elif ptype == mw.CONNACK:
                if payload[1] != 0:
                    self._fail(f"CONNACK refused with code {payload[1]}")
                elif not self.connected.done():
                    self.connected.set_result(0)
            elif ptype == mw.SUBACK and not self.subacked.done():
                self.subacked.set_result(payload[2:])
        if pubacks and self.transport is not None:
            self.transport.write(b"".join(pubacks))
        if stamps and self.recorder is not None:
            self.recorder.got(time.time(), stamps)
        self.flow.wake()

    def _fail(self, msg: str) -> None:
        self.flow.error = msg
        for fut in (self.connected, self.subacked):
            _fail_future(fut, msg)
        if not self.flow.closed.done():
            self.flow.closed.set_result(None)
        if self.transport:
            self.transport.close()

    def pause_writing(self) -> None:
        self.flow.can_write.clear()

    def resume_writing(self) -> None:
        self.flow.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.flow.error is None:
            self.flow.error = f"connection lost: {exc}" if exc else "connection closed"
        for fut in (self.connected, self.subacked):
            _fail_future(fut, self.flow.error)
        if not self.flow.closed.done():
            self.flow.closed.set_result(None)
        self.flow.can_write.set()


# --------------------------------------------------------------------------- connections

async def open_stomp(spec: LoadSpec, recorder: Recorder | None = None,
                     timeout: float = 30.0) -> StompClient:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(
        lambda: StompClient(recorder), spec.host, spec.port), timeout)
    assert proto.transport is not None
    headers = [("accept-version", "1.0,1.1,1.2"), ("host", spec.vhost), ("heart-beat", "0,0")]
    if spec.login is not None:
        headers += [("login", spec.login), ("passcode", spec.passcode or "")]
    proto.transport.write(encode_frame("CONNECT", headers))
    await asyncio.wait_for(proto.connected, timeout)
    return proto


async def open_mqtt(spec: LoadSpec, client_id: str, recorder: Recorder | None = None,
                    timeout: float = 30.0) -> MqttClient:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(
        lambda: MqttClient(recorder), spec.host, spec.port), timeout)
    assert proto.transport is not None
    proto.transport.write(mw.encode_connect(client_id, clean=True, keepalive=0))
    await asyncio.wait_for(proto.connected, timeout)
    return proto


def per_consumer(spec: LoadSpec, idx: int) -> int:
    """Messages consumer ``idx`` should get in count mode (0: unknown). Only the null
    sink reads this (from the subscription / client id) to stream that many."""
    if spec.count <= 0 or (spec.duration and spec.rate):
        return 0
    if spec.producers == 0:
        q, r = divmod(spec.drain, max(1, spec.consumers))
        return q + (1 if idx < r else 0)
    counts = _share_counts(spec)
    d = idx % spec.destinations
    to_d = sum(c for i, c in enumerate(counts) if i % spec.destinations == d)
    if spec.mode == "topic" or spec.protocol == "mqtt":
        return to_d
    peers = [j for j in range(spec.consumers) if j % spec.destinations == d]
    q, r = divmod(to_d, len(peers))
    return q + (1 if peers.index(idx) < r else 0)


async def subscribe(spec: LoadSpec, conn: StompClient | MqttClient, dest: str, idx: int,
                    timeout: float = 30.0) -> None:
    assert conn.transport is not None
    if isinstance(conn, StompClient):
        before = conn.receipts
        # The id names size and count so the null sink can stream such messages.
        sub_id = f"s{spec.size}n{per_consumer(spec, idx)}-{idx}"
        conn.transport.write(encode_frame("SUBSCRIBE", [
            ("destination", dest), ("id", sub_id), ("ack", "auto"), ("receipt", f"sub-{idx}")]))
        async with asyncio.timeout(timeout):
            while conn.receipts == before:
                await conn.flow.wait()  # inline, not wait_for(): no window to miss a wake-up
    else:
        conn.transport.write(mw.encode_subscribe(1, [(dest, spec.qos)]))
        codes = await asyncio.wait_for(conn.subacked, timeout)
        if codes and codes[0] == 0x80:
            raise ConnectionError(f"SUBSCRIBE to {dest} refused")


# --------------------------------------------------------------------------- producers

class _Pacer:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.t0 = time.perf_counter()

    def allowed(self, sent: int) -> int:
        return int((time.perf_counter() - self.t0) * self.rate) - sent


async def produce_stomp(spec: LoadSpec, conn: StompClient, dest: str, n: int,
                        t_end: float, rate: float) -> tuple[int, float, float]:
    """Send ``n`` messages (or until ``t_end``); returns (sent, first send, confirmed)."""
    assert conn.transport is not None
    tr = conn.transport
    flow = conn.flow
    size = max(8, spec.size)
    headers = [("destination", dest)]
    if spec.persistent:
        headers.append(("persistent", "true"))
    headers.append(("content-length", str(size)))
    head = encode_frame("SEND", headers, b"x" * size)[:-(size + 1)]
    head_r = head[:-1]  # without the blank line: a receipt header follows
    pad = b"x" * (size - 8) + b"\0"
    window = spec.window
    pack = _TS.pack
    clock = time.time
    base = conn.receipts
    pacer = _Pacer(rate) if rate else None
    batch: list[bytes] = []
    nbytes = 0
    i = 0
    outstanding = 0
    t_first = clock()
    while n == 0 or i < n:
        if t_end and (i & 31) == 0 and clock() >= t_end:
            break
        if pacer is not None and pacer.allowed(i) <= 0:
            if batch:
                tr.write(b"".join(batch))
                batch.clear()
                nbytes = 0
            await asyncio.sleep(0.0005)
            continue
        last = i == n - 1
        if window or last:
            frame = b"%sreceipt:%d\n\n%s%s" % (head_r, i, pack(clock()), pad)
            outstanding += 1
        else:
            frame = head + pack(clock()) + pad
        batch.append(frame)
        nbytes += len(frame)
        i += 1
        if window and outstanding >= window:
            tr.write(b"".join(batch))
            batch.clear()
            nbytes = 0
            while outstanding >= window:
                await flow.wait()
                outstanding = i - (conn.receipts - base)
        elif nbytes >= FLUSH_BYTES or len(batch) >= FLUSH_FRAMES:
            tr.write(b"".join(batch))
            batch.clear()
            nbytes = 0
            if not flow.can_write.is_set():
                await flow.can_write.wait()
            else:
                await asyncio.sleep(0)
            if flow.error:
                raise ConnectionError(flow.error)
        if window:
            outstanding = i - (conn.receipts - base)
    if i and (n == 0 or i < n) and not window:
        # Stopped by the clock: one more message carries the final receipt.
        batch.append(b"%sreceipt:%d\n\n%s%s" % (head_r, i, pack(clock()), pad))
        i += 1
    if batch:
        tr.write(b"".join(batch))
    if i == 0:
        return 0, t_first, clock()
    # Wait for every receipt asked for.
    asked = i if window else 1
    while conn.receipts - base < asked:
        await flow.wait()
    return i, t_first, clock()


async def produce_mqtt(spec: LoadSpec, conn: MqttClient, topic: str, n: int,
                       t_end: float, rate: float) -> tuple[int, float, float]:
    assert conn.transport is not None
    tr = conn.transport
    flow = conn.flow
    size = max(8, spec.size)
    qos = spec.qos
    t = topic.encode()
    rem = 2 + len(t) + (2 if qos else 0) + size
    prefix = bytes(((mw.PUBLISH << 4) | (qos << 1),)) + mw.varint(rem) + _U16.pack(len(t)) + t
    pad = b"x" * (size - 8)
    window = spec.window if qos else 0
    if qos and not window:
        window = 65535  # packet ids are 16-bit
    pack = _TS.pack
    u16 = _U16.pack
    clock = time.time
    base = conn.acks
    pacer = _Pacer(rate) if rate else None
    batch: list[bytes] = []
    nbytes = 0
    i = 0
    t_first = clock()
    while n == 0 or i < n:
        if t_end and (i & 31) == 0 and clock() >= t_end:
            break
        if pacer is not None and pacer.allowed(i) <= 0:
            if batch:
                tr.write(b"".join(batch))
                batch.clear()
                nbytes = 0
            await asyncio.sleep(0.0005)
            continue
        if qos:
            pkt = prefix + u16(i % 65535 + 1) + pack(clock()) + pad
        else:
            pkt = prefix + pack(clock()) + pad
        batch.append(pkt)
        nbytes += len(pkt)
        i += 1
        if window and i - (conn.acks - base) >= window:
            tr.write(b"".join(batch))
            batch.clear()
            nbytes = 0
            while i - (conn.acks - base) >= window:
                await flow.wait()
        elif nbytes >= FLUSH_BYTES or len(batch) >= FLUSH_FRAMES:
            tr.write(b"".join(batch))
            batch.clear()
            nbytes = 0
            if not flow.can_write.is_set():
                await flow.can_write.wait()
            else:
                await asyncio.sleep(0)
            if flow.error:
                raise ConnectionError(flow.error)
    if qos:
        if batch:
            tr.write(b"".join(batch))
        while conn.acks - base < i:
            await flow.wait()
    else:
        # QoS 0 has no confirmation: a PINGRESP proves the broker read everything before it.
        batch.append(mw.encode_pingreq())
        tr.write(b"".join(batch))
        while conn.pongs == 0:
            await flow.wait()
    return i, t_first, clock()


# --------------------------------------------------------------------------- worker process

@dataclass
class _Shared:
    barrier: Any
    received: Any
    sent: Any          # Array('q', producers)
    producers_done: Any
    stop: Any
    results: Any       # Queue


def _share_counts(spec: LoadSpec) -> list[int]:
    """Messages per producer (the count split as evenly as possible)."""
    p = spec.producers
    if p == 0:
        return []
    if spec.count <= 0:
        return [0] * p
    q, r = divmod(spec.count, p)
    return [q + (1 if k < r else 0) for k in range(p)]


async def _open_idle(spec: LoadSpec, n: int, tag: str) -> list[StompClient | MqttClient]:
    """``n`` connected, silent connections (16 handshakes in flight at a time)."""
    sem = asyncio.Semaphore(16)

    async def one(k: int) -> StompClient | MqttClient:
        async with sem:
            if spec.protocol == "stomp":
                return await open_stomp(spec, timeout=60)
            return await open_mqtt(spec, f"i{k}w{tag}", timeout=60)

    return list(await asyncio.gather(*(one(k) for k in range(n))))


async def _worker_main(spec: LoadSpec, roles: list[tuple[str, int]], sh: _Shared,
                       wid: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    recorder = Recorder(sh.received)
    producers: list[tuple[int, StompClient | MqttClient]] = []
    consumers: list[StompClient | MqttClient] = []
    idle: list[StompClient | MqttClient] = []
    later: list[tuple[int, StompClient | MqttClient]] = []
    tag = f"{os.getpid() % 100000}"
    try:
        for role, idx in roles:
            if role == "p":
                conn: StompClient | MqttClient
                if spec.protocol == "stomp":
                    conn = await open_stomp(spec)
                else:
                    conn = await open_mqtt(spec, f"p{idx}s{spec.size}w{tag}")
                producers.append((idx, conn))
            elif role == "c":
                if spec.protocol == "stomp":
                    conn = await open_stomp(spec, recorder)
                else:
                    conn = await open_mqtt(
                        spec, f"c{idx}s{spec.size}n{per_consumer(spec, idx)}", recorder)
                if spec.producers:
                    await subscribe(spec, conn, dest_name(spec, idx % spec.destinations), idx)
                else:
                    later.append((idx, conn))  # draining a backlog: subscribe at the start
                consumers.append(conn)
            elif role == "i":
                idle.extend(await _open_idle(spec, idx, tag))
    except BaseException as exc:
        sh.barrier.abort()
        raise RuntimeError(f"{role} {idx}: {type(exc).__name__}: {exc}") from exc
    await loop.run_in_executor(None, sh.barrier.wait, 600)
    t_go = time.time()
    for idx, conn in later:
        await subscribe(spec, conn, dest_name(spec, idx % spec.destinations), idx)
    counts = _share_counts(spec)
    t_end = t_go + spec.duration if spec.duration else 0.0
    rate_each = spec.rate / spec.producers if spec.rate and spec.producers else 0.0

    async def run_producer(idx: int, conn: StompClient | MqttClient) -> tuple[int, float, float]:
        dest = dest_name(spec, idx % spec.destinations)
        try:
            if isinstance(conn, StompClient):
                r = await produce_stomp(spec, conn, dest, counts[idx], t_end, rate_each)
            else:
                r = await produce_mqtt(spec, conn, dest, counts[idx], t_end, rate_each)
        finally:
            pass
        sh.sent[idx] = r[0]
        with sh.producers_done.get_lock():
            sh.producers_done.value += 1
        return r

    async def watch_stop() -> None:
        while not sh.stop.is_set():
            await asyncio.sleep(0.01)

    prod_tasks = [loop.create_task(run_producer(i, c)) for i, c in producers]
    stopper = loop.create_task(watch_stop())
    prod_results: list[tuple[int, float, float]] = []
    error = None
    try:
        if prod_tasks:
            await asyncio.wait([*prod_tasks, stopper],
                                         return_when=asyncio.FIRST_EXCEPTION)
            for t in prod_tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    error = f"producer: {type(exc).__name__}: {exc}"
                elif t.done() and not t.cancelled():
                    prod_results.append(t.result())
            if error:
                with sh.producers_done.get_lock():
                    sh.producers_done.value += 1000  # unblock the coordinator
        await stopper
    finally:
        for t in prod_tasks:
            t.cancel()
        for c in [*(c for _, c in producers), *consumers, *idle]:
            if c.transport is not None:
                c.transport.abort()
    for c in consumers:
        if c.flow.error and not error and "closed" not in c.flow.error \
                and "lost" not in c.flow.error:
            error = f"consumer: {c.flow.error}"
    return {
        "wid": wid, "t_go": t_go, "error": error,
        "producers": prod_results,
        "received": recorder.count, "first": recorder.first, "last": recorder.last,
        "latencies": recorder.latencies.tobytes(),
    }


def _worker(spec: LoadSpec, roles: list[tuple[str, int]], sh: _Shared, wid: int) -> None:
    install_uvloop()
    try:
        res = asyncio.run(_worker_main(spec, roles, sh, wid))
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            return
        tb = traceback.format_exc(limit=3)
        res = {"wid": wid, "error": f"{type(exc).__name__}: {exc}", "traceback": tb,
               "producers": [], "received": 0, "first": None, "last": 0.0,
               "latencies": b"", "t_go": 0.0}
    sh.results.put(res)


# --------------------------------------------------------------------------- coordinator

def _assign(spec: LoadSpec) -> list[list[tuple[str, int]]]:
    """Roles per worker process: producers and consumers in separate processes."""
    workers: list[list[tuple[str, int]]] = []
    for role, n in (("p", spec.producers), ("c", spec.consumers)):
        k = min(n, spec.procs_per_role)
        groups: list[list[tuple[str, int]]] = [[] for _ in range(k)]
        for i in range(n):
            groups[i % k].append((role, i))
        workers.extend(groups)
    if spec.idle:
        workers.append([("i", spec.idle)])
    return workers


def _expected(spec: LoadSpec, sent: list[int]) -> int:
    if spec.producers == 0:
        return spec.drain
    if spec.consumers == 0:
        return 0
    subs = [0] * spec.destinations
    for j in range(spec.consumers):
        subs[j % spec.destinations] += 1
    total = 0
    for i, s in enumerate(sent):
        d = i % spec.destinations
        if spec.mode == "topic" or spec.protocol == "mqtt":
            total += s * subs[d]
        elif subs[d]:
            total += s
    return total


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def workers_cpu(procs: list[Any]) -> float:
    """User + system CPU seconds so far of the worker processes still running."""
    total = 0.0
    for p in procs:
        try:
            t = psutil.Process(p.pid).cpu_times()
        except (psutil.Error, TypeError):
            continue
        total += t.user + t.system
    return total


def run_load(spec: LoadSpec, *, hard_timeout: float = 900.0,
             on_start: Callable[[], None] | None = None,
             on_end: Callable[[], None] | None = None) -> LoadResult:
    """Run one load and return its result. ``on_start`` runs when sending starts,
    ``on_end`` when the last message arrived (or the run gave up), before the workers
    are told to stop: between the two is the timed part of the run."""
    if not spec.name:
        spec.name = f"r{os.getpid()}x{int(time.time() * 1000) % 10**8}"
    if spec.protocol == "mqtt":
        spec.mode = "topic"
    roles = _assign(spec)
    ctx = mp.get_context("spawn")
    sh = _Shared(barrier=ctx.Barrier(len(roles) + 1), received=ctx.Value("q", 0),
                 sent=ctx.Array("q", max(1, spec.producers)),
                 producers_done=ctx.Value("i", 0), stop=ctx.Event(), results=ctx.Queue())
    procs = [ctx.Process(target=_worker, args=(spec, r, sh, w), daemon=True)
             for w, r in enumerate(roles)]
    for p in procs:
        p.start()
    result = LoadResult()
    outs: list[dict[str, Any]] = []
    try:
        try:
            sh.barrier.wait(timeout=300)
        except Exception:
            sh.stop.set()
            outs = _collect(sh, procs, 30)
            errs = sorted({str(o.get("error")) for o in outs if o.get("error")},
                          key=lambda e: "BrokenBarrier" in e)
            result.error = "setup failed: " + "; ".join(errs[:3]) \
                if errs else "setup failed (barrier broken)"
            return result
        t0 = time.time()
        if on_start:
            on_start()
        gen0 = workers_cpu(procs)
        expected: int | None = spec.drain if spec.producers == 0 else None
        last_count = -1
        last_change = time.time()
        while True:
            time.sleep(0.01)
            now = time.time()
            if expected is None and sh.producers_done.value >= spec.producers:
                if sh.producers_done.value >= 1000:
                    break  # a producer failed
                expected = _expected(spec, list(sh.sent[:spec.producers]))
                last_change = now
            got = sh.received.value
            if got != last_count:
                last_count = got
                last_change = now
            if expected is not None and got >= expected:
                break
            if expected is not None and now - last_change > spec.stall:
                result.notes.append(f"stalled: nothing received for {spec.stall:.0f}s")
                break
            if now - t0 > hard_timeout:
                result.notes.append(f"hard timeout after {hard_timeout:.0f}s")
                break
            if not any(p.is_alive() for p in procs):
                break
        result.gen_cpu_s = round(workers_cpu(procs) - gen0, 3)
        if on_end:
            on_end()
        sh.stop.set()
        outs = _collect(sh, procs, 120)
        result.expected = expected if expected is not None else 0
    finally:
        sh.stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    fill_result(result, outs)
    result.complete = result.error is None and result.received >= result.expected \
        and (spec.producers == 0 or result.sent > 0)
    return result


def fill_result(result: LoadResult, outs: list[dict[str, Any]]) -> None:
    """Totals, rates and latency percentiles of a run from its workers' reports (the
    caller decides what counts as complete)."""
    errs = [str(o["error"]) for o in outs if o.get("error")]
    if errs:
        result.error = "; ".join(errs[:3])
    prods = [r for o in outs for r in o["producers"]]
    result.sent = sum(r[0] for r in prods)
    result.received = sum(int(o["received"]) for o in outs)
    firsts = [o["first"] for o in outs if o.get("first")]
    lasts = [o["last"] for o in outs if o.get("last")]
    t_go = max((o["t_go"] for o in outs if o.get("t_go")), default=0.0)
    if prods:
        start = min(r[1] for r in prods)
        end = max(r[2] for r in prods)
        result.send_s = end - start
        result.send_rate = result.sent / result.send_s if result.send_s > 0 else 0.0
    else:
        start = t_go
    if lasts and result.received:
        result.e2e_s = max(lasts) - start
        result.e2e_rate = result.received / result.e2e_s if result.e2e_s > 0 else 0.0
        result.first_receive_s = min(firsts) - start if firsts else None
    lat = array("d")
    for o in outs:
        lat.frombytes(o["latencies"])
    if lat:
        vals = sorted(lat)
        result.p50_ms = round(_percentile(vals, 0.50), 3)
        result.p99_ms = round(_percentile(vals, 0.99), 3)
        result.max_ms = round(vals[-1], 3)
    result.send_s = round(result.send_s, 4)
    result.e2e_s = round(result.e2e_s, 4)
    result.send_rate = round(result.send_rate, 1)
    result.e2e_rate = round(result.e2e_rate, 1)
    if result.first_receive_s is not None:
        result.first_receive_s = round(result.first_receive_s, 4)


def _collect(sh: _Shared, procs: list[Any], timeout: float) -> list[dict[str, Any]]:
    outs = []
    deadline = time.time() + timeout
    while len(outs) < len(procs) and time.time() < deadline:
        try:
            outs.append(sh.results.get(timeout=0.5))
        except Exception:
            if not any(p.is_alive() for p in procs) and sh.results.empty():
                break
    return outs


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    install_uvloop()
    return asyncio.run(coro)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", choices=["stomp", "mqtt"], default="stomp")
    ap.add_argument("--host", default=HOST)
    ap.add_argument("--port", type=int, default=61613)
    ap.add_argument("-P", "--producers", type=int, default=1)
    ap.add_argument("-C", "--consumers", type=int, default=1)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--topic", action="store_true", help="topic fan-out (default: queue)")
    ap.add_argument("--destinations", type=int, default=1)
    ap.add_argument("--idle", type=int, default=0)
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--duration", type=float, default=0.0)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--qos", type=int, default=0, choices=[0, 1])
    ap.add_argument("--drain", type=int, default=0)
    ap.add_argument("--name", default="")
    a = ap.parse_args()
    spec = LoadSpec(protocol=a.protocol, host=a.host, port=a.port, producers=a.producers,
                    consumers=a.consumers, size=a.size, persistent=a.persistent,
                    window=a.window, mode="topic" if a.topic else "queue",
                    destinations=a.destinations, idle=a.idle, count=a.count,
                    duration=a.duration, rate=a.rate, qos=a.qos, drain=a.drain, name=a.name)
    print(json.dumps(run_load(spec).row()))


if __name__ == "__main__":
    main()
