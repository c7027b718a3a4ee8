"""A null sink: the cheapest possible STOMP/MQTT peer, to show the load generator's ceiling.

It answers CONNECT with CONNECTED (STOMP) or CONNACK (MQTT), SENDs that ask for
a receipt with RECEIPT, QoS 1 PUBLISHes with PUBACK, PINGREQ with PINGRESP, and
discards everything else. A SUBSCRIBE makes it stream ready-made messages to
that connection as fast as the socket takes them (timestamped like the
generator's, of the size named in the subscription id ``s<size>-...`` or the
MQTT client id ``...s<size>...``), so the consumers' ceiling is measured too.

    python bench/nullsink.py --stomp-port 61613 --mqtt-port 1883
"""

from __future__ import annotations

import argparse
import asyncio
import re
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mqtt_wire import (
    CONNECT,
    PINGREQ,
    PUBLISH,
    SUBSCRIBE,
    MqttParser,
    encode_connack,
    encode_pingresp,
    encode_puback,
    encode_publish,
    encode_suback,
    parse_connect_client_id,
    parse_publish,
    parse_subscribe,
)

from meshmq.protocol.stomp import StompParser, encode_frame

_SIZE_RE = re.compile(r"s(\d+)(?:n(\d+))?")
BATCH = 64
STREAM_BYTES = 256 * 1024


def _stamp(size: int) -> bytes:
    return struct.pack("<d", time.time()) + b"x" * max(0, size - 8)


# Streams wait here until the first SEND / PUBLISH arrives after their SUBSCRIBE, so
# the consumers' clock starts with the producers' (as it would with a real broker).
_ARMED: list[tuple[_Streamer, Callable[[int], bytes], int, int]] = []


def _release() -> None:
    while _ARMED:
        streamer, make, per, total = _ARMED.pop()
        streamer.start(make, per, total)


class _Streamer:
    """Writes batches from ``make()`` while the transport is not paused."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.task: asyncio.Task[None] | None = None

    def start(self, make: Callable[[int], bytes], per: int, total: int) -> None:
        """Stream ``total`` messages (0: until the peer goes), ``per`` per write."""
        self.task = asyncio.get_running_loop().create_task(self._run(make, per, total))

    async def _run(self, make: Callable[[int], bytes], per: int, total: int) -> None:
        left = total
        while not self.transport.is_closing() and (total == 0 or left > 0):
            await self.can_write.wait()
            if self.transport.is_closing():
                return
            k = per if total == 0 else min(per, left)
            self.transport.write(make(k))
            left -= k
            await asyncio.sleep(0)

    def stop(self) -> None:
        if self.task:
            self.task.cancel()


class StompSink(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.parser = StompParser(version="1.2")
        self.streamers: list[_Streamer] = []
        self.seq = 0

    def data_received(self, data: bytes) -> None:
        out = []
        for f in self.parser.feed(data):
            cmd = f.command
            if cmd == "SEND":
                if _ARMED:
                    _release()
                r = f.get("receipt")
                if r is not None:
                    out.append(encode_frame("RECEIPT", [("receipt-id", r)]))
            elif cmd in ("CONNECT", "STOMP"):
                out.append(encode_frame("CONNECTED", [("version", "1.2"),
                                                      ("heart-beat", "0,0")]))
            elif cmd == "SUBSCRIBE":
                r = f.get("receipt")
                if r is not None:
                    out.append(encode_frame("RECEIPT", [("receipt-id", r)]))
                sub = f.get("id") or "0"
                m = _SIZE_RE.match(sub)
                self._stream(f.get("destination") or "/queue/x", sub,
                             int(m.group(1)) if m else 256,
                             int(m.group(2) or 0) if m else 0)
            elif cmd == "DISCONNECT":
                r = f.get("receipt")
                if r is not None:
                    out.append(encode_frame("RECEIPT", [("receipt-id", r)]))
            else:
                r = f.get("receipt")
                if r is not None:
                    out.append(encode_frame("RECEIPT", [("receipt-id", r)]))
        if out:
            self.transport.write(b"".join(out))

    def _stream(self, dest: str, sub: str, size: int, total: int) -> None:
        head = encode_frame("MESSAGE", [("subscription", sub), ("destination", dest),
                                        ("message-id", "m")], b"x" * size)[:-(size + 1)]
        per = max(1, min(BATCH, STREAM_BYTES // (size + len(head))))
        pad = b"x" * max(0, size - 8)

        def make(k: int) -> bytes:
            ts = struct.pack("<d", time.time())
            frame = head + ts + pad + b"\0"
            return frame * k

        s = _Streamer(self.transport)
        self.streamers.append(s)
        _ARMED.append((s, make, per, total))

    def pause_writing(self) -> None:
        for s in self.streamers:
            s.can_write.clear()

    def resume_writing(self) -> None:
        for s in self.streamers:
            s.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        for s in self.streamers:
            s.stop()


class MqttSink(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.parser = MqttParser()
        self.size = 256
        self.total = 0
        self.streamer: _Streamer | None = None

    def data_received(self, data: bytes) -> None:
        out = []
        for ptype, flags, payload in self.parser.feed(data):
            if ptype == PUBLISH:
                if _ARMED:
                    _release()
                if flags & 0x06:
                    _, pid, _ = parse_publish(flags, payload)
                    out.append(encode_puback(pid))
            elif ptype == CONNECT:
                m = _SIZE_RE.search(parse_connect_client_id(payload))
                if m:
                    self.size = int(m.group(1))
                    self.total = int(m.group(2) or 0)
                out.append(encode_connack(0))
            elif ptype == SUBSCRIBE:
                pid, topics = parse_subscribe(payload)
                out.append(encode_suback(pid, [q for _, q in topics]))
                self._stream(topics[0][0], topics[0][1])
            elif ptype == PINGREQ:
                out.append(encode_pingresp())
        if out:
            self.transport.write(b"".join(out))

    def _stream(self, topic: str, qos: int) -> None:
        size = self.size
        per = max(1, min(BATCH, STREAM_BYTES // (size + 16)))
        pad = b"x" * max(0, size - 8)
        pid = [0]

        def make(k: int) -> bytes:
            ts = struct.pack("<d", time.time())
            parts = []
            for _ in range(k):
                pid[0] = pid[0] % 65535 + 1
                parts.append(encode_publish(topic, ts + pad, qos, pid[0]))
            return b"".join(parts)

        self.streamer = _Streamer(self.transport)
        _ARMED.append((self.streamer, make, per, self.total))

    def pause_writing(self) -> None:
        if self.streamer:
            self.streamer.can_write.clear()

    def resume_writing(self) -> None:
        if self.streamer:
            self.streamer.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streamer:
            self.streamer.stop()


async def serve(stomp_port: int, mqtt_port: int, host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(StompSink, host, stomp_port, backlog=4096),
               await loop.create_server(MqttSink, host, mqtt_port, backlog=4096)]
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stomp-port", type=int, default=61613)
    ap.add_argument("--mqtt-port", type=int, default=1883)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args.stomp_port, args.mqtt_port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
