"""One broker connection (no failover): the asyncio plumbing shared by STOMP and MQTT.

A :class:`BaseConnection` opens the socket (TLS if asked), runs one reader task that
feeds bytes to the protocol's sans-I/O codec, and fails every pending request with
:class:`ConnectionLostError` the moment the connection dies, so the failover layer
above never waits on a dead socket. It never reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import CertificateError, ConnectionLostError
from .options import Endpoint
from .tls import TlsSettings, client_context, describe_tls_failure
from .types import Message, SubscriptionSpec
from .websocket import WebSocketFramer

log = logging.getLogger("meshmq.client")

__all__ = ["BaseConnection", "DeliverFn", "Dialer", "dial_tcp"]

DeliverFn = Callable[[Message], None]
StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]
#: How a connection reaches its endpoint: the endpoint and the TLS context to use (None
#: for plain TCP) in, a connected reader and writer out. ``dial_tcp`` unless given.
Dialer = Callable[[Endpoint, ssl.SSLContext | None], Awaitable[StreamPair]]


async def dial_tcp(endpoint: Endpoint, tls: ssl.SSLContext | None) -> StreamPair:
    """A TCP connection to the endpoint's host and port (TLS when ``tls`` is given)."""
    return await asyncio.open_connection(endpoint.host, endpoint.port, ssl=tls)


# A TLS listener that rejects a client certificate may just close (meshmq's do, without
# a TLS alert), which the client cannot tell from a broker going away: say what it means.
_TLS_CLOSE_HINT = (" during the handshake (a TLS listener that needs a client certificate "
                   "does this when it gets none, or one its CA did not sign: pass "
                   "keyStore=FILE or ssl_certfile=FILE)")


def ssl_context(endpoint: Endpoint, defaults: TlsSettings | None = None
                ) -> ssl.SSLContext | None:
    """The TLS context to dial ``endpoint`` with (None for plain TCP): ``defaults``
    (the client's settings) with the endpoint's URI options on top."""
    if not endpoint.tls:
        return None
    return client_context(endpoint.tls_settings(defaults or TlsSettings()), str(endpoint))


