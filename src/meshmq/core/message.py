"""The broker's message: immutable once routed, shared by every subscriber.

Delivery state (redelivered flag, delivery count, who holds it) lives in the
queue entry that references the message, never in the message itself, so one
``Message`` object can sit in many subscriptions without copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from meshmq.core.destinations import Destination

PropertyValue = str | int | float | bool | None

DEFAULT_PRIORITY: Final = 4
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 9


# init=False: the hand-written __init__ below is compiled by mypyc in the compiled build,
# where the one dataclasses generates would run interpreted (a message is built per send).
@dataclass(slots=True, eq=False, init=False)
class Message:
    message_id: str
    destination: Destination
    body: bytes
    properties: dict[str, PropertyValue] = field(default_factory=dict)
    persistent: bool = False
    priority: int = DEFAULT_PRIORITY
    timestamp: int = 0  # ms since the epoch, set by the broker if the producer gave none
    expiration: int = 0  # absolute ms since the epoch; 0 = never expires
    correlation_id: str | None = None
    reply_to: Destination | None = None
    type: str | None = None
    group_id: str | None = None
    group_seq: int = 0
    producer_id: str = ""
    # Names of brokers this message has crossed, oldest first (loop prevention).
    broker_path: tuple[str, ...] = ()
    original_destination: Destination | None = None
    user_id: str | None = None
    # Protocol-specific hints preserved end to end (e.g. STOMP content-type, content-length).
    content_type: str | None = None
    # Cached wire encodings keyed by codec name, created on first use; not part of the
    # message's identity.
    wire_cache: dict[str, bytes] | None = field(default=None, repr=False)

    def __init__(self, message_id: str, destination: Destination, body: bytes,
                 properties: dict[str, PropertyValue] | None = None, persistent: bool = False,
                 priority: int = DEFAULT_PRIORITY, timestamp: int = 0, expiration: int = 0,
                 correlation_id: str | None = None, reply_to: Destination | None = None,
                 type: str | None = None, group_id: str | None = None,
                 group_seq: int = 0, producer_id: str = "",
                 broker_path: tuple[str, ...] = (),
                 original_destination: Destination | None = None, user_id: str | None = None,
                 content_type: str | None = None,
                 wire_cache: dict[str, bytes] | None = None) -> None:
        self.message_id = message_id
        self.destination = destination
        self.body = body
        self.properties = {} if properties is None else properties
        self.persistent = persistent
        self.priority = priority
        self.timestamp = timestamp
        self.expiration = expiration
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.type = type
        self.group_id = group_id
        self.group_seq = group_seq
        self.producer_id = producer_id
        self.broker_path = broker_path
        self.original_destination = original_destination
        self.user_id = user_id
        self.content_type = content_type
        self.wire_cache = wire_cache

    @property
    def size(self) -> int:
        """Memory cost used for memory limits and statistics: the body plus what one
        in-memory message and its queue entry measured (tracemalloc, CPython 3.11) on
        top of it, so ``memory_limit`` means real RAM, not just payload bytes."""
        return len(self.body) + 700 + 120 * len(self.properties)

    def is_expired(self, now_ms: int) -> bool:
        return self.expiration != 0 and now_ms >= self.expiration

    def copy_to(self, destination: Destination, **changes: object) -> Message:
        """A new message with another destination (DLQ, composite fan-out, network)."""
        fields = {name: getattr(self, name) for name in _FIELDS}
        fields["destination"] = destination
        fields["properties"] = dict(self.properties)
        fields["wire_cache"] = None
        fields.update(changes)
        return Message(**fields)


_FIELDS: Final = tuple(Message.__dataclass_fields__)
