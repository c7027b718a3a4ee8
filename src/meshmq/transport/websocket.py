"""WebSocket listeners: STOMP and MQTT over RFC 6455, on one port.

A thin asyncio adapter around wsproto (python-hyper's sans-I/O WebSocket codec).
``WebSocketProtocol`` is the asyncio protocol of one TCP (or TLS) connection. It
reads the HTTP upgrade request, picks a subprotocol, answers ``101 Switching
Protocols`` and from then on hosts an *inner* protocol -- ``StompProtocol``, an
MQTT protocol, any ``asyncio.Protocol`` -- exactly as if that protocol were on a
plain socket: the inner protocol gets a ``WebSocketTransport`` whose ``write``
wraps bytes in WebSocket data messages, and the payload of every incoming data
message is handed to its ``data_received`` as a byte stream. STOMP and MQTT
parsers are incremental, so messages are streamed as they arrive, never
reassembled, and neither protocol assumes its frames align with WebSocket
messages (MQTT 3.1.1 section 6 requires exactly that).

Wiring (the runtime does this for ``ws://`` and ``wss://`` listeners)::

    server = await start_websocket_listener(loop, host, port, {
        "v12.stomp": lambda: StompProtocol(runtime),
        "v11.stomp": lambda: StompProtocol(runtime),
        "v10.stomp": lambda: StompProtocol(runtime),
        "stomp": lambda: StompProtocol(runtime),
        "mqtt": lambda: MqttProtocol(runtime),  # when MQTT arrives
    }, ssl_context=ctx)

Decisions, in the order a connection meets them:

* **Handshake.** Bytes up to the blank line ending the request head are given to
  wsproto (``ConnectionType.SERVER``); anything after it is kept and fed to the
  WebSocket codec once the upgrade is accepted (a client that pipelines its first
  frame is not punished). A head larger than ``max_handshake_size``, bytes that
  are not HTTP, an HTTP request that is not a WebSocket upgrade, and a head not
  complete within ``handshake_timeout`` seconds all get an HTTP error response
  (400; 426 for an unsupported ``Sec-WebSocket-Version``; 408 on timeout) with a
  plain-text body saying why, and the connection is closed (lingering: our side
  ends with EOF, further input is discarded, TCP is closed when the client closes
  or after ``close_timeout``, so a reset cannot destroy the response). Nothing raised by a
  peer's bytes escapes into the event loop.
* **Path.** Any path is accepted (ActiveMQ serves ``ws://host:61614/``); pass
  ``paths`` in ``WebSocketOptions`` to accept only those (404 for others).
  The path is available as ``get_extra_info("path")``.
* **Subprotocol.** The server's preference wins: the first name of the
  ``protocols`` mapping (in its insertion order) that the client offers is chosen,
  so a stomp.js client offering ``v10.stomp, v11.stomp, v12.stomp`` gets
  ``v12.stomp``. Names match case-insensitively and the client's spelling is
  echoed. A client that offers subprotocols but none we speak gets 400 with the
  list we do speak. A client that offers *no* subprotocol at all (plain
  ``new WebSocket(url)``) is served with ``default_subprotocol`` (``"stomp"``,
  like ActiveMQ, which speaks STOMP to such clients) and no
  ``Sec-WebSocket-Protocol`` header is sent back; set it to ``None`` to require a
  subprotocol. The chosen mapping key is ``get_extra_info("subprotocol")``.
* **Text or binary.** Names in ``text_subprotocols`` (the STOMP ones by default)
  mirror the client: after the client's last data message was TEXT, writes go out
  as TEXT messages (browser STOMP clients send and expect text), otherwise as
  BINARY; a write that is not valid UTF-8 always goes out as BINARY, since a text
  message must be UTF-8. Everything else -- MQTT -- is always BINARY, as MQTT over
  WebSocket requires. One ``write`` is one message.
* **Limits.** A data message larger than ``max_message_size`` bytes (100 MiB,
  ActiveMQ's ``maxDataLength``) closes the connection with 1009. Protocol
  violations (unmasked client frames, bad opcodes, invalid UTF-8 in text) close
  with the code wsproto reports.
* **Closing.** Pings are answered with pongs. A client's close frame is answered
  and the TCP connection closed (RFC 6455: the server closes TCP first). When the
  inner protocol closes its transport, a 1000 close frame is sent after what it
  wrote, and TCP is closed when the client answers or after ``close_timeout``
  seconds. The inner protocol's ``connection_lost`` is called exactly once, when
  the TCP connection is gone.
* **Back-pressure.** ``pause_reading``/``resume_reading`` stop and restart the TCP
  transport; while paused, messages already received stay in wsproto's buffer and
  are delivered after ``resume_reading``. The TCP transport's ``pause_writing``/
  ``resume_writing`` are forwarded to the inner protocol, and its
  ``set_write_buffer_limits``/``get_write_buffer_size`` act on the TCP buffer.

wsproto does the handshake, parses every incoming frame and writes the control
frames; outgoing *data* frames are serialized here (``frame_header``) because
server frames are unmasked and a two-to-ten-byte header written in front of the
payload spares wsproto's three copies of every (possibly 100 MiB) payload.
Extensions (permessage-deflate) are not negotiated.

**Handoff** (a node's shards, transport/handoff.py): on a plain listener started with
``handoff`` subprotocols, a connection keeps the bytes it received that are not yet
part of a whole frame handed on (a frame's length is read from its header, which is
cheap; nothing is kept once the inner protocol has offered the connection or given up,
nor beyond what an offer may carry). At the end of a message,
``WebSocketTransport.handoff`` gives those bytes and the negotiated state (subprotocol,
path, whether the client writes text): a new wsproto ``Connection`` in another process
(``WebSocketProtocol.adopted``), fed them after its inner protocol has taken the bytes
that protocol had pending here, goes on exactly where this one stops. Part-way through
a message (the client fragmented it) nothing is offered: the partial message's decoding
state cannot move.
"""

