"""Sans-I/O codec of the meshmq wire protocol, version 1.

A connection starts with the 4-byte magic ``MMQ1`` from the side that connected, then
both sides exchange frames::

    u32 length (big-endian, of what follows) | u8 frame type | payload

Control frames (HELLO, WELCOME, REFUSE, INTEREST, BYE) carry UTF-8 JSON objects: they
are rare and their fields evolve. The data path is binary and batched: one MESSAGES
frame carries many messages (each a sequence number and the message codec's encoding,
so a message crosses the network in the exact form brokers keep on disk), and one ACKS
frame settles many of them. Nothing waits for a reply per message, so a bridge
pipelines up to its credit window.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.message_codec import (
    STORE_CACHE,
    decode_message,
    encode_into,
    encode_message,
)
from meshmq.errors import RemoteProtocolError, StoreError

MAGIC: Final = b"MMQ1"
WIRE_VERSION: Final = 1
# A frame larger than this is a protocol error. Above the largest STOMP frame a broker
# accepts by default (100 MiB), since one message is never split across frames.
MAX_FRAME: Final = 128 * 1024 * 1024
# Optional abilities a peer lists in HELLO / WELCOME ("features"); each side uses one only
# when the other listed it, so brokers of older versions keep linking.
FEATURE_MESSAGES_AGAIN: Final = "messages-again"
# The receiver may answer REFUSED (its rights for the link's user do not allow it).
FEATURE_REFUSALS: Final = "refusals"
# The receiver may settle in ACK_RANGES frames (runs of sequence numbers) instead of ACKS.
FEATURE_ACK_RANGES: Final = "ack-ranges"
# The forwarder takes INTEREST ``hold`` and ``release`` notes: the receiver asks it to
# stop (and resume) forwarding a destination whose consumers there cannot keep up.
FEATURE_HOLDS: Final = "holds"
FEATURES: Final = (FEATURE_MESSAGES_AGAIN, FEATURE_REFUSALS, FEATURE_ACK_RANGES,
                   FEATURE_HOLDS)
# Two shards of one node (docs/design.md, "Shards"): the link carries DELIVER and SETTLE
# and the HELLO a per-boot token instead of a user. Never listed by a network peer, and
# not in FEATURES: a bridge never offers it.
FEATURE_SHARD: Final = "shard"

_HEAD: Final = struct.Struct(">IB")
_COUNT: Final = struct.Struct(">I")
_MSG_HEAD: Final = struct.Struct(">QI")
_ACK: Final = struct.Struct(">QB")
_ACK_RANGE: Final = struct.Struct(">QQB")  # first sequence, last sequence, status
_DELIVER_HEAD: Final = struct.Struct(">QQII")  # relay id, owner's tag, delivery count, n
_SETTLE: Final = struct.Struct(">QQB")  # relay id, owner's tag, kind


class FrameType(enum.IntEnum):
    HELLO = 1  # initiator -> responder: who I am, what I want (JSON)
    WELCOME = 2  # responder -> initiator: accepted, who I am (JSON)
    REFUSE = 3  # either side: why the link cannot be used; the sender then closes (JSON)
    INTEREST = 4  # consumers the sender has: full sync, adds and removals (JSON)
    MESSAGES = 5  # a batch of forwarded messages (binary)
    ACKS = 6  # settlement of forwarded messages, after the receiver stored them (binary)
    PING = 7
    PONG = 8
    BYE = 9  # orderly close (JSON)
    # As MESSAGES, for messages the sender may have delivered before (a re-send after a
    # lost link or a restart): the receiver flags them redelivered. Sent only to a peer
    # that listed FEATURE_MESSAGES_AGAIN in its HELLO or WELCOME.
    MESSAGES_AGAIN = 10
    # Shard links only (FEATURE_SHARD): messages for relayed consumers, with the owner's
    # delivery tag and count (binary), and their settlements (binary).
    DELIVER = 11
    SETTLE = 12
    # As ACKS, one record per run of sequence numbers settled with one status: a batch
    # of forwarded messages is usually one record. Sent only to a peer that listed
    # FEATURE_ACK_RANGES in its HELLO or WELCOME.
    ACK_RANGES = 13
    # Shard links only: a transaction across shards (two-phase commit): a JSON head
    # (u32 length, then the object) and, for ``prepare``, the transaction's messages
    # as in MESSAGES.
    TXN = 14
    # Replicated master/slave (meshmq.ha.replication, on the [ha] listen address only).
    REPL_VOTE_REQUEST = 16  # candidate -> node: a (pre-)vote request (JSON)
    REPL_VOTE = 17  # node -> candidate: the answer (JSON)
    REPL_APPEND = 18  # master -> node: heartbeat and/or batches (JSON head + binary)
    REPL_ACK = 19  # node -> master: its log position, on disk (JSON)
    REPL_SNAPSHOT = 20  # master -> node: one part of a copy of the live store (head + binary)


class AckStatus(enum.IntEnum):
    STORED = 0  # accepted (and synced to disk when persistent)
    DUPLICATE = 1  # already had it: the sender may forget it too
    DROPPED = 2  # cannot be delivered here and never will (e.g. its temp queue is gone)
    RETRY = 3  # not taken now (e.g. memory limit): the sender keeps it for later
    # The link's user may not send it here (authorization): the sender keeps it for its
    # own consumers and stops forwarding that destination over this link for a while.
    # Only to a peer that listed FEATURE_REFUSALS; others get RETRY.
    REFUSED = 4


class SettleKind(enum.IntEnum):
    """What a shard's client did with a relayed delivery (SETTLE)."""

    ACK = 0  # consumed: the owner removes it
    NACK = 1  # rejected: the owner redelivers it (counted) or dead-letters it
    RETURNED = 2  # never reached a client (its consumer closed first): back, uncounted


