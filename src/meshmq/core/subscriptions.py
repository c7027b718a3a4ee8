"""Consumers and topic subscriptions, durable ones included.

Owns SUBSCRIBE and UNSUBSCRIBE: checking a subscription (ids, limits, selectors,
read and create rights, durable ones' client id), choosing its prefetch from the
destination policy, attaching the consumer to its queues (wildcards included, and
queues created later through ``CoreState.get_queue``), the topic subscriptions behind
topic consumers (plain, MQTT shared groups, durable ones with their stored record),
streams' start offsets, browsing, removing durable subscriptions, transport
back-pressure (``set_paused``), and the ConsumerAdded/Removed advisories and interest
events that follow.

It does not deliver: a consumer's queues dispatch to it when the runtime pumps.
Closing a consumer returns its unacknowledged messages to their queues.
"""

from __future__ import annotations

from meshmq.core import destinations as dst
from meshmq.core.access import Access
from meshmq.core.advisories import Advisories
from meshmq.core.authorization import Right
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.destinations import Destination
from meshmq.core.queue import BrowseEnd, Delivery, Queue
from meshmq.core.routing import Router
from meshmq.core.selector import compile_selector, message_lookup
from meshmq.core.shard_relay import DurableDrop, RelayQueue, SubscriptionRelay
from meshmq.core.shards import fans_in
from meshmq.core.state import Connection, CoreState, TopicStats, TopicSubscription
from meshmq.core.stream import NEXT, StreamOffset, StreamQueue
from meshmq.errors import DestinationError, ProtocolError, ResourceLimitError
from meshmq.store.base import DropKey, DurableSubscription, PutDurableSubscription


