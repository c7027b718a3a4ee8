"""STOMP frame encoder: frames and header values to bytes, per protocol version.

Two entry points:

* :func:`encode_frame` for any frame (CONNECTED, RECEIPT, ERROR, client frames).
* :func:`encode_header_block` + :func:`encode_message_frame` for deliveries: the
  broker escapes and encodes a message's headers once (``encode_header_block``)
  and shares that block between every subscriber; per delivery only the few
  consumer-specific headers (``subscription``, ``message-id``, ``ack``) are
  escaped and prepended by ``encode_message_frame``.

Anything that cannot be represented in the requested version (an LF in a STOMP
1.0 value, a non-letter command, a lone surrogate, ...) raises
:class:`LocalProtocolError`: it is our bug, never the peer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meshmq.errors import LocalProtocolError

__all__ = [
    "HEARTBEAT",
    "encode_frame",
    "encode_header_block",
    "encode_message_frame",
    "escape_header",
]

HEARTBEAT: bytes = b"\n"

_VERSIONS = ("1.0", "1.1", "1.2")
_UNESCAPED_COMMANDS = frozenset({"CONNECT", "CONNECTED"})


def _check_raw(text: str, is_name: bool) -> str:
    """Validate text sent without escaping (STOMP 1.0, CONNECT, CONNECTED)."""
    if "\n" in text:
        raise LocalProtocolError(f"header {'name' if is_name else 'value'} {text!r} "
                                 "contains LF, which cannot be sent without escaping")
    if is_name and ":" in text:
        raise LocalProtocolError(f"header name {text!r} contains ':', "
                                 "which cannot be sent without escaping")
    if text.endswith("\r"):
        # The receiver would take the CR as half of a CRLF line ending.
        raise LocalProtocolError(f"header {'name' if is_name else 'value'} {text!r} "
                                 "ends in CR, which cannot be sent without escaping")
    return text


def _escape_11(text: str, is_name: bool = False) -> str:
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    if text.endswith("\r"):
        # 1.1 has no escape for CR; a trailing one would be read as part of CRLF.
        raise LocalProtocolError(f"header {'name' if is_name else 'value'} {text!r} "
                                 "ends in CR, which STOMP 1.1 cannot represent")
    return text


def _escape_12(text: str, is_name: bool = False) -> str:
    # The fast path: most names and values need no escaping at all.
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text:
        text = text.replace("\n", "\\n")
    if ":" in text:
        text = text.replace(":", "\\c")
    if "\r" in text:
        text = text.replace("\r", "\\r")
    return text


def _escaper(version: str, command: str | None = None) -> Callable[[str, bool], str]:
    if version == "1.2" and command not in _UNESCAPED_COMMANDS:
        return _escape_12
    if version == "1.1" and command not in _UNESCAPED_COMMANDS:
        return _escape_11
    if version in _VERSIONS:
        return _check_raw
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

    1.1 escapes backslash, LF and ':' (as ``\\\\``, ``\\n``, ``\\c``); 1.2 also CR
    (``\\r``). 1.0 has no escaping: the text is returned as is, and an LF (or a
    trailing CR, which a receiver would take for CRLF) raises
    :class:`LocalProtocolError`.
    """
    return _escaper(version)(value, False)


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
    escape = _escaper(version, command)
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
        parts += (escape(name, True), ":", escape(value, False), "\n")
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
    escape = _escaper(version, "MESSAGE")
    return _encode_text(_header_lines(
        [(n, v) for n, v in headers if n != "content-length"], escape))


_SPECIAL = ("\\", ":", "\n", "\r")


def _header_lines(headers: list[tuple[str, str]], escape: Callable[[str, bool], str]) -> str:
    """``name:value\\n`` lines; one scan of all the text decides whether any escaping
    is needed at all (the common case is none), instead of one call per name and value."""
    text = "\0".join([n + "\0" + v for n, v in headers])
    if escape is not _check_raw and not any(c in text for c in _SPECIAL) \
            and all(n for n, _ in headers):
        return "".join([f"{n}:{v}\n" for n, v in headers])
    parts: list[str] = []
    for name, value in headers:
        if not name:
            raise LocalProtocolError("empty header name")
        parts += (escape(name, True), ":", escape(value, False), "\n")
    return "".join(parts)


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
    escape = _escaper(version, "MESSAGE")
    parts = ["MESSAGE\n"]
    for name, value in per_delivery:
        if not name:
            raise LocalProtocolError("empty header name")
        if name != "content-length":
            parts += (escape(name, True), ":", escape(value, False), "\n")
    with_length = content_length or b"\0" in body
    tail = b"content-length:%d\n\n" % len(body) if with_length else b"\n"
    return b"".join((_encode_text("".join(parts)), fixed_headers, tail, body, b"\0"))