# By wire value (both enums are dense from 0).
_ACK_STATUSES: Final = tuple(AckStatus)
_SETTLE_KINDS: Final = tuple(SettleKind)


@dataclass(frozen=True, slots=True)
class WireFrame:
    type: FrameType
    payload: bytes


def _frame(ftype: FrameType, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload) + 1, ftype) + payload


def encode_json(ftype: FrameType, body: dict[str, Any]) -> bytes:
    return _frame(ftype, json.dumps(body, separators=(",", ":")).encode())


def encode_ping(pong: bool = False) -> bytes:
    return _frame(FrameType.PONG if pong else FrameType.PING, b"")


def encode_messages(batch: list[tuple[int, Message]]) -> bytes:
    """One MESSAGES frame for ``batch`` of (sequence, message)."""
    return encode_records([(seq, encode_message(msg)) for seq, msg in batch])


def encode_records(batch: list[tuple[int, bytes]],
                   ftype: FrameType = FrameType.MESSAGES) -> bytes:
    """One MESSAGES (or MESSAGES_AGAIN) frame for ``batch`` of (sequence, message
    already in the message codec's format)."""
    parts = [_COUNT.pack(len(batch))]
    for seq, data in batch:
        parts.append(_MSG_HEAD.pack(seq, len(data)))
        parts.append(data)
    payload = b"".join(parts)
    return _HEAD.pack(len(payload) + 1, ftype) + payload


