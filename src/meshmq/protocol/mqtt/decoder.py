"""Incremental sans-I/O MQTT 3.1.1 / 5.0 decoder: bytes in, packets out.

``feed`` takes whatever bytes arrived and returns every packet they completed;
the partial rest stays buffered. Checks happen as early as the bytes allow (the
first byte's type and flags at once, the size as soon as the remaining length
is known), so garbage and oversized packets are rejected without buffering them.

Errors are :class:`MqttProtocolError` subclasses (all
:class:`meshmq.errors.RemoteProtocolError`) carrying the MQTT 5 reason code to
answer with. After an error the decoder is dead: every later ``feed`` raises
again; packets completed earlier in the failing ``feed`` call are kept in
``packets_before_error``.

Hot path: when no partial packet is buffered, packets are parsed straight out of
the ``bytes`` given to ``feed`` (no copy); otherwise the buffer is only turned
into bytes once the awaited packet is complete, so byte-at-a-time feeding stays
linear. PUBLISH without properties (or with an empty property block) skips the
property decoder; strings are decoded in one C call each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .errors import (
    MalformedPacketError,
    MqttProtocolError,
    PacketTooLargeError,
    TopicError,
    UnsupportedProtocolVersionError,
)
from .packets import (
    PROTOCOL_LEVEL_5,
    PROTOCOL_LEVEL_311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
    Will,
)
from .properties import WILL_CONTEXT, Properties, decode_properties, new_properties
from .reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
    ReasonCode,
    reason_code_from_v311_connack,
)
from .topics import validate_topic_filter

__all__ = ["DEFAULT_MAX_PACKET_SIZE", "MqttDecoder"]

DEFAULT_MAX_PACKET_SIZE: Final = 256 * 1024 * 1024

# The flags nibble each packet type must carry (PUBLISH: checked separately).
_REQUIRED_FLAGS: Final = (-1, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_FROM_CLIENT: Final = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_FROM_SERVER: Final = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})
_CODES: Final[dict[int, ReasonCode]] = {int(c): c for c in ReasonCode}
_SUBACK_311: Final = frozenset({0x00, 0x01, 0x02, 0x80})
_NAMES: Final = {t.value: t.name for t in PacketType}


def _build_options() -> tuple[tuple[SubscriptionOptions | None, ...], ...]:
    """Subscription options for every byte value, per level (None: invalid byte)."""
    v4: list[SubscriptionOptions | None] = [None] * 256
    v5: list[SubscriptionOptions | None] = [None] * 256
    for byte in range(256):
        qos = byte & 3
        if qos == 3:
            continue
        if byte < 4:
            v4[byte] = SubscriptionOptions(qos)
        rh = (byte >> 4) & 3
        if byte < 0x40 and rh != 3:
            v5[byte] = SubscriptionOptions(qos, bool(byte & 4), bool(byte & 8),
                                           RetainHandling(rh))
    return tuple(v4), tuple(v5)


_OPTIONS_311, _OPTIONS_5 = _build_options()


def _str(src: bytes, p: int, end: int, what: str) -> tuple[str, int]:
    if p + 2 > end:
        raise MalformedPacketError(f"truncated {what}")
    stop = p + 2 + (src[p] << 8 | src[p + 1])
    if stop > end:
        raise MalformedPacketError(f"truncated {what}")
    try:
        text = src[p + 2:stop].decode()
    except UnicodeDecodeError:
        raise MalformedPacketError(f"invalid UTF-8 in {what}") from None
    if "\x00" in text:
        raise MalformedPacketError(f"U+0000 in {what}")
    return text, stop


def _bin(src: bytes, p: int, end: int, what: str) -> tuple[bytes, int]:
    if p + 2 > end:
        raise MalformedPacketError(f"truncated {what}")
    stop = p + 2 + (src[p] << 8 | src[p + 1])
    if stop > end:
        raise MalformedPacketError(f"truncated {what}")
    return src[p + 2:stop], stop


def _pid(src: bytes, p: int, end: int) -> int:
    if p + 2 > end:
        raise MalformedPacketError("truncated packet identifier")
    pid = src[p] << 8 | src[p + 1]
    if pid == 0:
        raise MqttProtocolError("packet identifier 0")
    return pid


def _code(byte: int, allowed: frozenset[int], what: str) -> ReasonCode:
    if byte not in allowed:
        raise MqttProtocolError(f"reason code 0x{byte:02X} not valid in {what}")
    return _CODES[byte]


def _end(p: int, end: int, what: str) -> None:
    if p != end:
        raise MalformedPacketError(f"unexpected bytes at the end of {what}")


def _topic_name(raw: bytes) -> str:
    """The PUBLISH topic name in ``raw`` (length prefix stripped), checked, and cached
    in ``_TOPIC_NAMES`` (one dict lookup per PUBLISH on a known topic). Empty topics
    are checked by the caller: they depend on the protocol level."""
    try:
        topic = raw.decode()
    except UnicodeDecodeError:
        raise MalformedPacketError("invalid UTF-8 in PUBLISH topic") from None
    if "+" in topic or "#" in topic:
        raise TopicError(f"wildcard in PUBLISH topic {topic[:64]!r}")
    if "\x00" in topic:
        raise MalformedPacketError("U+0000 in PUBLISH topic")
    if len(raw) <= _TOPIC_NAME_CACHED_BYTES:
        if len(_TOPIC_NAMES) >= _TOPIC_NAMES_MAX:
            _TOPIC_NAMES.clear()
        _TOPIC_NAMES[raw] = topic
    return topic


# Valid PUBLISH topic names by their UTF-8 bytes, shared by all decoders (the mapping
# is pure); bounded by clearing, and long names are not kept (at most ~3 MB).
# (server side, connected, protocol level) -> MqttDecoder._valid_first for that state.
_VALID_FIRST: Final[dict[tuple[bool, bool, int | None], bytes]] = {}
_TOPIC_NAMES: Final[dict[bytes, str]] = {}
_TOPIC_NAMES_MAX: Final = 10_000
_TOPIC_NAME_CACHED_BYTES: Final = 256
_new_object: Final = object.__new__

_Decode = Callable[[bytes, int, int, int], Packet]


class MqttDecoder:
    """Turns a byte stream from one peer into :data:`Packet` objects.

    ``server_side=True`` (the broker): the peer is a client; with
    ``protocol_level=None`` the first packet must be CONNECT, whose level (4 or
    5) then governs decoding, and any later CONNECT is a protocol error. Passing
    ``protocol_level`` on the server side means the connection is already
    established at that level. ``server_side=False`` (a client): decode what a
    server sends at the given ``protocol_level`` (required).

    ``max_packet_size`` bounds a whole packet, fixed header included (0x95).
    ``retain_available=False`` rejects retained PUBLISHes and wills (0x9A);
    ``maximum_qos`` rejects higher-QoS PUBLISHes and wills (0x9B). Topic alias
    bounds, receive maximum, session state: the session layer's job.
    """

    __slots__ = (
        "_buf",
        "_connected",
        "_decoders",
        "_error",
        "_level",
        "_need",
        "_server_side",
        "_valid_first",
        "max_packet_size",
        "maximum_qos",
        "packets_before_error",
        "retain_available",
    )

    def __init__(self, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
                 protocol_level: int | None = None, *, server_side: bool = True,
                 retain_available: bool = True, maximum_qos: int = 2) -> None:
        if protocol_level not in (None, PROTOCOL_LEVEL_311, PROTOCOL_LEVEL_5):
            raise ValueError(f"unsupported MQTT protocol level {protocol_level!r}")
        if protocol_level is None and not server_side:
            raise ValueError("a client-side decoder needs its protocol_level")
        if max_packet_size < 2:
            raise ValueError("max_packet_size must be at least 2")
        self.max_packet_size = max_packet_size
        self._server_side = server_side
        self.retain_available = retain_available
        self.maximum_qos = maximum_qos
        self._level = protocol_level
        self._connected = protocol_level is not None
        self._buf = bytearray()
        self._need = 1
        self._valid_first: bytes = b""
        self._update_valid_first()
        self._error: MqttProtocolError | None = None
        self.packets_before_error: list[Packet] = []
        self._decoders: tuple[_Decode | None, ...] = (
            None, self._connect, self._connack, self._publish,
            self._ack(Puback, PUBACK_REASON_CODES), self._ack(Pubrec, PUBACK_REASON_CODES),
            self._ack(Pubrel, PUBREL_REASON_CODES), self._ack(Pubcomp, PUBREL_REASON_CODES),
            self._subscribe, self._suback, self._unsubscribe, self._unsuback,
            self._pingreq, self._pingresp, self._disconnect, self._auth,
        )

    @property
    def server_side(self) -> bool:
        return self._server_side

    @property
    def protocol_level(self) -> int | None:
        """4 or 5 once known (from CONNECT on the server side), else None."""
        return self._level

    @property
    def buffered(self) -> int:
        """Received bytes not yet returned as packets."""
        return len(self._buf)

    def unparsed(self) -> bytes:
        """The received bytes not yet returned as packets (the start of the next)."""
        return bytes(self._buf)

    @property
    def error(self) -> MqttProtocolError | None:
        """The error that killed this decoder, if any."""
        return self._error

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add ``data`` and return every packet it completed, in order."""
        if self._error is not None:
            err = self._error
            raise type(err)(err.message, reason_code=err.reason_code,
                            packet_type=err.packet_type)
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            src = bytes(buf)
            buf.clear()
        else:
            src = data if type(data) is bytes else bytes(data)
        packets: list[Packet] = []
        n = len(src)
        pos = 0
        ptype = None
        valid_first = self._valid_first
        max_size = self.max_packet_size
        decoders = self._decoders
        add = packets.append
        try:
            while pos < n:
                first = src[pos]
                ptype = first >> 4
                if not valid_first[first]:
                    # Raises, or accepts the first CONNECT (the table changes after it).
                    self._check_first_byte(ptype, first & 0x0F)
                # Remaining length: one byte in the common case.
                if pos + 1 >= n:
                    self._need = n - pos + 1
                    break
                size = src[pos + 1]
                start = pos + 2
                if size >= 0x80:
                    # Two bytes inline (128..16383: most PUBLISHes); longer or not
                    # minimal (second byte 0) in _remaining_length.
                    if start < n and 0 < src[start] < 0x80:
                        size = (size & 0x7F) | src[start] << 7
                        start += 1
                    else:
                        size, start = self._remaining_length(src, pos + 1, n)
                    if start < 0:
                        self._need = n - pos + 1
                        break
                end = start + size
                if end - pos > max_size:
                    raise PacketTooLargeError(
                        f"packet of {end - pos} bytes exceeds the maximum of "
                        f"{self.max_packet_size}")
                if end > n:
                    self._need = end - pos
                    break
                decode = decoders[ptype]
                assert decode is not None
                add(decode(src, first & 0x0F, start, end))
                if ptype == 1:
                    valid_first = self._valid_first
                pos = end
                ptype = None
            else:
                self._need = 1
        except MqttProtocolError as exc:
            if exc.packet_type is None and ptype:
                exc.packet_type = ptype
            self._die(exc, packets)
            raise
        except Exception as exc:  # pragma: no cover - a decoder bug must not leak raw errors
            error = MalformedPacketError(f"undecodable packet ({type(exc).__name__})",
                                         packet_type=ptype or None)
            self._die(error, packets)
            raise error from exc
        if pos < n:
            buf += memoryview(src)[pos:]
        return packets

    def _die(self, exc: MqttProtocolError, packets: list[Packet]) -> None:
        self._error = exc
        self.packets_before_error = packets
        self._buf.clear()

    def _update_valid_first(self) -> None:
        """Which first bytes pass :meth:`_check_first_byte` in this state: computed once
        per state for the process (trying all 256 costs about a millisecond, which every
        connection would pay three times)."""
        key = (self._server_side, self._connected, self._level)
        table = _VALID_FIRST.get(key)
        if table is None:
            valid = bytearray(256)
            for byte in range(256):
                try:
                    self._check_first_byte(byte >> 4, byte & 0x0F)
                except MqttProtocolError:
                    continue
                valid[byte] = byte >> 4 != 1  # CONNECT always takes the slow path
            table = _VALID_FIRST[key] = bytes(valid)
        self._valid_first = table

    @staticmethod
    def _remaining_length(src: bytes, p: int, n: int) -> tuple[int, int]:
        """Decode a multi-byte remaining length at ``p``; ``(size, start)`` or (0, -1)."""
        value = 0
        shift = 0
        for i in range(p, p + 4):
            if i >= n:
                return 0, -1
            byte = src[i]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if byte == 0:
                    raise MalformedPacketError("remaining length not minimally encoded")
                return value, i + 1
            shift += 7
        raise MalformedPacketError("remaining length longer than 4 bytes")

    def _check_first_byte(self, ptype: int, flags: int) -> None:
        if ptype == 3:
            if flags & 6 == 6:
                raise MalformedPacketError("PUBLISH with QoS 3")
            if flags & 0x0E == 8:
                raise MalformedPacketError("DUP set on a QoS 0 PUBLISH")
        elif ptype == 0:
            raise MalformedPacketError("reserved packet type 0")
        elif flags != _REQUIRED_FLAGS[ptype]:
            raise MalformedPacketError(f"invalid fixed header flags 0x{flags:X} "
                                       f"for {_NAMES[ptype]}")
        if self.server_side:
            if not self._connected:
                if ptype != 1:
                    raise MqttProtocolError(f"{_NAMES[ptype]} before CONNECT")
                return
            if ptype not in _FROM_CLIENT:
                raise MqttProtocolError(f"{_NAMES[ptype]} sent by a client")
            if ptype == 1:
                raise MqttProtocolError("second CONNECT")
        elif ptype not in _FROM_SERVER:
            raise MqttProtocolError(f"{_NAMES[ptype]} sent by a server")
        if ptype == 15 and self._level != PROTOCOL_LEVEL_5:
            raise MalformedPacketError("AUTH does not exist in MQTT 3.1.1")
        if ptype == 14 and not self.server_side and self._level != PROTOCOL_LEVEL_5:
            raise MqttProtocolError("DISCONNECT sent by an MQTT 3.1.1 server")

    # ------------------------------------------------------------------ packet bodies

    def _connect(self, src: bytes, flags: int, p: int, end: int) -> Connect:
        name, p = _str(src, p, end, "protocol name")
        if p >= end:
            raise MalformedPacketError("truncated CONNECT")
        level = src[p]
        if name != "MQTT":
            if name == "MQIsdp":
                raise UnsupportedProtocolVersionError(
                    f"MQTT 3.1 (MQIsdp, level {level}) is not supported")
            raise MqttProtocolError(f"unknown protocol name {name[:32]!r}",
                                    reason_code=ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
        if level not in (PROTOCOL_LEVEL_311, PROTOCOL_LEVEL_5):
            raise UnsupportedProtocolVersionError(f"unsupported protocol level {level}")
        # Known from here on, so an error CONNACK can be written in the client's version.
        self._level = level
        self._update_valid_first()
        v5 = level == PROTOCOL_LEVEL_5
        if p + 4 > end:
            raise MalformedPacketError("truncated CONNECT")
        cflags = src[p + 1]
        keep_alive = src[p + 2] << 8 | src[p + 3]
        p += 4
        if cflags & 0x01:
            raise MalformedPacketError("reserved CONNECT flag set")
        will_flag = cflags & 0x04
        will_qos = (cflags >> 3) & 3
        will_retain = bool(cflags & 0x20)
        if will_qos == 3:
            raise MalformedPacketError("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise MalformedPacketError("will QoS or retain set without the will flag")
        has_password = cflags & 0x40
        has_username = cflags & 0x80
        if has_password and not has_username and not v5:
            raise MalformedPacketError("password without user name (MQTT 3.1.1)")
        props = new_properties()
        if v5:
            props, p = decode_properties(src, p, end, 1)
            if props.authentication_data is not None and props.authentication_method is None:
                raise MqttProtocolError("authentication data without authentication method")
        client_id, p = _str(src, p, end, "client identifier")
        clean = bool(cflags & 0x02)
        if not v5 and not client_id and not clean:
            raise MqttProtocolError("empty client identifier needs clean session",
                                    reason_code=ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        will = None
        if will_flag:
            will_props = new_properties()
            if v5:
                will_props, p = decode_properties(src, p, end, WILL_CONTEXT)
            will_topic, p = _str(src, p, end, "will topic")
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise TopicError(f"invalid will topic {will_topic[:64]!r}")
            will_payload, p = _bin(src, p, end, "will payload")
            if will_retain and not self.retain_available:
                raise MqttProtocolError("retained will, but retain is not available",
                                        reason_code=ReasonCode.RETAIN_NOT_SUPPORTED)
            if will_qos > self.maximum_qos:
                raise MqttProtocolError(f"will QoS {will_qos} above the maximum "
                                        f"{self.maximum_qos}",
                                        reason_code=ReasonCode.QOS_NOT_SUPPORTED)
            will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
        username = password = None
        if has_username:
            username, p = _str(src, p, end, "user name")
        if has_password:
            password, p = _bin(src, p, end, "password")
        _end(p, end, "CONNECT")
        self._connected = True
        self._update_valid_first()
        return Connect(client_id, clean, keep_alive, username, password, will, props,
                       name, level)

    def _connack(self, src: bytes, flags: int, p: int, end: int) -> Connack:
        if p + 2 > end:
            raise MalformedPacketError("truncated CONNACK")
        ack_flags = src[p]
        byte = src[p + 1]
        if ack_flags & 0xFE:
            raise MalformedPacketError("reserved CONNACK flags set")
        props = new_properties()
        if self._level == PROTOCOL_LEVEL_5:
            code = _code(byte, CONNACK_REASON_CODES, "CONNACK")
            props, p = decode_properties(src, p + 2, end, 2)
        else:
            v311 = reason_code_from_v311_connack(byte)
            if v311 is None:
                raise MqttProtocolError(f"reserved CONNACK return code {byte}")
            code = v311
            p += 2
        _end(p, end, "CONNACK")
        if ack_flags and code:
            raise MqttProtocolError("session present on a failed CONNACK")
        return Connack(bool(ack_flags), code, props)

    def _publish(self, src: bytes, flags: int, p: int, end: int) -> Publish:
        if p + 2 > end:
            raise MalformedPacketError("truncated PUBLISH topic")
        stop = p + 2 + (src[p] << 8 | src[p + 1])
        if stop > end:
            raise MalformedPacketError("truncated PUBLISH topic")
        raw = src[p + 2:stop]
        topic = _TOPIC_NAMES.get(raw)  # checked before: skip decoding and checks
        if topic is None:
            topic = _topic_name(raw)
        qos = (flags >> 1) & 3
        packet_id = None
        if qos:
            if stop + 2 > end:
                raise MalformedPacketError("truncated packet identifier")
            packet_id = src[stop] << 8 | src[stop + 1]
            if packet_id == 0:
                raise MqttProtocolError("packet identifier 0")
            stop += 2
        if self._level == PROTOCOL_LEVEL_5:
            if stop < end and src[stop] == 0:
                props = _new_object(Properties)  # new_properties(), without the call
                stop += 1
            else:
                props, stop = decode_properties(src, stop, end, 3)
                if self.server_side and props.subscription_identifiers:
                    raise MqttProtocolError("subscription identifier in a client's PUBLISH")
                if props.response_topic is not None and (
                        "+" in props.response_topic or "#" in props.response_topic
                        or not props.response_topic):
                    raise MqttProtocolError("invalid response topic")
            if not topic and props.topic_alias is None:
                raise MqttProtocolError("empty topic without a topic alias")
        else:
            props = _new_object(Properties)
            if not topic:
                raise TopicError("empty PUBLISH topic")
        retain = flags & 1 == 1
        if retain and not self.retain_available:
            raise MqttProtocolError("retain is not available",
                                    reason_code=ReasonCode.RETAIN_NOT_SUPPORTED)
        if qos > self.maximum_qos:
            raise MqttProtocolError(f"QoS {qos} above the maximum {self.maximum_qos}",
                                    reason_code=ReasonCode.QOS_NOT_SUPPORTED)
        return Publish(topic, src[stop:end], qos, retain, flags & 8 == 8, packet_id, props)

    def _ack(self, cls: type[Puback | Pubrec | Pubrel | Pubcomp],
             allowed: frozenset[int]) -> _Decode:
        what = cls.__name__.upper()

        def decode(src: bytes, flags: int, p: int, end: int) -> Packet:
            pid = _pid(src, p, end)
            size = end - p
            if size == 2:
                return cls(pid)
            if self._level != PROTOCOL_LEVEL_5:
                raise MalformedPacketError(f"{what} longer than 2 bytes (MQTT 3.1.1)")
            code = _code(src[p + 2], allowed, what)
            if size == 3:
                return cls(pid, code)
            props, p = decode_properties(src, p + 3, end, cls.packet_type)
            _end(p, end, what)
            return cls(pid, code, props)
        return decode

    def _subscribe(self, src: bytes, flags: int, p: int, end: int) -> Subscribe:
        pid = _pid(src, p, end)
        p += 2
        level = self._level or PROTOCOL_LEVEL_5
        v5 = level == PROTOCOL_LEVEL_5
        props = new_properties()
        table = _OPTIONS_311
        if v5:
            props, p = decode_properties(src, p, end, 8)
            table = _OPTIONS_5
        subs: list[tuple[str, SubscriptionOptions]] = []
        while p < end:
            topic_filter, p = _str(src, p, end, "topic filter")
            if p >= end:
                raise MalformedPacketError("topic filter without subscription options")
            byte = src[p]
            p += 1
            options = table[byte]
            if options is None:
                if v5 and byte < 0x40 and byte & 3 != 3:
                    raise MqttProtocolError("retain handling 3")
                raise MalformedPacketError(f"invalid subscription options 0x{byte:02X}")
            validate_topic_filter(topic_filter, protocol_level=level)
            if options.no_local and v5 and topic_filter.startswith("$share/"):
                raise MqttProtocolError("no local on a shared subscription")
            subs.append((topic_filter, options))
        if not subs:
            raise MqttProtocolError("SUBSCRIBE without topic filters")
        return Subscribe(pid, subs, props)

    def _suback(self, src: bytes, flags: int, p: int, end: int) -> Suback:
        pid = _pid(src, p, end)
        p += 2
        props = new_properties()
        allowed = _SUBACK_311
        if self._level == PROTOCOL_LEVEL_5:
            props, p = decode_properties(src, p, end, 9)
            allowed = SUBACK_REASON_CODES
        if p >= end:
            raise MqttProtocolError("SUBACK without reason codes")
        codes = [_code(b, allowed, "SUBACK") for b in src[p:end]]
        return Suback(pid, codes, props)

    def _unsubscribe(self, src: bytes, flags: int, p: int, end: int) -> Unsubscribe:
        pid = _pid(src, p, end)
        p += 2
        level = self._level or PROTOCOL_LEVEL_5
        props = new_properties()
        if level == PROTOCOL_LEVEL_5:
            props, p = decode_properties(src, p, end, 10)
        filters: list[str] = []
        while p < end:
            topic_filter, p = _str(src, p, end, "topic filter")
            validate_topic_filter(topic_filter, protocol_level=level)
            filters.append(topic_filter)
        if not filters:
            raise MqttProtocolError("UNSUBSCRIBE without topic filters")
        return Unsubscribe(pid, filters, props)

    def _unsuback(self, src: bytes, flags: int, p: int, end: int) -> Unsuback:
        pid = _pid(src, p, end)
        p += 2
        if self._level != PROTOCOL_LEVEL_5:
            _end(p, end, "UNSUBACK")
            return Unsuback(pid)
        props, p = decode_properties(src, p, end, 11)
        if p >= end:
            raise MqttProtocolError("UNSUBACK without reason codes")
        codes = [_code(b, UNSUBACK_REASON_CODES, "UNSUBACK") for b in src[p:end]]
        return Unsuback(pid, codes, props)

    def _pingreq(self, src: bytes, flags: int, p: int, end: int) -> Pingreq:
        _end(p, end, "PINGREQ")
        return Pingreq()

    def _pingresp(self, src: bytes, flags: int, p: int, end: int) -> Pingresp:
        _end(p, end, "PINGRESP")
        return Pingresp()

    def _disconnect(self, src: bytes, flags: int, p: int, end: int) -> Disconnect:
        if p == end:
            return Disconnect()
        if self._level != PROTOCOL_LEVEL_5:
            raise MalformedPacketError("DISCONNECT with a body (MQTT 3.1.1)")
        code = _code(src[p], DISCONNECT_REASON_CODES, "DISCONNECT")
        props = new_properties()
        p += 1
        if p < end:
            props, p = decode_properties(src, p, end, 14)
            _end(p, end, "DISCONNECT")
            if not self.server_side and props.session_expiry_interval is not None:
                raise MqttProtocolError("session expiry interval in a server's DISCONNECT")
        return Disconnect(code, props)

    def _auth(self, src: bytes, flags: int, p: int, end: int) -> Auth:
        if p == end:
            return Auth()
        code = _code(src[p], AUTH_REASON_CODES, "AUTH")
        props = new_properties()
        p += 1
        if p < end:
            props, p = decode_properties(src, p, end, 15)
            _end(p, end, "AUTH")
        return Auth(code, props)
