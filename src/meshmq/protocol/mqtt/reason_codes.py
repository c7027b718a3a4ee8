"""MQTT 5 reason codes, MQTT 3.1.1 CONNACK return codes, and which codes each packet may carry.

meshmq's packet classes always carry a :class:`ReasonCode`, whatever the protocol
level: the encoder turns it into a 3.1.1 CONNACK return code (or SUBACK failure
byte) when writing protocol level 4, and the decoder turns 3.1.1 bytes back into
the matching :class:`ReasonCode`. So the broker reasons in one vocabulary.
"""

from __future__ import annotations

import enum

__all__ = [
    "AUTH_REASON_CODES",
    "CONNACK_REASON_CODES",
    "DISCONNECT_REASON_CODES",
    "PUBACK_REASON_CODES",
    "PUBREL_REASON_CODES",
    "SUBACK_REASON_CODES",
    "UNSUBACK_REASON_CODES",
    "ConnackReturnCode",
    "ReasonCode",
    "connack_return_code_v311",
    "reason_code_from_v311_connack",
]


class ReasonCode(enum.IntEnum):
    """MQTT 5.0 reason codes (spec section 2.4), with the spec's names.

    0x00 has four spec names (Success, Normal disconnection, Granted QoS 0) and
    they are aliases here: ``ReasonCode.NORMAL_DISCONNECTION is ReasonCode.SUCCESS``.
    Codes >= 0x80 are failures.
    """

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

    @property
    def is_failure(self) -> bool:
        return self >= 0x80


class ConnackReturnCode(enum.IntEnum):
    """MQTT 3.1.1 CONNACK return codes (spec 3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


_R = ReasonCode

# The six 3.1.1 return codes and the v5 reason codes they correspond to (a bijection).
_V311_TO_V5: dict[int, ReasonCode] = {
    0: _R.SUCCESS,
    1: _R.UNSUPPORTED_PROTOCOL_VERSION,
    2: _R.CLIENT_IDENTIFIER_NOT_VALID,
    3: _R.SERVER_UNAVAILABLE,
    4: _R.BAD_USER_NAME_OR_PASSWORD,
    5: _R.NOT_AUTHORIZED,
}
_V5_TO_V311: dict[int, ConnackReturnCode] = {
    int(v5): ConnackReturnCode(v311) for v311, v5 in _V311_TO_V5.items()}
# The closest 3.1.1 code for the other v5 CONNACK failures.
_V5_TO_V311.update({
    _R.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
    _R.BAD_AUTHENTICATION_METHOD: ConnackReturnCode.NOT_AUTHORIZED,
    _R.SERVER_BUSY: ConnackReturnCode.SERVER_UNAVAILABLE,
    _R.USE_ANOTHER_SERVER: ConnackReturnCode.SERVER_UNAVAILABLE,
    _R.SERVER_MOVED: ConnackReturnCode.SERVER_UNAVAILABLE,
    _R.CONNECTION_RATE_EXCEEDED: ConnackReturnCode.SERVER_UNAVAILABLE,
    _R.QUOTA_EXCEEDED: ConnackReturnCode.SERVER_UNAVAILABLE,
})


def connack_return_code_v311(reason_code: int) -> ConnackReturnCode:
    """The 3.1.1 CONNACK return code to send for a v5 CONNACK ``reason_code``.

    Failures without a close 3.1.1 equivalent (malformed packet, protocol error,
    ...) become SERVER_UNAVAILABLE, the 3.1.1 catch-all.
    """
    return _V5_TO_V311.get(reason_code, ConnackReturnCode.SERVER_UNAVAILABLE)


def reason_code_from_v311_connack(return_code: int) -> ReasonCode | None:
    """The v5 reason code for a 3.1.1 return code; None for the reserved values 6..255."""
    return _V311_TO_V5.get(return_code)


CONNACK_REASON_CODES: frozenset[int] = frozenset({
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90,
    0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
})
PUBACK_REASON_CODES: frozenset[int] = frozenset({
    0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})  # PUBACK and PUBREC
PUBREL_REASON_CODES: frozenset[int] = frozenset({0x00, 0x92})  # PUBREL and PUBCOMP
SUBACK_REASON_CODES: frozenset[int] = frozenset({
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
UNSUBACK_REASON_CODES: frozenset[int] = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_REASON_CODES: frozenset[int] = frozenset({
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
    0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
})
AUTH_REASON_CODES: frozenset[int] = frozenset({0x00, 0x18, 0x19})