class RecordsBuilder:
    """MESSAGES (or MESSAGES_AGAIN) frames built record by record: a forwarder adds each
    message as it encodes it, and ``frame`` joins them with the frame's head in one
    copy, without a (sequence, bytes) pair per message or a second join for the head."""

    __slots__ = ("_parts", "count", "size")

    def __init__(self) -> None:
        self._parts: list[bytes] = [b""]  # [0]: the frame head, filled in by ``frame``
        self.count = 0  # records added since the last frame
        self.size = 0  # their messages' bytes

    def add(self, seq: int, data: bytes) -> None:
        """Add one record: ``data`` is a message in the message codec's format."""
        parts = self._parts
        parts.append(_MSG_HEAD.pack(seq, len(data)))
        parts.append(data)
        self.count += 1
        self.size += len(data)

    def add_message(self, seq: int, msg: Message, path: bytes, path_len: int,
                    producer: bytes) -> None:
        """Add one record of ``msg`` as ``message_codec.encode_forwarded(msg, path,
        path_len, producer)`` would encode it, its parts going straight into the frame.
        Raises StoreError (and adds nothing) for a message the codec cannot hold."""
        parts = self._parts
        head = len(parts)
        parts.append(b"")
        try:
            size = encode_into(parts, msg, path, path_len, producer)
        except StoreError:
            parts.pop()
            raise
        parts[head] = _MSG_HEAD.pack(seq, size)
        self.count += 1
        self.size += size

    def frame(self, ftype: FrameType = FrameType.MESSAGES) -> bytes:
        """The frame of the records added so far (as ``encode_records``); starts over."""
        parts, count = self._parts, self.count
        payload = _COUNT.size + count * _MSG_HEAD.size + self.size
        parts[0] = _HEAD.pack(payload + 1, ftype) + _COUNT.pack(count)
        self._parts, self.count, self.size = [b""], 0, 0
        return b"".join(parts)


def encode_acks(acks: list[tuple[int, AckStatus]], *, as_ranges: bool = False) -> bytes:
    """One ACKS frame for ``acks`` of (sequence, status); ``as_ranges``: one ACK_RANGES
    frame instead, the same settlements as runs (for a peer with FEATURE_ACK_RANGES)."""
    if as_ranges:
        return encode_ack_ranges(ack_runs(acks))
    pack = _ACK.pack
    return b"".join([_HEAD.pack(_COUNT.size + len(acks) * _ACK.size + 1, FrameType.ACKS),
                     _COUNT.pack(len(acks)), *[pack(seq, status) for seq, status in acks]])


def ack_runs(acks: list[tuple[int, AckStatus]]) -> list[tuple[int, int, AckStatus]]:
    """``acks`` as (first, last, status) runs: each run the consecutive sequence numbers,
    in the order given, that share a status."""
    runs: list[tuple[int, int, AckStatus]] = []
    if not acks:
        return runs
    first, status = acks[0]
    last = first
    for i in range(1, len(acks)):
        seq, st = acks[i]
        if seq == last + 1 and st is status:
            last = seq
        else:
            runs.append((first, last, status))
            first = last = seq
            status = st
    runs.append((first, last, status))
    return runs


def encode_ack_ranges(runs: list[tuple[int, int, AckStatus]]) -> bytes:
    """One ACK_RANGES frame for ``runs`` of (first, last, status), first <= last."""
    pack = _ACK_RANGE.pack
    return b"".join([_HEAD.pack(_COUNT.size + len(runs) * _ACK_RANGE.size + 1,
                                FrameType.ACK_RANGES),
                     _COUNT.pack(len(runs)),
                     *[pack(first, last, status) for first, last, status in runs]])


def encode_deliver(batch: list[tuple[int, int, int, bytes]]) -> bytes:
    """One DELIVER frame for ``batch`` of (relay id, owner's tag, delivery count,
    message in the message codec's format)."""
    parts = [_COUNT.pack(len(batch))]
    for relay, tag, count, data in batch:
        parts.append(_DELIVER_HEAD.pack(relay, tag, count, len(data)))
        parts.append(data)
    payload = b"".join(parts)
    return _HEAD.pack(len(payload) + 1, FrameType.DELIVER) + payload


def encode_settle(settles: list[tuple[int, int, int]]) -> bytes:
    """One SETTLE frame for ``settles`` of (relay id, owner's tag, ``SettleKind`` value)."""
    payload = _COUNT.pack(len(settles)) + b"".join(
        _SETTLE.pack(relay, tag, kind) for relay, tag, kind in settles)
    return _frame(FrameType.SETTLE, payload)


def encode_txn(head: dict[str, Any], messages: Sequence[bytes] = ()) -> bytes:
    """One TXN frame: ``head`` (JSON) and ``messages`` in the message codec's format."""
    text = json.dumps(head, separators=(",", ":")).encode()
    parts = [_COUNT.pack(len(text)), text, _COUNT.pack(len(messages))]
    for seq, data in enumerate(messages):
        parts.append(_MSG_HEAD.pack(seq, len(data)))
        parts.append(data)
    return _frame(FrameType.TXN, b"".join(parts))


