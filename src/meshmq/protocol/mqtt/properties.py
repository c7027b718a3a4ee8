"""MQTT 5 properties: identifiers, wire types, which packet allows which, codec.

:class:`Properties` is one typed dataclass with a field per property (``None``
when absent). The two repeatable properties are lists: ``user_properties`` as
``(name, value)`` pairs in wire order, ``subscription_identifiers`` as ints.

Decoding errors follow the spec: an identifier unknown or not allowed in the
packet, or a value running past the property block, is a Malformed Packet
(0x81); a property present twice, or a value out of its range, is a Protocol
Error (0x82); Topic Alias 0 is Topic Alias Invalid (0x94).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypedDict

from meshmq.errors import LocalProtocolError

from .errors import MalformedPacketError, MqttProtocolError
from .reason_codes import ReasonCode

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ALLOWED_PROPERTIES",
    "PROPERTY_TYPES",
    "WILL_CONTEXT",
    "Properties",
    "PropertyId",
    "PropertyType",
    "decode_properties",
    "decode_varint",
    "encode_properties",
    "encode_varint",
]

# Property contexts are packet type numbers (1..15) plus this one for the will
# properties inside CONNECT (0 is a reserved packet type, so it cannot clash).
WILL_CONTEXT = 0

MAX_VARINT = 268_435_455


class PropertyId(enum.IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

    @property
    def field_name(self) -> str:
        """The :class:`Properties` attribute holding this property."""
        return _FIELD_NAMES[self]


class PropertyType(enum.Enum):
    BYTE = "byte"
    TWO_BYTE_INT = "two-byte integer"
    FOUR_BYTE_INT = "four-byte integer"
    VARIABLE_BYTE_INT = "variable byte integer"
    UTF8_STRING = "UTF-8 string"
    BINARY = "binary data"
    STRING_PAIR = "UTF-8 string pair"


_P = PropertyId
_T = PropertyType

PROPERTY_TYPES: dict[PropertyId, PropertyType] = {
    _P.PAYLOAD_FORMAT_INDICATOR: _T.BYTE,
    _P.MESSAGE_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.CONTENT_TYPE: _T.UTF8_STRING,
    _P.RESPONSE_TOPIC: _T.UTF8_STRING,
    _P.CORRELATION_DATA: _T.BINARY,
    _P.SUBSCRIPTION_IDENTIFIER: _T.VARIABLE_BYTE_INT,
    _P.SESSION_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.ASSIGNED_CLIENT_IDENTIFIER: _T.UTF8_STRING,
    _P.SERVER_KEEP_ALIVE: _T.TWO_BYTE_INT,
    _P.AUTHENTICATION_METHOD: _T.UTF8_STRING,
    _P.AUTHENTICATION_DATA: _T.BINARY,
    _P.REQUEST_PROBLEM_INFORMATION: _T.BYTE,
    _P.WILL_DELAY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.REQUEST_RESPONSE_INFORMATION: _T.BYTE,
    _P.RESPONSE_INFORMATION: _T.UTF8_STRING,
    _P.SERVER_REFERENCE: _T.UTF8_STRING,
    _P.REASON_STRING: _T.UTF8_STRING,
    _P.RECEIVE_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS: _T.TWO_BYTE_INT,
    _P.MAXIMUM_QOS: _T.BYTE,
    _P.RETAIN_AVAILABLE: _T.BYTE,
    _P.USER_PROPERTY: _T.STRING_PAIR,
    _P.MAXIMUM_PACKET_SIZE: _T.FOUR_BYTE_INT,
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE: _T.BYTE,
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _T.BYTE,
    _P.SHARED_SUBSCRIPTION_AVAILABLE: _T.BYTE,
}

_FIELD_NAMES: dict[PropertyId, str] = {
    pid: ("user_properties" if pid is _P.USER_PROPERTY
          else "subscription_identifiers" if pid is _P.SUBSCRIPTION_IDENTIFIER
          else pid.name.lower())
    for pid in PropertyId
}

# Packet type numbers, repeated here to keep this module free of packets.py.
_CONNECT, _CONNACK, _PUBLISH, _PUBACK, _PUBREC, _PUBREL, _PUBCOMP = 1, 2, 3, 4, 5, 6, 7
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH = 8, 9, 10, 11, 14, 15
_MESSAGE = (_PUBLISH, WILL_CONTEXT)
_ACKS = (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP)

_WHERE: dict[PropertyId, tuple[int, ...]] = {
    _P.PAYLOAD_FORMAT_INDICATOR: _MESSAGE,
    _P.MESSAGE_EXPIRY_INTERVAL: _MESSAGE,
    _P.CONTENT_TYPE: _MESSAGE,
    _P.RESPONSE_TOPIC: _MESSAGE,
    _P.CORRELATION_DATA: _MESSAGE,
    _P.SUBSCRIPTION_IDENTIFIER: (_PUBLISH, _SUBSCRIBE),
    _P.SESSION_EXPIRY_INTERVAL: (_CONNECT, _CONNACK, _DISCONNECT),
    _P.ASSIGNED_CLIENT_IDENTIFIER: (_CONNACK,),
    _P.SERVER_KEEP_ALIVE: (_CONNACK,),
    _P.AUTHENTICATION_METHOD: (_CONNECT, _CONNACK, _AUTH),
    _P.AUTHENTICATION_DATA: (_CONNECT, _CONNACK, _AUTH),
    _P.REQUEST_PROBLEM_INFORMATION: (_CONNECT,),
    _P.WILL_DELAY_INTERVAL: (WILL_CONTEXT,),
    _P.REQUEST_RESPONSE_INFORMATION: (_CONNECT,),
    _P.RESPONSE_INFORMATION: (_CONNACK,),
    _P.SERVER_REFERENCE: (_CONNACK, _DISCONNECT),
    _P.REASON_STRING: (_CONNACK, *_ACKS, _SUBACK, _UNSUBACK, _DISCONNECT, _AUTH),
    _P.RECEIVE_MAXIMUM: (_CONNECT, _CONNACK),
    _P.TOPIC_ALIAS_MAXIMUM: (_CONNECT, _CONNACK),
    _P.TOPIC_ALIAS: (_PUBLISH,),
    _P.MAXIMUM_QOS: (_CONNACK,),
    _P.RETAIN_AVAILABLE: (_CONNACK,),
    _P.USER_PROPERTY: (_CONNECT, _CONNACK, *_MESSAGE, *_ACKS, _SUBSCRIBE, _SUBACK,
                       _UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH),
    _P.MAXIMUM_PACKET_SIZE: (_CONNECT, _CONNACK),
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE: (_CONNACK,),
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_CONNACK,),
    _P.SHARED_SUBSCRIPTION_AVAILABLE: (_CONNACK,),
}

#: context (packet type number, or WILL_CONTEXT) -> the property ids it may carry.
ALLOWED_PROPERTIES: dict[int, frozenset[PropertyId]] = {
    ctx: frozenset(pid for pid, where in _WHERE.items() if ctx in where)
    for ctx in range(16)
}

_BOOLEAN_BYTES = frozenset({
    _P.PAYLOAD_FORMAT_INDICATOR, _P.REQUEST_PROBLEM_INFORMATION,
    _P.REQUEST_RESPONSE_INFORMATION, _P.MAXIMUM_QOS, _P.RETAIN_AVAILABLE,
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE, _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    _P.SHARED_SUBSCRIPTION_AVAILABLE,
})
_NON_ZERO = frozenset({_P.RECEIVE_MAXIMUM, _P.MAXIMUM_PACKET_SIZE})


class _Values(TypedDict, total=False):
    payload_format_indicator: int | None
    message_expiry_interval: int | None
    content_type: str | None
    response_topic: str | None
    correlation_data: bytes | None
    subscription_identifiers: list[int]
    session_expiry_interval: int | None
    assigned_client_identifier: str | None
    server_keep_alive: int | None
    authentication_method: str | None
    authentication_data: bytes | None
    request_problem_information: int | None
    will_delay_interval: int | None
    request_response_information: int | None
    response_information: str | None
    server_reference: str | None
    reason_string: str | None
    receive_maximum: int | None
    topic_alias_maximum: int | None
    topic_alias: int | None
    maximum_qos: int | None
    retain_available: int | None
    user_properties: list[tuple[str, str]]
    maximum_packet_size: int | None
    wildcard_subscription_available: int | None
    subscription_identifier_available: int | None
    shared_subscription_available: int | None


_LIST_FIELDS = frozenset({"user_properties", "subscription_identifiers"})


@dataclass(init=False, repr=False)
class Properties:
    """MQTT 5 properties of one packet (or of a will); ``None`` means absent.

    Construct with keywords: ``Properties(content_type="text/plain")``. Byte
    properties with a yes/no meaning (``retain_available``, ...) keep the wire
    value 0 or 1. Field order = identifier order.

    Built for the hot path: every packet has a Properties, almost always empty,
    so construction costs one object (defaults are class attributes, and the two
    lists are created on first access); ``vars(props)`` holds only what was set.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __init__(self, **values: Unpack[_Values]) -> None:
        if values:
            for name, value in values.items():
                if name not in _FIELD_SET:
                    raise TypeError(f"Properties got an unexpected keyword {name!r}")
                setattr(self, name, value)

    if not TYPE_CHECKING:  # hidden from mypy, so a misspelt attribute stays an error
        def __getattr__(self, name: str) -> Any:
            # Only reached for attributes that are neither set nor class defaults.
            if name in _LIST_FIELDS:
                value: list[Any] = []
                self.__dict__[name] = value
                return value
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(
            _ORDER_NAMES, _values(self), strict=True) if value is not None and value != [])
        return f"Properties({shown})"

    def is_empty(self) -> bool:
        return not self.__dict__ or _values(self) == _EMPTY_VALUES

    def present(self) -> list[PropertyId]:
        """The identifiers of the properties that are set, in identifier order."""
        if not self.__dict__:
            return []
        return [pid for pid, v in zip(_ORDER, _values(self), strict=True)
                if v is not None and v != []]


