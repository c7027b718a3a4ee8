"""STOMP frame encoder: frames and header values to bytes, per protocol version.

Two entry points:

* :func:`encode_frame` for any frame (CONNECTED, RECEIPT, ERROR, client frames).
* :func:`encode_header_block` + :func:`encode_message_frame` for deliveries: the
  broker escapes and encodes a message's headers once (``encode_header_block``)
  and shares that block between every subscriber; per delivery only the few
  consumer-specific headers (``subscription``, ``message-id``, ``ack``) are
  escaped and prepended by ``encode_message_frame``. The same frame also comes in
  parts: :func:`encode_message_start` (the command and the per-delivery headers,
  which a subscriber can keep), :func:`message_head_end` (the shared block and the
  body's length, kept per message), the body, and :data:`FRAME_END`, so a broker
  can write a large body without copying it into a frame.

Header text is escaped per version by the one set of escaping functions here
(:func:`escaper`), used by every frame the broker and the clients write: 1.1 and 1.2
escape, 1.0 (and CONNECT/CONNECTED) replaces CR and LF with a space, since a 1.0
peer has no way to read them. What cannot be sent at all (a non-letter command, an
empty header name, a lone surrogate, ...) raises :class:`LocalProtocolError`: it is
our bug, never the peer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from meshmq.errors import LocalProtocolError

__all__ = [
    "FRAME_END",
    "HEARTBEAT",
    "encode_frame",
    "encode_header_block",
    "encode_message_frame",
    "encode_message_start",
    "escape_10",
    "escape_11",
    "escape_12",
    "escape_header",
    "escaper",
    "message_head_end",
]

HEARTBEAT: Final[bytes] = b"\n"
FRAME_END: Final[bytes] = b"\0"

_VERSIONS: Final = ("1.0", "1.1", "1.2")
_UNESCAPED_COMMANDS: Final = frozenset({"CONNECT", "CONNECTED"})


def escape_10(text: str) -> str:
    """STOMP 1.0, and CONNECT/CONNECTED in every version: no escaping exists, so the
    text is sent as is, except that CR and LF become a space (a line break would end
    the header line, and the peer could not read the rest of the frame)."""
    if "\n" in text or "\r" in text:
        return text.replace("\r", " ").replace("\n", " ")
    return text


def escape_11(text: str) -> str:
    """STOMP 1.1: backslash, LF and ':' escaped; 1.1 has no escape for CR, which is sent
    as is (a trailing one is then read by the peer as part of the line ending)."""
    if "\\" in text or ":" in text or "\n" in text:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    return text


def escape_12(text: str) -> str:
    """STOMP 1.2: backslash, LF, ':' and CR escaped."""
    # The fast paths: most names and values need no escaping at all, and of the others
    # most hold only ':' (message ids, "ID:host-...:1:7"): one pass instead of four.
    special = "\\" in text or "\n" in text or "\r" in text
    if ":" in text:
        if not special:
            return text.replace(":", "\\c")
    elif not special:
        return text
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
            .replace("\r", "\\r"))


def escaper(version: str, command: str | None = None) -> Callable[[str], str]:
    """The escaping function for header names and values of ``command`` frames in
    ``version`` (CONNECT and CONNECTED are never escaped, as the spec says)."""
    if version == "1.2" and command not in _UNESCAPED_COMMANDS:
        return escape_12
    if version == "1.1" and command not in _UNESCAPED_COMMANDS:
        return escape_11
    if version in _VERSIONS:
        return escape_10
    raise LocalProtocolError(f"unsupported STOMP version {version!r}")


def _encode_text(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError("header text is not encodable as UTF-8") from None


def _check_command(command: str) -> None:
    if not (command.isascii() and command.isalpha() and command.isupper()):
        raise LocalProtocolError(f"invalid STOMP command {command!r}")


def escape_header(value: str, version: str) -> str:
    """Escape a header name or value for ``version``.

    1.1 escapes backslash, LF and ':' (as ``\\\\``, ``\\n``, ``\\c``) and sends CR as
    is; 1.2 also escapes CR (``\\r``). 1.0 has no escaping: the text is sent as is,
    except that CR and LF become a space, which every 1.0 peer can parse. Never raises
    for text; an unsupported version raises :class:`LocalProtocolError`.
    """
    return escaper(version)(value)


def encode_frame(command: str, headers: Iterable[tuple[str, str]], body: bytes = b"", *,
                 version: str = "1.2", content_length: bool = True) -> bytes:
    """Encode one complete frame, NUL included.

    Header names and values are escaped per ``version``, except in CONNECT and
    CONNECTED frames which the spec leaves unescaped. A ``content-length`` header
    is appended when the body is non-empty and the caller gave none (pass
    ``content_length=False`` to omit it, e.g. for an ActiveMQ text message; it is
    still added if the body contains a NUL). A caller-supplied ``content-length``
    must match the body.
    """
    _check_command(command)
    escape = escaper(version, command)
    parts = [command, "\n"]
    has_length = False
    for name, value in headers:
        if not name:
            raise LocalProtocolError("empty header name")
        if name == "content-length" and not has_length:
            has_length = True
            if value.strip() != str(len(body)):
                raise LocalProtocolError(
                    f"content-length {value!r} does not match the {len(body)}-byte body")
        parts += (escape(name), ":", escape(value), "\n")
    if not has_length and ((content_length and body) or b"\0" in body):
        parts.append(f"content-length:{len(body)}\n")
    parts.append("\n")
    return b"".join((_encode_text("".join(parts)), body, b"\0"))


def encode_header_block(headers: Iterable[tuple[str, str]], version: str) -> bytes:
    """Escape and encode headers once, as shared input for :func:`encode_message_frame`.

    Returns ``b"name:value\\n"`` lines escaped per ``version`` (MESSAGE frames are
    always escaped in 1.1/1.2). Any ``content-length`` header is dropped: it is
    derived from the body by ``encode_message_frame``. The result depends on the
    version, so cache one block per negotiated version.
    """
    escape = escaper(version, "MESSAGE")
    return _encode_text(_header_lines(
        [(n, v) for n, v in headers if n != "content-length"], escape))


_SPECIAL: Final = ("\\", ":", "\n", "\r")


def _header_lines(headers: list[tuple[str, str]], escape: Callable[[str], str]) -> str:
    """``name:value\\n`` lines; one scan of all the text decides whether any escaping
    is needed at all (the common case is none), instead of one call per name and value."""
    text = "\0".join([n + "\0" + v for n, v in headers])
    if not any(c in text for c in _SPECIAL) \
            and all(n for n, _ in headers):
        return "".join([f"{n}:{v}\n" for n, v in headers])
    parts: list[str] = []
    for name, value in headers:
        if not name:
            raise LocalProtocolError("empty header name")
        parts += (escape(name), ":", escape(value), "\n")
    return "".join(parts)


def encode_message_start(per_delivery: Iterable[tuple[str, str]], version: str) -> bytes:
    """``MESSAGE`` and the per-delivery header lines, escaped for ``version``: the part
    of a MESSAGE frame that differs between subscribers (``content-length`` in
    ``per_delivery`` is ignored: it is the body's own)."""
    escape = escaper(version, "MESSAGE")
    parts = ["MESSAGE\n"]
    for name, value in per_delivery:
        if not name:
            raise LocalProtocolError("empty header name")
        if name != "content-length":
            parts += (escape(name), ":", escape(value), "\n")
    return _encode_text("".join(parts))


def message_head_end(fixed_headers: bytes, body: bytes, *, content_length: bool = True) -> bytes:
    """The rest of a MESSAGE frame's head after :func:`encode_message_start`: the shared
    block, ``content-length`` (derived from ``body``; with ``content_length=False``
    only when the body contains a NUL) and the blank line. The body and
    :data:`FRAME_END` follow it."""
    if content_length or b"\0" in body:
        return b"%scontent-length:%d\n\n" % (fixed_headers, len(body))
    return fixed_headers + b"\n"


def encode_message_frame(fixed_headers: bytes, per_delivery: Iterable[tuple[str, str]],
                         body: bytes, version: str, *, content_length: bool = True) -> bytes:
    """Build a MESSAGE frame from a pre-encoded header block plus per-delivery headers.

    ``fixed_headers`` comes from :func:`encode_header_block` for the same
    ``version`` and is shared by every subscriber of the message; ``per_delivery``
    holds the few consumer-specific headers (``subscription``, ``message-id``,
    ``ack``), escaped here. They are written first, so under the first-occurrence
    rule they win over any stale copy inside ``fixed_headers``. ``content-length``
    is always derived from ``body`` (any in ``per_delivery`` is ignored); with
    ``content_length=False`` it is omitted unless the body contains a NUL.
    """
    return b"".join((encode_message_start(per_delivery, version),
                     message_head_end(fixed_headers, body, content_length=content_length),
                     body, FRAME_END))