from __future__ import annotations

import asyncio
import enum
import http
import logging
import re
import ssl
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection, ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError as WsRemoteProtocolError

log = logging.getLogger("meshmq.websocket")

ProtocolFactory = Callable[[], asyncio.Protocol]
# What a WebSocket's handoff carries besides bytes (JSON): "subprotocol", "path", "text"
# (the client's last message was text: replies mirror it), "inner" (see handoff_bytes).
WebSocketState = dict[str, str | int | bool | None]

MIB = 1024 * 1024
STOMP_SUBPROTOCOLS = frozenset({"v10.stomp", "v11.stomp", "v12.stomp", "stomp"})

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_OP_TEXT = 0x1
_OP_BINARY = 0x2
_READABLE = (ConnectionState.OPEN, ConnectionState.LOCAL_CLOSING)
# Bytes kept for a handoff at most: transport/handoff.py's MAX_PENDING, beyond which an
# offer is not sent (a big first message is not copied for nothing).
_TRACK_LIMIT = 16 * MIB


@dataclass(frozen=True, slots=True)
class WebSocketOptions:
    """Limits and choices of one WebSocket listener. Sizes in bytes, times in seconds."""

    max_message_size: int = 100 * MIB  # largest incoming data message (ActiveMQ maxDataLength)
    max_handshake_size: int = 16 * 1024  # the HTTP upgrade request head
    handshake_timeout: float = 10.0  # the upgrade request must be complete within this
    close_timeout: float = 5.0  # wait this long for the client's close frame
    # served to a client that offers no subprotocol at all; None: such clients get 400
    default_subprotocol: str | None = "stomp"
    # subprotocols whose replies mirror the client's text/binary choice; the rest are binary
    text_subprotocols: frozenset[str] = STOMP_SUBPROTOCOLS
    paths: frozenset[str] | None = None  # None: any path