_ORDER: tuple[PropertyId, ...] = tuple(sorted(PropertyId))
_ORDER_NAMES: tuple[str, ...] = tuple(_FIELD_NAMES[pid] for pid in _ORDER)
assert tuple(Properties.__dataclass_fields__) == _ORDER_NAMES, "field order drifted"
_FIELD_SET = frozenset(_ORDER_NAMES)


def new_properties() -> Properties:
    """An empty :class:`Properties`, skipping ``__init__`` (the decoders' hot path)."""
    return object.__new__(Properties)


_values: Callable[[Properties], tuple[object, ...]] = attrgetter(*_ORDER_NAMES)
_EMPTY_VALUES: tuple[object, ...] = _values(Properties())


# --------------------------------------------------------------------------- varints

def encode_varint(value: int) -> bytes:
    """The Variable Byte Integer encoding of ``value`` (0..268,435,455)."""
    if value < 128:
        if value < 0:
            raise LocalProtocolError(f"variable byte integer {value} is negative")
        return _SMALL[value]
    if value > MAX_VARINT:
        raise LocalProtocolError(f"variable byte integer {value} exceeds {MAX_VARINT}")
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at ``buf[pos:end]``: ``(value, next_pos)``.

    At most four bytes, and (MQTT 5 1.5.5) no longer than needed: a trailing
    zero byte after a continuation is rejected as malformed.
    """
    value = 0
    shift = 0
    for i in range(pos, min(pos + 4, end)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and i > pos:
                raise MalformedPacketError("variable byte integer not minimally encoded")
            return value, i + 1
        shift += 7
    if end - pos >= 4:
        raise MalformedPacketError("variable byte integer longer than 4 bytes")
    raise MalformedPacketError("truncated variable byte integer")


# ---------------------------------------------------------------------------- decoding

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _decode_str(buf: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    if pos + 2 > end:
        raise MalformedPacketError(f"truncated {what}")
    stop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
    if stop > end:
        raise MalformedPacketError(f"truncated {what}")
    try:
        text = buf[pos + 2:stop].decode()
    except UnicodeDecodeError:
        raise MalformedPacketError(f"invalid UTF-8 in {what}") from None
    if "\x00" in text:
        raise MalformedPacketError(f"U+0000 in {what}")
    return text, stop


def _decode_bin(buf: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacketError(f"truncated {what}")
    stop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
    if stop > end:
        raise MalformedPacketError(f"truncated {what}")
    return bytes(buf[pos + 2:stop]), stop


def decode_properties(buf: bytes, pos: int, end: int, context: int) -> tuple[Properties, int]:
    """Decode a property block (length prefix included) at ``buf[pos:end]``.

    ``context`` is the packet type number, or :data:`WILL_CONTEXT`. Returns the
    properties and the position after the block.
    """
    length, pos = decode_varint(buf, pos, end)
    props = new_properties()
    if length == 0:
        return props, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacketError("property length exceeds the packet")
    allowed = ALLOWED_PROPERTIES[context]
    seen: set[int] = set()
    while pos < stop:
        ident = buf[pos]
        pos += 1
        try:
            pid = PropertyId(ident)
        except ValueError:
            raise MalformedPacketError(f"unknown property identifier 0x{ident:02X}") from None
        if pid not in allowed:
            raise MalformedPacketError(f"property {pid.name} not allowed here")
        kind = PROPERTY_TYPES[pid]
        value: object
        if kind is _T.BYTE:
            if pos >= stop:
                raise MalformedPacketError(f"truncated property {pid.name}")
            value = buf[pos]
            pos += 1
            if pid in _BOOLEAN_BYTES and value > 1:
                raise MqttProtocolError(f"property {pid.name} must be 0 or 1, not {value}")
        elif kind is _T.TWO_BYTE_INT:
            if pos + 2 > stop:
                raise MalformedPacketError(f"truncated property {pid.name}")
            value = buf[pos] << 8 | buf[pos + 1]
            pos += 2
            if value == 0 and pid is _P.TOPIC_ALIAS:
                raise MqttProtocolError("topic alias 0",
                                        reason_code=ReasonCode.TOPIC_ALIAS_INVALID)
        elif kind is _T.FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise MalformedPacketError(f"truncated property {pid.name}")
            (value,) = _U32.unpack_from(buf, pos)
            pos += 4
        elif kind is _T.VARIABLE_BYTE_INT:
            value, pos = decode_varint(buf, pos, stop)
            if value == 0:
                raise MqttProtocolError("subscription identifier 0")
        elif kind is _T.UTF8_STRING:
            value, pos = _decode_str(buf, pos, stop, f"property {pid.name}")
        elif kind is _T.BINARY:
            value, pos = _decode_bin(buf, pos, stop, f"property {pid.name}")
        else:
            name, pos = _decode_str(buf, pos, stop, "user property name")
            val, pos = _decode_str(buf, pos, stop, "user property value")
            props.user_properties.append((name, val))
            continue
        if pid is _P.SUBSCRIPTION_IDENTIFIER:
            # Repeatable in PUBLISH (one per matching subscription), not in SUBSCRIBE.
            if context != _PUBLISH and ident in seen:
                raise MqttProtocolError("property SUBSCRIPTION_IDENTIFIER more than once")
            seen.add(ident)
            props.subscription_identifiers.append(value)  # type: ignore[arg-type]
            continue
        if ident in seen:
            raise MqttProtocolError(f"property {pid.name} more than once")
        seen.add(ident)
        if value == 0 and pid in _NON_ZERO:
            raise MqttProtocolError(f"property {pid.name} must not be 0")
        setattr(props, _FIELD_NAMES[pid], value)
    if pos != stop:  # pragma: no cover - every reader above stays within stop
        raise MalformedPacketError("property block overrun")
    return props, pos


# ---------------------------------------------------------------------------- encoding

def _enc_str(text: str, what: str) -> bytes:
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        raise LocalProtocolError(f"{what} is not encodable as UTF-8") from None
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"{what} longer than 65535 bytes")
    return _U16.pack(len(raw)) + raw


def _enc_bin(data: bytes, what: str) -> bytes:
    if len(data) > 0xFFFF:
        raise LocalProtocolError(f"{what} longer than 65535 bytes")
    return _U16.pack(len(data)) + bytes(data)


def _enc_int(width: int) -> Callable[[int, str], bytes]:
    limit = (1 << (8 * width)) - 1

    def enc(value: int, what: str) -> bytes:
        if not 0 <= value <= limit:
            raise LocalProtocolError(f"{what} value {value} out of range")
        return value.to_bytes(width, "big")
    return enc


_ENCODERS: dict[PropertyType, Callable[[object, str], bytes]] = {
    _T.BYTE: _enc_int(1),  # type: ignore[dict-item]
    _T.TWO_BYTE_INT: _enc_int(2),  # type: ignore[dict-item]
    _T.FOUR_BYTE_INT: _enc_int(4),  # type: ignore[dict-item]
    _T.UTF8_STRING: _enc_str,  # type: ignore[dict-item]
    _T.BINARY: _enc_bin,  # type: ignore[dict-item]
}
_EMPTY_BLOCK = b"\x00"
# Aligned with _ORDER; the two list-valued properties are handled separately (pid None).
_SCALARS: tuple[tuple[PropertyId | None, bytes, Callable[[object, str], bytes]], ...] = tuple(
    (None, b"", _ENCODERS[_T.BINARY]) if pid in (_P.USER_PROPERTY, _P.SUBSCRIPTION_IDENTIFIER)
    else (pid, bytes((pid,)), _ENCODERS[PROPERTY_TYPES[pid]])
    for pid in _ORDER
)


def encode_properties(props: Properties | None, context: int) -> bytes:
    """The property block (length prefix included) for ``props`` in ``context``.

    Raises :class:`LocalProtocolError` for a property the context does not allow
    or a value that does not fit its wire type.
    """
    if props is None or not props.__dict__:
        return _EMPTY_BLOCK
    values = _values(props)
    if values == _EMPTY_VALUES:
        return _EMPTY_BLOCK
    parts: list[bytes] = []
    allowed = ALLOWED_PROPERTIES[context]
    for (pid, ident, enc), value in zip(_SCALARS, values, strict=True):
        if value is None or pid is None:
            continue
        if pid not in allowed:
            raise LocalProtocolError(f"property {pid.name} not allowed in this packet")
        parts.append(ident)
        parts.append(enc(value, pid.name))
    if props.subscription_identifiers:
        if _P.SUBSCRIPTION_IDENTIFIER not in allowed:
            raise LocalProtocolError("property SUBSCRIPTION_IDENTIFIER not allowed here")
        if context != _PUBLISH and len(props.subscription_identifiers) > 1:
            raise LocalProtocolError("only one SUBSCRIPTION_IDENTIFIER allowed here")
        for sid in props.subscription_identifiers:
            if sid == 0:
                raise LocalProtocolError("subscription identifier 0")
            parts.append(b"\x0b")
            parts.append(encode_varint(sid))
    if props.user_properties:
        if _P.USER_PROPERTY not in allowed:
            raise LocalProtocolError("property USER_PROPERTY not allowed here")
        for key, val in props.user_properties:
            parts.append(b"\x26")
            parts.append(_enc_str(key, "user property name"))
            parts.append(_enc_str(val, "user property value"))
    if not parts:
        return _EMPTY_BLOCK
    block = b"".join(parts)
    return encode_varint(len(block)) + block
