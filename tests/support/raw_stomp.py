"""Byte-level STOMP test clients: frames written verbatim, frames read exactly as they
arrive.

``FrameReader`` holds the parsing and the waiting helpers (read until a command, until
a receipt, until the broker closes); a subclass only says how bytes go out and how more
bytes come in. ``MemoryRawClient`` talks to a ``MemoryBroker`` session with no socket,
so broker behaviour on odd frames is tested in milliseconds; the socket client for the
interop suite (tests/interop/stomp_helpers.py) shares the same parser, so both kinds of
test read frames the same way.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.support.memory_broker import MemoryBroker

TIMEOUT = 10.0
_ids = itertools.count(1)


def uid(prefix: str = "x") -> str:
    """A name unique within this test process."""
    return f"{prefix}{next(_ids)}"


@dataclass
class RawFrame:
    command: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def get(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(f"{name!r} not in {self.command} headers {self.headers}")
        return value


_UNESCAPE = {"\\n": "\n", "\\c": ":", "\\\\": "\\", "\\r": "\r"}


def unescape(text: str, version: str) -> str:
    if version == "1.0" or "\\" not in text:
        return text
    return re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(0), m.group(0)), text)


def escape(text: str) -> str:
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
            .replace("\r", "\\r"))


def frame_bytes(command: str, headers: Iterable[tuple[str, str]] = (), body: bytes = b"",
                eol: bytes = b"\n") -> bytes:
    """Encode a frame verbatim: no escaping, no content-length unless given."""
    lines = [command.encode()] + [f"{k}:{v}".encode() for k, v in headers]
    return eol.join(lines) + eol + eol + body + b"\x00"


class ClosedError(Exception):
    """The broker closed the connection."""


class FrameReader:
    """Reads STOMP frames from ``self.buf``; subclasses send bytes and refill the buffer."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.version = "1.0"
        self.heartbeats = 0
        self.eof = False

    # -- what a subclass provides
    def send_bytes(self, data: bytes) -> None:
        raise NotImplementedError

    def _fill(self, deadline: float) -> None:
        """Add what the broker sent to ``buf``; TimeoutError at ``deadline``, ClosedError
        once the broker has closed and everything it sent has been read."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> FrameReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------
    def send_frame(self, command: str, headers: Iterable[tuple[str, str]] = (),
                   body: bytes = b"", eol: bytes = b"\n") -> None:
        self.send_bytes(frame_bytes(command, headers, body, eol))

    def connect(self, version: str | None = "1.2", *, command: str = "CONNECT",
                heartbeat: str | None = None, extra: Iterable[tuple[str, str]] = ()) -> RawFrame:
        headers: list[tuple[str, str]] = []
        if version is not None:
            headers.append(("accept-version", version))
        headers.append(("host", "localhost"))
        if heartbeat is not None:
            headers.append(("heart-beat", heartbeat))
        headers.extend(extra)
        self.send_frame(command, headers)
        frame = self.read_frame()
        assert frame.command == "CONNECTED", f"expected CONNECTED, got {frame}"
        self.version = frame.get("version", "1.0") or "1.0"
        return frame

    # -- reading -------------------------------------------------------------
    def _skip_heartbeats(self) -> None:
        while self.buf:
            if self.buf[:1] == b"\n":
                del self.buf[:1]
                self.heartbeats += 1
            elif self.buf[:2] == b"\r\n":
                del self.buf[:2]
                self.heartbeats += 1
            else:
                break

    def read_frame(self, timeout: float = TIMEOUT) -> RawFrame:
        """The next frame (heart-beats are counted and skipped); raises ClosedError on EOF."""
        deadline = time.monotonic() + timeout
        while True:
            self._skip_heartbeats()
            frame = self._try_parse()
            if frame is not None:
                return frame
            self._fill(deadline)

    def _try_parse(self) -> RawFrame | None:
        buf = self.buf
        if not buf or buf == b"\r":
            return None
        m = re.search(rb"\r?\n\r?\n", buf)
        if m is None:
            return None
        head = bytes(buf[:m.start()]).decode("utf-8")
        body_start = m.end()
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in head.split("\n")]
        command = lines[0]
        version = "1.0" if command == "CONNECTED" else self.version
        headers = []
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.append((unescape(k, version), unescape(v, version)))
        clen = next((int(v) for k, v in headers if k == "content-length"), None)
        if clen is not None:
            if len(buf) < body_start + clen + 1:
                return None
            assert buf[body_start + clen] == 0, "frame not NUL-terminated after content-length"
            body = bytes(buf[body_start:body_start + clen])
            end = body_start + clen + 1
        else:
            nul = buf.find(b"\x00", body_start)
            if nul < 0:
                return None
            body = bytes(buf[body_start:nul])
            end = nul + 1
        del buf[:end]
        return RawFrame(command, headers, body)

    def read_until(self, command: str, timeout: float = TIMEOUT) -> tuple[RawFrame,
                                                                          list[RawFrame]]:
        """Read frames until one with ``command``; returns it and the frames before it."""
        deadline = time.monotonic() + timeout
        before: list[RawFrame] = []
        while True:
            frame = self.read_frame(max(0.001, deadline - time.monotonic()))
            if frame.command == command:
                return frame, before
            before.append(frame)

    def expect_closed(self, timeout: float = TIMEOUT) -> list[RawFrame]:
        """Read until the broker closes the connection; return the frames read on the way."""
        deadline = time.monotonic() + timeout
        frames: list[RawFrame] = []
        while True:
            try:
                frames.append(self.read_frame(max(0.001, deadline - time.monotonic())))
            except ClosedError:
                return frames

    def expect_error_and_close(self, timeout: float = TIMEOUT) -> RawFrame:
        """The next frames end with exactly one ERROR, then the connection closes."""
        frames = self.expect_closed(timeout)
        errors = [f for f in frames if f.command == "ERROR"]
        assert len(errors) == 1, f"expected one ERROR before close, got {frames}"
        assert frames[-1].command == "ERROR", f"ERROR must be the last frame: {frames}"
        assert errors[0].get("message"), f"ERROR without a message header: {errors[0]}"
        return errors[0]

    def receipt_roundtrip(self, timeout: float = TIMEOUT) -> list[RawFrame]:
        """Barrier: a frame with a receipt; returns the frames that arrived before it."""
        rid = uid("raw-barrier-")
        txn = uid("raw-tx-")
        self.send_frame("BEGIN", [("transaction", txn), ("receipt", rid)])
        before = self.read_until_receipt(rid, timeout)
        self.send_frame("ABORT", [("transaction", txn)])
        return before

    def read_until_receipt(self, rid: str, timeout: float = TIMEOUT) -> list[RawFrame]:
        """Read until RECEIPT ``rid``; returns every other frame read on the way."""
        deadline = time.monotonic() + timeout
        before: list[RawFrame] = []
        while True:
            frame = self.read_frame(max(0.001, deadline - time.monotonic()))
            if frame.command == "RECEIPT" and frame.get("receipt-id") == rid:
                return before
            before.append(frame)


class MemoryRawClient(FrameReader):
    """A byte-level STOMP client on a ``MemoryBroker``: what it sends is what the
    broker's session reads; reading runs the broker's loop until bytes arrive."""

    def __init__(self, broker: MemoryBroker, listener: str | None = None) -> None:
        from meshmq.transport.stomp_server import StompProtocol

        super().__init__()
        self.broker = broker
        self.protocol = StompProtocol(broker.runtime, listener)
        self.transport = broker.connect(self.protocol)
        self._seen = 0
        self._pending = bytearray()
        self.transport.on_resume = self._deliver

    def send_bytes(self, data: bytes) -> None:
        self._pending += data
        self._deliver()

    def _deliver(self) -> None:
        """Hand pending bytes to the session while it reads; a session that paused
        reading (flow control) gets them when it resumes, as from a socket buffer."""
        if self.transport.closed:
            self._pending.clear()  # bytes sent after a close are lost, as on a reset socket
            return
        if not self.transport.reading or not self._pending:
            return
        data = bytes(self._pending)
        self._pending.clear()
        loop = self.broker.loop
        if loop.is_running():
            self.protocol.data_received(data)
            return

        async def deliver() -> None:  # a session reads inside its loop, as with a socket
            self.protocol.data_received(data)
        loop.run_until_complete(deliver())

    def take(self) -> bool:
        """Move what the broker wrote since the last call into ``buf``; whether any.
        Also delivers bytes held back while the session was not reading."""
        self._deliver()
        written = self.transport.written
        if len(written) > self._seen:
            self.buf += written[self._seen:]
            self._seen = len(written)
            return True
        return False

    def _fill(self, deadline: float) -> None:
        had = len(self.buf)
        if self.take():
            return
        if self.transport.closed:
            self.eof = True
            raise ClosedError("the broker closed the connection")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out waiting for data from the broker")
        try:
            self.broker.wait_for(lambda: self.take() or self.transport.closed, remaining,
                                 "data from the broker")
        except AssertionError:
            raise TimeoutError("timed out waiting for data from the broker") from None
        if len(self.buf) == had and not self.take():
            self.eof = True
            raise ClosedError("the broker closed the connection")

    def close(self) -> None:
        """The client goes away without a DISCONNECT."""
        self.transport.drop()