# ---------------------------------------------------------------- pure helpers


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome of subprotocol negotiation."""

    name: str  # the key of the protocols mapping that serves the connection
    echo: str | None  # the Sec-WebSocket-Protocol value to answer with (None: no header)


def negotiate_subprotocol(offered: Sequence[str], supported: Sequence[str],
                          default: str | None) -> Negotiated | None:
    """Choose a subprotocol: the first of ``supported`` (server preference order) that
    the client ``offered``; ``default`` when it offered none; None when nothing fits."""
    if not offered:
        if default is not None and default in supported:
            return Negotiated(default, None)
        return None
    by_lower: dict[str, str] = {}
    for token in offered:
        by_lower.setdefault(token.lower(), token)
    for name in supported:
        echo = by_lower.get(name.lower())
        if echo is not None:
            return Negotiated(name, echo)
    return None


def http_error(status: int, message: str,
               headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 error response with a text body."""
    body = (message + "\n").encode("utf-8", "replace")
    phrase = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ \
        else "Error"
    lines = [f"HTTP/1.1 {status} {phrase}".encode(),
             b"Content-Type: text/plain; charset=utf-8",
             b"Content-Length: " + str(len(body)).encode(),
             b"Connection: close"]
    lines.extend(name + b": " + value for name, value in headers)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def frame_header(opcode: int, length: int) -> bytes:
    """The header of a final, unmasked (server-to-client) frame of ``length`` bytes."""
    if length < 126:
        return bytes((0x80 | opcode, length))
    if length < 0x10000:
        return struct.pack("!BBH", 0x80 | opcode, 126, length)
    return struct.pack("!BBQ", 0x80 | opcode, 127, length)


def frame_length(data: bytes | bytearray) -> int | None:
    """The size of the whole frame (header, mask key, payload) that ``data`` starts
    with, or None while its header is incomplete."""
    if len(data) < 2:
        return None
    length = data[1] & 0x7F
    head = 2
    if length == 126:
        if len(data) < 4:
            return None
        length = struct.unpack_from("!H", data, 2)[0]
        head = 4
    elif length == 127:
        if len(data) < 10:
            return None
        length = struct.unpack_from("!Q", data, 2)[0]
        head = 10
    if data[1] & 0x80:
        head += 4
    return int(head + length)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------- the adapter


class _Phase(enum.Enum):
    HANDSHAKE = "handshake"  # reading the HTTP upgrade request
    OPEN = "open"  # WebSocket open, inner protocol running
    CLOSING = "closing"  # close frame sent or received, waiting for the TCP close
    CLOSED = "closed"  # rejected, or the TCP connection is gone


