"""The server side of one STOMP connection as a sans-I/O machine.

Bytes in (``receive_data``), typed events out (the client's frames as ``Connect``,
``Send``, ... plus ``HeartBeat`` and ``ProtocolViolation``); events in (``send``),
bytes back (CONNECTED, RECEIPT, ERROR, MESSAGE, heart-beats). The machine owns what
the protocol decides: the connection's state, version and heart-beat negotiation,
the header escaping of the negotiated version, which frames are allowed when, and
which timers are due (``timeouts(now)``; time is always passed in, never read).
It does no I/O and knows nothing of the broker: an adapter turns its events into
broker calls and writes its bytes.

States and what moves between them are one table, ``TRANSITIONS``. The hot path
(a frame in CONNECTED, a MESSAGE out) stays in CONNECTED and skips the table lookup.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Final, cast

from meshmq.errors import LocalProtocolError, RemoteProtocolError

from .encoder import (
    HEARTBEAT,
    encode_frame,
    encode_message_frame,
    encode_message_start,
    escaper,
)
from .frames import Connect, Disconnect, Frame, Nack, Send
from .negotiation import (
    SUPPORTED_VERSIONS,
    missing_headers,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
)
from .parser import StompParser

__all__ = [
    "TRANSITIONS",
    "Connected",
    "ConnectionState",
    "Error",
    "HeartBeat",
    "HeartBeatDue",
    "Input",
    "PeerTimedOut",
    "ProtocolViolation",
    "Receipt",
    "StompConnection",
]


class ConnectionState(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"  # accepted; only CONNECT/STOMP is allowed
    AUTHENTICATING = "authenticating"  # CONNECT received; its answer not yet sent
    CONNECTED = "connected"  # CONNECTED sent: frames flow both ways
    DISCONNECTED = "disconnected"  # DISCONNECT received: only receipts still go out
    CLOSED = "closed"  # a fatal ERROR sent or a violation seen: nothing more is read


class Input(enum.Enum):
    CONNECT = "connect"  # the client's CONNECT/STOMP frame
    ACCEPT = "accept"  # we send CONNECTED
    FRAME = "frame"  # any other allowed client frame
    DISCONNECT = "disconnect"  # the client's DISCONNECT
    FAIL = "fail"  # a violation by the peer, or a fatal ERROR we send


_S, _I = ConnectionState, Input
TRANSITIONS: Final[dict[tuple[ConnectionState, Input], ConnectionState]] = {
    (_S.AWAITING_CONNECT, _I.CONNECT): _S.AUTHENTICATING,
    (_S.AUTHENTICATING, _I.ACCEPT): _S.CONNECTED,
    (_S.CONNECTED, _I.FRAME): _S.CONNECTED,
    (_S.CONNECTED, _I.DISCONNECT): _S.DISCONNECTED,
}
for _state in ConnectionState:
    TRANSITIONS[(_state, _I.FAIL)] = _S.CLOSED


# ------------------------------------------------------------------ events
class HeartBeat:
    """Only EOLs arrived (the client's heart-beat)."""

    __slots__ = ()


HEARTBEAT_EVENT: Final = HeartBeat()


class ProtocolViolation:
    """The client broke the protocol; answer with a fatal ``Error(reason, frame)``.
    ``frame`` is the offending frame (its receipt is named in the ERROR) or None."""

    __slots__ = ("frame", "reason", "unsupported_version")

    def __init__(self, reason: str, frame: Frame | None = None, *,
                 unsupported_version: bool = False) -> None:
        self.reason = reason
        self.frame = frame
        self.unsupported_version = unsupported_version

    def __repr__(self) -> str:
        return f"ProtocolViolation({self.reason!r})"


Event = Frame | HeartBeat | ProtocolViolation


class Connected:
    """Accept the CONNECT: the machine adds version and negotiated heart-beat."""

    __slots__ = ("extra", "server", "session")

    def __init__(self, session: str, server: str,
                 extra: Iterable[tuple[str, str]] = ()) -> None:
        self.session = session
        self.server = server
        self.extra = tuple(extra)


class Receipt:
    __slots__ = ("extra", "receipt_id")

    def __init__(self, receipt_id: str, extra: Iterable[tuple[str, str]] = ()) -> None:
        self.receipt_id = receipt_id
        self.extra = tuple(extra)


class Error:
    """An ERROR frame. ``frame``: the client frame it answers (its receipt is echoed).
    ``fatal``: the connection ends with it (the adapter closes after writing).
    ``headers``: more headers, after ``message`` (``meshmq-outcome`` of a COMMIT)."""

    __slots__ = ("fatal", "frame", "headers", "reason", "unsupported_version")

    def __init__(self, reason: str, frame: Frame | None = None, *, fatal: bool = True,
                 unsupported_version: bool = False,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.reason = reason
        self.frame = frame
        self.fatal = fatal
        self.unsupported_version = unsupported_version
        self.headers = headers


class HeartBeatDue:
    """Nothing was written for half the send interval: send a heart-beat."""

    __slots__ = ()


HEARTBEAT_DUE: Final = HeartBeatDue()


class PeerTimedOut:
    """The client missed a deadline; fail the connection with ``reason``."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


_VERSIONS_TEXT: Final = ",".join(SUPPORTED_VERSIONS)


class StompConnection:
    """One server-side STOMP connection. See the module docstring."""

    def __init__(self, now: float, *, max_frame_size: int, max_headers: int,
                 max_header_size: int, default_heartbeat: tuple[int, int] = (0, 0),
                 server_heartbeat_ms: int = 0, max_heartbeat_ms: int = 0,
                 heartbeat_grace: float = 1.5, connect_timeout_s: float = 0.0,
                 frame_timeout_s: float = 0.0) -> None:
        self.parser = StompParser(max_frame_size=max_frame_size, max_headers=max_headers,
                                  max_header_size=max_header_size, await_version=True)
        self.state = ConnectionState.AWAITING_CONNECT
        self.version = "1.0"
        self.escape: Callable[[str], str] = escaper("1.0")
        self.default_heartbeat = default_heartbeat
        self.server_heartbeat_ms = server_heartbeat_ms
        self.max_heartbeat_ms = max_heartbeat_ms
        self.heartbeat_grace = heartbeat_grace
        self.connect_timeout_s = connect_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.send_interval = 0.0  # seconds; 0 = no heart-beats that way
        self.recv_interval = 0.0
        self.accepted_at = now
        self.last_read = now
        self.last_write = now  # the adapter sets it when its output reaches the socket
        self.partial_since: float | None = None  # when the current partial frame began
        self._connect: Frame | None = None
        self._held_input: list[bytes] = []  # arrived while authenticating

    def _move(self, event: Input) -> None:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise LocalProtocolError(
                f"{event.value} is not valid in state {self.state.value}") from None

    # ------------------------------------------------------------ input
    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Feed what arrived at ``now``; returns the events it completed, in order.
        After a ``ProtocolViolation`` nothing more comes (state CLOSED)."""
        self.last_read = now
        state = self.state
        if state is not ConnectionState.CONNECTED:
            if state is ConnectionState.AUTHENTICATING:
                if data:
                    self._held_input.append(data)  # parsed once the version is known
                return []
            if state is not ConnectionState.AWAITING_CONNECT:
                return []
        parser = self.parser
        try:
            frames = parser.feed(data)
        except RemoteProtocolError as exc:
            return self._unparseable(exc)
        if not parser.in_frame:
            self.partial_since = None
        elif self.partial_since is None or frames:
            # The frame now partial began in this feed unless it was partial before and
            # none completed (a clock may read 0.0: test for None, not falsy).
            self.partial_since = now
        if not frames:
            return [HEARTBEAT_EVENT] if data and not parser.in_frame else []
        if state is ConnectionState.CONNECTED:
            return self._check_connected(frames)
        return self._check_first(frames)

    def _unparseable(self, exc: RemoteProtocolError) -> list[Event]:
        """The bytes broke the framing. The frames completed before the bad bytes are
        still events (so how the stream was cut changes nothing), then the violation."""
        frames = self.parser.frames_before_error
        events: list[Event] = []
        if frames:
            events = list(self._check_connected(frames) if self.state is
                          ConnectionState.CONNECTED else self._check_first(frames))
            if self.state is not ConnectionState.CONNECTED and \
                    self.state is not ConnectionState.AWAITING_CONNECT:
                return events  # a violation or DISCONNECT came first: the rest is unread
        self._move(Input.FAIL)
        events.append(ProtocolViolation(str(exc)))
        return events

    def _check_first(self, frames: list[Frame]) -> list[Event]:
        # The parser stops behind CONNECT, so a CONNECT is always the last frame here.
        frame = frames[0]
        if not isinstance(frame, Connect):
            self._move(Input.FAIL)
            return [ProtocolViolation(f"{frame.command} received before CONNECT: connection "
                                      "is not established", frame)]
        version = negotiate_version(frame.get("accept-version"))
        if version is None:
            self._move(Input.FAIL)
            return [ProtocolViolation(f"Supported protocol versions are {_VERSIONS_TEXT}",
                                      frame, unsupported_version=True)]
        self._move(Input.CONNECT)
        self.version = version
        self.parser.version = version  # frames behind CONNECT use its escaping
        self.escape = escaper(version)
        self._connect = frame
        return [frame]

    def _check_connected(self, frames: list[Frame]) -> list[Event]:
        """Frames in CONNECTED: those the protocol allows, up to the first violation
        or DISCONNECT. SEND, the hot path, needs no check here: its one required header
        is looked up by the adapter, which reads the headers anyway."""
        version = self.version
        for index, frame in enumerate(frames):
            if isinstance(frame, Send):
                continue
            reason = self._violation(frame, version)
            if reason is not None:
                self._move(Input.FAIL)
                events: list[Event] = list(frames[:index])
                events.append(ProtocolViolation(reason, frame))
                return events
            if isinstance(frame, Disconnect):
                self._move(Input.DISCONNECT)
                return list(frames[:index + 1])
        return cast("list[Event]", frames)  # no copy: a Frame is an Event

    @staticmethod
    def _violation(frame: Frame, version: str) -> str | None:
        command = frame.command
        if type(frame) is Frame:
            return f"Unknown STOMP action: {command}"
        if isinstance(frame, Connect):
            return "already connected"
        missing = missing_headers(frame, version)
        if missing:
            return f"{command} frame is missing the required header '{missing[0]}'"
        if version == "1.0" and isinstance(frame, Nack):
            return "Unknown STOMP action: NACK (not part of STOMP 1.0)"
        return None

    def reading_resumed(self, now: float) -> None:
        """The adapter resumes reading after holding the client: its clocks restart."""
        self.last_read = now
        if self.partial_since is not None:
            self.partial_since = now

    # ------------------------------------------------------------ output
    def send(self, event: Connected | Receipt | Error | HeartBeatDue) -> bytes:
        """The bytes for ``event``; CONNECTED and fatal ERRORs move the state."""
        if isinstance(event, Receipt):
            return encode_frame("RECEIPT", [("receipt-id", event.receipt_id), *event.extra],
                                version=self.version)
        if isinstance(event, Connected):
            return self._accept(event)
        if isinstance(event, Error):
            return self._error(event)
        return HEARTBEAT

    def send_message(self, fixed: bytes, per_delivery: list[tuple[str, str]],
                     body: bytes) -> bytes:
        """A MESSAGE frame: ``fixed`` is the shared header block of the message, already
        escaped with ``self.escape``; ``per_delivery`` the subscriber's own headers."""
        return encode_message_frame(fixed, per_delivery, body, self.version)

    def message_start(self, per_delivery: list[tuple[str, str]]) -> bytes:
        """The start of a MESSAGE frame in parts (encoder.encode_message_start): the
        command and the subscriber's own headers; the shared head
        (encoder.message_head_end), the body and encoder.FRAME_END follow it."""
        return encode_message_start(per_delivery, self.version)

    def _accept(self, event: Connected) -> bytes:
        connect = self._connect
        if self.state is not ConnectionState.AUTHENTICATING or connect is None:
            raise LocalProtocolError(f"CONNECTED is not valid in state {self.state.value}")
        version = self.version
        hb = connect.get("heart-beat")
        if version == "1.0":
            cx, cy = 0, 0
        elif hb is None:
            cx, cy = self.default_heartbeat  # ActiveMQ's transport.defaultHeartBeat
        else:
            cx, cy = parse_heartbeat(hb)
        server_cx = self.server_heartbeat_ms if cy else 0
        server_cy = cx
        cap = self.max_heartbeat_ms
        if cap and server_cy:
            server_cy = min(server_cy, cap)
        send_ms, recv_ms = negotiate_heartbeat((cx, cy), (server_cx, server_cy))
        if cap and recv_ms:
            # A client may not ask to stay silent longer than the operator allows.
            recv_ms = min(recv_ms, cap)
        self.send_interval = send_ms / 1000.0
        self.recv_interval = recv_ms / 1000.0
        headers = [("version", version), ("session", event.session), ("server", event.server)]
        if version != "1.0":
            headers.append(("heart-beat", f"{server_cx},{server_cy}"))
        headers += event.extra
        data = encode_frame("CONNECTED", headers, version=version)
        self._move(Input.ACCEPT)
        self._connect = None
        return data

    def adopt(self, version: str, send_interval: float, recv_interval: float,
              now: float) -> None:
        """Begin CONNECTED with what another process negotiated: a node's shard handed
        this connection, already connected, to this one (transport/handoff.py)."""
        if self.state is not ConnectionState.AWAITING_CONNECT or self.parser.buffered:
            raise LocalProtocolError(f"cannot adopt a connection in state {self.state.value}")
        self.state = ConnectionState.CONNECTED
        self.version = version
        self.parser.version = version
        self.escape = escaper(version)
        self.send_interval = send_interval
        self.recv_interval = recv_interval
        self.last_read = self.last_write = now

    def received_while_authenticating(self) -> list[Event]:
        """After CONNECTED: the events of what the client pipelined behind CONNECT."""
        held, self._held_input = b"".join(self._held_input), []
        if self.state is not ConnectionState.CONNECTED:
            return []
        try:
            frames = self.parser.feed(held)
        except RemoteProtocolError as exc:
            return self._unparseable(exc)
        if self.parser.in_frame and self.partial_since is None:
            self.partial_since = self.last_read
        return self._check_connected(frames) if frames else []

    def _error(self, event: Error) -> bytes:
        frame = event.frame
        if event.fatal:
            self._move(Input.FAIL)
        if event.unsupported_version:
            return encode_frame("ERROR", [
                ("version", _VERSIONS_TEXT), ("content-type", "text/plain"),
                ("message", event.reason)], event.reason.encode(), version="1.0")
        reason = event.reason
        headers = [("message", reason), ("content-type", "text/plain"), *event.headers]
        receipt = frame.get("receipt") if frame is not None else None
        if receipt:
            headers.append(("receipt-id", receipt))
        # The answer to a CONNECT is written before any version is agreed: as 1.0.
        version = "1.0" if isinstance(frame, Connect) else self.version
        try:
            return encode_frame("ERROR", headers, reason.encode(), version=version)
        except LocalProtocolError:
            return encode_frame("ERROR", [("message", "protocol error")], version="1.0")

    # ------------------------------------------------------------ time
    def timeouts(self, now: float, *, reading_held: bool = False) -> list[PeerTimedOut |
                                                                           HeartBeatDue]:
        """What is due at ``now``. ``reading_held``: the adapter, not the client, has
        stopped reading, so the client's own deadlines do not run."""
        state = self.state
        if state is ConnectionState.CLOSED or state is ConnectionState.DISCONNECTED:
            return []
        if state is not ConnectionState.CONNECTED and \
                now - self.accepted_at > self.connect_timeout_s:
            return [PeerTimedOut("no CONNECT frame received in time")]
        if not reading_held:
            if self.partial_since is not None and \
                    now - self.partial_since > self.frame_timeout_s:
                return [PeerTimedOut("incomplete frame: timed out waiting for the rest of it")]
            if self.recv_interval and \
                    now - self.last_read > self.recv_interval * self.heartbeat_grace:
                return [PeerTimedOut("heart-beat timeout: no data received from the client "
                                     f"for {now - self.last_read:.1f}s")]
        if self.send_interval and now - self.last_write >= self.send_interval * 0.5:
            return [HEARTBEAT_DUE]
        return []

    def heartbeat_delay(self) -> float | None:
        """Seconds until the heart-beat timers should next be checked; None: never."""
        candidates = [i for i in (self.send_interval,
                                  self.recv_interval * self.heartbeat_grace) if i]
        if not candidates:
            return None
        return max(0.01, min(candidates) / 2)
