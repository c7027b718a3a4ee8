"""ActiveMQ's advisory messages and the interest stream for network bridges.

Owns the advisory topics' names (``ActiveMQ.Advisory.<Kind>.<Type>.<name>``), the
decision whether an advisory is worth building (advisory support on and a subscriber
on its topic), the advisory message itself (JSON body, the fields as properties), the
count of open consumers per destination (advisories' ``consumerCount``, the network's
demand) and the listeners told when a consumer comes or goes (``ConsumerEvent``).

It routes nothing: the message it builds is routed by ``core/routing.py``
(``Router.advise``), so building an advisory never re-enters routing from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from meshmq.core import destinations as dst
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.state import Connection, CoreState

ADVISORY_PREFIX = "ActiveMQ.Advisory."
TYPE_NAMES = {DestKind.QUEUE: "Queue", DestKind.TOPIC: "Topic",
              DestKind.TEMP_QUEUE: "TempQueue", DestKind.TEMP_TOPIC: "TempTopic"}


def advisory_topic(kind: str, dest: Destination) -> Destination:
    """The advisory topic of ``kind`` (``Consumer``, ``Producer``, ...) for ``dest``."""
    return Destination(DestKind.TOPIC,
                       f"{ADVISORY_PREFIX}{kind}.{TYPE_NAMES[dest.kind]}.{dest.name}")


def kind_topic(kind: DestKind) -> Destination:
    """The topic announcing temporary destinations of ``kind``."""
    return dst.topic(ADVISORY_PREFIX + TYPE_NAMES[kind])


@dataclass(frozen=True, slots=True)
class ConsumerEvent:
    """Interest stream for network bridges: a consumer appeared or went away."""

    added: bool
    consumer_id: str
    destinations: tuple[Destination, ...]
    selector: str | None
    connection_id: str
    client_id: str | None
    durable_name: str | None
    consumer_count: dict[Destination, int]
    spec: ConsumerSpec


class Advisories:
    """Builds advisory messages and keeps consumer counts and interest listeners."""

    def __init__(self, state: CoreState) -> None:
        self._state = state
        self.counts: dict[Destination, int] = {}
        self.listeners: list[Callable[[ConsumerEvent], None]] = []

    def message(self, topic: Destination, advisory_type: str,
                fields: dict[str, PropertyValue]) -> Message | None:
        """The advisory to publish on ``topic``, or None when nobody would read it."""
        state = self._state
        if not state.config.advisory_support or not state.subs_for(topic):
            return None
        props: dict[str, PropertyValue] = {"advisoryType": advisory_type,
                                           "originBrokerName": state.name}
        props.update({k: v for k, v in fields.items() if v is not None})
        return self._build(topic, props)

    def master_broker_message(self, fields: dict[str, object]) -> Message | None:
        """``ActiveMQ.Advisory.MasterBroker`` (HA takeover), built even without a
        subscriber: it is kept as the topic's retained message."""
        state = self._state
        if not state.config.advisory_support:
            return None
        props: dict[str, PropertyValue] = {"advisoryType": "MasterBroker",
                                           "originBrokerName": state.name}
        props.update({k: v for k, v in fields.items()
                      if isinstance(v, str | int | float | bool)})
        return self._build(dst.topic(ADVISORY_PREFIX + "MasterBroker"), props)

    def _build(self, topic: Destination, props: dict[str, PropertyValue]) -> Message:
        state = self._state
        return Message(message_id=state.new_message_id("advisory"), destination=topic,
                       body=json.dumps(props, sort_keys=True).encode(), properties=props,
                       timestamp=state.now_ms(), type="Advisory",
                       content_type="application/json")

    # ------------------------------------------------------------ consumers
    def consumer_count(self, dest: Destination) -> int:
        """Open consumers that named ``dest`` in their subscription."""
        return self.counts.get(dest, 0)

    def count_consumer(self, spec: ConsumerSpec, delta: int) -> None:
        counts = self.counts
        for d in set(spec.destinations):
            count = counts.get(d, 0) + delta
            if count:
                counts[d] = count
            else:
                del counts[d]

    def consumer_messages(self, conn: Connection, consumer: Consumer, *,
                          added: bool) -> list[tuple[Destination, Message]]:
        """The ConsumerAdded/ConsumerRemoved advisories for ``consumer``, per topic."""
        spec = consumer.spec
        out: list[tuple[Destination, Message]] = []
        for d in spec.destinations:
            if d.is_advisory:
                continue
            topic = advisory_topic("Consumer", d)
            msg = self.message(topic, "ConsumerAdded" if added else "ConsumerRemoved", {
                "consumerId": consumer.id, "connectionId": conn.id,
                "clientId": conn.client_id, "destination": str(d),
                "consumerCount": self.consumer_count(d), "selector": spec.selector,
                "prefetchSize": consumer.prefetch, "priority": spec.priority,
                "exclusive": spec.exclusive, "noLocal": spec.no_local,
                "subscriptionName": spec.subscription_name,
                "ackMode": spec.ack_mode.value})
            if msg is not None:
                out.append((topic, msg))
        return out

    def notify(self, conn: Connection, consumer: Consumer, *, added: bool) -> None:
        """Tell the interest listeners (network bridges) about ``consumer``."""
        if not self.listeners:
            return
        spec = consumer.spec
        counts = {d: self.consumer_count(d) for d in spec.destinations}
        event = ConsumerEvent(added, consumer.id, spec.destinations, spec.selector, conn.id,
                              conn.client_id, spec.subscription_name, counts, spec)
        for listener in self.listeners:
            listener(event)
