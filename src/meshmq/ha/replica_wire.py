"""Frames of the replication link, on meshmq's wire framing (``MMQ1`` magic,
``u32 length | u8 type | payload``; docs/wire-protocol.md, "Replication frames").

JSON frames (votes, acks) use ``encode_json``. APPEND and SNAPSHOT carry a JSON head and
binary batches: ``u32 head length | head JSON | payload``; in APPEND the head lists each
batch as ``[term, index, length]`` and the payloads follow back to back.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from meshmq.errors import RemoteProtocolError
from meshmq.ha.replication_policy import Position
from meshmq.protocol.wire.codec import FrameType, WireFrame, _frame

_U32 = struct.Struct(">I")


def encode_mixed(ftype: FrameType, head: dict[str, Any], payload: bytes = b"") -> bytes:
    raw = json.dumps(head, separators=(",", ":")).encode()
    return _frame(ftype, _U32.pack(len(raw)) + raw + payload)


def decode_mixed(frame: WireFrame) -> tuple[dict[str, Any], bytes]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError(f"{frame.type.name} frame too short")
    (n,) = _U32.unpack_from(data)
    if len(data) < 4 + n:
        raise RemoteProtocolError(f"{frame.type.name} head length {n} runs past the frame")
    try:
        head = json.loads(data[4:4 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RemoteProtocolError(f"{frame.type.name} head is not valid JSON: {exc}") from None
    if not isinstance(head, dict):
        raise RemoteProtocolError(f"{frame.type.name} head is not a JSON object")
    return head, data[4 + n:]


def encode_append(head: dict[str, Any], batches: list[tuple[Position, bytes]]) -> bytes:
    head = dict(head, entries=[[t, i, len(p)] for (t, i), p in batches])
    return encode_mixed(FrameType.REPL_APPEND, head, b"".join(p for _, p in batches))


def decode_append(frame: WireFrame) -> tuple[dict[str, Any], list[tuple[Position, bytes]]]:
    head, payload = decode_mixed(frame)
    out: list[tuple[Position, bytes]] = []
    pos = 0
    try:
        for term, index, length in head.get("entries", []):
            size = int(length)
            if size < 0 or pos + size > len(payload):
                raise RemoteProtocolError("APPEND payload does not match its entries")
            out.append(((int(term), int(index)), payload[pos:pos + size]))
            pos += size
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"APPEND entries malformed: {exc}") from None
    if pos != len(payload):
        raise RemoteProtocolError("APPEND payload does not match its entries")
    return head, out


def position(value: Any, what: str) -> Position:
    """A ``[term, index]`` pair from a JSON head."""
    if not isinstance(value, list | tuple):
        raise RemoteProtocolError(f"{what} is not a [term, index] pair: {value!r}")
    try:
        term, index = value
        return int(term), int(index)
    except (TypeError, ValueError):
        raise RemoteProtocolError(f"{what} is not a [term, index] pair: {value!r}") from None
