"""Consumers: what a subscription asked for and what it currently holds."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshmq.core.destinations import Destination

if TYPE_CHECKING:
    from meshmq.core.broker import TopicSubscription
    from meshmq.core.message import Message
    from meshmq.core.queue import Entry, Queue
    from meshmq.core.selector import Selector


class AckMode(enum.Enum):
    AUTO = "auto"  # acknowledged when dispatched
    CLIENT = "client"  # cumulative: acking one acks every earlier one of the subscription
    CLIENT_INDIVIDUAL = "client-individual"


@dataclass(frozen=True, slots=True)
class ConsumerOrigin:
    """The client's consumer that a relayed consumer's stand-in on the owning shard runs
    for, named as the node names it (``s<k>-c<n>``): the owner's advisories show the
    client's consumer, not the shard link's stand-in."""

    consumer_id: str
    connection_id: str
    client_id: str | None
    ack_mode: str
    no_local: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A subscription request, protocol-neutral."""

    destinations: tuple[Destination, ...]
    ack_mode: AckMode = AckMode.AUTO
    prefetch: int | None = None  # None: the destination policy's default
    priority: int = 0
    exclusive: bool = False
    selector: str | None = None
    no_local: bool = False
    browser: bool = False
    subscription_name: str | None = None  # durable topic subscription (needs a client id)
    retroactive: bool = False
    # MQTT 5 shared subscription ($share/<group>/<filter>): the group's consumers
    # compete for the topic's messages like queue consumers.
    shared_group: str | None = None
    # Set on a network bridge's demand subscription: the brokers the remote consumer's
    # interest crossed to reach this broker (nearest last). None: a local consumer.
    network_path: tuple[str, ...] | None = None
    # ... and the real consumers it stands for ("<broker>/<consumer id>").
    network_origins: tuple[str, ...] = ()
    # Set on a stand-in the owning shard runs for another shard's relayed consumer.
    origin: ConsumerOrigin | None = None


class Consumer:
    """One subscription of one connection; may draw from several queues
    (wildcards, composites, a topic subscription queue)."""

    __slots__ = (
        "acked_count",
        "burst",
        "by_message_id",
        "closed",
        "connection_id",
        "dispatched",
        "dispatched_count",
        "id",
        "net_filter",
        "next_tag",
        "paused",
        "prefetch",
        "readable",
        "selector",
        "sources",
        "spec",
        "subscription_id",
        "topic_sub",
    )

    def __init__(self, consumer_id: str, connection_id: str, subscription_id: str,
                 spec: ConsumerSpec, prefetch: int, selector: Selector | None) -> None:
        self.id = consumer_id
        self.connection_id = connection_id
        self.subscription_id = subscription_id  # the protocol's id (STOMP `id` header)
        self.spec = spec
        self.prefetch = max(1, prefetch)
        self.selector = selector
        self.sources: list[Queue] = []
        # The topic subscription (plain, durable or shared) feeding this consumer's topics.
        self.topic_sub: TopicSubscription | None = None
        self.dispatched: dict[int, Entry] = {}  # delivery tag -> entry, in dispatch order
        self.by_message_id: dict[str, int] = {}  # message id -> tag, for 1.0/1.1 acks
        self.next_tag = 1
        self.paused = False  # transport back-pressure: the socket's buffer is full
        # Deliveries in the current pump. Auto-ack consumers have no ack window, so this
        # caps how much one pump can push into a socket before the transport's own
        # back-pressure (pause_writing) gets a chance to act.
        self.burst = 0
        self.closed = False
        self.dispatched_count = 0
        self.acked_count = 0
        # Network demand subscriptions: may this message go to the remote broker (loop
        # prevention, TTL, rate limit)? Checked before the selector.
        self.net_filter: Callable[[Message], bool] | None = None
        # A wildcard subscription under an authorization map: which of the queues it
        # matches its subscriber may read (None: all).
        self.readable: Callable[[Destination], bool] | None = None

    @property
    def sub_queue(self) -> Queue | None:
        """The queue that receives this consumer's topic messages, if it has topics."""
        return self.topic_sub.queue if self.topic_sub is not None else None

    @property
    def ack_mode(self) -> AckMode:
        return self.spec.ack_mode

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def has_capacity(self) -> bool:
        if self.paused or self.closed or self.spec.browser:
            return False
        if self.spec.ack_mode is AckMode.AUTO:
            return self.burst < self.prefetch
        return len(self.dispatched) < self.prefetch

    def __repr__(self) -> str:
        return f"<Consumer {self.id} {self.spec.ack_mode.value} inflight={len(self.dispatched)}>"
