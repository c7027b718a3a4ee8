"""A TLS listener whose handshake is done here, so that a refusal is visible (the
replication listener; broker links use network/link.py's TlsGate, the same idea).

``create_server(ssl=...)`` drops a connection whose handshake fails without a word: an
operator whose nodes' certificates are refused (or who pointed a plaintext node at a
TLS port) would see nothing in the log. ``tls_gate`` wraps a listener's protocol
factory: each connection is accepted as plain TCP with reading paused, ``start_tls``
does the handshake, and only then is the listener's protocol made and attached. A
failed handshake goes to ``on_failure`` (or is logged in one line naming the listener,
the peer and the cause, at most once a minute per peer host and cause).

Bytes that arrive together with the end of the handshake reach the SSL transport before
the listener's protocol exists; ``_Holding`` keeps them (and an EOF or a close) and
hands them over in order.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import cast

from meshmq.tls import handshake_failure_reason

log = logging.getLogger("meshmq.runtime")

# A refused peer host and cause are logged again at most this often.
LOG_INTERVAL_S = 60.0
_LOG_KEYS_LIMIT = 10_000

ProtocolFactory = Callable[[], asyncio.Protocol]


class _RefusalLog:
    def __init__(self, label: str) -> None:
        self.label = label
        self._last: dict[tuple[str, str], float] = {}

    def note(self, peer: str, reason: str) -> None:
        key = (peer.rpartition(":")[0], reason)
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < LOG_INTERVAL_S:
            return
        if len(self._last) >= _LOG_KEYS_LIMIT:
            self._last.clear()
        self._last[key] = now
        log.warning("%s refused a connection from %s: %s", self.label, peer, reason)


class _Holding(asyncio.Protocol):
    """The SSL transport's protocol until the listener's own takes over."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost = False
        self.lost_exc: Exception | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True  # keep the transport: the listener's protocol decides

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.lost_exc = True, exc


# Told about a refused handshake: (peer "host:port", the exception).
OnFailure = Callable[[str, BaseException], None]


class _Gate(asyncio.Protocol):
    def __init__(self, make: ProtocolFactory, ctx: ssl.SSLContext, timeout_s: float,
                 on_failure: OnFailure) -> None:
        self.make = make
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses: no isinstance here)
        tcp = cast(asyncio.Transport, transport)
        tcp.pause_reading()  # not a byte read before the handshake (start_tls resumes)
        self._task = asyncio.get_running_loop().create_task(self._handshake(tcp))

    async def _handshake(self, tcp: asyncio.Transport) -> None:
        peer = tcp.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        holding = _Holding()
        try:
            tls = await asyncio.get_running_loop().start_tls(
                tcp, holding, self.ctx, server_side=True, ssl_handshake_timeout=self.timeout_s)
        except (OSError, TimeoutError) as exc:
            if not isinstance(exc, ConnectionError) or isinstance(exc, ssl.SSLError):
                self.on_failure(where, exc)  # (a peer that went away is no refusal)
            tcp.abort()
            return
        if tls is None or holding.lost:
            return  # closed during the handshake
        app = self.make()
        tls.set_protocol(app)
        app.connection_made(tls)
        for data in holding.data:
            app.data_received(data)
        if holding.eof and not app.eof_received():
            tls.close()

    def data_received(self, data: bytes) -> None:  # reading is paused until TLS is up
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


def tls_gate(make: ProtocolFactory, ctx: ssl.SSLContext, label: str, *,
             timeout_s: float = 30.0, on_failure: OnFailure | None = None
             ) -> ProtocolFactory:
    """A protocol factory for ``create_server`` without ``ssl=``: TLS with ``ctx``, then
    ``make()``'s protocol; failed handshakes logged as ``label`` ("listener stomp-tls"),
    or handed to ``on_failure``."""
    if on_failure is None:
        refusals = _RefusalLog(label)

        def on_failure(peer: str, exc: BaseException) -> None:
            refusals.note(peer, handshake_failure_reason(exc))
    return lambda: _Gate(make, ctx, timeout_s, on_failure)
