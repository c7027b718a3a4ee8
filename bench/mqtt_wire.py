"""A tiny MQTT 3.1.1 codec for the benchmark: just what a load generator needs.

Packets: CONNECT/CONNACK, PUBLISH (QoS 0/1), PUBACK, SUBSCRIBE/SUBACK, PINGREQ/
PINGRESP, DISCONNECT. Sans-I/O: :class:`MqttParser` turns bytes into
``(packet_type, flags, payload)`` tuples; the ``encode_*`` functions build bytes.
:func:`parse_publish` splits a PUBLISH payload into topic, packet id and body.
"""

from __future__ import annotations

import struct

__all__ = [
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBLISH",
    "SUBACK",
    "SUBSCRIBE",
    "MqttParser",
    "encode_connack",
    "encode_connect",
    "encode_disconnect",
    "encode_pingreq",
    "encode_puback",
    "encode_publish",
    "encode_suback",
    "encode_subscribe",
    "parse_connect_client_id",
    "parse_publish",
    "parse_subscribe",
    "varint",
]

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
SUBSCRIBE = 8
SUBACK = 9
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14

_U16 = struct.Struct(">H")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return _U16.pack(len(raw)) + raw


def _packet(first: int, payload: bytes) -> bytes:
    return bytes((first,)) + varint(len(payload)) + payload


def encode_connect(client_id: str, *, clean: bool = True, keepalive: int = 0,
                   username: str | None = None, password: str | None = None) -> bytes:
    flags = 0x02 if clean else 0
    tail = _str(client_id)
    if username is not None:
        flags |= 0x80
        tail += _str(username)
    if password is not None:
        flags |= 0x40
        tail += _str(password)
    return _packet(CONNECT << 4, _str("MQTT") + bytes((4, flags)) + _U16.pack(keepalive) + tail)


def encode_connack(code: int = 0, session_present: bool = False) -> bytes:
    return _packet(CONNACK << 4, bytes((1 if session_present else 0, code)))


def encode_publish(topic: str | bytes, body: bytes, qos: int = 0, packet_id: int = 0,
                   retain: bool = False) -> bytes:
    head = _str(topic)
    if qos:
        head += _U16.pack(packet_id)
    return _packet((PUBLISH << 4) | (qos << 1) | (1 if retain else 0), head + body)


def encode_puback(packet_id: int) -> bytes:
    return b"\x40\x02" + _U16.pack(packet_id)


def encode_subscribe(packet_id: int, topics: list[tuple[str, int]]) -> bytes:
    payload = _U16.pack(packet_id) + b"".join(_str(t) + bytes((q,)) for t, q in topics)
    return _packet((SUBSCRIBE << 4) | 0x02, payload)


def encode_suback(packet_id: int, codes: list[int]) -> bytes:
    return _packet(SUBACK << 4, _U16.pack(packet_id) + bytes(codes))


def encode_pingreq() -> bytes:
    return b"\xc0\x00"


def encode_pingresp() -> bytes:
    return b"\xd0\x00"


def encode_disconnect() -> bytes:
    return b"\xe0\x00"


def parse_publish(flags: int, payload: bytes | memoryview) -> tuple[bytes, int, bytes]:
    """(topic, packet id or 0, body) of a PUBLISH packet's variable part."""
    (tlen,) = _U16.unpack_from(payload, 0)
    topic = bytes(payload[2:2 + tlen])
    pos = 2 + tlen
    pid = 0
    if flags & 0x06:
        (pid,) = _U16.unpack_from(payload, pos)
        pos += 2
    return topic, pid, bytes(payload[pos:])


def parse_subscribe(payload: bytes) -> tuple[int, list[tuple[str, int]]]:
    (pid,) = _U16.unpack_from(payload, 0)
    pos = 2
    topics = []
    while pos < len(payload):
        (tlen,) = _U16.unpack_from(payload, pos)
        topic = payload[pos + 2:pos + 2 + tlen].decode()
        qos = payload[pos + 2 + tlen]
        topics.append((topic, qos))
        pos += 3 + tlen
    return pid, topics


def parse_connect_client_id(payload: bytes) -> str:
    (plen,) = _U16.unpack_from(payload, 0)
    pos = 2 + plen + 1 + 1 + 2  # protocol name, level, flags, keepalive
    (clen,) = _U16.unpack_from(payload, pos)
    return payload[pos + 2:pos + 2 + clen].decode()


class MqttParser:
    """Incremental MQTT packet splitter: ``feed(bytes)`` -> list of
    ``(packet_type, flags, payload)``."""

    __slots__ = ("_buf", "max_packet")

    def __init__(self, max_packet: int = 256 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_packet = max_packet

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            first = buf[pos]
            mult = 1
            length = 0
            i = pos + 1
            complete = False
            while i < end and i - pos <= 4:
                b = buf[i]
                length += (b & 0x7F) * mult
                i += 1
                if not b & 0x80:
                    complete = True
                    break
                mult <<= 7
            if not complete:
                if i - pos > 4:
                    raise ValueError("malformed MQTT remaining length")
                break  # length bytes incomplete
            if length > self.max_packet:
                raise ValueError(f"MQTT packet of {length} bytes exceeds the limit")
            if end - i < length:
                break
            out.append((first >> 4, first & 0x0F, bytes(buf[i:i + length])))
            pos = i + length
        if pos:
            del buf[:pos]
        return out
