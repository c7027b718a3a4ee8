"""Routing: where a sent message goes, and the store operations that keep it.

Owns the send path from a producer's SEND or PUBLISH to the queues that hold the
message: checking the destinations (no wildcards, live temporaries, nothing the
broker owns), the write right, the store and memory limits, the idempotent-producer
window (``dedup-id``), composite destinations (one copy per part), queues (created on
first use, streams stamped with their offset) and topics (every matching subscription,
its selector, no-local, a bridge's filter, durable subscribers' stored references).
Also retained messages and the store's single-reference records, and the broker's own
messages (advisories, MQTT wills, ``$SYS``): all of them are routed here.

It dispatches nothing (queues are only marked dirty) and does no I/O: what must be
written is appended to the state's store operations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from meshmq.core import destinations as dst
from meshmq.core.access import Access
from meshmq.core.advisories import Advisories, advisory_topic
from meshmq.core.auth import Principal
from meshmq.core.dedup import DEDUP_PROPERTY
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.queue import Queue
from meshmq.core.selector import compile_selector, message_lookup
from meshmq.core.shard_relay import (
    ProducerNote,
    ShardSend,
    copy_retained,
    retain_with_send,
    retained_view,
)
from meshmq.core.state import (
    LINK_PROTOCOLS,
    Connection,
    CoreState,
    TopicStats,
    find_transaction,
)
from meshmq.core.stream import StreamQueue
from meshmq.core.trace import DROPPED, RECEIVED, STORED
from meshmq.errors import AuthorizationError, DestinationError, ResourceLimitError
from meshmq.store.base import AddMessage, RemoveRef, SetDeliveryCount

log = logging.getLogger("meshmq.broker")

RETAINED_PREFIX: Final = "retained://"
RECORD_PREFIX: Final = "record://"


class Router:
    """The send path (see the module docstring)."""

    def __init__(self, state: CoreState, access: Access, advisories: Advisories) -> None:
        self._state = state
        self._access = access
        self._advisories = advisories
        # Destinations validated once (hot path: one set lookup per send).
        self._sendable: set[Destination] = set()
        # Client sends refused as not authorized (broker-owned topics), for statistics.
        self.denied_publishes = 0

    # ------------------------------------------------------------ producers
    def send(self, conn: Connection, destinations: tuple[Destination, ...], message: Message,
             txn: str | None, redelivered: bool) -> bool:
        """Route ``message`` to every destination (or keep it in ``txn``). True when a
        store sync must complete before the send may be confirmed."""
        state = self._state
        conn.sent += 1
        for d in destinations:
            if d in self._sendable:
                continue
            if d.is_wildcard:
                raise DestinationError(f"cannot send to a wildcard destination: {d}")
            if d.is_temporary and not state.temp_exists(d):
                raise DestinationError(f"temporary destination {d} does not exist "
                                       "(its connection has closed)")
            if d.is_broker_owned:
                # Whatever an authorization map grants: a spoofed advisory or statistic
                # would mislead every monitor that reads it.
                self.denied_publishes += 1
                raise AuthorizationError(f"{d} is written only by the broker (clients may "
                                         "read it, not send to it)")
            if not d.is_temporary:  # temporary ones can disappear; always re-check them
                if len(self._sendable) > 10_000:
                    self._sendable.clear()
                self._sendable.add(d)
        if conn.checked:
            writable = conn.writable
            for d in destinations:
                if d not in writable:
                    self._access.authorize_send(conn, d, message)
        if state.persistent_refusal is not None or state.usage.full:
            self._check_limits(destinations, message)
        if state.owners_down:
            self._check_owners(destinations)
        if txn is not None:
            find_transaction(conn, txn).sends.append((destinations, message))
            return False
        return self.route(conn, destinations, message, redelivered)

    def send_from_shard(self, conn: Connection, message: Message, redelivered: bool) -> bool:
        """Route a send another shard of this node forwarded to its owner (this shard).
        The shard the client is connected to checked the destination and the client's
        rights; what only the owner knows is checked here: its store and memory limits,
        and that a temporary destination still exists."""
        conn.sent += 1
        dest = message.destination
        kind = dest.kind
        if (kind is DestKind.TEMP_QUEUE or kind is DestKind.TEMP_TOPIC) \
                and not self._state.temp_exists(dest):
            raise DestinationError(f"temporary destination {dest} does not exist "
                                   "(its connection has closed)")
        destinations = (dest,)
        state = self._state
        if state.persistent_refusal is not None or state.usage.full:
            self._check_limits(destinations, message)
        return self.route(conn, destinations, message, redelivered, owned=True)

    def _check_owners(self, destinations: tuple[Destination, ...]) -> None:
        """A send to a destination whose owning shard has been unreachable for longer
        than the node waits (``shards.owner_wait_ms``) is refused, retriably."""
        state = self._state
        shard = state.shard
        if shard is None:
            return
        for d in destinations:
            owner = state.owner_of(shard, d)
            if owner in state.owners_down:
                raise ResourceLimitError(
                    f"the shard that owns {d} is restarting (shard {owner}, unreachable for "
                    "longer than shards.owner_wait_ms); send it again shortly")

    def _check_limits(self, destinations: tuple[Destination, ...], message: Message) -> None:
        state = self._state
        if message.persistent and state.persistent_refusal is not None:
            self._trace_dropped(message, "store full")
            raise ResourceLimitError(f"persistent message refused: {state.persistent_refusal}; "
                                     "non-persistent messages are still accepted")
        if state.usage.full and not message.persistent:
            for d in destinations:
                if state.config.usage.on_limit == "fail" or \
                        not state.policy_for(d).producer_flow_control:
                    self._trace_dropped(message, "broker memory limit reached")
                    raise ResourceLimitError(
                        f"broker memory limit reached ({state.usage.limit} bytes); send to "
                        f"{d} rejected")

    def _trace_dropped(self, message: Message, reason: str) -> None:
        tracer = self._state.tracer
        if tracer is not None:
            tracer.message(DROPPED, message, reason=reason)

    def route(self, conn: Connection | None, destinations: tuple[Destination, ...],
              message: Message, redelivered: bool = False, *, owned: bool = False) -> bool:
        """Route an accepted message (a send, a committed one, the broker's own).
        ``owned``: its destinations are this shard's (another shard forwarded it)."""
        state = self._state
        shard = None if owned else state.shard
        duplicate = False
        if message.properties:
            dedup_id = message.properties.get(DEDUP_PROPERTY)
            if dedup_id is not None and state.dedup.check_and_add(str(dedup_id)):
                # A re-send of an accepted message: confirm again, store nothing. The
                # confirmation still waits for a store sync, which orders it after the
                # original's write.
                log.debug("duplicate send %s dropped (dedup-id %s)", message.message_id,
                          dedup_id)
                self._trace_dropped(message, "duplicate dedup-id (idempotent producer)")
                if shard is None:
                    return True
                # One shard of several: the original's write is on the owners of the
                # destinations owned elsewhere, so the re-send goes to them (they drop
                # it as a duplicate) and its confirmation waits for their STORED.
                duplicate = True
        needs_sync = False
        # Producers' messages only: bridges trace received_from_bridge themselves.
        tracer = (state.tracer if conn is not None and conn.protocol not in LINK_PROTOCOLS
                  and not duplicate else None)
        queues = state.queues
        for i, d in enumerate(destinations):
            msg = message if i == 0 and d == message.destination else message.copy_to(d)
            if tracer is not None:
                tracer.hot(RECEIVED, msg, None, 0, None)
            # A send another shard forwarded comes over a shard link, not from a
            # producer: the client is counted as one on its own shard.
            if conn is not None and not owned and d not in conn.producer_destinations \
                    and not conn.closed:
                conn.producer_destinations.add(d)
                self.producer_changed(conn, d, added=True)
            if shard is not None:  # one shard of several: is ``d`` owned here?
                owner = state.owner_of(shard, d)
                if owner != shard.index:
                    # The owner stores and enqueues it; the confirmation waits for its
                    # STORED (transport/durability.py).
                    state.shard_sends.append(ShardSend(owner, msg, redelivered))
                    needs_sync = True
                    continue
                if duplicate:  # stored here before
                    needs_sync = True
                    continue
            queue = queues.get(d)
            if queue is not None or d.kind is DestKind.QUEUE or d.kind is DestKind.TEMP_QUEUE:
                needs_sync |= self.route_queue(queue or state.get_queue(d), msg, redelivered)
            else:
                needs_sync |= self.route_topic(d, msg, traced=tracer is not None,
                                               redelivered=redelivered)
        return needs_sync

    def route_admin(self, message: Message) -> bool:
        """Route a message the management API sends, moves or retries (no duplicate
        check: a moved message was accepted once already). True when it was stored (on
        a shard of several, a destination another shard owns gets it from that owner)."""
        dest = message.destination
        state = self._state
        if state.shard is not None and state.owned_elsewhere(dest):
            state.shard_sends.append(ShardSend(state.owner_of(state.shard, dest), message,
                                               False))
            return True
        if dest.is_queue:
            return self.route_queue(self._state.get_queue(dest), message)
        return self.route_topic(dest, message)

    def publish_internal(self, message: Message, *, retain: bool = False,
                         persist: bool = True) -> None:
        """Route a message the broker itself produces (MQTT wills, $SYS statistics);
        ``persist=False`` keeps a retained copy in memory only."""
        self.route(None, (message.destination,), message)
        if retain:
            self.retain(message, persist=persist)

    def node_id(self, local_id: str) -> str:
        """A connection's id as the node names it (core/advisories.py)."""
        return self._advisories.node_id(local_id)

    def producer_changed(self, conn: Connection, dest: Destination, *, added: bool) -> None:
        """``conn`` sent to ``dest`` for the first time (or closed): the ProducerAdded
        (ProducerRemoved) advisory, raised by the destination's owner on a node of
        shards (told by a ``ProducerNote`` when it is another shard)."""
        state = self._state
        if not state.config.advisory_support:
            return
        shard = state.shard
        connection_id = self._advisories.node_id(conn.id)
        if shard is not None and not dest.is_wildcard:
            owner = state.owner_of(shard, dest)
            if owner != shard.index:
                state.relay_ops.append(ProducerNote(owner, dest, connection_id, added))
                return
        self._producer_advisory(dest, connection_id, added)

    def producer_relayed(self, shard: int, dest: Destination, connection_id: str,
                         added: bool) -> None:
        """Another shard's ``ProducerNote`` for ``dest``, owned here."""
        if self._advisories.producer_relayed(shard, dest, connection_id, added):
            self._producer_advisory(dest, connection_id, added)

    def producers_lost(self, shard: int) -> None:
        """The link to shard ``shard`` is gone: its producers are, as its connections
        are when it dies (a link back brings them again)."""
        for dest, connection_id in self._advisories.producers_lost(shard):
            self._producer_advisory(dest, connection_id, False)

    def _producer_advisory(self, dest: Destination, connection_id: str, added: bool) -> None:
        fields: dict[str, PropertyValue] = {"connectionId": connection_id,
                                            "destination": str(dest)}
        if added:
            fields["producerCount"] = self._advisories.producer_count(dest)
        self.advise(advisory_topic("Producer", dest),
                    "ProducerAdded" if added else "ProducerRemoved", fields)

    def advise(self, topic: Destination, advisory_type: str,
               fields: dict[str, PropertyValue]) -> None:
        """Publish an advisory on ``topic`` if anybody listens (core/advisories.py)."""
        msg = self._advisories.message(topic, advisory_type, fields)
        if msg is not None:
            self.route_topic(topic, msg)

    # ------------------------------------------------------------ queues and topics
    def route_queue(self, queue: Queue, msg: Message, redelivered: bool = False) -> bool:
        state = self._state
        seq = queue.allocate_seq()
        if queue.retains_all:  # a stream: every message is stored, with its offset
            assert isinstance(queue, StreamQueue)
            msg = queue.stamp(msg, seq)
            persisted = True
        else:
            persisted = msg.persistent and queue.key is not None
        if persisted:
            state.ops.append(AddMessage(msg, ((queue.key or "", seq),)))
            if redelivered and not queue.retains_all:
                state.ops.append(SetDeliveryCount(queue.key or "", seq, 1))
            tracer = state.tracer
            if tracer is not None:
                if queue.retains_all:
                    tracer.message(STORED, msg, queue.destination, reason="stream")
                else:
                    tracer.hot(STORED, msg, queue.destination, 0, None)
        queue.enqueue(msg, seq, persisted, delivery_count=int(redelivered))
        return persisted

    def route_topic(self, dest: Destination, msg: Message, *, traced: bool = False,
                    redelivered: bool = False) -> bool:
        """``traced``: a producer's message, so having no subscriber is traced as a drop."""
        state = self._state
        stats = state.topics.get(dest)
        if stats is None:
            stats = state.topics[dest] = TopicStats()
        stats.enqueued += 1
        subs = state.topic_index.match(dest)
        tracer = state.tracer
        if not subs:
            if traced and tracer is not None:
                tracer.message(DROPPED, msg, reason="no subscriber")
            return False
        refs: list[tuple[str, int]] = []
        targets: list[tuple[Queue, int, bool]] = []
        lookup = None
        for sub in subs:
            if sub.no_local and sub.connection_id is not None \
                    and sub.connection_id == msg.producer_id:
                continue
            if sub.readable is not None and not sub.readable(dest):
                continue  # a wildcard subscriber not allowed to read this topic
            net_consumer = sub.consumer
            if net_consumer is not None and net_consumer.net_filter is not None \
                    and not net_consumer.net_filter(msg):
                continue  # a bridge that must not carry it (loop, TTL)
            if sub.selector_text is not None:
                if lookup is None:
                    lookup = message_lookup(msg)
                if not compile_selector(sub.selector_text).matches(lookup):
                    continue
            queue = sub.queue
            seq = queue.allocate_seq()
            persisted = sub.durable is not None and msg.persistent
            if persisted:
                refs.append((queue.key or "", seq))
            targets.append((queue, seq, persisted))
        if refs:
            state.ops.append(AddMessage(msg, tuple(refs)))
            if redelivered:
                state.ops.extend(SetDeliveryCount(key, seq, 1) for key, seq in refs)
            if tracer is not None:
                tracer.message(STORED, msg, dest)
        elif not targets and traced and tracer is not None:
            tracer.message(DROPPED, msg, reason="no matching subscriber")
        for queue, seq, persisted in targets:
            queue.enqueue(msg, seq, persisted, delivery_count=int(redelivered))
        stats.dispatched += len(targets)
        return bool(refs)

    # ------------------------------------------------------------ retained and records
    def replace_single(self, key: str, old_seq: int | None,
                       message: Message | None) -> int | None:
        """Replace the one stored reference of ``key`` (retained messages and records
        keep exactly one); returns the new seq, or None when only removing."""
        state = self._state
        if old_seq is not None:
            state.ops.append(RemoveRef(key, old_seq))
        if message is None:
            return None
        seq = state.single_seq.get(key, 0) + 1
        state.single_seq[key] = seq
        state.ops.append(AddMessage(message, ((key, seq),)))
        return seq

    def retain(self, message: Message, *, persist: bool = True) -> None:
        """Keep ``message`` as its topic's retained message (an empty body clears it).
        Retained messages are stored, whatever their persistence, unless ``persist`` is
        False: then it lives in memory only (seq 0), as the broker's own ``$SYS``
        statistics, which are regenerated at every start."""
        state = self._state
        if persist and state.owned_elsewhere(message.destination) \
                and retain_with_send(state.shard_sends, message):
            return  # kept by the topic's owner
        retained = self._state.retained
        dest = message.destination
        old = retained.pop(dest, None)
        old_seq = old[0] if old is not None and old[0] > 0 else None
        seq = self.replace_single(RETAINED_PREFIX + dest.name, old_seq,
                                  message if message.body and persist else None)
        if seq is not None:
            retained[dest] = (seq, message)
        elif message.body and not persist:
            retained[dest] = (0, message)
        if persist and state.shard is not None and not state.owned_elsewhere(dest):
            state.relay_ops.extend(copy_retained(state.shard.count, state.shard.index, dest,
                                                 message if seq is not None else None))

    def put_record(self, name: str, body: bytes) -> None:
        """Store (or replace) a small named record; it comes back in ``records`` after a
        restart. Written in the current batch, so it is as durable as what follows it."""
        records = self._state.records
        old = records.pop(name, None)
        record = Message(message_id=f"record:{name}", destination=dst.queue("meshmq.records"),
                         body=body)
        seq = self.replace_single(RECORD_PREFIX + name, old[0] if old is not None else None,
                                  record)
        assert seq is not None
        records[name] = (seq, body)

    def drop_record(self, name: str) -> None:
        old = self._state.records.pop(name, None)
        if old is not None:
            self.replace_single(RECORD_PREFIX + name, old[0], None)

    def retained_for(self, patterns: Iterable[Destination],
                     principal: Principal | None = None) -> list[Message]:
        """Retained messages for a new subscription: those ``principal`` may read."""
        pats = tuple(patterns)
        readable = None if principal is None else self._access.readable_filter(principal)
        retained = retained_view(self._state.retained, self._state.retained_copies)
        return [msg for dest, msg in sorted(retained.items(), key=lambda kv: kv[0].name)
                if any(dst.matches(p, dest) for p in pats)
                and (readable is None or readable(dest))]