class Subscriptions:
    """Subscribing and unsubscribing (see the module docstring)."""

    def __init__(self, state: CoreState, access: Access, router: Router,
                 advisories: Advisories) -> None:
        self._state = state
        self._access = access
        self._router = router
        self._advisories = advisories

    def subscribe(self, conn: Connection, subscription_id: str, spec: ConsumerSpec,
                  stream_offset: StreamOffset | None) -> Consumer:
        state = self._state
        if subscription_id in conn.consumers:
            raise ProtocolError(f"subscription id {subscription_id!r} is already in use "
                                "on this connection", code="duplicate-subscription")
        if not spec.destinations:
            raise DestinationError("no destination")
        limit = state.config.max_subscriptions_per_connection
        if limit and len(conn.consumers) >= limit and spec.network_path is None:
            raise ResourceLimitError(
                f"subscription limit reached: a connection may hold at most {limit} "
                "subscriptions (broker.max_subscriptions_per_connection)")
        selector = None
        if spec.selector is not None:
            selector = compile_selector(spec.selector)  # raises SelectorError
        queues = [d for d in spec.destinations if d.is_queue]
        topics = [d for d in spec.destinations if d.is_topic]
        for d in spec.destinations:
            if d.is_temporary and not d.is_wildcard and not state.temp_exists(d):
                raise DestinationError(f"temporary destination {d} does not exist")
        readable = None
        if self._access.authz is not None and not conn.principal.internal:
            for d in spec.destinations:  # a composite needs every part
                self._access.authorize(conn, Right.READ, d)
                if d.is_queue and not d.is_wildcard and not d.is_temporary \
                        and d not in state.queues and not state.owned_elsewhere(d):
                    self._access.authorize(conn, Right.ADMIN, d)  # this subscription creates it
            if any(d.is_wildcard for d in spec.destinations):
                readable = self._access.readable_filter(conn.principal)
        if spec.browser and topics:
            raise DestinationError("browsing is only possible on queues")
        durable_key = None
        if spec.subscription_name is not None and topics:
            if conn.client_id is None:
                raise ProtocolError("a durable subscription (activemq.subscriptionName) "
                                    "needs a client-id on CONNECT", code="client-id-required")
            durable_key = (conn.client_id, spec.subscription_name)
            existing = state.durables.get(durable_key)
            if (existing is not None and existing.consumer is not None) or (
                    existing is None and state.shard is not None
                    and _relayed_durable_active(conn, spec.subscription_name)):
                raise ProtocolError(f"durable subscription {spec.subscription_name!r} of "
                                    f"client {conn.client_id!r} is already active",
                                    code="durable-in-use")
        policy = state.policy_for(spec.destinations[0])
        if spec.prefetch is not None:
            prefetch = spec.prefetch
        elif spec.browser:
            prefetch = policy.browser_prefetch
        elif queues:
            prefetch = policy.queue_prefetch
        elif durable_key is not None:
            prefetch = policy.durable_topic_prefetch
        else:
            prefetch = policy.topic_prefetch
        consumer = Consumer(f"{conn.id}:{subscription_id}", conn.id, subscription_id, spec,
                            prefetch, selector)
        consumer.readable = readable
        conn.consumers[subscription_id] = consumer
        self._advisories.count_consumer(spec, 1)
        if spec.browser:
            self._browse(consumer, queues)
            return consumer
        if state.shard is not None and stream_offset is None and self._relay(conn, consumer):
            return consumer
        if state.shard is not None and stream_offset is None and durable_key is not None \
                and self._relay_durable(conn, consumer, durable_key):
            return consumer
        for d in queues:
            if d.is_wildcard:
                if consumer not in state.queue_wildcards:
                    state.queue_wildcards.append(consumer)
                for qd, queue in list(state.queues.items()):
                    if dst.matches(d, qd) and queue not in consumer.sources and (
                            readable is None or readable(qd)):
                        consumer.sources.append(queue)
            else:
                queue = state.get_queue(d)
                if queue not in consumer.sources:
                    consumer.sources.append(queue)
        if topics:
            consumer.topic_sub = self._topic_subscription(conn, consumer, tuple(topics),
                                                          durable_key)
            if consumer.topic_sub.shared_key is None:
                consumer.topic_sub.readable = readable
            consumer.sources.append(consumer.topic_sub.queue)
        streams = [q for q in consumer.sources if isinstance(q, StreamQueue)]
        if stream_offset is not None and not streams:
            conn.consumers.pop(subscription_id, None)
            self._advisories.count_consumer(spec, -1)
            raise DestinationError(f"x-stream-offset given, but {spec.destinations[0]} is "
                                   "not a stream destination")
        for stream in streams:
            stream.expect(consumer, stream_offset or NEXT)
        for queue in consumer.sources:
            queue.add_consumer(consumer)
        if state.shard is not None and stream_offset is None:
            self._fan_in(conn, consumer, durable_key)
        self._consumer_changed(conn, consumer, added=True)
        return consumer

    def _relay(self, conn: Connection, consumer: Consumer) -> bool:
        """One shard of several: a subscription to one destination another shard owns
        becomes a relayed consumer (core/shard_relay.py); False: it is served here. A
        bridge's demand is relayed too, so a remote broker's consumers get what every
        shard owns, and a shared subscription's member joins its group on the owner, so
        a group is one across the node. Composites and durable subscriptions stay local
        for now (wildcards: ``_fan_in``)."""
        state = self._state
        shard = state.shard
        spec = consumer.spec
        if shard is None or len(spec.destinations) != 1 or spec.subscription_name is not None:
            return False
        d = spec.destinations[0]
        if d.is_wildcard or d.is_temporary or fans_in(d):
            return False
        owner = state.owner_of(shard, d)
        if owner == shard.index:
            return False
        relay = RelayQueue(d, state.policy_for(d), state, owner, state.next_relay,
                           state.relay_decision)
        relay.origin = self._advisories.origin(conn, consumer)
        state.next_relay += 1
        state.relays[relay.relay_id] = relay
        consumer.sources.append(relay)
        relay.add_consumer(consumer)
        state.relay_ops.append(relay.open_decision(consumer))
        self._consumer_changed(conn, consumer, added=True)
        return True

    def _relay_durable(self, conn: Connection, consumer: Consumer,
                       durable_key: tuple[str, str]) -> bool:
        """One shard of several: a durable subscription to one topic another shard owns
        lives (and is stored) on that owner, so what is published while its client is
        away waits there for the client's return through any shard; here it is a
        relayed consumer. False: the topic is owned here (or it is not that case)."""
        state = self._state
        shard = state.shard
        spec = consumer.spec
        if shard is None or conn.protocol == "shard" or len(spec.destinations) != 1 \
                or spec.shared_group is not None or spec.network_path is not None:
            return False
        d = spec.destinations[0]
        if not d.is_topic or d.is_wildcard or d.is_temporary or fans_in(d):
            return False
        owner = state.owner_of(shard, d)
        if owner == shard.index:
            return False
        self._open_relay(conn, consumer, spec.destinations, owner, durable_key, None)
        self._consumer_changed(conn, consumer, added=True)
        return True

    def _fan_in(self, conn: Connection, consumer: Consumer,
                durable_key: tuple[str, str] | None) -> None:
        """One shard of several: a wildcard subscription (with the topics of its
        composite, as MQTT's ``a/#`` is ``a.>`` and ``a``) served here for what this
        shard owns also runs on every other shard for what that one owns, each relayed
        back here (durable on each, for a durable one; a member of its group on each,
        for a shared one). Plain queues of a composite stay local, as before."""
        state = self._state
        shard = state.shard
        spec = consumer.spec
        if shard is None or conn.protocol == "shard" \
                or (spec.network_path is not None and spec.subscription_name is not None):
            return
        patterns = tuple(d for d in spec.destinations if not d.is_temporary
                         and (d.is_wildcard or d.is_topic))
        # (An advisory topic about no destination is raised by every shard: its
        # subscription fans in as a wildcard's does.)
        if not any(d.is_wildcard or fans_in(d) for d in patterns):
            return
        reader = None
        if self._access.authz is not None and not conn.principal.internal:
            reader = (conn.principal.user, tuple(sorted(conn.principal.groups)))
        for owner in range(shard.count):
            if owner != shard.index:
                self._open_relay(conn, consumer, patterns, owner, durable_key, reader)

    def _open_relay(self, conn: Connection, consumer: Consumer,
                    patterns: tuple[Destination, ...], owner: int,
                    durable_key: tuple[str, str] | None,
                    reader: tuple[str, tuple[str, ...]] | None) -> None:
        state = self._state
        relay = SubscriptionRelay(patterns, state.policy_for(patterns[0]), state, owner,
                                  state.next_relay, state.relay_decision,
                                  durable=durable_key, reader=reader)
        relay.origin = self._advisories.origin(conn, consumer)
        state.next_relay += 1
        state.relays[relay.relay_id] = relay
        consumer.sources.append(relay)
        relay.add_consumer(consumer)
        state.relay_ops.append(relay.open_decision(consumer))

    def _topic_subscription(self, conn: Connection, consumer: Consumer,
                            topics: tuple[Destination, ...],
                            durable_key: tuple[str, str] | None) -> TopicSubscription:
        state = self._state
        spec = consumer.spec
        for topic in topics:
            # A subscription makes its topic exist, as in ActiveMQ: the management API
            # lists and describes it before its first message.
            if not topic.is_wildcard and not state.owned_elsewhere(topic):
                state.topics.setdefault(topic, TopicStats())
        if spec.shared_group is not None and durable_key is None:
            shared_key = (spec.shared_group, topics, spec.selector)
            shared = state.shared.get(shared_key)
            if shared is None:
                queue = Queue(topics[0], None, state.policy_for(topics[0]), state, None,
                              prefiltered=True)
                shared = TopicSubscription(topics, queue, selector_text=spec.selector,
                                           no_local=False, connection_id=None, durable=None)
                shared.shared_key = shared_key
                state.shared[shared_key] = shared
                state.topic_index.add(shared)
            return shared
        if durable_key is None:
            policy = state.policy_for(topics[0])
            queue = Queue(topics[0], None, policy, state, None, prefiltered=True)
            plain = TopicSubscription(topics, queue, selector_text=spec.selector,
                                      no_local=spec.no_local, connection_id=conn.id,
                                      durable=None)
            plain.consumer = consumer
            state.topic_index.add(plain)
            return plain
        client_id, name = durable_key
        destination_text = ",".join(str(t) for t in topics)
        sub: TopicSubscription | None = state.durables.get(durable_key)
        if sub is not None and sub.durable is not None and (
                sub.durable.destination != destination_text
                or sub.durable.selector != spec.selector
                or sub.durable.no_local != spec.no_local):
            # JMS: changing topic or selector of a durable subscription replaces it.
            self.drop_durable(durable_key)
            sub = None
        if sub is None:
            key = f"durable://{client_id}:{name}"
            record = DurableSubscription(key=key, client_id=client_id, subscription_name=name,
                                         destination=destination_text, selector=spec.selector,
                                         no_local=spec.no_local, created_ms=state.now_ms())
            state.ops.append(PutDurableSubscription(record))
            queue = Queue(topics[0], key, state.policy_for(topics[0]), state, state.store,
                          prefiltered=True)
            sub = TopicSubscription(topics, queue, selector_text=spec.selector,
                                    no_local=spec.no_local, connection_id=conn.id,
                                    durable=record)
            state.durables[durable_key] = sub
            state.durable_names.setdefault(client_id, set()).add(name)
            state.topic_index.add(sub)
        sub.consumer = consumer
        sub.connection_id = conn.id
        return sub

    def drop_durable(self, key: tuple[str, str]) -> None:
        """Delete a durable subscription and its stored messages (no checks)."""
        state = self._state
        sub = state.durables.pop(key)
        names = state.durable_names.get(key[0])
        if names is not None:
            names.discard(key[1])
            if not names:
                del state.durable_names[key[0]]
        state.topic_index.discard(sub)
        sub.queue.purge()
        sub.queue.deleted = True
        state.ops.append(DropKey(sub.queue.key or ""))

    def remove_durable(self, conn: Connection, name: str) -> None:
        """UNSUBSCRIBE with activemq.subscriptionName: delete the durable subscription."""
        if conn.client_id is None:
            raise ProtocolError("removing a durable subscription needs a client-id",
                                code="client-id-required")
        key = (conn.client_id, name)
        sub = self._state.durables.get(key)
        if sub is None and self._state.shard is not None:
            # Kept by its topic's owner, if anywhere (by each owner, if a wildcard).
            self.drop_durable_elsewhere(conn.client_id, name)
            return
        if sub is None:
            raise DestinationError(f"no durable subscription {name!r} for client "
                                   f"{conn.client_id!r}")
        if sub.consumer is not None:
            raise ProtocolError(f"durable subscription {name!r} is active; unsubscribe its "
                                "consumer first", code="durable-in-use")
        self.drop_durable(key)
        self.drop_durable_elsewhere(conn.client_id, name)

    def drop_durable_elsewhere(self, client_id: str, name: str | None) -> None:
        """One shard of several: every other shard deletes durable subscription ``name``
        of ``client_id`` (None: its MQTT session's) if it holds it, unattached."""
        shard = self._state.shard
        if shard is not None:
            for owner in range(shard.count):
                if owner != shard.index:
                    self._state.relay_ops.append(DurableDrop(owner, client_id, name))

    def drop_durable_here(self, client_id: str, name: str | None) -> int:
        """Another shard's ``DurableDrop``: delete the matching durable subscriptions
        held here that no consumer is attached to; how many were deleted."""
        durables = self._state.durables
        names = self._state.durable_names.get(client_id, ())
        keys = [(client_id, n) for n in names
                if (n == name if name is not None else _mqtt_session_name(n))
                and durables[(client_id, n)].consumer is None]
        for key in keys:
            self.drop_durable(key)
        return len(keys)

    def _browse(self, consumer: Consumer, queues: list[Destination]) -> None:
        state = self._state
        for d in queues:
            for qd, queue in list(state.queues.items()):
                if not dst.matches(d, qd):
                    continue
                now = state.now_ms()
                for msg, count in queue.browse():
                    if msg.is_expired(now):
                        continue
                    if consumer.selector is not None and not consumer.selector.matches(
                            message_lookup(msg, delivery_count=count + 1,
                                           redelivered=count > 0)):
                        continue
                    tag = consumer.next_tag
                    consumer.next_tag += 1
                    state.emit(Delivery(consumer, msg, tag, count + 1 if count else 1))
        state.emit(BrowseEnd(consumer))

    def unsubscribe(self, conn: Connection, consumer: Consumer) -> None:
        if consumer.closed:
            return
        state = self._state
        consumer.closed = True
        conn.consumers.pop(consumer.subscription_id, None)
        self._advisories.count_consumer(consumer.spec, -1)
        if consumer in state.queue_wildcards:
            state.queue_wildcards.remove(consumer)
        # Unacked messages go back to their queues (counted as a delivery attempt).
        for entry in list(consumer.dispatched.values()):
            # A bridge that went down did not deliver anything to a client: its
            # in-flight messages go back without counting towards the DLQ.
            entry.queue.release(entry, count_delivery=consumer.spec.network_path is None,
                                cause="consumer closed with the message unacknowledged",
                                reason="consumer closed")
        consumer.dispatched.clear()
        consumer.by_message_id.clear()
        for queue in consumer.sources:
            queue.remove_consumer(consumer)
            if isinstance(queue, RelayQueue):
                state.relays.pop(queue.relay_id, None)
        sub = consumer.topic_sub
        if sub is not None:
            if sub.durable is not None:  # the subscription outlives its consumer
                sub.consumer = None
                sub.connection_id = None
            elif sub.shared_key is None or not sub.queue.consumers:
                # A plain topic subscriber, or the last member of a shared group.
                if sub.shared_key is not None:
                    del state.shared[sub.shared_key]
                state.topic_index.discard(sub)
                sub.queue.purge()
                sub.queue.deleted = True
        if not consumer.spec.browser:
            self._consumer_changed(conn, consumer, added=False)

    def set_paused(self, conn: Connection, paused: bool) -> None:
        """Transport back-pressure: stop (or resume) dispatching to this connection."""
        if conn.closed:
            return  # being closed: its consumers stay paused (see close_connection_step)
        for consumer in conn.consumers.values():
            if consumer.paused != paused:
                consumer.paused = paused
                if not paused:
                    for queue in consumer.sources:
                        self._state.mark_dirty(queue)

    def _consumer_changed(self, conn: Connection, consumer: Consumer, *, added: bool) -> None:
        for topic, msg in self._advisories.consumer_messages(conn, consumer, added=added):
            self._router.route_topic(topic, msg)
        self._advisories.notify(conn, consumer, added=added)


def _mqtt_session_name(name: str) -> bool:
    """Whether a durable subscription's name is an MQTT session's (``mqtt<qos><flags>:
    <filter>``, as transport/mqtt_server.py names them)."""
    head, sep, _ = name.partition(":")
    return bool(sep) and head.startswith("mqtt") and len(head) > 4 and head[4].isdigit()


def _relayed_durable_active(conn: Connection, name: str) -> bool:
    """One shard of several: whether ``conn`` (the one connection of its client id on
    this shard) has durable subscription ``name`` open already, on its topics' owners
    (kept there, so it has no record here)."""
    return any(c.spec.subscription_name == name and c.topic_sub is None
               and any(d.is_topic for d in c.spec.destinations)
               for c in conn.consumers.values())
