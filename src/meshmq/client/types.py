"""Value types shared by the STOMP and MQTT halves of the client."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from .options import Endpoint

__all__ = ["AckMode", "Event", "EventKind", "Message", "SubscriptionSpec"]

#: STOMP header / MQTT 5 user property carrying a producer's stable id for a message.
DEDUP_HEADER = "dedup-id"
#: STOMP CONNECTED header / MQTT 5 CONNACK user property listing the broker's peers.
PEERS_HEADER = "meshmq-peers"


class AckMode(enum.Enum):
    AUTO = "auto"  # acknowledged by the broker on dispatch (STOMP) / at once (MQTT)
    CLIENT = "client"  # cumulative ack (STOMP); per message for MQTT
    CLIENT_INDIVIDUAL = "client-individual"


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """What the application asked for; replayed on every reconnect."""

    id: str
    destination: str
    ack: AckMode = AckMode.AUTO
    durable_name: str | None = None
    selector: str | None = None
    qos: int = 1  # MQTT only
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Message:
    """A received message. ``headers`` are STOMP headers or MQTT 5 user properties."""

    destination: str
    body: bytes
    headers: dict[str, str]
    subscription: str
    redelivered: bool = False
    ack_id: str | None = None  # STOMP ack / message id, MQTT packet id (as str)
    generation: int = 0  # which connection delivered it (acks of old ones are dropped)
    key: str | None = None  # the duplicate-filter key

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class EventKind(enum.Enum):
    CONNECTED = "connected"  # first connection
    INTERRUPTED = "interrupted"  # the connection dropped; reconnecting
    RESUMED = "resumed"  # connected again, subscriptions restored, sends replayed
    FAILED = "failed"  # reconnect budget spent; the client is unusable
    TOPOLOGY = "topology"  # the broker pushed a new peer list
    EVENTS_MISSED = "events-missed"  # agent: a non-durable subscriber saw a sequence gap


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    endpoint: Endpoint | None = None
    error: BaseException | None = None
    peers: tuple[str, ...] = ()
    topic: str | None = None  # EVENTS_MISSED: the topic the events were published on
    missed: int = 0  # EVENTS_MISSED: how many events of one publisher did not arrive