class WebSocketTransport(asyncio.Transport):
    """What the inner protocol sees as its transport: writes become WebSocket data
    messages; everything else is the TCP transport's."""

    def __init__(self, owner: WebSocketProtocol) -> None:
        super().__init__()
        self._owner = owner

    # -- writing
    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._owner._send_data(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket has no half-close; use close()")

    def get_write_buffer_size(self) -> int:
        return self._owner._tcp.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._owner._tcp.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._owner._tcp.set_write_buffer_limits(high, low)

    # -- reading
    def pause_reading(self) -> None:
        self._owner._pause_reading()

    def resume_reading(self) -> None:
        self._owner._resume_reading()

    def is_reading(self) -> bool:
        return not self._owner._reading_paused and not self.is_closing()

    # -- closing
    def close(self) -> None:
        self._owner._close_from_inner()

    def abort(self) -> None:
        self._owner._tcp.abort()

    def is_closing(self) -> bool:
        return self._owner._phase is not _Phase.OPEN or self._owner._tcp.is_closing()

    # -- the rest
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        owner = self._owner
        if name == "subprotocol":
            return owner.subprotocol
        if name == "path":
            return owner.path
        if name == "websocket_request":
            return owner.request
        return owner._tcp.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._owner._inner = cast(asyncio.Protocol, protocol)

    # -- handing the connection to another shard (transport/handoff.py)
    def handoff(self) -> tuple[bytes, WebSocketState] | None:
        """What another process needs to go on serving this WebSocket: the client's
        bytes for its codec (every byte received after the last whole message handed
        on) and the negotiated state. None when the connection cannot move now: not
        tracked for handoff (TLS, or not asked for), or part of a message read."""
        return self._owner._handoff_state()

    def handoff_done(self) -> None:
        """The inner protocol will not offer this connection (again): stop keeping what
        an offer would need."""
        self._owner._track = None

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._owner._inner is not None
        return self._owner._inner


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection: handshake, then host the chosen inner protocol."""

    def __init__(self, protocols: Mapping[str, ProtocolFactory],
                 options: WebSocketOptions | None = None, *,
                 handoff: Collection[str] = ()) -> None:
        self.protocols = protocols
        self.options = options or WebSocketOptions()
        self.subprotocol: str | None = None  # the chosen key of ``protocols``
        self.path: str | None = None
        self.request: Request | None = None
        self.remote = "?"
        self._tcp: asyncio.Transport = cast(asyncio.Transport, None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._phase = _Phase.HANDSHAKE
        self._head = b""
        self._ws: WSConnection | Connection = WSConnection(ConnectionType.SERVER)
        self._inner: asyncio.Protocol | None = None
        self._shim: WebSocketTransport | None = None
        self._inner_lost = False
        self._text_capable = False
        self._client_text = True  # STOMP clients start with text until they show otherwise
        self._message_size = 0
        self._reading_paused = False  # by the inner protocol
        self._tcp_paused = False
        self._write_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._drain_scheduled = False
        # Connection handoff (plain ws:// on a node of shards; the subprotocols whose
        # sessions offer their connection): until the inner protocol has offered the
        # connection or given up, every byte received and not yet part of a whole frame
        # handed on is kept, so an offer can carry what the codec holds.
        self._handoff = handoff
        self._track: bytearray | None = None
        self._message_end = True  # the last data handed on ended a message
        self._adopted: bytes | None = None  # handed here: the client's bytes to go on with

    @classmethod
    def adopted(cls, inner: asyncio.Protocol, state: WebSocketState, raw: bytes,
                options: WebSocketOptions | None = None) -> WebSocketProtocol:
        """A connection another shard handed here, open already, with the state and
        the client's bytes ``WebSocketTransport.handoff`` gave there: ``inner`` (which
        takes the bytes its own protocol had pending there) serves it, then ``raw``."""
        protocol = cls({str(state["subprotocol"]): lambda: inner}, options)
        path = state.get("path")
        protocol.path = path if isinstance(path, str) else None
        protocol._client_text = state.get("text") is not False
        protocol._adopted = raw
        protocol._ws = Connection(ConnectionType.SERVER)
        return protocol

    # ------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; cast, don't assert.
        self._tcp = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._adopted is not None:
            raw, self._adopted = self._adopted, None
            self._start(next(iter(self.protocols)), raw)
            return
        self._timer = self._loop.call_later(self.options.handshake_timeout,
                                            self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        try:
            if self._phase is _Phase.HANDSHAKE:
                self._handshake_data(data)
            elif self._phase is not _Phase.CLOSED and self._ws.state in _READABLE:
                self._feed(data)
                self._drain()
        except Exception:
            log.exception("internal error on WebSocket connection %s", self.remote)
            self._phase = _Phase.CLOSED
            self._tcp.abort()

    def eof_received(self) -> bool | None:
        return None  # the client went away without a close frame: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = _Phase.CLOSED
        self._cancel_timer()
        if self._inner is not None and not self._inner_lost:
            self._inner_lost = True
            try:
                self._inner.connection_lost(exc)
            except Exception:
                log.exception("connection_lost of the %s protocol failed (%s)",
                              self.subprotocol, self.remote)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._inner is not None and not self._inner_lost:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._inner is not None and not self._inner_lost:
            self._inner.resume_writing()

    # ------------------------------------------------------------ handshake
    def _handshake_data(self, data: bytes) -> None:
        self._head += data
        limit = self.options.max_handshake_size
        end = _HEAD_END.search(self._head, 0, limit + 4)
        if end is None or end.end() > limit:
            if len(self._head) > limit:
                self._reject(400, f"the HTTP request head is larger than {limit} bytes")
            return
        head, rest = self._head[:end.end()], self._head[end.end():]
        self._head = b""
        try:
            self._ws.receive_data(head)
            request = next((e for e in self._ws.events() if isinstance(e, Request)), None)
        except (UnicodeError, ValueError):
            self._reject(400, "malformed HTTP request: this is a WebSocket endpoint")
            return
        except WsRemoteProtocolError as exc:
            hint = exc.event_hint
            status = getattr(hint, "status_code", 400)
            headers = list(getattr(hint, "headers", ()))
            self._reject(status, f"{exc}: this is a WebSocket endpoint, it expects an "
                                 "HTTP/1.1 GET with 'Connection: Upgrade' and "
                                 "'Upgrade: websocket'", headers)
            return
        if request is None:
            self._reject(400, "not an HTTP request: this is a WebSocket endpoint")
            return
        self.request = request
        try:
            path = urlsplit(request.target).path or "/"
        except ValueError:
            path = ""
        if not path.startswith("/"):
            self._reject(400, f"invalid request target {request.target!r}")
            return
        self.path = path
        paths = self.options.paths
        if paths is not None and path not in paths:
            self._reject(404, f"no WebSocket endpoint at {path}; try "
                              f"{', '.join(sorted(paths))}")
            return
        supported = list(self.protocols)
        chosen = negotiate_subprotocol(request.subprotocols, supported,
                                       self.options.default_subprotocol)
        if chosen is None:
            offered = ", ".join(request.subprotocols) or "none"
            self._reject(400, f"unsupported WebSocket subprotocol (offered: {offered}); "
                              f"this endpoint speaks: {', '.join(supported)}")
            return
        self._accept(chosen, rest)

    def _accept(self, chosen: Negotiated, rest: bytes) -> None:
        self._cancel_timer()
        self._tcp.write(self._ws.send(AcceptConnection(subprotocol=chosen.echo)))
        if chosen.name in self._handoff and self._tcp.get_extra_info("ssl_object") is None:
            self._track = bytearray()  # (a TLS session cannot leave this process)
        self._start(chosen.name, rest)

    def _start(self, name: str, rest: bytes) -> None:
        """The WebSocket is open: start the inner protocol, then hand it ``rest``."""
        self.subprotocol = name
        self._text_capable = name in self.options.text_subprotocols
        self._phase = _Phase.OPEN
        log.debug("WebSocket %s from %s on %s", name, self.remote, self.path)
        try:
            inner = self.protocols[name]()
            self._inner = inner
            self._shim = WebSocketTransport(self)
            inner.connection_made(self._shim)
            if self._write_paused:
                inner.pause_writing()
        except Exception:
            log.exception("the %s protocol failed to start (%s)", name, self.remote)
            self._send_close(CloseReason.INTERNAL_ERROR, "internal broker error")
            return
        if rest and self._phase is _Phase.OPEN:
            self._feed(rest)
            self._drain()

    def _reject(self, status: int, message: str,
                headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        log.info("rejected WebSocket handshake from %s: %d %s", self.remote, status, message)
        self._phase = _Phase.CLOSED
        self._cancel_timer()
        self._head = b""
        self._tcp.write(http_error(status, message, headers))
        # Lingering close: closing a socket with unread input makes the kernel send a
        # reset, which can destroy the response before the client reads it. So end our
        # side with EOF, discard whatever the client still sends, and close when it
        # closes or after close_timeout.
        if self._tcp.can_write_eof():
            self._tcp.write_eof()
            assert self._loop is not None
            self._timer = self._loop.call_later(self.options.close_timeout, self._tcp.close)
        else:
            self._tcp.close()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self._phase is _Phase.HANDSHAKE:
            self._reject(408, "no complete WebSocket upgrade request within "
                              f"{self.options.handshake_timeout:g}s")

    # ------------------------------------------------------------ incoming messages
    def _feed(self, data: bytes) -> None:
        track = self._track
        if track is not None:
            track += data
            if len(track) > _TRACK_LIMIT:
                self._track = None  # more than an offer may carry: not offered
        self._ws.receive_data(data)

    def _drain(self) -> None:
        """Hand received events to the inner protocol until paused or out of events."""
        ws = self._ws
        for event in ws.events():
            track = self._track
            if track is not None and (event.frame_finished if isinstance(
                    event, TextMessage | BytesMessage) else True):
                # A whole frame was parsed: drop its bytes from what an offer carries
                # (one event per control frame; a data frame's last part ends it).
                size = frame_length(track)
                if size is None or size > len(track):
                    self._track = None  # not where this count expects: never offer
                else:
                    del track[:size]
            if isinstance(event, TextMessage | BytesMessage):
                if self._phase is _Phase.OPEN:
                    self._on_data(event)
            elif isinstance(event, Ping):
                if ws.state is ConnectionState.OPEN:
                    self._tcp.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self._on_close(event)
                return
            if self._reading_paused and self._phase is _Phase.OPEN:
                return  # the rest waits in wsproto's buffer until resume_reading

    def _on_data(self, event: TextMessage | BytesMessage) -> None:
        data = event.data
        if isinstance(data, str):
            payload = data.encode("utf-8")
            self._client_text = True
        else:
            payload = bytes(data)
            self._client_text = False
        self._message_size += len(payload)
        if self._message_size > self.options.max_message_size:
            log.info("closing WebSocket %s: message larger than %d bytes", self.remote,
                     self.options.max_message_size)
            self._send_close(CloseReason.MESSAGE_TOO_BIG, "message larger than "
                             f"{self.options.max_message_size} bytes")
            return
        if event.message_finished:
            self._message_size = 0
        self._message_end = event.frame_finished and event.message_finished
        if payload and self._inner is not None:
            self._inner.data_received(payload)

    def _on_close(self, event: CloseConnection) -> None:
        ws = self._ws
        if ws.state is ConnectionState.REMOTE_CLOSING:  # the client closes: answer, drop TCP
            self._phase = _Phase.CLOSING
            self._tcp.write(ws.send(event.response()))
            self._close_tcp()
        elif ws.state is ConnectionState.CLOSED:  # the client answered our close frame
            self._close_tcp()
        else:  # wsproto found a protocol violation and reports it as a close event
            log.info("closing WebSocket %s: %s (%s)", self.remote, event.reason, event.code)
            if ws.state is ConnectionState.OPEN and not self._tcp.is_closing():
                self._tcp.write(ws.send(CloseConnection(code=event.code,
                                                        reason=event.reason)))
            self._close_tcp()

    # ------------------------------------------------------------ for the transport shim
    def _handoff_state(self) -> tuple[bytes, WebSocketState] | None:
        track = self._track
        if track is None or not self._message_end or self._phase is not _Phase.OPEN or \
                self._ws.state is not ConnectionState.OPEN or self.subprotocol is None:
            return None
        return bytes(track), {"subprotocol": self.subprotocol, "path": self.path,
                              "text": self._client_text}

    def _send_data(self, data: bytes) -> None:
        if not data or self._phase is not _Phase.OPEN or self._tcp.is_closing():
            return
        if self._text_capable and self._client_text and _is_utf8(data):
            opcode = _OP_TEXT
        else:
            opcode = _OP_BINARY
        header = frame_header(opcode, len(data))
        if len(data) < 65536:
            self._tcp.write(header + data)
        else:  # no copy of a big payload
            self._tcp.write(header)
            self._tcp.write(data)

    def _pause_reading(self) -> None:
        self._reading_paused = True
        if not self._tcp_paused and not self._tcp.is_closing():
            self._tcp_paused = True
            self._tcp.pause_reading()

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if self._tcp_paused and not self._tcp.is_closing():
            self._tcp_paused = False
            self._tcp.resume_reading()
        if not self._drain_scheduled and self._loop is not None:
            # Messages held in wsproto's buffer are delivered on the next loop turn,
            # never from inside the inner protocol's own call.
            self._drain_scheduled = True
            self._loop.call_soon(self._drain_held)

    def _drain_held(self) -> None:
        self._drain_scheduled = False
        if self._phase is _Phase.CLOSED or self._reading_paused:
            return
        try:
            self._drain()
        except Exception:
            log.exception("internal error on WebSocket connection %s", self.remote)
            self._phase = _Phase.CLOSED
            self._tcp.abort()

    def _close_from_inner(self) -> None:
        if self._phase is _Phase.OPEN:
            self._send_close(CloseReason.NORMAL_CLOSURE, "")
        elif self._phase is _Phase.HANDSHAKE:
            self._phase = _Phase.CLOSED
            self._tcp.close()

    def _send_close(self, code: int, reason: str) -> None:
        """Send our close frame (if the state allows one) and wait for the client's."""
        self._phase = _Phase.CLOSING
        ws = self._ws
        if ws.state is ConnectionState.OPEN and not self._tcp.is_closing():
            self._tcp.write(ws.send(CloseConnection(code=code, reason=reason or None)))
        else:
            self._close_tcp()
            return
        # Keep reading (the inner protocol may have paused it) to see the answer.
        self._reading_paused = False
        if self._tcp_paused:
            self._tcp_paused = False
            self._tcp.resume_reading()
        self._cancel_timer()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.options.close_timeout, self._close_timed_out)

    def _close_timed_out(self) -> None:
        self._timer = None
        if self._tcp.get_write_buffer_size():
            self._tcp.abort()  # the client neither answers nor reads
        else:
            self._tcp.close()

    def _close_tcp(self) -> None:
        self._phase = _Phase.CLOSING if self._phase is not _Phase.CLOSED else self._phase
        self._cancel_timer()
        self._tcp.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def handoff_bytes(transport: asyncio.BaseTransport, pending: bytes
                  ) -> tuple[bytes, WebSocketState | None] | None:
    """What an offer of the connection on ``transport`` carries (transport/handoff.py):
    on a plain socket ``pending`` (the session's unhandled bytes) and no WebSocket state;
    over WebSocket ``pending`` followed by the codec's bytes, and the WebSocket's state
    with ``inner``, where the codec's bytes start (``split_handoff`` takes them apart);
    None when it cannot move now."""
    if not isinstance(transport, WebSocketTransport):
        return pending, None
    carried = transport.handoff()
    if carried is None:
        return None
    raw, state = carried
    return pending + raw, {**state, "inner": len(pending)}


