"""Compact, versioned binary encoding of ``Message`` (store records, network bridges).

It lives next to ``Message`` because two layers share the bytes: every store keeps
messages in this form and the broker-to-broker wire protocol carries them in it, so a
message crosses the network exactly as brokers keep it on disk. Neither layer owns it.

Layout (little-endian), version 1::

    u8  version (= 1)
    u8  flags        bit0 persistent, bit1 correlation_id, bit2 reply_to, bit3 type,
                     bit4 group_id, bit5 original_destination, bit6 user_id,
                     bit7 content_type (a set bit means the optional field follows)
    u8  priority
    u8  destination kind (index into KIND_CODES)
    u32 body length  (fixed offset 4 so a reader can size a message without decoding it)
    i64 timestamp, i64 expiration, i64 group_seq
    u16 property count, u16 broker_path length
    str message_id, str destination name, str producer_id
    optional fields in flag order (a destination is u8 kind + str)
    str * broker_path
    (str name, u8 tag, value) * properties
    body

``str`` is UTF-8 with a short length prefix: one byte when < 255, else 0xFF + u32.
Property tags: 0 None, 1 False, 2 True, 3 i64, 4 f64, 5 str, 6 int outside i64
(decimal text). ``wire_cache`` is never encoded.

Plain ``struct`` and byte slicing, no json/pickle: this is on the persistent-send path.
"""

from __future__ import annotations

import struct
from typing import Final

from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.errors import CorruptStoreError, StoreError

CODEC_VERSION: Final = 1

# Kinds are stored as small integers; the order is part of the format, append only.
KIND_CODES: Final[tuple[DestKind, ...]] = (
    DestKind.QUEUE, DestKind.TOPIC, DestKind.TEMP_QUEUE, DestKind.TEMP_TOPIC,
)
_KIND_INDEX: Final = {kind: i for i, kind in enumerate(KIND_CODES)}

# decode builds Message positionally (faster); fail at import if the field order changes.
_POSITIONAL: Final = ("message_id", "destination", "body", "properties", "persistent", "priority",
               "timestamp", "expiration", "correlation_id", "reply_to", "type", "group_id",
               "group_seq", "producer_id", "broker_path", "original_destination", "user_id",
               "content_type")
if tuple(Message.__dataclass_fields__)[:len(_POSITIONAL)] != _POSITIONAL:  # pragma: no cover
    raise ImportError("meshmq.core.message_codec: Message fields changed; update the codec")

_HEADER: Final = struct.Struct("<BBBBIqqqHH")
HEADER_SIZE: Final = _HEADER.size
# The same header in three parts for a message with no optional field: its first four
# bytes and its last twenty (no expiration, no group, few properties and hops) from
# tables, so only the body length and timestamp are packed per message; a 10-argument
# pack costs four times what a 2-argument one does.
_LEAD: Final = struct.Struct("<Iq")  # body length, timestamp
_PRIORITIES: Final = 10  # 0-9; other values take the general path (and fail there)
_FIRST4: Final = tuple(
    bytes((1, flags, priority, kind))
    for flags in (0, 1) for priority in range(_PRIORITIES) for kind in range(4))
_TAILS: Final = tuple(struct.pack("<qqHH", 0, 0, props, path)
                      for props in range(16) for path in range(16))
# The last (body length, timestamp, packed) of the fast path: at the rates where the
# pack's cost shows, consecutive messages mostly share the millisecond and, from one
# producer, the size. One tuple, replaced whole, so a reader in another thread never
# sees one message's length with another's timestamp.
_LAST_LEAD: Final[list[tuple[int, int, bytes]]] = [(-1, 0, b"")]
_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")
_F64: Final = struct.Struct("<d")

_F_PERSISTENT: Final = 0x01
_F_CORRELATION: Final = 0x02
_F_REPLY_TO: Final = 0x04
_F_TYPE: Final = 0x08
_F_GROUP: Final = 0x10
_F_ORIGINAL: Final = 0x20
_F_USER: Final = 0x40
_F_CONTENT_TYPE: Final = 0x80

