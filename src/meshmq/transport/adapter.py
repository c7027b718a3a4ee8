"""The asyncio adapter shared by every protocol: one per connection.

It admits the connection against its listener's ``max_connections``, creates the
protocol session, and forwards bytes, back-pressure and the close to it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from meshmq.transport.host import Session, SessionHost

WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024


class BufferedOutput:
    """Output of a protocol session: frames are queued as they are produced and written
    with one ``transport.write`` when the runtime's pump flushes the session.

    A large body is queued by reference (``_write_parts``) and the queue is then handed
    to ``transport.writelines``: uvloop writes the parts with one ``writev``, so a
    1 MB body is not copied into a frame and again into one buffer (the standard
    event loop joins them, as ``flush`` does otherwise)."""

    host: SessionHost
    transport: asyncio.Transport
    _out: list[bytes]
    last_write: float
    _out_by_reference = False  # _out holds a large body: write it with writelines

    def _write(self, data: bytes) -> None:
        out = self._out
        if not out:
            # Only an empty buffer needs marking: flush() empties it, so a non-empty one
            # is marked already (one dict insert per pump, not per frame).
            self.host.mark_flush(self)  # type: ignore[arg-type]  # every user is a Session
        out.append(data)

    def _write_parts(self, head: bytes, body: bytes, tail: bytes) -> None:
        """Queue one frame in three parts without joining them (a large body)."""
        out = self._out
        if not out:
            self.host.mark_flush(self)  # type: ignore[arg-type]  # every user is a Session
        out += (head, body, tail)
        self._out_by_reference = True

    def flush(self) -> None:
        out = self._out
        if not out:
            return
        if self._out_by_reference:
            self._out_by_reference = False
            parts = out.copy()
            out.clear()
            if not self.transport.is_closing():
                self.transport.writelines(parts)
                self.last_write = time.monotonic()
            return
        data = b"".join(out) if len(out) > 1 else out[0]
        out.clear()
        if self.transport.is_closing():
            return
        self.transport.write(data)
        self.last_write = time.monotonic()


class ConnectionSession(Protocol):
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


S = TypeVar("S", bound=ConnectionSession)


class SessionProtocol(asyncio.Protocol, Generic[S]):
    """Subclasses name the session class to create in ``make_session``."""

    def __init__(self, host: SessionHost, listener: str | None = None) -> None:
        self.host = host
        self.listener = listener  # counts against this listener's max_connections
        self.admitted = False
        self.session: S | None = None

    def make_session(self, transport: asyncio.Transport, remote: str) -> S:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; cast, don't assert.
        transport = cast(asyncio.Transport, transport)
        if self.listener is not None and not self.admitted:  # (adopted: admitted before)
            if not self.host.admit(self.listener):
                transport.close()
                return
            self.admitted = True
        peer = transport.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.session = self.make_session(transport, remote)
        self.host.accepted(cast("Session", self.session))

    def data_received(self, data: bytes) -> None:
        if self.session is not None:
            self.session.data_received(data)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted and self.listener is not None:
            self.host.release(self.listener)
            self.admitted = False
        if self.session is not None:
            self.host.forget(cast("Session", self.session))
            self.session.connection_lost()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.pause_writing()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.resume_writing()


def socket_open(transport: asyncio.BaseTransport) -> bool:
    """Is the client's side of ``transport``'s socket still open? A peek at a copy of
    its descriptor (the loop's transports lend no ``recv``): an end of stream, or a
    reset, that the loop has not read yet says it is not. Other transports: open."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return True
    try:
        with socket.socket(sock.family, sock.type, fileno=socket.dup(sock.fileno())) as copy:
            return copy.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True  # nothing to read: open
    except OSError:
        return False  # reset, or already closed
