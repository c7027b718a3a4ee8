"""A TLS listener whose refusals are visible (the replication listener).

``create_server(ssl=...)`` drops a connection whose handshake fails without a word: an
operator whose nodes' certificates are refused (or who pointed a plaintext node at a TLS
port) would see nothing in the log. And a listener that accepts plain TCP first and then
calls ``start_tls`` has a window in which the event loop may already read (and lose) the
peer's ClientHello. :class:`TlsListener` accepts sockets itself and hands each one to
``loop.connect_accepted_socket(..., ssl=ctx)``: the transport speaks TLS from the first
byte, and a failed handshake is raised here, to be reported by the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger("meshmq.runtime")

ProtocolFactory = Callable[[], asyncio.Protocol]
# Told about a refused handshake: (peer "host:port", the exception).
OnFailure = Callable[[str, BaseException], None]


class TlsListener:
    """A TLS listener that accepts connections itself and gives each socket to
    ``loop.connect_accepted_socket(..., ssl=ctx)``: the connection's transport speaks TLS
    from its first byte, so no plain-TCP phase exists in which an event loop could read
    (and lose) the peer's ClientHello before the handshake starts, and a failed handshake
    comes back here as an exception to report. ``close``/``wait_closed``/``sockets`` as
    ``asyncio.Server``'s."""

    def __init__(self, sock: socket.socket, make: ProtocolFactory, ctx: ssl.SSLContext,
                 timeout_s: float, on_failure: OnFailure) -> None:
        self.sockets = [sock]
        self._sock = sock
        self._make = make
        self._ctx = ctx
        self._timeout_s = timeout_s
        self._on_failure = on_failure
        self._admissions: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, say: keep the listener
                log.warning("TLS listener on %s: accept failed: %s",
                            self._sock.getsockname(), exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._admit(conn, addr))
            self._admissions.add(task)
            task.add_done_callback(self._admissions.discard)

    async def _admit(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        where = f"{addr[0]}:{addr[1]}"
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._make, conn, ssl=self._ctx, ssl_handshake_timeout=self._timeout_s)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            # The loop closes the connection's transport (and with it the socket).
            if not isinstance(exc, ConnectionError) or isinstance(exc, ssl.SSLError):
                self._on_failure(where, exc)  # (a peer that went away is no refusal)

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._admissions):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        for task in (self._accepting, *self._admissions):
            with contextlib.suppress(BaseException):
                await task


async def tls_listen(make: ProtocolFactory, ctx: ssl.SSLContext, host: str, port: int, *,
                     timeout_s: float, on_failure: OnFailure) -> TlsListener:
    """A :class:`TlsListener` bound to ``host:port`` (OSError when it cannot bind)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return TlsListener(sock, make, ctx, timeout_s, on_failure)
