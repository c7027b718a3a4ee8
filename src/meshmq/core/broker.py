"""The broker core: routes messages and returns its decisions as data.

Nothing here touches a socket or a clock: protocol sessions call the methods
below, then the runtime calls ``pump`` pieces (``dispatch_dirty``,
``take_ops``, ``take_outcomes``) to write the store batch and hand deliveries
to connections. All calls happen on one thread (the event loop), so the core
needs no locks.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from meshmq.config.model import BrokerConfig, DestinationPolicy, StreamPolicy
from meshmq.core import destinations as dst
from meshmq.core.auth import Authenticator, Principal
from meshmq.core.authorization import AuthorizationMap, DenialRecord, Right, denial_text
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.dedup import DEDUP_PROPERTY, DuplicateWindow, network_key
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.paging import PageLoad
from meshmq.core.queue import Entry, Outcome, Queue
from meshmq.core.rates import RateSampler
from meshmq.core.selector import Selector, compile_selector, message_lookup
from meshmq.core.stream import NEXT, STREAM_PREFIX, StreamOffset, StreamQueue
from meshmq.core.topic_index import TopicIndex
from meshmq.core.trace import (
    DLQ,
    DROPPED,
    EXPIRED,
    RECEIVED,
    RECOVERED,
    STORED,
    Tracer,
)
from meshmq.core.usage import MemoryUsage
from meshmq.errors import (
    AuthorizationError,
    DestinationError,
    MeshmqError,
    ProtocolError,
    ResourceLimitError,
    TransactionError,
)
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    Store,
    StoredEntry,
    StoreOp,
)

log = logging.getLogger("meshmq.broker")

ADVISORY_PREFIX = "ActiveMQ.Advisory."
RETAINED_PREFIX = "retained://"
SYS_PREFIX = "$SYS."  # the broker's statistics topics (MQTT $SYS/...), memory only
RECORD_PREFIX = "record://"
_TYPE_NAMES = {DestKind.QUEUE: "Queue", DestKind.TOPIC: "Topic",
               DestKind.TEMP_QUEUE: "TempQueue", DestKind.TEMP_TOPIC: "TempTopic"}


@dataclass(slots=True)
class Transaction:
    id: str
    sends: list[tuple[tuple[Destination, ...], Message]] = field(default_factory=list)
    acks: list[tuple[Consumer, int, bool]] = field(default_factory=list)
    nacks: list[tuple[Consumer, int, bool]] = field(default_factory=list)


@dataclass(slots=True)
class Connection:
    id: str
    principal: Principal
    client_id: str | None = None
    remote: str = ""
    protocol: str = "stomp"
    connected_ms: int = 0
    consumers: dict[str, Consumer] = field(default_factory=dict)
    transactions: dict[str, Transaction] = field(default_factory=dict)
    temp_destinations: set[Destination] = field(default_factory=set)
    producer_destinations: set[Destination] = field(default_factory=set)
    # Whether its rights are checked (an authorization map, and not the broker's own),
    # and the destinations it was allowed to send to (write checked once each).
    checked: bool = False
    writable: set[Destination] = field(default_factory=set)
    closed: bool = False
    sent: int = 0  # messages it sent (accepted or not): the management API shows it


class TopicSubscription:
    """A consumer's (or an offline durable subscriber's) interest in topics."""

    __slots__ = ("connection_id", "consumer", "durable", "no_local", "patterns", "queue",
                 "readable", "selector_text", "shared_key")

    def __init__(self, patterns: tuple[Destination, ...], queue: Queue, *,
                 selector_text: str | None, no_local: bool, connection_id: str | None,
                 durable: DurableSubscription | None) -> None:
        self.patterns = patterns
        self.queue = queue
        self.selector_text = selector_text
        self.no_local = no_local
        self.connection_id = connection_id
        self.durable = durable
        self.consumer: Consumer | None = None
        # Set for an MQTT shared subscription group: its key in Broker._shared.
        self.shared_key: tuple[str, tuple[Destination, ...], str | None] | None = None
        # A wildcard subscription under an authorization map: which of the topics it
        # matches its subscriber may read (None: all of them).
        self.readable: Callable[[Destination], bool] | None = None

    def matches(self, dest: Destination) -> bool:
        return any(dst.matches(p, dest) for p in self.patterns)


@dataclass(slots=True)
class TopicStats:
    enqueued: int = 0
    dispatched: int = 0


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


class Broker:
    def __init__(self, config: BrokerConfig, store: Store, *,
                 clock: Callable[[], int] | None = None) -> None:
        self.config = config
        self.name = config.broker_name
        self.store = store
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.usage = MemoryUsage(config.usage.memory_limit)
        self.auth = Authenticator(config.auth)
        # Rights per destination (core/authorization.py); None: everything is allowed.
        self.authz = (AuthorizationMap(config.auth.authorization)
                      if config.auth.authorization is not None else None)
        self.denials = DenialRecord()
        self.queues: dict[Destination, Queue] = {}
        self.topics: dict[Destination, TopicStats] = {}
        self.connections: dict[str, Connection] = {}
        self.client_ids: dict[str, str] = {}  # client id -> connection id
        self.durables: dict[tuple[str, str], TopicSubscription] = {}
        self._topic_index: TopicIndex[TopicSubscription] = TopicIndex()
        # Why the store takes no new persistent messages right now (disk full, the
        # store's size limit), or None; set by the runtime from the store's state.
        self.persistent_refusal: str | None = None
        # Open consumers per destination they named (advisories' consumerCount, the
        # network's demand), kept up to date instead of counted on every subscribe.
        self._consumer_counts: dict[Destination, int] = {}
        self._queue_wildcards: list[Consumer] = []
        self._shared: dict[tuple[str, tuple[Destination, ...], str | None],
                           TopicSubscription] = {}
        # Retained messages (MQTT): the last retained message per topic, and its store seq.
        self.retained: dict[Destination, tuple[int, Message]] = {}
        # Small named records protocol layers keep in the store (MQTT session state).
        self.records: dict[str, tuple[int, bytes]] = {}
        # Last seq used per single-reference key (retained messages and records).
        self._single_seq: dict[str, int] = {}
        self._dirty: dict[Queue, None] = {}
        self._deferred: dict[Queue, None] = {}
        self._sendable: set[Destination] = set()
        self._bursting: list[Consumer] = []
        self._ops: list[StoreOp] = []
        self._outbox: list[Outcome] = []
        # Dispatch marks (Queue._cover): off unless the runtime's store keeps them across
        # a restart. Marks written since the last take_dispatch_marks(), and whether a
        # delivery of this pump waits for one to be durable.
        self.dispatch_marks = False
        self._marks: list[tuple[Queue, int]] = []
        self._hold = False
        # Pages of stored messages queues asked for (core/paging.py), for the runtime,
        # and queues whose last load failed, asked again on the next tick.
        self._page_loads: list[PageLoad] = []
        self._page_retry: dict[Queue, None] = {}
        self._listeners: list[Callable[[ConsumerEvent], None]] = []
        self.dedup = DuplicateWindow(config.duplicate_window)
        # Client sends refused as not authorized (broker-owned topics), for statistics.
        self.denied_publishes = 0
        self._policies = [(Destination.parse_uri(p.match), p) for p in config.policies]
        self._stream_policies = [(Destination.parse_uri(p.match), p) for p in config.streams]
        self._default_policy = DestinationPolicy()
        self._boot = format(self._clock(), "x")
        self._conn_seq = itertools.count(1)
        self.client_connections_opened = 0  # since start; broker links not counted
        self._msg_seq = itertools.count(1)
        self._temp_seq = itertools.count(1)
        self.started_ms = self._clock()
        # Message trace (docs/pipeline.md); None when tracing is off. The runtime sets it.
        self.tracer: Tracer | None = None
        self.rates = RateSampler()  # per-destination msg/s for the management API

    # ================================================================ plumbing
    def now_ms(self) -> int:
        return self._clock()

    def store_op(self, op: StoreOp) -> None:
        self._ops.append(op)

    def emit(self, outcome: Outcome) -> None:
        self._outbox.append(outcome)

    def remember_network_message(self, message: Message) -> None:
        self.dedup.remember(network_key(message))

    def dispatch_marked(self, queue: Queue, mark: int) -> None:
        self._marks.append((queue, mark))

    def hold_deliveries(self) -> None:
        self._hold = True

    def take_dispatch_marks(self) -> tuple[list[tuple[Queue, int]], bool]:
        """The dispatch marks written since the last call, and whether the outcomes
        taken next must wait until the store has made them (and everything written
        before) durable: a delivery that a crash could forget must not leave the broker
        before its mark is on disk. Call after ``take_ops``, before ``take_outcomes``."""
        marks, self._marks = self._marks, []
        hold, self._hold = self._hold, False
        return marks, hold

    def dispatch_marks_durable(self, marks: list[tuple[Queue, int]]) -> None:
        """The store synced the batches holding ``marks`` (from ``take_dispatch_marks``)."""
        for queue, mark in marks:
            queue.mark_durable(mark)

    def request_page(self, load: PageLoad) -> None:
        self._page_loads.append(load)

    @property
    def has_page_loads(self) -> bool:
        return bool(self._page_loads)

    def take_page_loads(self) -> list[PageLoad]:
        """The pages queues asked for since the last call (core/paging.py): the caller
        reads each from the store (``Store.load(load.key, load.after_seq, load.count)``)
        and answers with ``page_loaded`` or ``page_failed``. Call after ``take_ops`` has
        been written, so that the store holds every reference the page may contain."""
        loads, self._page_loads = self._page_loads, []
        return loads

    def page_loaded(self, load: PageLoad, entries: list[StoredEntry]) -> None:
        """The store returned the page ``load`` asked for: its queue dispatches it on
        the next ``dispatch_dirty``."""
        load.queue.page_loaded(load, entries)

    def page_failed(self, load: PageLoad) -> None:
        """The page could not be read: the queue keeps its place and asks again on the
        next ``tick`` (a broken store is not retried in a tight loop)."""
        load.queue.page_failed(load)
        self._page_retry[load.queue] = None

    def mark_dirty(self, queue: Queue) -> None:
        self._dirty[queue] = None

    def defer(self, queue: Queue) -> None:
        self._deferred[queue] = None

    def bursting(self, consumer: Consumer) -> None:
        self._bursting.append(consumer)

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred)

    def dispatch_dirty(self) -> None:
        # A new pump: consumers' per-pump delivery budgets start again, and queues that
        # stopped on a budget carry on.
        for consumer in self._bursting:
            consumer.burst = 0
        self._bursting.clear()
        if self._deferred:
            self._dirty.update(self._deferred)
            self._deferred.clear()
        # Dispatching can dirty other queues (DLQ, redelivery); loop until quiet.
        rounds = 0
        while self._dirty and rounds < 100:
            rounds += 1
            dirty, self._dirty = self._dirty, {}
            for queue in dirty:
                queue.dispatch()

    def take_ops(self) -> list[StoreOp]:
        ops, self._ops = self._ops, []
        return ops

    def take_outcomes(self) -> list[Outcome]:
        out, self._outbox = self._outbox, []
        return out

    def add_listener(self, listener: Callable[[ConsumerEvent], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[ConsumerEvent], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def advise(self, topic: Destination, advisory_type: str,
               fields: dict[str, PropertyValue]) -> None:
        """Publish an advisory (for subsystems outside the core: network bridges)."""
        self._advise(topic, advisory_type, fields)

    def stream_policy_for(self, dest: Destination) -> StreamPolicy | None:
        """The stream policy making ``dest`` a stream, if any (queues only)."""
        if dest.kind is DestKind.QUEUE:
            for pattern, policy in self._stream_policies:
                if dst.matches(pattern, dest):
                    return policy
        return None

    def policy_for(self, dest: Destination) -> DestinationPolicy:
        for pattern, policy in self._policies:
            if dst.matches(pattern, dest):
                return policy
        return self._default_policy

    def new_message_id(self, connection_id: str) -> str:
        return f"ID:{self.name}-{self._boot}-{connection_id}-{next(self._msg_seq)}"

    # ================================================================ trace hooks
    # For network bridges and other edges of the broker; no-ops while tracing is off.
    def trace_forwarded(self, message: Message, *, to_broker: str, connector: str) -> None:
        """A bridge handed ``message`` on towards ``to_broker`` over ``connector``."""
        if self.tracer is not None:
            self.tracer.forwarded(message, to_broker=to_broker, connector=connector)

    def trace_received_from_bridge(self, message: Message, *, from_broker: str,
                                   connector: str) -> None:
        """``message`` arrived over ``connector`` from ``from_broker``; call before routing."""
        if self.tracer is not None:
            self.tracer.received_from_bridge(message, from_broker=from_broker,
                                             connector=connector)

    def trace_dropped(self, message: Message, reason: str) -> None:
        """``message`` was discarded at the edge (e.g. a duplicate in the producer window)."""
        if self.tracer is not None:
            self.tracer.message(DROPPED, message, reason=reason)

    def trace_recovered(self, page: int = 1000) -> int:
        """Record a ``recovered`` event for every stored message (after ``recover``);
        lets the audit tell messages that survived a crash from lost ones."""
        tracer = self.tracer
        if tracer is None:
            return 0
        count = 0
        queues = [q for q in self.queues.values() if q.key is not None and not q.retains_all]
        queues += [sub.queue for sub in self.durables.values()]
        for queue in queues:
            if not queue.depth or queue.key is None:
                continue
            after = 0
            while True:
                entries = self.store.load(queue.key, after, page)
                for entry in entries:
                    tracer.message(RECOVERED, entry.message, queue.destination,
                                   delivery_count=entry.delivery_count)
                    after = entry.seq
                count += len(entries)
                if len(entries) < page:
                    break
        return count

    # ================================================================ recovery
    def recover(self, recovery: Recovery) -> None:
        """Rebuild queues and durable subscriptions from what the store holds."""
        durable_keys = {d.key for d in recovery.durable_subscriptions}
        for key, info in recovery.keys.items():
            if key in durable_keys:
                continue
            if key.startswith(STREAM_PREFIX):
                sdest = dst.queue(key[len(STREAM_PREFIX):])
                self.queues[sdest] = StreamQueue(
                    sdest, self.policy_for(sdest),
                    self.stream_policy_for(sdest) or StreamPolicy(match=str(sdest)), self,
                    self.store, first_seq=info.first_seq, last_seq=info.last_seq)
                continue
            if key.startswith((RETAINED_PREFIX, RECORD_PREFIX)):
                self._single_seq[key] = info.last_seq
                for entry in self.store.load(key, 0, 10):
                    if key.startswith(RECORD_PREFIX):
                        self.records[key[len(RECORD_PREFIX):]] = (entry.seq,
                                                                  entry.message.body)
                    else:
                        self.retained[entry.message.destination] = (entry.seq, entry.message)
                continue
            try:
                dest = Destination.parse_uri(key)
            except MeshmqError:
                log.warning("store holds unknown key %r; ignored", key)
                continue
            if dest.kind is not DestKind.QUEUE:
                log.warning("store holds non-queue key %r; dropped", key)
                self._ops.append(DropKey(key))
                continue
            self.queues[dest] = Queue(dest, key, self.policy_for(dest), self, self.store,
                                      last_seq=info.last_seq, stored_count=info.count,
                                      dispatched=info.dispatched)
            self.mark_dirty(self.queues[dest])
        for record in recovery.durable_subscriptions:
            stored = recovery.keys.get(record.key)
            patterns = tuple(Destination.parse_uri(u) for u in record.destination.split(","))
            queue = Queue(patterns[0], record.key, self.policy_for(patterns[0]), self,
                          self.store, last_seq=stored.last_seq if stored else 0,
                          stored_count=stored.count if stored else 0, prefiltered=True,
                          dispatched=stored.dispatched if stored else 0)
            sub = TopicSubscription(patterns, queue, selector_text=record.selector,
                                    no_local=record.no_local, connection_id=None,
                                    durable=record)
            self.durables[(record.client_id, record.subscription_name)] = sub
            self._add_topic_sub(sub)

    def remember_stored_network_messages(self, recovery: Recovery) -> int:
        """Put the newest stored messages that came over a bridge into the duplicate
        window, up to its capacity, right after ``recover``; returns how many.

        A bridge re-sends what it never saw acknowledged, and those are the messages this
        broker received last: found here, they are acknowledged as duplicates and not
        stored twice. (Paging in re-adds them too, but a queue deeper than its page size
        pages the newest ones in only after a long while.)"""
        budget = self.dedup.capacity
        found = 0
        for key, info in recovery.keys.items():
            if budget <= 0:
                break
            if not info.count or key.startswith((STREAM_PREFIX, RETAINED_PREFIX,
                                                 RECORD_PREFIX)):
                continue
            want = min(info.count, budget)
            entries = self.store.load(key, max(0, info.last_seq - want), want)
            budget -= len(entries)
            for entry in entries:
                if entry.message.broker_path:
                    self.remember_network_message(entry.message)
                    found += 1
        return found

    def _replace_single(self, key: str, old_seq: int | None,
                        message: Message | None) -> int | None:
        """Replace the one stored reference of ``key`` (retained messages and records
        keep exactly one); returns the new seq, or None when only removing."""
        if old_seq is not None:
            self._ops.append(RemoveRef(key, old_seq))
        if message is None:
            return None
        seq = self._single_seq.get(key, 0) + 1
        self._single_seq[key] = seq
        self._ops.append(AddMessage(message, ((key, seq),)))
        return seq

    # ================================================================ retained messages
    def retain(self, message: Message, *, persist: bool = True) -> None:
        """Keep ``message`` as its topic's retained message (an empty body clears it).
        Retained messages are stored, whatever their persistence, unless ``persist`` is
        False: then it lives in memory only (seq 0), as the broker's own ``$SYS``
        statistics, which are regenerated at every start."""
        dest = message.destination
        old = self.retained.pop(dest, None)
        old_seq = old[0] if old is not None and old[0] > 0 else None
        seq = self._replace_single(RETAINED_PREFIX + dest.name, old_seq,
                                   message if message.body and persist else None)
        if seq is not None:
            self.retained[dest] = (seq, message)
        elif message.body and not persist:
            self.retained[dest] = (0, message)

    def put_record(self, name: str, body: bytes) -> None:
        """Store (or replace) a small named record; it comes back in ``records`` after a
        restart. Written in the current batch, so it is as durable as what follows it."""
        old = self.records.pop(name, None)
        record = Message(message_id=f"record:{name}", destination=dst.queue("meshmq.records"),
                         body=body)
        seq = self._replace_single(RECORD_PREFIX + name, old[0] if old is not None else None,
                                   record)
        assert seq is not None
        self.records[name] = (seq, body)

    def drop_record(self, name: str) -> None:
        old = self.records.pop(name, None)
        if old is not None:
            self._replace_single(RECORD_PREFIX + name, old[0], None)

    def retained_for(self, patterns: Iterable[Destination],
                     principal: Principal | None = None) -> list[Message]:
        """Retained messages for a new subscription: those ``principal`` may read."""
        pats = tuple(patterns)
        readable = None if principal is None else self.readable_filter(principal)
        return [msg for dest, (_, msg) in sorted(self.retained.items(),
                                                 key=lambda kv: kv[0].name)
                if any(dst.matches(p, dest) for p in pats)
                and (readable is None or readable(dest))]

    # ================================================================ connections
    def authenticate(self, login: str | None, passcode: str | None) -> Principal:
        return self.auth.authenticate(login, passcode)

    def open_connection(self, principal: Principal, *, client_id: str | None = None,
                        remote: str = "", protocol: str = "stomp") -> Connection:
        if client_id is not None and client_id in self.client_ids:
            raise MeshmqError(f"Broker: {self.name} - Client: {client_id} already connected",
                              code="client-id-in-use", retriable=True)
        conn = Connection(id=f"c{next(self._conn_seq)}", principal=principal,
                          client_id=client_id, remote=remote, protocol=protocol,
                          connected_ms=self.now_ms(),
                          checked=self.authz is not None and not principal.internal)
        self.connections[conn.id] = conn
        if protocol != "network":
            self.client_connections_opened += 1
        if client_id is not None:
            self.client_ids[client_id] = conn.id
        self._advise(dst.topic("ActiveMQ.Advisory.Connection"), "ConnectionAdded", {
            "connectionId": conn.id, "clientId": client_id, "userName": principal.user,
            "remoteAddress": remote, "protocol": protocol})
        return conn

    def close_connection(self, conn: Connection) -> None:
        self.close_connection_step(conn, None)

    def close_connection_step(self, conn: Connection, budget: int | None) -> bool:
        """Close ``conn``, unsubscribing at most ``budget`` consumers per call (None: all).

        Returns False while consumers remain: call again (on a later event-loop turn, so
        that a client with 100,000 subscriptions does not stall everybody else). From the
        first call on, nothing is dispatched to the connection's consumers.
        """
        if not conn.closed:
            conn.closed = True
            for consumer in conn.consumers.values():
                consumer.paused = True
        if conn.consumers:
            if budget is not None and len(conn.consumers) > budget:
                for consumer in list(itertools.islice(conn.consumers.values(), budget)):
                    self.unsubscribe(conn, consumer)
                return False
            for consumer in list(conn.consumers.values()):
                self.unsubscribe(conn, consumer)
        elif conn.id not in self.connections:
            return True  # already closed
        conn.transactions.clear()
        for temp in list(conn.temp_destinations):
            self._delete_temp(conn, temp)
        for pd in conn.producer_destinations:
            self._advise(self._advisory_topic("Producer", pd), "ProducerRemoved",
                         {"connectionId": conn.id, "destination": str(pd)})
        self.connections.pop(conn.id, None)
        if conn.client_id is not None and self.client_ids.get(conn.client_id) == conn.id:
            del self.client_ids[conn.client_id]
        self._advise(dst.topic("ActiveMQ.Advisory.Connection"), "ConnectionRemoved", {
            "connectionId": conn.id, "clientId": conn.client_id})
        return True

    # ================================================================ temp destinations
    def create_temp(self, conn: Connection, kind: DestKind) -> Destination:
        assert kind.is_temporary
        dest = Destination(kind, f"ID:{self.name}-{self._boot}-{conn.id}:{next(self._temp_seq)}")
        if self.authz is not None:
            self.authorize(conn, Right.ADMIN, dest)
        conn.temp_destinations.add(dest)
        if kind is DestKind.TEMP_QUEUE:
            self._get_queue(dest)
        else:
            self.topics.setdefault(dest, TopicStats())
        self._advise(dst.topic(ADVISORY_PREFIX + _TYPE_NAMES[kind]), "TempDestinationAdded",
                     {"destination": str(dest), "connectionId": conn.id})
        return dest

    def _delete_temp(self, conn: Connection, dest: Destination) -> None:
        conn.temp_destinations.discard(dest)
        queue = self.queues.pop(dest, None)
        if queue is not None:
            queue.purge()
            queue.deleted = True
        self.topics.pop(dest, None)
        self._advise(dst.topic(ADVISORY_PREFIX + _TYPE_NAMES[dest.kind]),
                     "TempDestinationRemoved", {"destination": str(dest),
                                                "connectionId": conn.id})

    def adopt_temp(self, conn: Connection, dest: Destination) -> None:
        """Make a remote broker's temporary destination exist here, owned by the bridge
        connection ``conn`` (bridgeTempDestinations): replies sent here to it can then
        cross the network; it goes away with the bridge."""
        if self.temp_exists(dest):
            return
        conn.temp_destinations.add(dest)
        if dest.kind is DestKind.TEMP_QUEUE:
            self._get_queue(dest)
        else:
            self.topics.setdefault(dest, TopicStats())

    def temp_exists(self, dest: Destination) -> bool:
        return dest in self.queues if dest.kind is DestKind.TEMP_QUEUE else dest in self.topics

    # ================================================================ producing
    def send(self, conn: Connection, destinations: tuple[Destination, ...], message: Message,
             txn: str | None = None, *, redelivered: bool = False) -> bool:
        """Route ``message`` to every destination. Returns True when a store sync
        must complete before the send may be confirmed. ``redelivered``: it may have
        been delivered before (a bridge's re-send): its consumers are told so."""
        conn.sent += 1
        for d in destinations:
            if d in self._sendable:
                continue  # validated before (hot path: one set lookup per send)
            if d.is_wildcard:
                raise DestinationError(f"cannot send to a wildcard destination: {d}")
            if d.is_temporary and not self.temp_exists(d):
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
                    self._authorize_send(conn, d, message)
        if message.persistent and self.persistent_refusal is not None:
            self.trace_dropped(message, "store full")
            raise ResourceLimitError(f"persistent message refused: {self.persistent_refusal}; "
                                     "non-persistent messages are still accepted")
        if self.usage.full and not message.persistent:
            for d in destinations:
                if self.config.usage.on_limit == "fail" or \
                        not self.policy_for(d).producer_flow_control:
                    self.trace_dropped(message, "broker memory limit reached")
                    raise ResourceLimitError(
                        f"broker memory limit reached ({self.usage.limit} bytes); send to "
                        f"{d} rejected")
        if txn is not None:
            self._txn(conn, txn).sends.append((destinations, message))
            return False
        return self._route(conn, destinations, message, redelivered)

    # ================================================================ authorization
    def _exists(self, dest: Destination) -> bool:
        return dest in self.queues if dest.is_queue else dest in self.topics

    def _authorize_send(self, conn: Connection, dest: Destination, message: Message) -> None:
        """Write on ``dest``, and admin when this send creates it (ActiveMQ's rule)."""
        self.authorize(conn, Right.WRITE, dest, message)
        if not dest.is_temporary and not self._exists(dest):
            self.authorize(conn, Right.ADMIN, dest, message)
        if len(conn.writable) < 10_000:
            conn.writable.add(dest)

    def may(self, principal: Principal, right: Right, dest: Destination) -> bool:
        """Whether ``principal`` holds ``right`` on ``dest`` (always, without a map)."""
        authz = self.authz
        return authz is None or principal.internal or authz.allowed(principal.groups, right,
                                                                    dest)

    def authorize(self, conn: Connection, right: Right, dest: Destination,
                  message: Message | None = None) -> None:
        """Raise AuthorizationError unless the connection's user holds ``right`` on
        ``dest``; a denial is counted per user, logged (rate limited) and traced."""
        principal = conn.principal
        if self.may(principal, right, dest):
            return
        text = denial_text(principal.user, right, dest)
        unlogged = self.denials.note(principal.user, right, dest, self.now_ms())
        if unlogged is not None:
            more = f" ({unlogged} more since the last report)" if unlogged else ""
            log.warning("%s (connection %s from %s)%s", text, conn.id, conn.remote or "?", more)
        if self.tracer is not None:
            self.tracer.denied(dest, text, message)
        raise AuthorizationError(text)

    def readable_filter(self, principal: Principal) -> Callable[[Destination], bool] | None:
        """For a wildcard subscription: which concrete destinations it may carry."""
        authz = self.authz
        if authz is None or principal.internal:
            return None
        groups = principal.groups
        return lambda dest: authz.allowed(groups, Right.READ, dest)

    def publish_internal(self, message: Message, *, retain: bool = False,
                         persist: bool = True) -> None:
        """Route a message the broker itself produces (MQTT wills, $SYS statistics);
        ``persist=False`` keeps a retained copy in memory only."""
        self._route(None, (message.destination,), message)
        if retain:
            self.retain(message, persist=persist)

    def _route(self, conn: Connection | None, destinations: tuple[Destination, ...],
               message: Message, redelivered: bool = False) -> bool:
        if message.properties:
            dedup_id = message.properties.get(DEDUP_PROPERTY)
            if dedup_id is not None and self.dedup.check_and_add(str(dedup_id)):
                # A re-send of an accepted message: confirm again, store nothing. The
                # confirmation still waits for a store sync, which orders it after the
                # original's write.
                log.debug("duplicate send %s dropped (dedup-id %s)", message.message_id,
                          dedup_id)
                self.trace_dropped(message, "duplicate dedup-id (idempotent producer)")
                return True
        needs_sync = False
        # Producers' messages only: bridges trace received_from_bridge themselves.
        tracer = self.tracer if conn is not None and conn.protocol != "network" else None
        for i, d in enumerate(destinations):
            msg = message if i == 0 and d == message.destination else message.copy_to(d)
            if tracer is not None:
                tracer.hot(RECEIVED, msg, None, 0, None)
            if conn is not None and d not in conn.producer_destinations and not conn.closed:
                conn.producer_destinations.add(d)
                self._advise(self._advisory_topic("Producer", d), "ProducerAdded",
                             {"connectionId": conn.id, "destination": str(d),
                              "producerCount": self._producer_count(d)})
            queue = self.queues.get(d)
            if queue is not None or d.kind is DestKind.QUEUE or d.kind is DestKind.TEMP_QUEUE:
                needs_sync |= self._route_queue(queue or self._get_queue(d), msg,
                                                redelivered)
            else:
                needs_sync |= self._route_topic(d, msg, traced=tracer is not None,
                                                redelivered=redelivered)
        return needs_sync

    def _producer_count(self, d: Destination) -> int:
        return sum(1 for c in self.connections.values() if d in c.producer_destinations)

    def route_admin(self, message: Message) -> bool:
        """Route a message the management API sends, moves or retries to its destination
        (core/admin.py): no duplicate check, as a moved message was accepted once already.
        True when it was stored."""
        dest = message.destination
        if dest.is_queue:
            return self._route_queue(self._get_queue(dest), message)
        return self._route_topic(dest, message)

    def _route_queue(self, queue: Queue, msg: Message, redelivered: bool = False) -> bool:
        seq = queue.allocate_seq()
        if queue.retains_all:  # a stream: every message is stored, with its offset
            assert isinstance(queue, StreamQueue)
            msg = queue.stamp(msg, seq)
            persisted = True
        else:
            persisted = msg.persistent and queue.key is not None
        if persisted:
            self._ops.append(AddMessage(msg, ((queue.key or "", seq),)))
            if redelivered and not queue.retains_all:
                self._ops.append(SetDeliveryCount(queue.key or "", seq, 1))
            if self.tracer is not None:
                if queue.retains_all:
                    self.tracer.message(STORED, msg, queue.destination, reason="stream")
                else:
                    self.tracer.hot(STORED, msg, queue.destination, 0, None)
        queue.enqueue(msg, seq, persisted, delivery_count=int(redelivered))
        return persisted

    def _route_topic(self, dest: Destination, msg: Message, *, traced: bool = False,
                     redelivered: bool = False) -> bool:
        """``traced``: a producer's message, so having no subscriber is traced as a drop."""
        stats = self.topics.get(dest)
        if stats is None:
            stats = self.topics[dest] = TopicStats()
        stats.enqueued += 1
        subs = self._subs_for(dest)
        if not subs:
            if traced and self.tracer is not None:
                self.tracer.message(DROPPED, msg, reason="no subscriber")
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
                if not self._compiled(sub.selector_text).matches(lookup):
                    continue
            queue = sub.queue
            seq = queue.allocate_seq()
            persisted = sub.durable is not None and msg.persistent
            if persisted:
                refs.append((queue.key or "", seq))
            targets.append((queue, seq, persisted))
        if refs:
            self._ops.append(AddMessage(msg, tuple(refs)))
            if redelivered:
                self._ops.extend(SetDeliveryCount(key, seq, 1) for key, seq in refs)
            if self.tracer is not None:
                self.tracer.message(STORED, msg, dest)
        elif not targets and traced and self.tracer is not None:
            self.tracer.message(DROPPED, msg, reason="no matching subscriber")
        for queue, seq, persisted in targets:
            queue.enqueue(msg, seq, persisted, delivery_count=int(redelivered))
        stats.dispatched += len(targets)
        return bool(refs)

    @staticmethod
    def _compiled(text: str) -> Selector:
        return compile_selector(text)

    def _subs_for(self, dest: Destination) -> list[TopicSubscription]:
        return self._topic_index.match(dest)

    def _add_topic_sub(self, sub: TopicSubscription) -> None:
        self._topic_index.add(sub)

    def _remove_topic_sub(self, sub: TopicSubscription) -> None:
        self._topic_index.discard(sub)

    def _get_queue(self, dest: Destination) -> Queue:
        queue = self.queues.get(dest)
        if queue is None:
            stream = self.stream_policy_for(dest)
            if stream is not None:
                queue = StreamQueue(dest, self.policy_for(dest), stream, self, self.store)
            else:
                key = str(dest) if dest.kind is DestKind.QUEUE else None
                queue = Queue(dest, key, self.policy_for(dest), self, self.store)
            self.queues[dest] = queue
            for consumer in self._queue_wildcards:
                if any(dst.matches(p, dest) for p in consumer.spec.destinations) and (
                        consumer.readable is None or consumer.readable(dest)):
                    consumer.sources.append(queue)
                    queue.add_consumer(consumer)
        return queue

    # ================================================================ consuming
    def subscribe(self, conn: Connection, subscription_id: str, spec: ConsumerSpec, *,
                  stream_offset: StreamOffset | None = None) -> Consumer:
        """``stream_offset``: where a consumer of a stream destination starts (next)."""
        if subscription_id in conn.consumers:
            raise ProtocolError(f"subscription id {subscription_id!r} is already in use "
                                "on this connection", code="duplicate-subscription")
        if not spec.destinations:
            raise DestinationError("no destination")
        limit = self.config.max_subscriptions_per_connection
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
            if d.is_temporary and not d.is_wildcard and not self.temp_exists(d):
                raise DestinationError(f"temporary destination {d} does not exist")
        readable = None
        if self.authz is not None and not conn.principal.internal:
            for d in spec.destinations:  # a composite needs every part
                self.authorize(conn, Right.READ, d)
                if d.is_queue and not d.is_wildcard and not d.is_temporary \
                        and d not in self.queues:
                    self.authorize(conn, Right.ADMIN, d)  # this subscription creates it
            if any(d.is_wildcard for d in spec.destinations):
                readable = self.readable_filter(conn.principal)
        if spec.browser and topics:
            raise DestinationError("browsing is only possible on queues")
        durable_key = None
        if spec.subscription_name is not None and topics:
            if conn.client_id is None:
                raise ProtocolError("a durable subscription (activemq.subscriptionName) "
                                    "needs a client-id on CONNECT", code="client-id-required")
            durable_key = (conn.client_id, spec.subscription_name)
            existing = self.durables.get(durable_key)
            if existing is not None and existing.consumer is not None:
                raise ProtocolError(f"durable subscription {spec.subscription_name!r} of "
                                    f"client {conn.client_id!r} is already active",
                                    code="durable-in-use")
        policy = self.policy_for(spec.destinations[0])
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
        self._count_consumer(spec, 1)
        if spec.browser:
            self._browse(consumer, queues)
            return consumer
        for d in queues:
            if d.is_wildcard:
                if consumer not in self._queue_wildcards:
                    self._queue_wildcards.append(consumer)
                for qd, queue in list(self.queues.items()):
                    if dst.matches(d, qd) and queue not in consumer.sources and (
                            readable is None or readable(qd)):
                        consumer.sources.append(queue)
            else:
                queue = self._get_queue(d)
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
            self._count_consumer(spec, -1)
            raise DestinationError(f"x-stream-offset given, but {spec.destinations[0]} is "
                                   "not a stream destination")
        for stream in streams:
            stream.expect(consumer, stream_offset or NEXT)
        for queue in consumer.sources:
            queue.add_consumer(consumer)
        self._consumer_changed(conn, consumer, added=True)
        return consumer

    def _topic_subscription(self, conn: Connection, consumer: Consumer,
                            topics: tuple[Destination, ...],
                            durable_key: tuple[str, str] | None) -> TopicSubscription:
        spec = consumer.spec
        if spec.shared_group is not None and durable_key is None:
            shared_key = (spec.shared_group, topics, spec.selector)
            shared = self._shared.get(shared_key)
            if shared is None:
                queue = Queue(topics[0], None, self.policy_for(topics[0]), self, None,
                              prefiltered=True)
                shared = TopicSubscription(topics, queue, selector_text=spec.selector,
                                           no_local=False, connection_id=None, durable=None)
                shared.shared_key = shared_key
                self._shared[shared_key] = shared
                self._add_topic_sub(shared)
            return shared
        if durable_key is None:
            policy = self.policy_for(topics[0])
            queue = Queue(topics[0], None, policy, self, None, prefiltered=True)
            plain = TopicSubscription(topics, queue, selector_text=spec.selector,
                                      no_local=spec.no_local, connection_id=conn.id,
                                      durable=None)
            plain.consumer = consumer
            self._add_topic_sub(plain)
            return plain
        client_id, name = durable_key
        destination_text = ",".join(str(t) for t in topics)
        sub: TopicSubscription | None = self.durables.get(durable_key)
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
                                         no_local=spec.no_local, created_ms=self.now_ms())
            self._ops.append(PutDurableSubscription(record))
            queue = Queue(topics[0], key, self.policy_for(topics[0]), self, self.store,
                          prefiltered=True)
            sub = TopicSubscription(topics, queue, selector_text=spec.selector,
                                    no_local=spec.no_local, connection_id=conn.id,
                                    durable=record)
            self.durables[durable_key] = sub
            self._add_topic_sub(sub)
        sub.consumer = consumer
        sub.connection_id = conn.id
        return sub

    def drop_durable(self, key: tuple[str, str]) -> None:
        """Delete a durable subscription and its stored messages (no checks)."""
        sub = self.durables.pop(key)
        self._remove_topic_sub(sub)
        sub.queue.purge()
        sub.queue.deleted = True
        self._ops.append(DropKey(sub.queue.key or ""))

    def remove_durable(self, conn: Connection, name: str) -> None:
        """UNSUBSCRIBE with activemq.subscriptionName: delete the durable subscription."""
        if conn.client_id is None:
            raise ProtocolError("removing a durable subscription needs a client-id",
                                code="client-id-required")
        key = (conn.client_id, name)
        sub = self.durables.get(key)
        if sub is None:
            raise DestinationError(f"no durable subscription {name!r} for client "
                                   f"{conn.client_id!r}")
        if sub.consumer is not None:
            raise ProtocolError(f"durable subscription {name!r} is active; unsubscribe its "
                                "consumer first", code="durable-in-use")
        self.drop_durable(key)

    def _browse(self, consumer: Consumer, queues: list[Destination]) -> None:
        from meshmq.core.queue import BrowseEnd, Delivery

        for d in queues:
            for qd, queue in list(self.queues.items()):
                if not dst.matches(d, qd):
                    continue
                now = self.now_ms()
                for msg, count in queue.browse():
                    if msg.is_expired(now):
                        continue
                    if consumer.selector is not None and not consumer.selector.matches(
                            message_lookup(msg, delivery_count=count + 1,
                                           redelivered=count > 0)):
                        continue
                    tag = consumer.next_tag
                    consumer.next_tag += 1
                    self.emit(Delivery(consumer, msg, tag, count + 1 if count else 1))
        self.emit(BrowseEnd(consumer))

    def unsubscribe(self, conn: Connection, consumer: Consumer) -> None:
        if consumer.closed:
            return
        consumer.closed = True
        conn.consumers.pop(consumer.subscription_id, None)
        self._count_consumer(consumer.spec, -1)
        if consumer in self._queue_wildcards:
            self._queue_wildcards.remove(consumer)
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
        sub = consumer.topic_sub
        if sub is not None:
            if sub.durable is not None:  # the subscription outlives its consumer
                sub.consumer = None
                sub.connection_id = None
            elif sub.shared_key is None or not sub.queue.consumers:
                # A plain topic subscriber, or the last member of a shared group.
                if sub.shared_key is not None:
                    del self._shared[sub.shared_key]
                self._remove_topic_sub(sub)
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
                        self.mark_dirty(queue)

    # ================================================================ acknowledging
    def _select(self, consumer: Consumer, tag: int, cumulative: bool) -> list[int]:
        if tag not in consumer.dispatched:
            raise ProtocolError(f"unexpected ACK/NACK: no unacknowledged message with that "
                                f"id on subscription {consumer.subscription_id!r}",
                                code="unknown-ack")
        if not cumulative:
            return [tag]
        tags = []
        for t in consumer.dispatched:
            tags.append(t)
            if t == tag:
                break
        return tags

    def ack(self, conn: Connection, consumer: Consumer, tag: int, *, cumulative: bool,
            txn: str | None = None) -> bool:
        tags = self._select(consumer, tag, cumulative)
        if txn is not None:
            self._txn(conn, txn).acks.append((consumer, tag, cumulative))
            return False
        return self._apply_ack(consumer, tags)

    def _apply_ack(self, consumer: Consumer, tags: Iterable[int]) -> bool:
        return self._settle(consumer, tags, acked=True)

    def _settle(self, consumer: Consumer, tags: Iterable[int], *, acked: bool) -> bool:
        """Take entries out of the consumer's window: consumed (ack) or returned (nack)."""
        persisted = False
        for t in tags:
            entry = consumer.dispatched.pop(t, None)
            if entry is None:
                continue
            consumer.by_message_id.pop(entry.message.message_id, None)
            persisted |= entry.persisted
            if acked:
                consumer.acked_count += 1
                entry.queue.ack_entry(entry)
            else:
                entry.queue.release(entry, cause="message was rejected (NACK) too many times",
                                    reason="rejected (NACK)")
        for queue in consumer.sources:
            self.mark_dirty(queue)
        return persisted

    def nack(self, conn: Connection, consumer: Consumer, tag: int, *, cumulative: bool,
             txn: str | None = None) -> bool:
        tags = self._select(consumer, tag, cumulative)
        if txn is not None:
            self._txn(conn, txn).nacks.append((consumer, tag, cumulative))
            return False
        return self._apply_nack(consumer, tags)

    def _apply_nack(self, consumer: Consumer, tags: Iterable[int]) -> bool:
        return self._settle(consumer, tags, acked=False)

    # ================================================================ transactions
    def _txn(self, conn: Connection, txn_id: str) -> Transaction:
        txn = conn.transactions.get(txn_id)
        if txn is None:
            raise TransactionError(f"transaction {txn_id!r} has not been started")
        return txn

    def begin(self, conn: Connection, txn_id: str) -> None:
        if txn_id in conn.transactions:
            raise TransactionError(f"transaction {txn_id!r} is already started")
        conn.transactions[txn_id] = Transaction(txn_id)

    def commit(self, conn: Connection, txn_id: str) -> bool:
        """Apply the transaction; its store writes form one atomic batch."""
        txn = self._txn(conn, txn_id)
        del conn.transactions[txn_id]
        needs_sync = False
        for destinations, _ in txn.sends:
            for d in destinations:
                if d.is_temporary and not self.temp_exists(d):
                    raise TransactionError(f"temporary destination {d} no longer exists")
        for destinations, message in txn.sends:
            needs_sync |= self._route(conn, destinations, message)
        for consumer, tag, cumulative in txn.acks:
            if consumer.closed:
                continue
            tags = self._select_lenient(consumer, tag, cumulative)
            needs_sync |= self._apply_ack(consumer, tags)
        for consumer, tag, cumulative in txn.nacks:
            if consumer.closed:
                continue
            needs_sync |= self._apply_nack(consumer,
                                           self._select_lenient(consumer, tag, cumulative))
        return needs_sync

    def _select_lenient(self, consumer: Consumer, tag: int, cumulative: bool) -> list[int]:
        if tag not in consumer.dispatched:
            return []
        return self._select(consumer, tag, cumulative)

    def abort(self, conn: Connection, txn_id: str) -> None:
        self._txn(conn, txn_id)
        del conn.transactions[txn_id]

    # ================================================================ expiry and DLQ
    def tick(self) -> None:
        """Periodic housekeeping: sweep expired messages, sample rates."""
        if self._page_retry:
            self._dirty.update(self._page_retry)
            self._page_retry.clear()
        for queue in list(self.queues.values()):
            queue.expire_pending()
        for sub in self._topic_index.all():
            sub.queue.expire_pending()
        self.rates.sample(self.now_ms(), self.queues, self.topics)

    def expired(self, queue: Queue, entry: Entry) -> None:
        queue.remove_entry(entry)
        msg = entry.message
        if self.tracer is not None:
            self.tracer.message(EXPIRED, msg, queue.destination,
                                delivery_count=entry.delivery_count)
        self._advise(self._advisory_topic("Expired", queue.destination), "MessageExpired",
                     {"messageId": msg.message_id, "destination": str(queue.destination)})
        if queue.policy.expired_to_dlq and msg.persistent:
            self._to_dlq(queue, entry, "message expired")

    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None:
        queue.remove_entry(entry)
        msg = entry.message
        if not msg.persistent and not queue.policy.non_persistent_to_dlq:
            log.info("dropping non-persistent message %s from %s: %s",
                     msg.message_id, queue.destination, cause)
            if self.tracer is not None:
                self.tracer.message(DROPPED, msg, queue.destination, reason=cause)
            return
        self._to_dlq(queue, entry, cause)

    def _to_dlq(self, queue: Queue, entry: Entry, cause: str) -> None:
        policy = queue.policy
        msg = entry.message
        if policy.individual_dlq_prefix is not None:
            name = policy.individual_dlq_prefix + queue.destination.name
        else:
            name = policy.dead_letter_queue
        dlq = dst.queue(name)
        if queue.destination == dlq:
            log.warning("message %s failed in the dead letter queue %s itself; dropped",
                        msg.message_id, name)
            if self.tracer is not None:
                self.tracer.message(DROPPED, msg, dlq, reason=f"failed in the DLQ: {cause}")
            return
        queue.stats.dead_lettered += 1
        if self.tracer is not None:
            self.tracer.message(DLQ, msg, queue.destination, reason=f"{cause} -> {name}",
                                delivery_count=entry.delivery_count)
        props: dict[str, PropertyValue] = dict(msg.properties)
        props["dlqDeliveryFailureCause"] = cause
        copy = msg.copy_to(dlq, properties=props, expiration=0,
                           original_destination=msg.original_destination or msg.destination)
        self._route_queue(self._get_queue(dlq), copy)
        self._advise(self._advisory_topic("MessageDLQd", queue.destination), "MessageDLQd",
                     {"messageId": msg.message_id, "destination": str(queue.destination),
                      "cause": cause})

    # ================================================================ advisories
    @staticmethod
    def _advisory_topic(kind: str, dest: Destination) -> Destination:
        return Destination(DestKind.TOPIC, f"{ADVISORY_PREFIX}{kind}.{_TYPE_NAMES[dest.kind]}."
                                           f"{dest.name}")

    def _advise(self, topic: Destination, advisory_type: str,
                fields: dict[str, PropertyValue]) -> None:
        if not self.config.advisory_support or not self._subs_for(topic):
            return
        props: dict[str, PropertyValue] = {"advisoryType": advisory_type,
                                           "originBrokerName": self.name}
        props.update({k: v for k, v in fields.items() if v is not None})
        msg = Message(message_id=self.new_message_id("advisory"), destination=topic,
                      body=json.dumps(props, sort_keys=True).encode(), properties=props,
                      timestamp=self.now_ms(), type="Advisory",
                      content_type="application/json")
        self._route_topic(topic, msg)

    def advise_master_broker(self, fields: dict[str, object]) -> None:
        """``ActiveMQ.Advisory.MasterBroker``: this broker became master (HA). Kept as the
        topic's retained message too, so a client connecting after the takeover (which
        is every client: a slave opens no connectors) can still read it."""
        if not self.config.advisory_support:
            return
        props: dict[str, PropertyValue] = {"advisoryType": "MasterBroker",
                                           "originBrokerName": self.name}
        props.update({k: v for k, v in fields.items()
                      if isinstance(v, str | int | float | bool)})
        topic = dst.topic(ADVISORY_PREFIX + "MasterBroker")
        msg = Message(message_id=self.new_message_id("advisory"), destination=topic,
                      body=json.dumps(props, sort_keys=True).encode(), properties=props,
                      timestamp=self.now_ms(), type="Advisory",
                      content_type="application/json")
        self.publish_internal(msg, retain=True)

    def consumer_count(self, dest: Destination) -> int:
        """Open consumers that named ``dest`` in their subscription."""
        return self._consumer_counts.get(dest, 0)

    def _count_consumer(self, spec: ConsumerSpec, delta: int) -> None:
        counts = self._consumer_counts
        for d in set(spec.destinations):
            count = counts.get(d, 0) + delta
            if count:
                counts[d] = count
            else:
                del counts[d]

    def _consumer_changed(self, conn: Connection, consumer: Consumer, *, added: bool) -> None:
        spec = consumer.spec
        counts = {d: self.consumer_count(d) for d in spec.destinations}
        for d in spec.destinations:
            if d.is_advisory:
                continue
            self._advise(self._advisory_topic("Consumer", d),
                         "ConsumerAdded" if added else "ConsumerRemoved", {
                             "consumerId": consumer.id, "connectionId": conn.id,
                             "clientId": conn.client_id, "destination": str(d),
                             "consumerCount": counts[d], "selector": spec.selector,
                             "prefetchSize": consumer.prefetch, "priority": spec.priority,
                             "exclusive": spec.exclusive, "noLocal": spec.no_local,
                             "subscriptionName": spec.subscription_name,
                             "ackMode": spec.ack_mode.value})
        if self._listeners:
            event = ConsumerEvent(added, consumer.id, spec.destinations, spec.selector, conn.id,
                                  conn.client_id, spec.subscription_name, counts, spec)
            for listener in self._listeners:
                listener(event)

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
                          "producers": self._producer_count(d)})
        for d, ts in sorted(self.topics.items(), key=lambda kv: str(kv[0])):
            if d.is_advisory or d.name.startswith(SYS_PREFIX):
                continue  # the broker's own topics, not the operator's destinations
            dests.append({"name": d.name, "type": d.kind.value, "depth": 0,
                          "enqueued": ts.enqueued, "dequeued": ts.dispatched,
                          "dispatched": ts.dispatched, "expired": 0, "dead_lettered": 0,
                          "redelivered": 0,
                          "inflight": 0, "consumers": len(self._subs_for(d)), "memory": 0,
                          "producers": self._producer_count(d)})
        durables = [{"clientId": cid, "name": name, "destination": sub.durable.destination
                     if sub.durable else "", "pending": sub.queue.depth,
                     "active": sub.consumer is not None}
                    for (cid, name), sub in sorted(self.durables.items())]
        return {"broker": self.name, "uptime_ms": self.now_ms() - self.started_ms,
                "connections": len(self.connections), "destinations": dests,
                "durable_subscriptions": durables,
                "duplicates_dropped": self.dedup.duplicates,
                "denied_publishes": self.denied_publishes,
                "denied": {"total": self.denials.total,
                           "by_user": dict(sorted(self.denials.by_user.items()))},
                **self.auth.statistics(),  # failed_logins, login_slowed_addresses
                "memory": {"used": self.usage.used, "limit": self.usage.limit,
                           "peak": self.usage.peak, "percent": round(self.usage.percent, 1)},
                "store": self.store.stats(),
                "persistent_refused": self.persistent_refusal}
