"""One broker-to-broker connection: framing, keep-alive and back-pressure (asyncio).

The link knows nothing of bridges: it hands decoded frames to its handler and tells
it when the connection is gone, with the cause. Both sides send a PING when they have
sent nothing for a heartbeat interval, and close a peer silent for three intervals, so
a half-open TCP connection cannot keep a bridge "up" for ever.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from meshmq.errors import MeshmqError
from meshmq.protocol.wire import (
    MAGIC,
    FrameType,
    WireDecoder,
    WireFrame,
    encode_json,
    encode_ping,
)
from meshmq.tls import handshake_failure_reason

if TYPE_CHECKING:
    from meshmq.connector_uri import Endpoint

log = logging.getLogger("meshmq.network")

SILENT_INTERVALS = 3


class LinkHandler(Protocol):
    def on_frame(self, link: WireLink, frame: WireFrame) -> None: ...
    def on_lost(self, link: WireLink, cause: str) -> None: ...
    def on_writable(self, link: WireLink) -> None: ...


class WireLink(asyncio.Protocol):
    def __init__(self, handler: LinkHandler | None, *, initiator: bool,
                 heartbeat_s: float) -> None:
        self.handler = handler
        self.initiator = initiator
        self.heartbeat_s = heartbeat_s
        self.decoder = WireDecoder(expect_magic=not initiator)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.closed = False
        self.paused = False
        self.lost = asyncio.get_running_loop().create_future()
        self._last_rx = self._last_tx = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._close_cause = ""
        self.bytes_in = 0
        self.bytes_out = 0
        self.peercert: object = None  # over TLS: what getpeercert() returned
        self.lost_exc: Exception | None = None
        self._early = b""
        # The TCP connection while its TLS handshake runs (TlsGate): closed with the link.
        self.pending: asyncio.BaseTransport | None = None


    # ------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peercert = transport.get_extra_info("peercert")
        self.transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        if self.initiator:
            self.write(MAGIC)
        self._schedule()
        early, self._early = self._early, b""
        if early:
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            # TLS (TlsGate): asyncio hands over data that came with the end of the
            # handshake before the gate can call connection_made.
            self._early += data
            return
        self._last_rx = time.monotonic()
        self.bytes_in += len(data)
        try:
            frames = self.decoder.feed(data)
        except MeshmqError as exc:
            self.refuse("protocol-error", str(exc))
            return
        for frame in frames:
            if self.closed:
                return
            if frame.type is FrameType.PING:
                self.write(encode_ping(pong=True))
                continue
            if frame.type is FrameType.PONG:
                continue
            if self.handler is None:
                continue
            try:
                self.handler.on_frame(self, frame)
            except MeshmqError as exc:
                self.refuse(exc.code or "protocol-error", str(exc))
                return
            except Exception as exc:  # a bug must cost this link, not the broker
                log.exception("network link %s: failure handling %s", self.peer,
                              frame.type.name)
                self.refuse("internal-error", f"{type(exc).__name__}: {exc}")
                return

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.handler is not None and not self.closed:
            self.handler.on_writable(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_exc = exc
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        cause = self._close_cause or (f"connection lost: {exc}" if exc else
                                      "connection closed by the peer")
        if not self.lost.done():
            self.lost.set_result(cause)
        if self.handler is not None:
            self.handler.on_lost(self, cause)

    # ------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        if self.transport is None or self.closed:
            return
        self.transport.write(data)
        self.bytes_out += len(data)
        self._last_tx = time.monotonic()

    def refuse(self, code: str, message: str) -> None:
        """Tell the peer why, then close."""
        if self.closed:
            return
        self.write(encode_json(FrameType.REFUSE, {"code": code, "message": message}))
        self.close(f"{code}: {message}")

    def close(self, cause: str = "closed locally") -> None:
        if self.closed:
            return
        self._close_cause = cause
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        elif self.pending is not None:
            cast(asyncio.Transport, self.pending).abort()

    def abort(self, cause: str) -> None:
        self._close_cause = cause
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        elif self.pending is not None:
            cast(asyncio.Transport, self.pending).abort()

    # ------------------------------------------------------------ keep-alive
    def _schedule(self) -> None:
        if self.heartbeat_s > 0 and not self.closed:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.heartbeat_s, self._beat)

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last_rx > self.heartbeat_s * SILENT_INTERVALS:
            self.abort(f"peer silent for {now - self._last_rx:.1f}s (keep-alive)")
            return
        if now - self._last_tx >= self.heartbeat_s * 0.9:
            self.write(encode_ping())
        self._schedule()


class TlsGate(asyncio.Protocol):
    """Accepts a TCP connection on a TLS listener and hands it to ``link`` once the TLS
    handshake succeeded. Doing the handshake here (not in ``create_server(ssl=...)``,
    where a failed handshake vanishes silently) lets the listener say in one line why a
    peer was refused, e.g. a plaintext bridge dialing a TLS port."""

    def __init__(self, link: WireLink, ctx: ssl.SSLContext, timeout_s: float,
                 on_failure: Callable[[str, str], None]) -> None:
        self.link = link
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)
        tcp.pause_reading()
        self.link.pending = tcp
        self._task = asyncio.get_running_loop().create_task(self._handshake(tcp))

    async def _handshake(self, tcp: asyncio.Transport) -> None:
        peer = tcp.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        try:
            tls = await asyncio.get_running_loop().start_tls(
                tcp, self.link, self.ctx, server_side=True,
                ssl_handshake_timeout=self.timeout_s)
        except (OSError, TimeoutError, ConnectionError) as exc:
            if isinstance(exc, ssl.SSLError) or not isinstance(exc, ConnectionError):
                self.on_failure(where, handshake_failure_reason(exc))  # a peer gone is no refusal
            tcp.abort()
            self.link.connection_lost(None)
            return
        if tls is None:  # closed during the handshake
            self.link.connection_lost(None)
            return
        self.link.connection_made(tls)

    def data_received(self, data: bytes) -> None:  # reading is paused until TLS is up
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self.link.connection_lost(exc)


async def dial_tcp(link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                   timeout: float) -> None:
    """Connect ``link`` to ``endpoint`` over TCP (and TLS when ``ctx`` is given); a
    failed dial leaves the link lost, so nothing waits for it at stop."""
    loop = asyncio.get_running_loop()
    if ctx is None:
        try:
            await loop.create_connection(lambda: link, endpoint.host, endpoint.port)
        except BaseException:
            link.connection_lost(None)
            raise
        return
    # The TLS handshake on a TCP connection of our own, so a failed handshake closes
    # it at once (create_connection(ssl=...) can leave it half-closed).
    try:
        tcp, _ = await loop.create_connection(asyncio.Protocol, endpoint.host,
                                              endpoint.port)
    except BaseException:
        link.connection_lost(None)
        raise
    try:
        tls = await loop.start_tls(tcp, link, ctx, server_hostname=endpoint.host,
                                   ssl_handshake_timeout=timeout)
        if tls is None:
            raise ConnectionResetError("connection closed during the TLS handshake")
    except BaseException:
        tcp.abort()
        link.connection_lost(None)
        raise
    link.connection_made(tls)
