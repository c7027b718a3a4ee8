"""The broker core's facade: the one object protocol sessions, bridges, the runtime
and the management API call.

Nothing here touches a socket or a clock: callers invoke the methods below, then the
runtime's pump takes the decisions (``dispatch_dirty``, ``take_ops``,
``take_outcomes``, ``take_dispatch_marks``, ``take_page_loads``) to write the store
batch and hand deliveries to connections. All calls happen on one thread (the event
loop), so the core needs no locks.

``Broker`` owns no rules itself: each method hands over to the module that owns the
matter (docs/design.md, "The core"), sharing the tables in ``CoreState``:
core/routing.py (send, retained messages, records), core/subscriptions.py (consumers,
durable subscriptions), core/acks.py and core/transactions.py, core/dead_letters.py
(expiry, the DLQ), core/advisories.py, core/access.py (rights), core/connections.py
(connections, temporary destinations) and core/recovery.py. Per message a call costs
one delegation here and none inside the modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from meshmq.config.model import BrokerConfig, DestinationPolicy, StreamPolicy
from meshmq.core.access import Access
from meshmq.core.acks import Acks
from meshmq.core.advisories import ADVISORY_PREFIX, Advisories, ConsumerEvent
from meshmq.core.auth import Authenticator, CredentialSource, Principal
from meshmq.core.authorization import AuthorizationMap, DenialRecord, Right
from meshmq.core.connections import Connections
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.dead_letters import DeadLetters
from meshmq.core.destinations import Destination, DestKind, matches
from meshmq.core.message import Message, PropertyValue
from meshmq.core.paging import PageLoad
from meshmq.core.queue import Entry, Outcome, Queue
from meshmq.core.rates import RateSampler
from meshmq.core.recovery import recover, remember_stored_sends, trace_recovered
from meshmq.core.routing import RECORD_PREFIX, RETAINED_PREFIX, Router
from meshmq.core.shard_relay import (
    SETTLE_RETURNED,
    ProducerNote,
    RelayDecision,
    RelayOpen,
    ShardSend,
    ShardSettle,
)
from meshmq.core.shard_txn import ShardTransactions
from meshmq.core.shards import ShardIdentity
from meshmq.core.state import (
    Connection,
    CoreState,
    TopicStats,
    TopicSubscription,
    Transaction,
)
from meshmq.core.stream import StreamOffset
from meshmq.core.subscriptions import Subscriptions
from meshmq.core.trace import DROPPED, Tracer
from meshmq.core.transactions import Transactions
from meshmq.store.base import Recovery, Store, StoredEntry, StoreOp

__all__ = ["ADVISORY_PREFIX", "RECORD_PREFIX", "RETAINED_PREFIX", "SYS_PREFIX", "Broker",
           "Connection", "ConsumerEvent", "TopicStats", "TopicSubscription", "Transaction"]

SYS_PREFIX: Final = "$SYS."  # the broker's statistics topics (MQTT $SYS/...), memory only


# Bound once: in the compiled build ``time.time_ns()`` would look the name up on the
# module at every call (twice per message).
_TIME_NS: Final = time.time_ns


def _wall_clock_ms() -> int:
    return _TIME_NS() // 1_000_000


class Broker:
    def __init__(self, config: BrokerConfig, store: Store, *,
                 clock: Callable[[], int] | None = None,
                 credentials: CredentialSource | None = None) -> None:
        """``credentials``: the users/groups/certificate files' tables when the
        configuration names such files (config/credential_files.py loads them)."""
        state = self.state = CoreState(config, store, clock or _wall_clock_ms)
        self.config = config
        self.name = config.broker_name
        self.store = store
        self.auth = Authenticator(config.auth, credentials=credentials)
        self._access = Access(state)
        self._advisories = Advisories(state)
        self._router = Router(state, self._access, self._advisories)
        self._subscriptions = Subscriptions(state, self._access, self._router,
                                            self._advisories)
        self._acks = Acks(state)
        self._transactions = Transactions(state, self._router, self._acks)
        self._dead_letters = DeadLetters(state, self._router)
        state.dead_letters = self._dead_letters
        self._connections = Connections(state, self._access, self._router,
                                        self._subscriptions)
        # The tables, under the names callers have always read (the same objects).
        self.usage = state.usage
        self.dedup = state.dedup
        self.queues = state.queues
        self.topics = state.topics
        self.connections = state.connections
        self.client_ids = state.client_ids
        self.durables = state.durables
        self.retained = state.retained
        self.records = state.records
        self.started_ms = state.now_ms()
        self.rates = RateSampler()  # per-destination msg/s for the management API

    # ================================================================ settings
    @property
    def tracer(self) -> Tracer | None:
        """Message trace (docs/pipeline.md); None when tracing is off."""
        return self.state.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        self.state.tracer = tracer

    @property
    def persistent_refusal(self) -> str | None:
        """Why the store takes no new persistent messages right now, or None."""
        return self.state.persistent_refusal

    @persistent_refusal.setter
    def persistent_refusal(self, reason: str | None) -> None:
        self.state.persistent_refusal = reason

    @property
    def dispatch_marks(self) -> bool:
        """Whether the store keeps dispatch marks across a restart."""
        return self.state.dispatch_marks

    @dispatch_marks.setter
    def dispatch_marks(self, on: bool) -> None:
        self.state.dispatch_marks = on

    @property
    def authz(self) -> AuthorizationMap | None:
        return self._access.authz

    @property
    def denials(self) -> DenialRecord:
        return self._access.denials

    @property
    def denied_publishes(self) -> int:
        """Client sends refused as not authorized (broker-owned topics)."""
        return self._router.denied_publishes

    @property
    def client_connections_opened(self) -> int:
        return self._connections.client_connections_opened

    # ================================================================ decisions
    def now_ms(self) -> int:
        return self.state.clock()

    def store_op(self, op: StoreOp) -> None:
        self.state.ops.append(op)

    def emit(self, outcome: Outcome) -> None:
        self.state.outbox.append(outcome)

    def mark_dirty(self, queue: Queue) -> None:
        self.state.dirty[queue] = None

    def remember_stored(self, message: Message) -> bool:
        return self.state.remember_stored(message)

    @property
    def has_deferred(self) -> bool:
        return bool(self.state.deferred)

    def dispatch_dirty(self) -> None:
        self.state.dispatch_dirty()

    def take_ops(self) -> list[StoreOp]:
        state = self.state
        ops, state.ops = state.ops, []
        return ops

    def take_outcomes(self) -> list[Outcome]:
        state = self.state
        out, state.outbox = state.outbox, []
        return out

    # ------------------------------------------------------------ shards of a node
    def use_shard(self, shard: ShardIdentity) -> None:
        """Serve as shard ``shard.index`` of a node (before any connection or recovery):
        destinations other shards own become decisions (core/shard_relay.py). Message
        ids and temporary names carry ``s<k>``, so shards never mint the same id."""
        if shard.count > 1:
            self.state.shard = shard
            self.state.boot = f"s{shard.index}-{self.state.boot}"

    def take_shard_sends(self) -> list[ShardSend]:
        """Messages routed to destinations other shards own, since the last call."""
        state = self.state
        sends, state.shard_sends = state.shard_sends, []
        return sends

    @property
    def shard_transactions(self) -> ShardTransactions:
        """Transactions across the shards of a node, both roles (core/shard_txn.py)."""
        return self._transactions.shards

    def take_relay_decisions(self) -> list[RelayDecision]:
        """Relayed consumers opened, closed and settled, in order, since the last call."""
        state = self.state
        out, state.relay_ops = state.relay_ops, []
        return out

    def relay_deliver(self, owner: int, relay_id: int, tag: int, delivery_count: int,
                      message: Message) -> None:
        """Shard ``owner`` delivered ``message`` to relayed consumer ``relay_id``."""
        relay = self.state.relays.get(relay_id)
        if relay is None or relay.owner != owner:  # closed meanwhile: back, uncounted
            self.state.relay_ops.append(ShardSettle(owner, relay_id, tag, SETTLE_RETURNED))
            return
        relay.deliver(message, tag, delivery_count)

    def send_from_shard(self, conn: Connection, message: Message, redelivered: bool) -> bool:
        """Route a send another shard forwarded to this one, its destination's owner
        (the ingress shard checked the destination and rights). True: confirm after a
        sync. Raises as ``send`` does when this shard's limits refuse it."""
        return self._router.send_from_shard(conn, message, redelivered)

    def settle_relayed(self, consumer: Consumer, tags: list[int], *, acked: bool) -> bool:
        """Another shard's client acknowledged (or rejected) these deliveries of
        ``consumer``, this shard's consumer for it: as ``ack``/``nack`` of each tag,
        in one pass. True when a stored message was settled."""
        return self._acks.settle(consumer, tags, acked)

    def owner_unreachable(self, owner: int, down: bool) -> None:
        """Shard ``owner`` has been unreachable for longer than the node waits (or is
        back): sends to its destinations are refused (or accepted again)."""
        if down:
            self.state.owners_down.add(owner)
        else:
            self.state.owners_down.discard(owner)

    def pause_relayed(self, consumer: Consumer, paused: bool) -> None:
        """The shard that relays ``consumer`` (this shard's consumer for another shard's
        client) cannot take more, or can again: stop or resume dispatching to it."""
        if consumer.paused != paused and not consumer.closed:
            consumer.paused = paused
            if not paused:
                for queue in consumer.sources:
                    self.state.mark_dirty(queue)

    def relay_opens(self, owner: int) -> list[RelayOpen]:
        """The relayed consumers shard ``owner`` must run (again, after a new link)."""
        return [relay.open_decision(relay.consumers[0])
                for relay in self.state.relays.values()
                if relay.owner == owner and relay.consumers]

    def drop_durable_relayed(self, client_id: str, name: str | None) -> int:
        """Another shard's ``DurableDrop``: delete durable subscription ``name`` of
        ``client_id`` here (None: its MQTT session's) unless a consumer is attached."""
        return self._subscriptions.drop_durable_here(client_id, name)

    def drop_durables_elsewhere(self, client_id: str, name: str | None = None) -> None:
        """One shard of several: the other shards delete durable subscription ``name``
        of ``client_id`` if they keep it (those on topics they own), unattached; None:
        every MQTT session subscription of the client (its session ends: clean start)."""
        self._subscriptions.drop_durable_elsewhere(client_id, name)

    def retained_owned(self) -> list[Message]:
        """The stored retained messages of the topics this shard owns: what another
        shard is sent in full when its link comes up."""
        state = self.state
        return [msg for dest, (seq, msg) in state.retained.items()
                if seq > 0 and not state.owned_elsewhere(dest)]

    def retained_copied(self, owner: int, dest: Destination, message: Message | None) -> None:
        """Shard ``owner`` retained ``message`` on its topic ``dest`` (None: cleared)."""
        copies = self.state.retained_copies
        if message is None:
            copies.pop(dest, None)
        else:
            copies[dest] = (owner, message)

    def retained_synced(self, owner: int, messages: list[Message], *,
                        first: bool = True) -> None:
        """Retained messages shard ``owner`` keeps, sent in full (in parts) as its link
        came up: the first part replaces what was copied from it before (cleared
        meanwhile: gone), the others add to it."""
        copies = self.state.retained_copies
        if first:
            for dest in [d for d, (o, _) in copies.items() if o == owner]:
                del copies[dest]
        for message in messages:
            copies[message.destination] = (owner, message)

    def relay_link_lost(self, owner: int) -> None:
        """The link to ``owner`` dropped: what it delivered goes back there."""
        for relay in self.state.relays.values():
            if relay.owner == owner:
                relay.link_lost()
        # As the owner: that shard's producers of what this one owns are gone with it
        # (its link back tells them again: ``producer_notes``).
        self._router.producers_lost(owner)

    def producer_relayed(self, shard: int, dest: Destination, connection_id: str,
                         added: bool) -> None:
        """Another shard's ``ProducerNote``: its connection ``connection_id`` started
        (stopped) sending to ``dest``, owned here (the Producer advisory)."""
        self._router.producer_relayed(shard, dest, connection_id, added)

    def producer_notes(self, owner: int) -> list[ProducerNote]:
        """This shard's producers of what shard ``owner`` owns (told again with a new
        link: the owner forgot them when the old one dropped)."""
        state = self.state
        shard = state.shard
        if shard is None or not state.config.advisory_support:
            return []
        return [ProducerNote(owner, d, self._router.node_id(conn.id), True)
                for conn in state.connections.values() if not conn.closed
                for d in conn.producer_destinations
                if not d.is_wildcard and state.owner_of(shard, d) == owner]

    def take_dispatch_marks(self) -> tuple[list[tuple[Queue, int]], bool]:
        """The dispatch marks written since the last call, and whether the outcomes
        taken next must wait until the store has made them (and everything written
        before) durable: a delivery that a crash could forget must not leave the broker
        before its mark is on disk. Call after ``take_ops``, before ``take_outcomes``."""
        state = self.state
        marks, state.marks = state.marks, []
        hold, state.hold = state.hold, False
        return marks, hold

    def dispatch_marks_durable(self, marks: list[tuple[Queue, int]]) -> None:
        """The store synced the batches holding ``marks`` (from ``take_dispatch_marks``)."""
        for queue, mark in marks:
            queue.mark_durable(mark)

    @property
    def has_page_loads(self) -> bool:
        return bool(self.state.page_loads)

    def take_page_loads(self) -> list[PageLoad]:
        """The pages queues (and streams) asked for since the last call
        (core/paging.py): the caller reads each from the store
        (``Store.load(load.key, load.after_seq, load.count)``) and answers with
        ``page_loaded`` or ``page_failed``. Call after ``take_ops`` has been written, so
        that the store holds every reference the page may contain."""
        state = self.state
        loads, state.page_loads = state.page_loads, []
        return loads

    def page_loaded(self, load: PageLoad, entries: list[StoredEntry]) -> None:
        """The store returned the page ``load`` asked for: its queue dispatches it on
        the next ``dispatch_dirty``."""
        load.queue.page_loaded(load, entries)

    def page_failed(self, load: PageLoad) -> None:
        """The page could not be read: the queue keeps its place and asks again on the
        next ``tick`` (a broken store is not retried in a tight loop)."""
        load.queue.page_failed(load)
        self.state.page_retry[load.queue] = None

    def tick(self) -> None:
        """Periodic housekeeping: ask again for failed pages, sweep expired messages,
        sample rates."""
        state = self.state
        if state.page_retry:
            state.dirty.update(state.page_retry)
            state.page_retry.clear()
        self._dead_letters.sweep()
        self.rates.sample(state.now_ms(), state.queues, state.topics)

    # ================================================================ lookups
    def stream_policy_for(self, dest: Destination) -> StreamPolicy | None:
        """The stream policy making ``dest`` a stream, if any (queues only)."""
        return self.state.stream_policy_for(dest)

    def policy_for(self, dest: Destination) -> DestinationPolicy:
        return self.state.policy_for(dest)

    def new_message_id(self, connection_id: str) -> str:
        return self.state.new_message_id(connection_id)

    def get_queue(self, dest: Destination) -> Queue:
        """The queue of ``dest``, created on first use."""
        return self.state.get_queue(dest)

    def subs_for(self, dest: Destination) -> list[TopicSubscription]:
        """The topic subscriptions a message sent to ``dest`` reaches."""
        return self.state.topic_index.match(dest)

    def temp_exists(self, dest: Destination) -> bool:
        return self.state.temp_exists(dest)

    def waiting_queues(self, dest: Destination) -> list[Queue]:
        """The queues here in which a message sent to ``dest`` waits for its consumers:
        the queue itself if it exists, or each matching topic subscription's."""
        if dest.is_queue:
            queue = self.state.queues.get(dest)
            return [] if queue is None else [queue]
        return [sub.queue for sub in self.state.topic_index.match(dest)]

    def consumes(self, connection_id: str, dest: Destination) -> bool:
        """Whether connection ``connection_id`` has a consumer of ``dest`` here (a
        relayed one included): push-back never holds a connection by its own
        consumers."""
        conn = self.state.connections.get(connection_id)
        return conn is not None and any(
            matches(pattern, dest)
            for consumer in conn.consumers.values() for pattern in consumer.spec.destinations)

    def consumer_count(self, dest: Destination) -> int:
        """Open consumers that named ``dest`` in their subscription."""
        return self._advisories.consumer_count(dest)

    # ================================================================ listeners, advisories
    def add_listener(self, listener: Callable[[ConsumerEvent], None]) -> None:
        self._advisories.listeners.append(listener)

    def remove_listener(self, listener: Callable[[ConsumerEvent], None]) -> None:
        if listener in self._advisories.listeners:
            self._advisories.listeners.remove(listener)

    def advise(self, topic: Destination, advisory_type: str,
               fields: dict[str, PropertyValue]) -> None:
        """Publish an advisory (for subsystems outside the core: network bridges)."""
        self._router.advise(topic, advisory_type, fields)

    def advise_master_broker(self, fields: dict[str, object]) -> None:
        """``ActiveMQ.Advisory.MasterBroker``: this broker became master (HA). Kept as the
        topic's retained message too, so a client connecting after the takeover (which
        is every client: a slave opens no connectors) can still read it."""
        msg = self._advisories.master_broker_message(fields)
        if msg is not None:
            self._router.publish_internal(msg, retain=True)

    # ================================================================ trace hooks
    # For network bridges and other edges of the broker; no-ops while tracing is off.
    def trace_forwarded(self, message: Message, *, to_broker: str, connector: str) -> None:
        """A bridge handed ``message`` on towards ``to_broker`` over ``connector``."""
        tracer = self.state.tracer
        if tracer is not None:
            tracer.forwarded(message, to_broker=to_broker, connector=connector)

    def trace_received_from_bridge(self, message: Message, *, from_broker: str,
                                   connector: str) -> None:
        """``message`` arrived over ``connector`` from ``from_broker``; call before routing."""
        tracer = self.state.tracer
        if tracer is not None:
            tracer.received_from_bridge(message, from_broker=from_broker, connector=connector)

    def trace_dropped(self, message: Message, reason: str) -> None:
        """``message`` was discarded at the edge (e.g. a duplicate in the producer window)."""
        tracer = self.state.tracer
        if tracer is not None:
            tracer.message(DROPPED, message, reason=reason)

    # ================================================================ recovery
    def recover(self, recovery: Recovery) -> None:
        """Rebuild queues and durable subscriptions from what the store holds."""
        recover(self.state, recovery)

    def remember_stored_sends(self, recovery: Recovery) -> int:
        """Refill the duplicate window with stored bridge messages (core/recovery.py)."""
        return remember_stored_sends(self.state, recovery)

    def trace_recovered(self, page: int = 1000) -> int:
        """Trace a ``recovered`` event per stored message; returns how many."""
        return trace_recovered(self.state, page)

    # ================================================================ retained, records
    def retain(self, message: Message, *, persist: bool = True) -> None:
        """Keep ``message`` as its topic's retained message (core/routing.py)."""
        self._router.retain(message, persist=persist)

    def put_record(self, name: str, body: bytes) -> None:
        """Store (or replace) a small named record; it is back in ``records`` after a
        restart."""
        self._router.put_record(name, body)

    def drop_record(self, name: str) -> None:
        self._router.drop_record(name)

    def retained_for(self, patterns: Iterable[Destination],
                     principal: Principal | None = None) -> list[Message]:
        """Retained messages for a new subscription: those ``principal`` may read."""
        return self._router.retained_for(patterns, principal)

    # ================================================================ connections
    def authenticate(self, login: str | None, passcode: str | None) -> Principal:
        return self.auth.authenticate(login, passcode)

    def open_connection(self, principal: Principal, *, client_id: str | None = None,
                        remote: str = "", protocol: str = "stomp") -> Connection:
        return self._connections.open(principal, client_id, remote, protocol)

    def close_connection(self, conn: Connection) -> None:
        self._connections.close_step(conn, None)

    def close_connection_step(self, conn: Connection, budget: int | None) -> bool:
        """Close ``conn``, unsubscribing at most ``budget`` consumers per call (None:
        all); False while consumers remain (call again on a later loop turn)."""
        return self._connections.close_step(conn, budget)

    def create_temp(self, conn: Connection, kind: DestKind) -> Destination:
        return self._connections.create_temp(conn, kind)

    def adopt_temp(self, conn: Connection, dest: Destination) -> None:
        """Make a remote broker's temporary destination exist here, owned by the bridge
        connection ``conn`` (bridgeTempDestinations)."""
        self._connections.adopt_temp(conn, dest)

    # ================================================================ rights
    def may(self, principal: Principal, right: Right, dest: Destination) -> bool:
        """Whether ``principal`` holds ``right`` on ``dest`` (always, without a map)."""
        return self._access.may(principal, right, dest)

    def authorize(self, conn: Connection, right: Right, dest: Destination,
                  message: Message | None = None) -> None:
        """Raise AuthorizationError unless the connection's user holds ``right``."""
        self._access.authorize(conn, right, dest, message)

    def readable_filter(self, principal: Principal) -> Callable[[Destination], bool] | None:
        """For a wildcard subscription: which concrete destinations it may carry."""
        return self._access.readable_filter(principal)

    # ================================================================ producing
    def send(self, conn: Connection, destinations: tuple[Destination, ...], message: Message,
             txn: str | None = None, *, redelivered: bool = False) -> bool:
        """Route ``message`` to every destination. Returns True when a store sync
        must complete before the send may be confirmed. ``redelivered``: it may have
        been delivered before (a bridge's re-send): its consumers are told so."""
        return self._router.send(conn, destinations, message, txn, redelivered)

    def publish_internal(self, message: Message, *, retain: bool = False,
                         persist: bool = True) -> None:
        """Route a message the broker itself produces (MQTT wills, $SYS statistics);
        ``persist=False`` keeps a retained copy in memory only."""
        self._router.publish_internal(message, retain=retain, persist=persist)

    def route_admin(self, message: Message) -> bool:
        """Route a message the management API sends, moves or retries; True when it was
        stored."""
        return self._router.route_admin(message)

    # ================================================================ consuming
    def subscribe(self, conn: Connection, subscription_id: str, spec: ConsumerSpec, *,
                  stream_offset: StreamOffset | None = None) -> Consumer:
        """``stream_offset``: where a consumer of a stream destination starts (next)."""
        return self._subscriptions.subscribe(conn, subscription_id, spec, stream_offset)

    def unsubscribe(self, conn: Connection, consumer: Consumer) -> None:
        self._subscriptions.unsubscribe(conn, consumer)

    def drop_durable(self, key: tuple[str, str]) -> None:
        """Delete a durable subscription and its stored messages (no checks)."""
        self._subscriptions.drop_durable(key)

    def remove_durable(self, conn: Connection, name: str) -> None:
        """UNSUBSCRIBE with activemq.subscriptionName: delete the durable subscription."""
        self._subscriptions.remove_durable(conn, name)

    def set_paused(self, conn: Connection, paused: bool) -> None:
        """Transport back-pressure: stop (or resume) dispatching to this connection."""
        self._subscriptions.set_paused(conn, paused)

    # ================================================================ acks, transactions
    def ack(self, conn: Connection, consumer: Consumer, tag: int, *, cumulative: bool,
            txn: str | None = None) -> bool:
        return self._acks.ack(conn, consumer, tag, cumulative, txn)

    def nack(self, conn: Connection, consumer: Consumer, tag: int, *, cumulative: bool,
             txn: str | None = None) -> bool:
        return self._acks.nack(conn, consumer, tag, cumulative, txn)

    def begin(self, conn: Connection, txn_id: str) -> None:
        self._transactions.begin(conn, txn_id)

    def commit(self, conn: Connection, txn_id: str) -> bool:
        """Apply the transaction; its store writes form one atomic batch."""
        return self._transactions.commit(conn, txn_id)

    def abort(self, conn: Connection, txn_id: str) -> None:
        self._transactions.abort(conn, txn_id)

    # ================================================================ expiry and DLQ
    def expired(self, queue: Queue, entry: Entry) -> None:
        self._dead_letters.expired(queue, entry)

    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None:
        self._dead_letters.dead_letter(queue, entry, cause)

    # ================================================================ statistics
    def statistics(self) -> dict[str, object]:
        dests: list[dict[str, object]] = []
        for d, q in sorted(self.queues.items(), key=lambda kv: str(kv[0])):
            dests.append({"name": d.name, "type": d.kind.value, "depth": q.depth,
                          "enqueued": q.stats.enqueued, "dequeued": q.stats.dequeued,
                          "dispatched": q.stats.dispatched, "expired": q.stats.expired,
                          "dead_lettered": q.stats.dead_lettered,
                          "redelivered": q.stats.redelivered, "inflight": q.inflight,
                          "consumers": len(q.consumers), "memory": q.in_memory_bytes,
                          "producers": self.state.producer_count(d)})
        for d, ts in sorted(self.topics.items(), key=lambda kv: str(kv[0])):
            if d.is_advisory or d.name.startswith(SYS_PREFIX):
                continue  # the broker's own topics, not the operator's destinations
            dests.append({"name": d.name, "type": d.kind.value, "depth": 0,
                          "enqueued": ts.enqueued, "dequeued": ts.dispatched,
                          "dispatched": ts.dispatched, "expired": 0, "dead_lettered": 0,
                          "redelivered": 0,
                          "inflight": 0, "consumers": len(self.subs_for(d)), "memory": 0,
                          "producers": self.state.producer_count(d)})
        durables = [{"clientId": cid, "name": name, "destination": sub.durable.destination
                     if sub.durable else "", "pending": sub.queue.depth,
                     "active": sub.consumer is not None}
                    for (cid, name), sub in sorted(self.durables.items())]
        return {"broker": self.name, "uptime_ms": self.now_ms() - self.started_ms,
                "connections": sum(1 for c in self.connections.values()
                                   if c.protocol != "shard"),
                "destinations": dests,
                "durable_subscriptions": durables,
                "duplicates_dropped": self.dedup.duplicates,
                "denied_publishes": self.denied_publishes,
                "denied": {"total": self.denials.total,
                           "by_user": dict(sorted(self.denials.by_user.items()))},
                **self.auth.statistics(),  # failed_logins, login_slowed_addresses
                "memory": {"used": self.usage.used, "limit": self.usage.limit,
                           "peak": self.usage.peak, "percent": round(self.usage.percent, 1)},
                "store": self.store.stats(),
                "persistent_refused": self.persistent_refusal,
                **self.producers_elsewhere()}

    def producers_elsewhere(self) -> dict[str, object]:
        """One shard of several: its clients sending to destinations other shards own
        (``producers_elsewhere``, per destination), which the owner's figures cannot
        count; the node adds them to the owner's. Nothing on one broker."""
        shard = self.state.shard
        if shard is None:
            return {}
        counts: dict[Destination, int] = {}
        for conn in self.connections.values():
            if conn.closed or conn.protocol == "shard":
                continue
            for d in conn.producer_destinations:
                if self.state.owner_of(shard, d) != shard.index:
                    counts[d] = counts.get(d, 0) + 1
        return {"producers_elsewhere": [
            {"type": d.kind.value, "name": d.name, "producers": n}
            for d, n in sorted(counts.items(), key=lambda kv: str(kv[0]))]}