class BaseConnection:
    """Socket, reader task, pending futures; subclasses speak the protocol."""

    protocol = "stomp"  # or "mqtt": set by the subclass

    def __init__(self, endpoint: Endpoint, deliver: DeliverFn, generation: int, *,
                 tls: ssl.SSLContext | None = None, dialer: Dialer = dial_tcp) -> None:
        self.endpoint = endpoint
        self.dialer = dialer
        self.tls = tls  # None: made from the endpoint's own options
        self.deliver = deliver
        self.generation = generation
        self.peers: tuple[str, ...] = ()
        self.closed = asyncio.Event()
        self.error: BaseException | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._seq = 0
        self._ws: WebSocketFramer | None = None  # ws:// and wss:// endpoints
        self._early = b""  # protocol bytes that came with the WebSocket upgrade answer
        self._loop = asyncio.get_running_loop()
        self.last_received = self._loop.time()
        self._opening = False  # between connect and the end of the protocol handshake

    # ------------------------------------------------------------------ opening

    async def open(self, **handshake: Any) -> None:
        """Connect and complete the protocol handshake within the endpoint's timeout."""
        self._opening = True
        try:
            async with asyncio.timeout(self.endpoint.connect_timeout):
                tls = self.tls if self.tls is not None or not self.endpoint.tls \
                    else ssl_context(self.endpoint)
                self._reader, self._writer = await self.dialer(self.endpoint, tls)
                if self.endpoint.websocket:
                    await self._upgrade()
                self._tasks.append(asyncio.create_task(self._read_loop(),
                                                       name=f"read {self.endpoint}"))
                await self.handshake(**handshake)
            self._opening = False
        except BaseException as exc:
            self._opening = False
            self._die(exc if isinstance(exc, Exception) else ConnectionLostError("cancelled"))
            await self._reap()
            if isinstance(exc, TimeoutError):
                raise ConnectionLostError(
                    f"{self.endpoint}: no connection within "
                    f"{self.endpoint.connect_timeout:g} s") from None
            cert = describe_tls_failure(str(self.endpoint), exc)
            if cert is not None:
                raise cert from None
            if isinstance(exc, OSError):
                raise ConnectionLostError(f"{self.endpoint}: {exc}") from None
            raise

    async def handshake(self, **kwargs: Any) -> None:
        raise NotImplementedError

    async def _upgrade(self) -> None:
        """ws:// and wss://: the HTTP upgrade, before the protocol's own handshake."""
        assert self._reader is not None and self._writer is not None
        framer = WebSocketFramer(f"{self.endpoint.host}:{self.endpoint.port}",
                                 self.endpoint.path, self.protocol)
        self._writer.write(framer.request())
        while True:
            data = await self._reader.read(65536)
            if not data:
                raise ConnectionLostError(f"{self.endpoint}: closed during the WebSocket "
                                          "upgrade")
            accepted, leftover = framer.handshake(data)
            if accepted:
                self._ws = framer
                self._early = leftover
                return

    # --------------------------------------------------------------- plumbing

    def next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}{self._seq}"

    def write(self, data: bytes) -> None:
        if self.closed.is_set() or self._writer is None:
            raise ConnectionLostError(f"{self.endpoint}: connection closed",)
        self._writer.write(data if self._ws is None else self._ws.encode(data))

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark (back-pressure
        for fire-and-forget sends)."""
        if self._writer is not None and not self.closed.is_set():
            try:
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                self._die(ConnectionLostError(f"{self.endpoint}: {exc}"))

    def expect(self, key: str) -> asyncio.Future[Any]:
        if self.closed.is_set():
            raise ConnectionLostError(f"{self.endpoint}: connection closed")
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[key] = fut
        return fut

    def resolve(self, key: str, value: Any = None, error: BaseException | None = None) -> bool:
        fut = self._pending.pop(key, None)
        if fut is None or fut.done():
            return False
        if error is None:
            fut.set_result(value)
        else:
            fut.set_exception(error)
        return True

    async def wait(self, fut: asyncio.Future[Any], timeout: float | None = None) -> Any:
        """Await a reply; a dead connection raises ConnectionLostError at once."""
        if timeout is None:
            return await fut
        async with asyncio.timeout(timeout):
            return await fut

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            if self._early:
                self.feed(self._early)
                self._early = b""
            while True:
                data = await self._reader.read(65536)
                if not data:
                    raise self._closed_by_broker()
                self.last_received = self._loop.time()
                if self._ws is not None:
                    data, reply = self._ws.decode(data)
                    if reply and self._writer is not None:
                        self._writer.write(reply)
                    if not data:
                        continue
                self.feed(data)
        except asyncio.CancelledError:
            self._die(ConnectionLostError(f"{self.endpoint}: connection closed"))
        except Exception as exc:
            # TLS 1.3: a broker refuses our certificate after the handshake, in a read.
            cert = describe_tls_failure(str(self.endpoint), exc)
            if cert is None and isinstance(exc, ConnectionResetError) and self._closing_tls():
                # The same close, reaching us as a reset when our handshake bytes were
                # still unread on the broker's side: the same hint.
                exc = self._closed_by_broker()
            self._die(cert or (exc if isinstance(exc, ConnectionLostError)
                               else ConnectionLostError(f"{self.endpoint}: {exc}")))

    def _closing_tls(self) -> bool:
        return self._opening and self.endpoint.tls

    def _closed_by_broker(self) -> ConnectionLostError:
        """The broker closed the connection (with the client-certificate hint while a
        TLS connection is still opening)."""
        return ConnectionLostError(f"{self.endpoint}: closed by the broker"
                                   f"{_TLS_CLOSE_HINT if self._closing_tls() else ''}")

    def feed(self, data: bytes) -> None:
        raise NotImplementedError

    def _die(self, exc: Exception) -> None:
        """Mark the connection dead and fail everything waiting on it."""
        if self.closed.is_set():
            return
        self.error = exc
        self.closed.set()
        for key, fut in list(self._pending.items()):
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, ConnectionLostError | CertificateError)
                                  else ConnectionLostError(str(exc)))
            self._pending.pop(key, None)
        if self._writer is not None:
            self._writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    def abort(self, reason: str = "aborted by the client") -> None:
        if self._writer is not None and self._writer.transport is not None:
            self._writer.transport.abort()
        self._die(ConnectionLostError(f"{self.endpoint}: {reason}"))

    async def _reap(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)

    async def close(self, timeout: float = 5.0) -> None:
        """Polite close (protocol goodbye, bounded by ``timeout``), then tear down."""
        if not self.closed.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self.goodbye()
            except Exception as exc:
                log.debug("%s: close: %s", self.endpoint, exc)
        self._die(ConnectionLostError(f"{self.endpoint}: closed by the client"))
        await self._reap()

    async def goodbye(self) -> None:
        raise NotImplementedError

    # The protocol operations every connection offers (the failover layer's vocabulary).

    async def send(self, destination: str, body: bytes, headers: dict[str, str], *,
                   confirm: bool = True, transaction: str | None = None,
                   **extra: Any) -> None:
        raise NotImplementedError

    async def subscribe(self, spec: SubscriptionSpec) -> dict[str, str]:
        """Subscribe; returns the headers of the broker's confirmation (a STOMP RECEIPT
        may carry some, e.g. a stream's offsets), or {}."""
        raise NotImplementedError

    async def unsubscribe(self, spec: SubscriptionSpec, *, remove_durable: bool) -> None:
        raise NotImplementedError

    async def ack(self, message: Message, spec: SubscriptionSpec, *, positive: bool = True,
                  transaction: str | None = None) -> None:
        raise NotImplementedError

    async def begin(self, tx: str) -> None:
        raise NotImplementedError

    async def commit(self, tx: str) -> None:
        raise NotImplementedError

    async def abort_tx(self, tx: str) -> None:
        raise NotImplementedError

    def start_task(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))
