"""MQTT decoding errors: :class:`meshmq.errors.RemoteProtocolError` subclasses.

Every error carries ``reason_code``, the MQTT 5 reason code the server should
send back (in a CONNACK if the error was in the CONNECT packet, else in a
DISCONNECT), and ``packet_type``, the type of the packet being decoded when
known. For MQTT 3.1.1 peers the broker closes the connection instead, except
for the errors 3.1.1 answers with a CONNACK: use
:func:`~meshmq.protocol.mqtt.reason_codes.connack_return_code_v311` on
``reason_code`` when ``packet_type`` is CONNECT (unsupported protocol version ->
return code 1, invalid client identifier -> 2).

``code`` (the meshmq-wide machine code) is derived from the reason code, e.g.
``"mqtt-malformed-packet"``; ``retriable`` is False.
"""

from __future__ import annotations

from meshmq.errors import FrameTooLargeError, RemoteProtocolError

from .reason_codes import ReasonCode

__all__ = [
    "MalformedPacketError",
    "MqttProtocolError",
    "PacketTooLargeError",
    "TopicError",
    "UnsupportedProtocolVersionError",
]


class MqttProtocolError(RemoteProtocolError):
    """The peer sent an invalid MQTT packet; ``reason_code`` says what to answer."""

    default_reason_code: ReasonCode = ReasonCode.PROTOCOL_ERROR

    def __init__(self, message: str, *, reason_code: ReasonCode | None = None,
                 packet_type: int | None = None) -> None:
        rc = self.default_reason_code if reason_code is None else ReasonCode(reason_code)
        super().__init__(message, code="mqtt-" + rc.name.lower().replace("_", "-"))
        self.reason_code: ReasonCode = rc
        self.packet_type: int | None = packet_type

    def __reduce__(self) -> tuple[object, ...]:  # keep pickling (and copying) working
        return (_rebuild, (type(self), self.message, self.reason_code, self.packet_type))


def _rebuild(cls: type[MqttProtocolError], message: str, reason_code: ReasonCode,
             packet_type: int | None) -> MqttProtocolError:
    return cls(message, reason_code=reason_code, packet_type=packet_type)


class MalformedPacketError(MqttProtocolError):
    """The bytes cannot be parsed as the packet they claim to be (0x81)."""

    default_reason_code = ReasonCode.MALFORMED_PACKET


class PacketTooLargeError(MqttProtocolError, FrameTooLargeError):
    """The packet exceeds the decoder's ``max_packet_size`` (0x95)."""

    default_reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersionError(MqttProtocolError):
    """CONNECT asked for a protocol name or level we do not speak (0x84).

    Answer with a 3.1.1-format CONNACK, return code 1 (``20 02 00 01``): the
    client may not understand anything newer.
    """

    default_reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class TopicError(MqttProtocolError):
    """An invalid topic name (0x90) or topic filter (0x8F)."""

    default_reason_code = ReasonCode.TOPIC_NAME_INVALID
