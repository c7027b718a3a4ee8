"""Incremental sans-I/O STOMP 1.0/1.1/1.2 frame parser.

Feed it bytes as they arrive; it returns every complete frame and keeps the
partial rest buffered. It never blocks, never touches a socket or a clock: the
transport adapter owns those (and runs a frame timeout while ``in_frame``).

Hot-path notes: the buffer is a ``bytearray`` read through an offset and
compacted once per ``feed`` call; the end of the header block and the body's NUL
are located with ``bytearray.find`` (resuming where the last search stopped, so
byte-at-a-time feeding stays linear); the header block is decoded as UTF-8 in
one call and split in C; un-escaping only runs when a backslash is present. A body
of at least ``LARGE_BODY`` bytes whose length is given is not appended to the buffer
as it arrives: its reads are kept as they are and joined once, when the NUL after it
has arrived, so the body is copied once instead of into the buffer and out again.
"""

from __future__ import annotations

import re
from typing import Final

from meshmq.errors import FrameTooLargeError, RemoteProtocolError

from .frames import CLIENT_COMMANDS, CLIENT_FRAME_TYPES, SERVER_COMMANDS, Frame, Send

__all__ = ["StompParser"]

_VERSIONS: Final = ("1.0", "1.1", "1.2")
# The spec exempts these from escaping so 1.0-only peers can still negotiate.
_UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "CONNECTED"})
_CONNECT_COMMANDS: Final = frozenset({"CONNECT", "STOMP"})
# Every command the spec names: a look-up instead of three string tests per frame (any
# other uppercase ASCII word is still parsed, and refused later as unknown).
_COMMANDS: Final = frozenset(CLIENT_COMMANDS) | frozenset(SERVER_COMMANDS)
_ESCAPES_11: Final = {"n": "\n", "c": ":", "\\": "\\"}
_ESCAPES_12: Final = {**_ESCAPES_11, "r": "\r"}
# ".?" so a trailing lone backslash is matched too (and rejected).
_ESCAPE_RE: Final = re.compile(r"\\(.?)", re.DOTALL)
# content-length beyond this many digits exceeds any sane frame limit; checking the
# length first also keeps int() away from its huge-number ValueError.
_MAX_CONTENT_LENGTH_DIGITS: Final = 18
# content-length text -> its value, for texts seen before: producers send the same few
# sizes over and over, and checking and converting the digits costs several times a
# look-up. Only valid texts are kept; bounded (cleared when full).
_LENGTHS: Final[dict[str, int]] = {}
_LENGTHS_KEPT: Final = 1024
# A body with a content-length at least this large is collected in its reads.
LARGE_BODY: Final = 64 * 1024
# A body at least this large is copied out of the buffer through a memoryview (one
# copy); a smaller one through a bytearray slice (two copies, but no view to create and
# release, which costs more than copying a few KiB: ~8 KiB is where they meet).
_VIEW_COPY: Final = 8 * 1024