# Property value tags (module docstring). Final: mypyc inlines Final constants, where a
# plain module global costs a dictionary look-up at every use.
_T_NONE: Final = 0
_T_FALSE: Final = 1
_T_TRUE: Final = 2
_T_INT: Final = 3
_T_FLOAT: Final = 4
_T_STR: Final = 5
_T_BIGINT: Final = 6
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_MAX_COUNT: Final = 0xFFFF


_LEN1: Final = tuple(bytes((i,)) for i in range(255))


def _put_str(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8")
    n = len(raw)
    out.append(_LEN1[n] if n < 255 else b"\xff" + _U32.pack(n))
    out.append(raw)


STORE_CACHE: Final = "store"  # wire_cache key of a message's encoding in this format


def encoded(msg: Message) -> bytes:
    """``encode_message(msg)``, reusing the bytes it arrived in when it came over a
    broker link in this very format (the receiving broker then stores them as is)."""
    cache = msg.wire_cache
    if cache is not None:
        data = cache.get(STORE_CACHE)
        if data is not None:
            return data
    return encode_message(msg)


def encode_message(msg: Message, *, broker_path: tuple[str, ...] | None = None,
                   producer_id: str | None = None) -> bytes:
    """Encode every field of ``msg`` except ``wire_cache``; ``broker_path`` and
    ``producer_id`` replace the message's own (a bridge forwarding it adds a hop
    without copying the message). Raises StoreError for values the format cannot hold
    (unsupported property types, out-of-range numbers)."""
    path = msg.broker_path if broker_path is None else broker_path
    try:
        producer = str_bytes(msg.producer_id if producer_id is None else producer_id)
        path_bytes = b"".join([str_bytes(name) for name in path]) if path else b""
    except (AttributeError, TypeError, UnicodeEncodeError) as exc:
        raise StoreError(f"cannot encode message {msg.message_id!r}: {exc}") from exc
    return encode_forwarded(msg, path_bytes, len(path), producer)


def str_bytes(text: str) -> bytes:
    """``text`` as the format writes a ``str``: its length prefix, then its UTF-8."""
    raw = text.encode("utf-8")
    n = len(raw)
    return (_LEN1[n] if n < 255 else b"\xff" + _U32.pack(n)) + raw


# Destination name -> ``str_bytes(name)``: a forwarder or a store encodes the same few
# names over and over. Bounded: cleared when it grows past _NAMES_KEPT.
_NAMES: Final[dict[str, bytes]] = {}
_NAMES_KEPT: Final = 4096


def encode_forwarded(msg: Message, path: bytes, path_len: int, producer: bytes) -> bytes:
    """``encode_message(msg, broker_path=P, producer_id=Q)`` from the parts a forwarder
    keeps encoded: ``path`` is ``P``'s names each as ``str_bytes`` (joined), ``path_len``
    is ``len(P)``, ``producer`` is ``str_bytes(Q)``. The same bytes, less work per message."""
    out: list[bytes] = []
    encode_into(out, msg, path, path_len, producer)
    return b"".join(out)


def encode_into(out: list[bytes], msg: Message, path: bytes, path_len: int,
                producer: bytes) -> int:
    """``encode_forwarded``'s bytes appended to ``out`` in parts, not joined (a frame
    being built takes them as they are: one copy of the body, not two); returns their
    total length. On StoreError ``out`` is left as it was."""
    props = msg.properties
    if len(props) > _MAX_COUNT or path_len > _MAX_COUNT:
        raise StoreError("message has too many properties or broker_path entries to store")
    start = len(out)
    try:
        dest = msg.destination
        name = _NAMES.get(dest.name)
        if name is None:
            if len(_NAMES) >= _NAMES_KEPT:
                _NAMES.clear()
            name = _NAMES[dest.name] = str_bytes(dest.name)
        raw_id = msg.message_id.encode("utf-8")
        n = len(raw_id)
        prefix = _LEN1[n] if n < 255 else b"\xff" + _U32.pack(n)
        body = msg.body
        size = HEADER_SIZE + len(prefix) + n + len(name) + len(producer) + len(path) + len(body)
        out.append(b"")  # the header (in up to three parts), once the flags are known
        out.append(b"")
        out.append(b"")
        out.append(prefix)
        out.append(raw_id)
        out.append(name)
        out.append(producer)
        flags = _F_PERSISTENT if msg.persistent else 0
        if msg.correlation_id is not None:
            flags |= _F_CORRELATION
            _put_str(out, msg.correlation_id)
        if msg.reply_to is not None:
            flags |= _F_REPLY_TO
            out.append(bytes((_KIND_INDEX[msg.reply_to.kind],)))
            _put_str(out, msg.reply_to.name)
        if msg.type is not None:
            flags |= _F_TYPE
            _put_str(out, msg.type)
        if msg.group_id is not None:
            flags |= _F_GROUP
            _put_str(out, msg.group_id)
        if msg.original_destination is not None:
            flags |= _F_ORIGINAL
            out.append(bytes((_KIND_INDEX[msg.original_destination.kind],)))
            _put_str(out, msg.original_destination.name)
        if msg.user_id is not None:
            flags |= _F_USER
            _put_str(out, msg.user_id)
        if msg.content_type is not None:
            flags |= _F_CONTENT_TYPE
            _put_str(out, msg.content_type)
        if flags > _F_PERSISTENT:
            size += _sizes(out, start + 7)
        if path:
            out.append(path)
        if props:
            mark = len(out)
            for key, value in props.items():
                _put_str(out, key)
                _put_value(out, value)
            size += _sizes(out, mark)
        priority = msg.priority
        kind = _KIND_INDEX[dest.kind]
        nprops = len(props)
        if (flags <= _F_PERSISTENT and 0 <= priority < _PRIORITIES and nprops < 16
                and path_len < 16 and msg.expiration == 0 and msg.group_seq == 0):
            out[start] = _FIRST4[(flags * _PRIORITIES + priority) * 4 + kind]
            body_len = len(body)
            timestamp = msg.timestamp
            last_len, last_ts, lead = _LAST_LEAD[0]
            if body_len != last_len or timestamp != last_ts:
                lead = _LEAD.pack(body_len, timestamp)
                _LAST_LEAD[0] = (body_len, timestamp, lead)
            out[start + 1] = lead
            out[start + 2] = _TAILS[nprops * 16 + path_len]
        else:
            out[start] = _HEADER.pack(CODEC_VERSION, flags, priority, kind, len(body),
                                      msg.timestamp, msg.expiration, msg.group_seq, nprops,
                                      path_len)
        out.append(body)
        return size
    except (struct.error, KeyError, AttributeError, TypeError, UnicodeEncodeError) as exc:
        del out[start:]
        raise StoreError(f"cannot encode message {msg.message_id!r}: {exc}") from exc
    except StoreError:
        del out[start:]
        raise


def _sizes(parts: list[bytes], start: int) -> int:
    total = 0
    for i in range(start, len(parts)):
        total += len(parts[i])
    return total


def _put_value(out: list[bytes], value: PropertyValue) -> None:
    # bool before int: bool is an int subclass.
    if value is None:
        out.append(b"\x00")
    elif value is True:
        out.append(b"\x02")
    elif value is False:
        out.append(b"\x01")
    elif type(value) is str:
        out.append(b"\x05")
        _put_str(out, value)
    elif isinstance(value, int):
        if _I64_MIN <= value <= _I64_MAX:
            out.append(b"\x03" + _I64.pack(value))
        else:
            out.append(b"\x06")
            _put_str(out, str(value))
    elif isinstance(value, float):
        out.append(b"\x04" + _F64.pack(value))
    elif isinstance(value, str):
        out.append(b"\x05")
        _put_str(out, str(value))
    else:
        raise StoreError(f"unsupported property value type {type(value).__name__}")


def body_length(data: bytes | memoryview, offset: int = 0) -> int:
    """The body size of the message encoded at ``offset``, without decoding it."""
    if len(data) < offset + HEADER_SIZE or data[offset] != CODEC_VERSION:
        raise CorruptStoreError("not a version-1 encoded message")
    return int(_U32.unpack_from(data, offset + 4)[0])


def decode_message(data: bytes | memoryview) -> Message:
    """Inverse of ``encode_message``. Raises CorruptStoreError, and nothing else, on bad input."""
    try:
        return _decode(bytes(data))
    except CorruptStoreError:
        raise
    except Exception as exc:  # any malformation surfaces as one documented error
        raise CorruptStoreError(f"malformed message encoding: {exc!r}") from exc


def _str(buf: bytes, pos: int) -> tuple[str, int]:
    n = buf[pos]
    pos += 1
    if n == 255:
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
    end = pos + n
    if end > len(buf):
        raise CorruptStoreError("string runs past the end of the message")
    return buf[pos:end].decode("utf-8"), end


def _dest(buf: bytes, pos: int) -> tuple[Destination, int]:
    kind = KIND_CODES[buf[pos]]
    name, pos = _str(buf, pos + 1)
    return Destination(kind, name), pos


# One Destination per name among decoded messages (a bridge's receiver or a store's
# recovery decodes the same few names over and over): a dict look-up instead of a new
# frozen dataclass per message, and the broker's tables then find it by identity.
_DECODED: Final[dict[str, Destination]] = {}


def _destination(kind: DestKind, name: str) -> Destination:
    known = _DECODED.get(name)
    if known is not None and known.kind is kind:
        return known
    dest = Destination(kind, name)
    if known is None:
        if len(_DECODED) >= 10_000:
            _DECODED.clear()
        _DECODED[name] = dest
    return dest


def _decode(buf: bytes) -> Message:
    size = len(buf)
    if size < HEADER_SIZE:
        raise CorruptStoreError("message encoding too short")
    # Declared ints: struct hands back untyped values, and compiled code tests flags
    # and counts generically (boxed) otherwise.
    version: int
    flags: int
    priority: int
    kind: int
    body_len: int
    timestamp: int
    expiration: int
    group_seq: int
    n_props: int
    n_path: int
    (version, flags, priority, kind, body_len, timestamp, expiration, group_seq,
     n_props, n_path) = _HEADER.unpack_from(buf, 0)
    if version != CODEC_VERSION:
        raise CorruptStoreError(f"unsupported message encoding version {version}")
    message_id, pos = _str(buf, HEADER_SIZE)
    dest_name, pos = _str(buf, pos)
    producer_id, pos = _str(buf, pos)
    correlation_id = mtype = group_id = user_id = content_type = None
    reply_to = original = None
    if flags & 0xFE:  # any optional field present
        if flags & _F_CORRELATION:
            correlation_id, pos = _str(buf, pos)
        if flags & _F_REPLY_TO:
            reply_to, pos = _dest(buf, pos)
        if flags & _F_TYPE:
            mtype, pos = _str(buf, pos)
        if flags & _F_GROUP:
            group_id, pos = _str(buf, pos)
        if flags & _F_ORIGINAL:
            original, pos = _dest(buf, pos)
        if flags & _F_USER:
            user_id, pos = _str(buf, pos)
        if flags & _F_CONTENT_TYPE:
            content_type, pos = _str(buf, pos)
    path: tuple[str, ...] = ()
    if n_path:
        names = []
        for _ in range(n_path):
            name, pos = _str(buf, pos)
            names.append(name)
        path = tuple(names)
    props: dict[str, PropertyValue] = {}
    for _ in range(n_props):
        name, pos = _str(buf, pos)
        tag = buf[pos]
        pos += 1
        value: PropertyValue
        if tag == _T_STR:
            value, pos = _str(buf, pos)
        elif tag == _T_INT:
            value = _I64.unpack_from(buf, pos)[0]
            pos += 8
        elif tag == _T_TRUE:
            value = True
        elif tag == _T_FALSE:
            value = False
        elif tag == _T_NONE:
            value = None
        elif tag == _T_FLOAT:
            value = _F64.unpack_from(buf, pos)[0]
            pos += 8
        elif tag == _T_BIGINT:
            text, pos = _str(buf, pos)
            value = int(text)
        else:
            raise CorruptStoreError(f"unknown property tag {tag}")
        props[name] = value
    if pos + body_len != size:
        raise CorruptStoreError("message body length does not match the encoding")
    # Positional: noticeably cheaper than keywords for a 19-field dataclass.
    return Message(message_id, _destination(KIND_CODES[kind], dest_name), buf[pos:], props,
                   bool(flags & _F_PERSISTENT), priority, timestamp, expiration,
                   correlation_id, reply_to, mtype, group_id, group_seq, producer_id, path,
                   original, user_id, content_type)
