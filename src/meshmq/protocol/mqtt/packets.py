"""MQTT 3.1.1 and 5.0 control packets as dataclasses.

One class per packet type, shared by both protocol levels: fields that exist
only in MQTT 5 (properties, most reason codes) keep their defaults when a 3.1.1
packet is decoded and are left out when encoding for 3.1.1. Reason codes are
always :class:`ReasonCode` values (3.1.1 CONNACK return codes and SUBACK bytes
are translated by the codec). Strings are ``str``; payloads, passwords and
binary properties are ``bytes``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from .properties import Properties
from .reason_codes import ReasonCode

__all__ = [
    "PROTOCOL_LEVEL_5",
    "PROTOCOL_LEVEL_311",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "RetainHandling",
    "Suback",
    "Subscribe",
    "SubscriptionOptions",
    "Unsuback",
    "Unsubscribe",
    "Will",
]

PROTOCOL_LEVEL_311 = 4
PROTOCOL_LEVEL_5 = 5


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class RetainHandling(enum.IntEnum):
    """MQTT 5 subscription option: when to send retained messages."""

    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT. ``clean_start`` is 3.1.1's Clean Session flag."""

    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)
    protocol_name: str = "MQTT"
    protocol_level: int = PROTOCOL_LEVEL_5
    packet_type: ClassVar[PacketType] = PacketType.CONNECT


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.CONNACK


@dataclass(slots=True)
class Publish:
    """PUBLISH. ``packet_id`` is None for QoS 0 and a non-zero int otherwise.

    In MQTT 5 ``topic`` may be "" when ``properties.topic_alias`` is set (the
    receiver resolves the alias; the codec does not keep alias state).
    """

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.PUBLISH


@dataclass(slots=True)
class Puback:
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.PUBACK


@dataclass(slots=True)
class Pubrec:
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.PUBREC


@dataclass(slots=True)
class Pubrel:
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.PUBREL


@dataclass(slots=True)
class Pubcomp:
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP


@dataclass(slots=True, frozen=True)
class SubscriptionOptions:
    """Per-filter options; 3.1.1 only has ``qos`` (the others must stay default)."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: RetainHandling = RetainHandling.SEND_ON_SUBSCRIBE


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]]
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE


@dataclass(slots=True)
class Suback:
    """SUBACK: one reason code per filter (GRANTED_QOS_n or a failure)."""

    packet_id: int
    reason_codes: list[ReasonCode]
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE


@dataclass(slots=True)
class Unsuback:
    """UNSUBACK. 3.1.1 has no reason codes: decoded as [], ignored when encoding."""

    packet_id: int
    reason_codes: list[ReasonCode] = field(default_factory=list)
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK


@dataclass(slots=True)
class Pingreq:
    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(slots=True)
class Pingresp:
    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT; 3.1.1 has neither reason code nor properties."""

    reason_code: ReasonCode = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT


@dataclass(slots=True)
class Auth:
    """AUTH (MQTT 5 only)."""

    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)
    packet_type: ClassVar[PacketType] = PacketType.AUTH


Packet: TypeAlias = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)