def _show(text: str, limit: int = 64) -> str:
    """Render peer-controlled text for a one-line error message."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _unescape(text: str, table: dict[str, str], header: str) -> str:
    # Fast path for the usual case, ':' in ActiveMQ ids ("ID\\chost-1..."): if every
    # backslash starts a "\\c", a plain replace is exact.
    if "\\" not in text.replace("\\c", ""):
        return text.replace("\\c", ":")

    def replace(match: re.Match[str]) -> str:
        char = match.group(1)
        result = table.get(char)
        if result is None:
            if char:
                raise RemoteProtocolError(
                    f"invalid escape sequence '\\{_show(char)}' in header '{_show(header)}'")
            raise RemoteProtocolError(
                f"invalid escape sequence '\\' at end of header '{_show(header)}'")
        return result

    return _ESCAPE_RE.sub(replace, text)


class StompParser:
    """Turns a byte stream into :class:`Frame` objects.

    Errors are :class:`RemoteProtocolError` (:class:`FrameTooLargeError` for the
    size limits) with a one-line message fit for an ERROR frame's ``message``
    header. After an error the parser is dead: every later ``feed`` raises again.
    Frames completed earlier in the failing ``feed`` call are kept in
    ``frames_before_error`` so an adapter may still act on them.

    ``max_header_size`` bounds the command line plus header lines (including
    their EOLs, excluding the blank line); ``max_frame_size`` bounds a whole frame
    from its command through its terminating NUL.
    """

    __slots__ = (
        "_awaiting_version",
        "_body_start",
        "_buf",
        "_clen",
        "_command",
        "_error",
        "_headers",
        "_parts",
        "_parts_size",
        "_scan",
        "_version",
        "frames_before_error",
        "max_frame_size",
        "max_header_size",
        "max_headers",
    )

    def __init__(self, *, max_frame_size: int = 100 * 1024 * 1024, max_headers: int = 1000,
                 max_header_size: int = 64 * 1024, version: str = "1.0",
                 await_version: bool = False) -> None:
        self.max_frame_size = max_frame_size
        self.max_headers = max_headers
        self.max_header_size = max_header_size
        self.version = version
        # A server parses the frames after CONNECT with the escaping of the version that
        # CONNECT negotiates. With ``await_version`` a feed stops after a CONNECT or STOMP
        # frame; the bytes behind it stay buffered until ``version`` is set, and
        # ``feed(b"")`` then parses them (a client may pipeline SEND right behind CONNECT).
        self._awaiting_version = await_version
        self._buf = bytearray()
        self._error: RemoteProtocolError | None = None
        # Where the next search for the header end or the body NUL resumes, as an
        # index into _buf; the partial frame (if any) always starts at index 0.
        self._scan = 0
        # Set once a frame's header block is parsed and its body is still awaited.
        self._command: str | None = None
        self._headers: list[tuple[str, str]] = []
        self._body_start = 0
        self._clen = -1
        # A large body being collected (LARGE_BODY): its bytes so far, read by read;
        # the frame's head stays in _buf meanwhile.
        self._parts: list[bytes] | None = None
        self._parts_size = 0
        self.frames_before_error: list[Frame] = []

    @property
    def version(self) -> str:
        """STOMP version used to un-escape headers; set it after CONNECT negotiation."""
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        if value not in _VERSIONS:
            raise ValueError(f"unsupported STOMP version {value!r}")
        self._version = value
        self._awaiting_version = False

    @property
    def in_frame(self) -> bool:
        """True while part of a frame (not just heart-beat EOLs) is buffered."""
        if self._command is not None:
            return True
        buf = self._buf
        # Leading EOLs were consumed, except a CR whose LF has not arrived yet.
        return bool(buf) and buf != b"\r"

    @property
    def buffered(self) -> int:
        """Number of received bytes not yet returned as frames."""
        return len(self._buf) + self._parts_size

    def unparsed(self) -> bytes | None:
        """The bytes received and not yet returned as frames, as they arrived (a partial
        frame, or nothing); None while a large body is being collected."""
        if self._parts is not None or self._error is not None:
            return None
        return bytes(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data`` and return every frame it completed, in order."""
        if self._error is not None:
            raise type(self._error)(self._error.message)
        buf = self._buf
        frames: list[Frame] = []
        if self._parts is not None:
            # The rest of a large body: keep the read as it is until the NUL arrives.
            if data:
                self._parts.append(bytes(data))
                self._parts_size += len(data)
            if self._parts_size <= self._clen:
                return frames
            try:
                data = self._large_frame_done(frames)
            except RemoteProtocolError as exc:
                self._die(exc, frames)
                raise
            if self._awaiting_version and frames[0].command in _CONNECT_COMMANDS:
                buf += data
                return frames
        if data:
            buf += data
        pos = 0  # start of the frame being parsed
        try:
            while True:
                command = self._command
                if command is None:
                    end = len(buf)
                    # EOLs between frames are heart-beats.
                    while pos < end:
                        byte = buf[pos]
                        if byte == 10:
                            pos += 1
                        elif byte == 13 and pos + 1 < end and buf[pos + 1] == 10:
                            pos += 2
                        else:
                            break
                    if pos == end or (pos + 1 == end and buf[pos] == 13):
                        break
                    command = self._parse_head(buf, pos)
                    if command is None:
                        break
                clen = self._clen
                body_start = self._body_start
                if clen >= 0:
                    stop = body_start + clen
                    if len(buf) <= stop:
                        if clen >= LARGE_BODY:
                            # Collect the rest in its reads; the head stays in the buffer.
                            self._parts = [bytes(memoryview(buf)[body_start:])]
                            self._parts_size = len(buf) - body_start
                            del buf[body_start:]
                        break
                    if buf[stop] != 0:
                        raise RemoteProtocolError(
                            f"frame body not terminated by NUL after content-length {clen}")
                else:
                    limit = pos + self.max_frame_size  # the NUL must sit below this index
                    stop = buf.find(0, max(self._scan, body_start), limit)
                    if stop < 0:
                        if len(buf) >= limit:
                            raise FrameTooLargeError(
                                f"frame larger than {self.max_frame_size} bytes")
                        self._scan = len(buf)
                        break
                size = stop - body_start
                if size >= _VIEW_COPY:  # one copy straight out of the buffer
                    body = bytes(memoryview(buf)[body_start:stop])
                else:  # two copies of a few bytes cost less than a memoryview
                    body = bytes(buf[body_start:stop]) if size else b""
                # A client's frame comes back typed (Send, Subscribe, ...); others as Frame.
                # SEND, the hot path, is built directly: a native constructor call, where
                # a class looked up in a dict is a generic (slower) call once compiled.
                if command == "SEND":
                    frames.append(Send(command, self._headers, body))
                else:
                    frames.append(CLIENT_FRAME_TYPES.get(command, Frame)(
                        command, self._headers, body))
                self._command = None
                self._headers = []
                self._clen = -1
                pos = self._scan = stop + 1
                if self._awaiting_version and command in _CONNECT_COMMANDS:
                    break
        except RemoteProtocolError as exc:
            self._die(exc, frames)
            raise
        except Exception as exc:  # pragma: no cover - a parser bug must not leak raw errors
            error = RemoteProtocolError(f"unparseable frame ({type(exc).__name__})")
            self._die(error, frames)
            raise error from exc
        if pos:
            # Compact once per feed: the partial frame moves to index 0.
            del buf[:pos]
            self._scan = max(0, self._scan - pos)
            self._body_start -= pos
        return frames

    def _large_frame_done(self, frames: list[Frame]) -> bytes:
        """The collected large body and its NUL have arrived: append its frame to
        ``frames`` and return the bytes read after the NUL."""
        parts = self._parts
        assert parts is not None and self._command is not None
        clen = self._clen
        # Only the last read reaches past the body: every earlier one left it short.
        last = parts.pop()
        cut = clen - (self._parts_size - len(last))
        tail = memoryview(last)[cut:]
        if tail[0] != 0:
            raise RemoteProtocolError(
                f"frame body not terminated by NUL after content-length {clen}")
        pieces: list[bytes | memoryview] = [*parts, memoryview(last)[:cut]]
        body = b"".join(pieces)
        command = self._command
        if command == "SEND":
            frames.append(Send(command, self._headers, body))
        else:
            frames.append(CLIENT_FRAME_TYPES.get(command, Frame)(command, self._headers, body))
        self._parts = None
        self._parts_size = 0
        self._command = None
        self._headers = []
        self._clen = -1
        self._buf.clear()  # the frame's head
        self._scan = 0
        self._body_start = 0
        return bytes(tail[1:])

    def _die(self, exc: RemoteProtocolError, frames: list[Frame]) -> None:
        self._error = exc
        self.frames_before_error = frames
        self._buf.clear()
        self._parts = None
        self._parts_size = 0
        self._command = None

    def _parse_head(self, buf: bytearray, pos: int) -> str | None:
        """Parse the command and header block of the frame at ``pos``.

        Returns None if the block is not complete yet. On success returns the
        command and stores it, the headers, body start and content-length on ``self``.
        """
        max_header = self.max_header_size
        avail = len(buf)
        # A terminator that starts beyond this index means an oversized header block.
        limit = min(avail, pos + max_header + 3)
        scan = max(pos, self._scan - 2)  # a terminator may straddle the previous end
        first_nl = buf.find(b"\n", pos, limit)
        # A LF-style block can still end with a CRLF blank line ("\n\r\n"): looked for
        # only when the block found holds a CR, known once it is decoded (a "\n\r\n"
        # before the "\n\n" puts its CR inside the block), so the usual frame costs
        # two searches, not three.
        recheck = False
        if first_nl >= 0 and first_nl > pos and buf[first_nl - 1] == 13:
            # CRLF style: look for "\n\r\n" first so neither search runs past the block.
            end = buf.find(b"\n\r\n", scan, limit)
            alt = buf.find(b"\n\n", scan, end + 2 if end >= 0 else limit)
            if alt >= 0 and (end < 0 or alt < end):
                end = alt
        else:
            end = buf.find(b"\n\n", scan, limit)
            if end < 0:
                end = buf.find(b"\n\r\n", scan, limit)
            else:
                recheck = True
        if end < 0:
            if avail - pos >= max_header + 3:
                raise FrameTooLargeError(f"header block larger than {max_header} bytes")
            if avail - pos > self.max_frame_size:
                raise FrameTooLargeError(f"frame larger than {self.max_frame_size} bytes")
            self._scan = avail
            return None
        text: str | None = None
        if recheck:
            try:
                text = buf[pos:end].decode("utf-8")
            except UnicodeDecodeError:  # perhaps a body after a CRLF blank line
                text = None
            if text is None or "\r" in text:
                alt = buf.find(b"\n\r\n", scan, end + 2)
                if 0 <= alt < end:
                    end = alt
                    text = None
        # The block spans buf[pos:end + 1] (last line's LF included); the blank line
        # after it is "\n" or "\r\n".
        if end + 1 - pos > max_header:
            raise FrameTooLargeError(f"header block larger than {max_header} bytes")
        body_start = end + 2 if buf[end + 1] == 10 else end + 3
        if text is None:
            text = self._head_text(buf, pos, end)
        lines = text.split("\n")
        if "\r" in text:
            lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        command = lines[0]
        if command not in _COMMANDS and not (
                command.isascii() and command.isalpha() and command.isupper()):
            raise RemoteProtocolError("malformed command line")
        if len(lines) - 1 > self.max_headers:
            raise FrameTooLargeError(f"too many headers (limit {self.max_headers})")
        # Two C-driven comprehensions beat a Python loop with checks per header; the
        # slow path only runs to name the offending line.
        parts = [line.partition(":") for line in lines[1:]]
        headers = [(name, value) for name, sep, value in parts if sep and name]
        if len(headers) != len(parts):
            for number, (name, sep, _) in enumerate(parts, 1):
                if not sep:
                    raise RemoteProtocolError(f"missing ':' in header line {number}")
                if not name:
                    raise RemoteProtocolError(f"empty header name in header line {number}")
        if "\\" in text and self._version != "1.0" and command not in _UNESCAPED_COMMANDS:
            table = _ESCAPES_12 if self._version == "1.2" else _ESCAPES_11
            headers = [
                (_unescape(name, table, name) if "\\" in name else name,
                 _unescape(value, table, name) if "\\" in value else value)
                for name, value in headers
            ]
        clen = -1
        # No escape sequence can produce these letters, so the raw text check is exact.
        if "content-length" in text:
            for name, value in headers:
                if name == "content-length":
                    clen = self._content_length(value, body_start - pos)
                    break
        self._command = command
        self._headers = headers
        self._body_start = body_start
        self._clen = clen
        self._scan = body_start
        return command

    @staticmethod
    def _head_text(buf: bytearray, pos: int, end: int) -> str:
        try:
            return buf[pos:end].decode("utf-8")  # a head is small: cheaper than a view
        except UnicodeDecodeError as exc:
            line = buf.count(b"\n", pos, pos + exc.start)
            if line == 0:
                raise RemoteProtocolError("malformed command line") from None
            raise RemoteProtocolError(f"invalid UTF-8 in header line {line}") from None

    def _content_length(self, value: str, head_size: int) -> int:
        length = _LENGTHS.get(value)
        if length is None:
            digits = value.strip()
            if not (digits.isascii() and digits.isdigit()):
                raise RemoteProtocolError(f"invalid content-length '{_show(value)}'")
            if len(digits) > _MAX_CONTENT_LENGTH_DIGITS:
                raise FrameTooLargeError(f"frame larger than {self.max_frame_size} bytes")
            length = int(digits)
            if len(_LENGTHS) >= _LENGTHS_KEPT:
                _LENGTHS.clear()
            _LENGTHS[value] = length
        if head_size + length + 1 > self.max_frame_size:
            raise FrameTooLargeError(f"frame larger than {self.max_frame_size} bytes")
        return length