def decode_txn(frame: WireFrame) -> tuple[dict[str, Any], list[Message]]:
    """A TXN frame's head and messages."""
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("TXN frame too short")
    (size,) = _COUNT.unpack_from(data, 0)
    if 4 + size > len(data):
        raise RemoteProtocolError("TXN frame truncated")
    head = decode_json(WireFrame(FrameType.TXN, data[4:4 + size]))
    rest = WireFrame(FrameType.MESSAGES, data[4 + size:])
    return head, [msg for _, msg in decode_messages(rest)]


def decode_json(frame: WireFrame) -> dict[str, Any]:
    try:
        body = json.loads(frame.payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RemoteProtocolError(f"{frame.type.name} frame is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RemoteProtocolError(f"{frame.type.name} frame must hold a JSON object")
    return body


def decode_messages(frame: WireFrame) -> list[tuple[int, Message]]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("MESSAGES frame too short")
    # Declared ints: struct hands back untyped values, and compiled code does generic
    # (boxed) arithmetic and slicing on those.
    count: int = _COUNT.unpack_from(data, 0)[0]
    pos = 4
    end = len(data)
    head = _MSG_HEAD.unpack_from
    head_size: int = _MSG_HEAD.size
    known = _DESTINATIONS
    out: list[tuple[int, Message]] = []
    seq: int
    size: int
    for _ in range(count):
        if pos + head_size > end:
            raise RemoteProtocolError("MESSAGES frame truncated")
        seq, size = head(data, pos)
        pos += head_size
        if pos + size > end:
            raise RemoteProtocolError("MESSAGES frame truncated")
        raw = data[pos:pos + size]
        try:
            msg = decode_message(raw)
        except Exception as exc:  # the message codec raises its own errors on garbage
            raise RemoteProtocolError(f"undecodable message in MESSAGES frame: {exc}") from None
        # The receiver stores exactly these bytes: no re-encoding.
        msg.wire_cache = {STORE_CACHE: raw}
        dest = msg.destination  # _intern, inlined for the usual case (a known name)
        same = known.get(dest.name)
        if same is not None and same.kind is dest.kind:
            msg.destination = same
        elif same is None:
            _intern(msg)
        out.append((seq, msg))
        pos += size
    if pos != end:
        raise RemoteProtocolError("MESSAGES frame has trailing bytes")
    return out


# One Destination object per name among received messages: the broker's tables (queues,
# owners, a connection's producer destinations) then find them by identity, without a
# call to Destination.__eq__ for each lookup.
_DESTINATIONS: Final[dict[str, Destination]] = {}


def _intern(msg: Message) -> None:
    dest = msg.destination
    known = _DESTINATIONS.get(dest.name)
    if known is None:
        if len(_DESTINATIONS) >= 10_000:
            _DESTINATIONS.clear()
        _DESTINATIONS[dest.name] = dest
    elif known.kind is dest.kind:
        msg.destination = known


def decode_acks(frame: WireFrame) -> list[tuple[int, AckStatus]]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("ACKS frame too short")
    (count,) = _COUNT.unpack_from(data, 0)
    if len(data) != 4 + count * _ACK.size:
        raise RemoteProtocolError("ACKS frame has the wrong length")
    # A table, not ``AckStatus(status)``: the enum's call costs a microsecond a message.
    statuses = _ACK_STATUSES
    try:
        return [(seq, statuses[status])
                for seq, status in _ACK.iter_unpack(memoryview(data)[4:])]
    except IndexError:
        bad = next(st for _, st in _ACK.iter_unpack(memoryview(data)[4:])
                   if st >= len(statuses))
        raise RemoteProtocolError(f"unknown ack status {bad}") from None


def decode_ack_ranges(frame: WireFrame) -> list[tuple[int, int, AckStatus]]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("ACK_RANGES frame too short")
    (count,) = _COUNT.unpack_from(data, 0)
    if len(data) != 4 + count * _ACK_RANGE.size:
        raise RemoteProtocolError("ACK_RANGES frame has the wrong length")
    statuses = _ACK_STATUSES
    runs: list[tuple[int, int, AckStatus]] = []
    for first, last, status in _ACK_RANGE.iter_unpack(memoryview(data)[4:]):
        if status >= len(statuses):
            raise RemoteProtocolError(f"unknown ack status {status}")
        if first > last:
            raise RemoteProtocolError(f"ACK_RANGES run {first}-{last} ends before it starts")
        runs.append((first, last, statuses[status]))
    return runs


def decode_deliver(frame: WireFrame) -> list[tuple[int, int, int, Message]]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("DELIVER frame too short")
    (count,) = _COUNT.unpack_from(data, 0)
    pos = 4
    out: list[tuple[int, int, int, Message]] = []
    for _ in range(count):
        if pos + _DELIVER_HEAD.size > len(data):
            raise RemoteProtocolError("DELIVER frame truncated")
        relay, tag, delivered, size = _DELIVER_HEAD.unpack_from(data, pos)
        pos += _DELIVER_HEAD.size
        if pos + size > len(data):
            raise RemoteProtocolError("DELIVER frame truncated")
        raw = data[pos:pos + size]
        try:
            msg = decode_message(raw)
        except Exception as exc:  # the message codec raises its own errors on garbage
            raise RemoteProtocolError(f"undecodable message in DELIVER frame: {exc}") from None
        msg.wire_cache = {STORE_CACHE: raw}
        _intern(msg)
        out.append((relay, tag, delivered, msg))
        pos += size
    if pos != len(data):
        raise RemoteProtocolError("DELIVER frame has trailing bytes")
    return out


def decode_settle(frame: WireFrame) -> list[tuple[int, int, SettleKind]]:
    data = frame.payload
    if len(data) < 4:
        raise RemoteProtocolError("SETTLE frame too short")
    (count,) = _COUNT.unpack_from(data, 0)
    if len(data) != 4 + count * _SETTLE.size:
        raise RemoteProtocolError("SETTLE frame has the wrong length")
    kinds = _SETTLE_KINDS
    try:
        return [(relay, tag, kinds[kind])
                for relay, tag, kind in _SETTLE.iter_unpack(memoryview(data)[4:])]
    except IndexError:
        bad = next(k for _, _, k in _SETTLE.iter_unpack(memoryview(data)[4:])
                   if k >= len(kinds))
        raise RemoteProtocolError(f"unknown settle kind {bad}") from None


class WireDecoder:
    """Feed bytes, get frames. ``expect_magic``: the accepting side first checks the
    4-byte magic, so a client of another protocol gets a clear error, not garbage."""

    def __init__(self, *, expect_magic: bool, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._need_magic = expect_magic
        self._max = max_frame

    def feed(self, data: bytes) -> list[WireFrame]:
        buf = self._buf
        buf += data
        if self._need_magic:
            if len(buf) < len(MAGIC):
                if not MAGIC.startswith(bytes(buf)):
                    raise RemoteProtocolError("not a meshmq wire connection (bad magic): "
                                              "this port speaks meshmq's broker protocol")
                return []
            if bytes(buf[:4]) != MAGIC:
                raise RemoteProtocolError("not a meshmq wire connection (bad magic): "
                                          "this port speaks meshmq's broker protocol")
            del buf[:4]
            self._need_magic = False
        frames: list[WireFrame] = []
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length, ftype = _HEAD.unpack_from(buf, pos)
            if length < 1 or length > self._max:
                raise RemoteProtocolError(f"frame length {length} out of range")
            if n - pos < 4 + length:
                break
            try:
                kind = FrameType(ftype)
            except ValueError:
                raise RemoteProtocolError(f"unknown frame type {ftype}") from None
            # One copy of the payload (a bytearray slice would be a second).
            with memoryview(buf) as view:
                frames.append(WireFrame(kind, view[pos + 5:pos + 4 + length].tobytes()))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return frames
