"""ActiveMQ's advisory messages and the interest stream for network bridges.

Owns the advisory topics' names (``ActiveMQ.Advisory.<Kind>.<Type>.<name>``), the
decision whether an advisory is worth building (advisory support on and a subscriber
on its topic), the advisory message itself (JSON body, the fields as properties), the
count of open consumers per destination (advisories' ``consumerCount``, the network's
demand) and the listeners told when a consumer comes or goes (``ConsumerEvent``).

It routes nothing: the message it builds is routed by ``core/routing.py``
(``Router.advise``), so building an advisory never re-enters routing from here.

On a node of shards the node is one broker to its advisories' readers
(docs/design.md, "Topics and wildcards"): a destination's consumer and producer
advisories are raised by its owning shard alone, which runs every consumer of it
(another shard's client's as a relay stand-in, shown here as that client's consumer,
``ConsumerOrigin``) and is told of every producer (``ProducerNote``); connections and
consumers are named as the node names them (``s<k>-c<n>``); a wildcard consumer's
advisory is raised by its client's shard only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from meshmq.core import destinations as dst
from meshmq.core.consumer import Consumer, ConsumerOrigin, ConsumerSpec
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.state import Connection, CoreState

ADVISORY_PREFIX: Final = "ActiveMQ.Advisory."
TYPE_NAMES: Final = {DestKind.QUEUE: "Queue", DestKind.TOPIC: "Topic",
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
        # One shard of several, as a destination's owner: the producers other shards'
        # connections are of it (by shard, the node's connection ids).
        self.remote_producers: dict[int, dict[Destination, set[str]]] = {}

    # ------------------------------------------------------------ a node's names
    def node_id(self, local_id: str) -> str:
        """A connection's or consumer's id as the node names it (``s1-c3``, ``s1-c3:0``;
        the bare id on a single broker)."""
        shard = self._state.shard
        return local_id if shard is None else f"s{shard.index}-{local_id}"

    def advises(self, dest: Destination, *, stand_in: bool) -> bool:
        """Whether this broker raises the consumer or producer advisory of ``dest``:
        always on a single broker; on a shard, for a destination it owns, and for a
        wildcard when the consumer is its client's here, not a stand-in (each shard
        runs a wildcard for what it owns: the client's shard speaks for it)."""
        state = self._state
        shard = state.shard
        if shard is None:
            return True
        if dest.is_wildcard:
            return not stand_in
        return state.owner_of(shard, dest) == shard.index

    def origin(self, conn: Connection, consumer: Consumer) -> ConsumerOrigin:
        """How the owner of a relayed consumer's destination names it (``RelayOpen``)."""
        spec = consumer.spec
        return ConsumerOrigin(self.node_id(consumer.id), self.node_id(conn.id),
                              conn.client_id, spec.ack_mode.value, spec.no_local)

    # ------------------------------------------------------------ producers
    def producer_count(self, dest: Destination) -> int:
        """Connections that sent to ``dest``: this broker's, and on its owning shard
        those of every other shard."""
        count = self._state.producer_count(dest)
        for by_dest in self.remote_producers.values():
            count += len(by_dest.get(dest, ()))
        return count

    def producer_relayed(self, shard: int, dest: Destination, connection_id: str,
                         added: bool) -> bool:
        """Shard ``shard``'s connection started or stopped sending to ``dest`` (owned
        here); False when that changes nothing (told twice)."""
        by_dest = self.remote_producers.setdefault(shard, {})
        ids = by_dest.setdefault(dest, set())
        if added == (connection_id in ids):
            return False
        if added:
            ids.add(connection_id)
        else:
            ids.discard(connection_id)
            if not ids:
                del by_dest[dest]
        return True

    def producers_lost(self, shard: int) -> list[tuple[Destination, str]]:
        """The link to shard ``shard`` is gone, with its connections' producers here."""
        by_dest = self.remote_producers.pop(shard, {})
        return [(dest, cid) for dest, ids in by_dest.items() for cid in sorted(ids)]

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
        if not self._state.config.advisory_support:
            return out
        stand_in = conn.protocol == "shard"
        origin = spec.origin
        for d in spec.destinations:
            if d.is_advisory or not self.advises(d, stand_in=stand_in):
                continue
            topic = advisory_topic("Consumer", d)
            if not self._state.subs_for(topic):
                continue  # nobody reads it (checked again by ``message``)
            if origin is None:
                origin = self.origin(conn, consumer)
            msg = self.message(topic, "ConsumerAdded" if added else "ConsumerRemoved", {
                "consumerId": origin.consumer_id, "connectionId": origin.connection_id,
                "clientId": origin.client_id, "destination": str(d),
                "consumerCount": self.consumer_count(d), "selector": spec.selector,
                "prefetchSize": consumer.prefetch, "priority": spec.priority,
                "exclusive": spec.exclusive, "noLocal": origin.no_local or spec.no_local,
                "subscriptionName": spec.subscription_name,
                "ackMode": origin.ack_mode})
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
