"""MQTT packet encoder: packets to bytes, for protocol level 4 (3.1.1) or 5.

:func:`encode` handles every packet type in both directions (the broker, the
client and the tests share it). For level 4 the MQTT 5-only parts (properties,
reason codes other than CONNACK's and SUBACK's) are left out; CONNACK and SUBACK
reason codes are translated to their 3.1.1 bytes. :func:`encode_publish` is the
hot path: it takes the fields directly (the topic may be pre-encoded bytes) so a
broker can write one message to many subscribers without building packets.

Anything that cannot be represented (packet id 0 or missing for QoS > 0, a
string over 65535 bytes, a property the packet does not allow, AUTH or MQTT 5
subscription options for 3.1.1, ...) raises :class:`LocalProtocolError`.
Topic syntax is not re-validated here: the encoder trusts its caller.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from meshmq.errors import LocalProtocolError

from .packets import (
    PROTOCOL_LEVEL_5,
    PROTOCOL_LEVEL_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    RetainHandling,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
)
from .properties import WILL_CONTEXT, Properties, encode_properties, encode_varint
from .reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
    connack_return_code_v311,
)

__all__ = [
    "encode",
    "encode_publish",
    "encode_publish_prepared",
    "encode_subscription_options",
    "publish_topic_field",
]

_U16: Final = struct.Struct(">H")
_PACK_U16: Final = _U16.pack
_PACK_B2: Final = struct.Struct(">BB").pack
_PACK_B3: Final = struct.Struct(">BBB").pack
_MAX_REMAINING: Final = 268_435_455
_PINGREQ: Final = b"\xc0\x00"
_PINGRESP: Final = b"\xd0\x00"
_DISCONNECT_NORMAL: Final = b"\xe0\x00"
_AUTH_SUCCESS: Final = b"\xf0\x00"
_HEADER_BYTES: Final = tuple(bytes((i,)) for i in range(256))


def _check_level(protocol_level: int) -> bool:
    if protocol_level == PROTOCOL_LEVEL_5:
        return True
    if protocol_level == PROTOCOL_LEVEL_311:
        return False
    raise LocalProtocolError(f"unsupported MQTT protocol level {protocol_level!r}")


def _packet(first: int, body: bytes) -> bytes:
    size = len(body)
    if size < 128:
        return bytes((first, size)) + body
    if size > _MAX_REMAINING:
        raise LocalProtocolError(f"packet body of {size} bytes exceeds the MQTT maximum")
    return _HEADER_BYTES[first] + encode_varint(size) + body


def _str(text: str, what: str) -> bytes:
    try:
        raw = text.encode()
    except UnicodeEncodeError:
        raise LocalProtocolError(f"{what} is not encodable as UTF-8") from None
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"{what} longer than 65535 bytes")
    return _PACK_U16(len(raw)) + raw


def _bin(data: bytes, what: str) -> bytes:
    if len(data) > 0xFFFF:
        raise LocalProtocolError(f"{what} longer than 65535 bytes")
    return _PACK_U16(len(data)) + bytes(data)


def _pid(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"packet identifier {packet_id!r} not in 1..65535")
    return _PACK_U16(packet_id)


def _check_code(code: int, allowed: frozenset[int], what: str) -> int:
    if code not in allowed:
        raise LocalProtocolError(f"reason code 0x{code:02X} not allowed in {what}")
    return code


# ------------------------------------------------------------------------------ PUBLISH

def encode_publish(topic: str | bytes, payload: bytes, *, qos: int = 0, retain: bool = False,
                   dup: bool = False, packet_id: int | None = None,
                   protocol_level: int = PROTOCOL_LEVEL_311,
                   properties: Properties | bytes | None = None) -> bytes:
    """A PUBLISH packet from its fields.

    ``topic`` may be the UTF-8 bytes already (encode once, send to many);
    ``properties`` may be a :class:`Properties` or an already encoded property
    block (length prefix included); both are ignored for level 4.
    """
    if isinstance(topic, str):
        try:
            topic = topic.encode()
        except UnicodeEncodeError:
            raise LocalProtocolError("topic is not encodable as UTF-8") from None
    tlen = len(topic)
    if tlen > 0xFFFF:
        raise LocalProtocolError("topic longer than 65535 bytes")
    if qos:
        if not 0 < qos < 3:
            raise LocalProtocolError(f"invalid QoS {qos!r}")
        if packet_id is None or not 0 < packet_id <= 0xFFFF:
            raise LocalProtocolError(f"packet identifier {packet_id!r} not in 1..65535")
        head = _PACK_U16(tlen) + topic + _PACK_U16(packet_id)
    else:
        if dup:
            raise LocalProtocolError("DUP set on a QoS 0 PUBLISH")
        if packet_id is not None:
            raise LocalProtocolError("packet identifier on a QoS 0 PUBLISH")
        head = _PACK_U16(tlen) + topic
    if protocol_level == PROTOCOL_LEVEL_5:
        if properties is None:
            head += b"\x00"
        elif isinstance(properties, Properties):
            head += encode_properties(properties, 3)
        else:
            head += properties
    elif protocol_level != PROTOCOL_LEVEL_311:
        raise LocalProtocolError(f"unsupported MQTT protocol level {protocol_level!r}")
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    size = len(head) + len(payload)
    if size < 128:
        return b"".join((bytes((first, size)), head, payload))
    if size > _MAX_REMAINING:
        raise LocalProtocolError(f"packet body of {size} bytes exceeds the MQTT maximum")
    return b"".join((_HEADER_BYTES[first], encode_varint(size), head, payload))


def publish_topic_field(topic: str) -> bytes:
    """The topic field of a PUBLISH (length prefix and UTF-8), as :func:`encode_publish`
    writes it; for callers that encode one topic once and reuse it."""
    try:
        raw = topic.encode()
    except UnicodeEncodeError:
        raise LocalProtocolError("topic is not encodable as UTF-8") from None
    if len(raw) > 0xFFFF:
        raise LocalProtocolError("topic longer than 65535 bytes")
    return _PACK_U16(len(raw)) + raw


def encode_publish_prepared(flags: int, variable_header: bytes, payload: bytes) -> bytes:
    """A PUBLISH from its first byte's flags nibble (``qos << 1 | dup << 3 | retain``,
    unchecked) and its finished variable header: the topic field from
    :func:`publish_topic_field`, then the packet id when QoS > 0, then (level 5) the
    property block. Byte-identical to :func:`encode_publish` for the same fields; the
    broker's delivery hot path, which caches the variable header per topic."""
    size = len(variable_header) + len(payload)
    first = 0x30 | flags
    if size < 128:
        head = _PACK_B2(first, size)
    elif size < 16384:
        head = _PACK_B3(first, size & 0x7F | 0x80, size >> 7)
    elif size > _MAX_REMAINING:
        raise LocalProtocolError(f"packet body of {size} bytes exceeds the MQTT maximum")
    else:
        head = _HEADER_BYTES[first] + encode_varint(size)
    return b"".join((head, variable_header, payload))