def split_handoff(pending: bytes, state: WebSocketState) -> tuple[bytes, bytes] | None:
    """``handoff_bytes``'s bytes apart: the session's, then the WebSocket codec's; None
    when ``inner`` does not fall within them."""
    inner = state.get("inner", 0)
    if not isinstance(inner, int) or isinstance(inner, bool) or \
            not 0 <= inner <= len(pending):
        return None
    return pending[:inner], pending[inner:]


def handoff_tried(transport: asyncio.BaseTransport) -> None:
    """The session on ``transport`` will not offer its connection (again)."""
    if isinstance(transport, WebSocketTransport):
        transport.handoff_done()


async def start_websocket_listener(
        loop: asyncio.AbstractEventLoop, host: str | None, port: int,
        protocols: Mapping[str, ProtocolFactory], *,
        ssl_context: ssl.SSLContext | None = None,
        options: WebSocketOptions | None = None, reuse_port: bool = False,
        handoff: Collection[str] = ()) -> asyncio.Server:
    """Listen for WebSocket clients (``wss://`` when ``ssl_context`` is given) and serve
    each with the protocol its negotiated subprotocol names. Port 0 lets the OS choose;
    read the bound address from ``server.sockets[0].getsockname()``. ``reuse_port``:
    several processes (a node's shards) listen on the same port (SO_REUSEPORT).
    ``handoff``: plain connections of these subprotocols keep what
    ``WebSocketTransport.handoff`` needs."""
    if not protocols:
        raise ValueError("a WebSocket listener needs at least one subprotocol")
    opts = options or WebSocketOptions()

    return await loop.create_server(
        lambda: WebSocketProtocol(protocols, opts, handoff=handoff), host, port,
        ssl=ssl_context,
        reuse_address=True, reuse_port=reuse_port, backlog=1024)


__all__ = [
    "Negotiated",
    "ProtocolFactory",
    "WebSocketOptions",
    "WebSocketProtocol",
    "WebSocketState",
    "WebSocketTransport",
    "frame_header",
    "frame_length",
    "handoff_bytes",
    "handoff_tried",
    "http_error",
    "negotiate_subprotocol",
    "split_handoff",
    "start_websocket_listener",
]