def _publish(p: Publish, v5: bool) -> bytes:
    return encode_publish(p.topic, p.payload, qos=p.qos, retain=p.retain, dup=p.dup,
                          packet_id=p.packet_id,
                          protocol_level=PROTOCOL_LEVEL_5 if v5 else PROTOCOL_LEVEL_311,
                          properties=p.properties if v5 else None)


# ------------------------------------------------------------------------------ others

def _connect(p: Connect, v5: bool) -> bytes:
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        if not 0 <= will.qos <= 2:
            raise LocalProtocolError(f"invalid will QoS {will.qos!r}")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.password is not None:
        if p.username is None and not v5:
            raise LocalProtocolError("MQTT 3.1.1 does not allow a password without a username")
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise LocalProtocolError(f"keep alive {p.keep_alive!r} not in 0..65535")
    if not 0 <= p.protocol_level <= 0xFF:
        raise LocalProtocolError(f"protocol level {p.protocol_level!r} not a byte")
    parts = [_str(p.protocol_name, "protocol name"),
             bytes((p.protocol_level, flags)), _PACK_U16(p.keep_alive)]
    if v5:
        parts.append(encode_properties(p.properties, 1))
    parts.append(_str(p.client_id, "client identifier"))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL_CONTEXT))
        parts.append(_str(will.topic, "will topic"))
        parts.append(_bin(will.payload, "will payload"))
    if p.username is not None:
        parts.append(_str(p.username, "user name"))
    if p.password is not None:
        parts.append(_bin(p.password, "password"))
    return _packet(0x10, b"".join(parts))


def _connack(p: Connack, v5: bool) -> bytes:
    code = _check_code(p.reason_code, CONNACK_REASON_CODES, "CONNACK")
    flags = 1 if p.session_present else 0
    if flags and code:
        raise LocalProtocolError("session present on a failed CONNACK")
    if v5:
        return _packet(0x20, bytes((flags, code)) + encode_properties(p.properties, 2))
    return bytes((0x20, 2, flags, connack_return_code_v311(code)))


def _ack(first: int, allowed: frozenset[int], name: str, context: int) -> Callable[
        [Puback | Pubrec | Pubrel | Pubcomp, bool], bytes]:
    def enc(p: Puback | Pubrec | Pubrel | Pubcomp, v5: bool) -> bytes:
        pid = _pid(p.packet_id)
        if not v5:
            return bytes((first, 2)) + pid
        code = _check_code(p.reason_code, allowed, name)
        props = encode_properties(p.properties, context)
        if props == b"\x00":
            if code == 0:
                return bytes((first, 2)) + pid
            return bytes((first, 3)) + pid + bytes((code,))
        return _packet(first, pid + bytes((code,)) + props)
    return enc


def encode_subscription_options(options: SubscriptionOptions, protocol_level: int) -> int:
    """The options byte of one SUBSCRIBE entry."""
    qos = options.qos
    if not 0 <= qos <= 2:
        raise LocalProtocolError(f"invalid subscription QoS {qos!r}")
    if protocol_level == PROTOCOL_LEVEL_5:
        rh = RetainHandling(options.retain_handling)
        return (qos | (4 if options.no_local else 0) | (8 if options.retain_as_published else 0)
                | (rh << 4))
    if options.no_local or options.retain_as_published or options.retain_handling:
        raise LocalProtocolError("MQTT 3.1.1 subscriptions only have a QoS option")
    return qos


def _subscribe(p: Subscribe, v5: bool) -> bytes:
    if not p.subscriptions:
        raise LocalProtocolError("SUBSCRIBE without topic filters")
    level = PROTOCOL_LEVEL_5 if v5 else PROTOCOL_LEVEL_311
    parts = [_pid(p.packet_id)]
    if v5:
        parts.append(encode_properties(p.properties, 8))
    for topic_filter, options in p.subscriptions:
        parts.append(_str(topic_filter, "topic filter"))
        parts.append(bytes((encode_subscription_options(options, level),)))
    return _packet(0x82, b"".join(parts))


def _suback(p: Suback, v5: bool) -> bytes:
    if not p.reason_codes:
        raise LocalProtocolError("SUBACK without reason codes")
    codes = bytes(_check_code(c, SUBACK_REASON_CODES, "SUBACK") for c in p.reason_codes)
    if v5:
        return _packet(0x90, _pid(p.packet_id) + encode_properties(p.properties, 9) + codes)
    # 3.1.1 knows 0, 1, 2 and 0x80 (Failure).
    return _packet(0x90, _pid(p.packet_id) + bytes(c if c < 0x80 else 0x80 for c in codes))


def _unsubscribe(p: Unsubscribe, v5: bool) -> bytes:
    if not p.topic_filters:
        raise LocalProtocolError("UNSUBSCRIBE without topic filters")
    parts = [_pid(p.packet_id)]
    if v5:
        parts.append(encode_properties(p.properties, 10))
    parts.extend(_str(f, "topic filter") for f in p.topic_filters)
    return _packet(0xA2, b"".join(parts))


def _unsuback(p: Unsuback, v5: bool) -> bytes:
    if not v5:
        return b"\xb0\x02" + _pid(p.packet_id)
    if not p.reason_codes:
        raise LocalProtocolError("MQTT 5 UNSUBACK without reason codes")
    codes = bytes(_check_code(c, UNSUBACK_REASON_CODES, "UNSUBACK") for c in p.reason_codes)
    return _packet(0xB0, _pid(p.packet_id) + encode_properties(p.properties, 11) + codes)


def _pingreq(p: Pingreq, v5: bool) -> bytes:
    return _PINGREQ


def _pingresp(p: Pingresp, v5: bool) -> bytes:
    return _PINGRESP


def _disconnect(p: Disconnect, v5: bool) -> bytes:
    if not v5:
        return _DISCONNECT_NORMAL
    code = _check_code(p.reason_code, DISCONNECT_REASON_CODES, "DISCONNECT")
    props = encode_properties(p.properties, 14)
    if props == b"\x00":
        return _DISCONNECT_NORMAL if code == 0 else bytes((0xE0, 1, code))
    return _packet(0xE0, bytes((code,)) + props)


def _auth(p: Auth, v5: bool) -> bytes:
    if not v5:
        raise LocalProtocolError("AUTH does not exist in MQTT 3.1.1")
    code = _check_code(p.reason_code, AUTH_REASON_CODES, "AUTH")
    props = encode_properties(p.properties, 15)
    if props == b"\x00" and code == 0:
        return _AUTH_SUCCESS
    return _packet(0xF0, bytes((code,)) + props)


_ENCODERS: Final[dict[type, Callable[[Any, bool], bytes]]] = {
    Connect: _connect,
    Connack: _connack,
    Publish: _publish,
    Puback: _ack(0x40, PUBACK_REASON_CODES, "PUBACK", 4),
    Pubrec: _ack(0x50, PUBACK_REASON_CODES, "PUBREC", 5),
    Pubrel: _ack(0x62, PUBREL_REASON_CODES, "PUBREL", 6),
    Pubcomp: _ack(0x70, PUBREL_REASON_CODES, "PUBCOMP", 7),
    Subscribe: _subscribe,
    Suback: _suback,
    Unsubscribe: _unsubscribe,
    Unsuback: _unsuback,
    Pingreq: _pingreq,
    Pingresp: _pingresp,
    Disconnect: _disconnect,
    Auth: _auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The wire bytes of ``packet`` for ``protocol_level`` 4 (3.1.1) or 5."""
    v5 = _check_level(protocol_level)
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise LocalProtocolError(f"not an MQTT packet: {type(packet).__name__}") from None
    return encoder(packet, v5)
