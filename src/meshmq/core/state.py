"""The core's shared tables and its queues of decisions: what the core modules share.

``CoreState`` holds what more than one of the broker's modules reads or changes --
queues, topics, connections, durable subscriptions, the topic index, retained messages
and records, the destination policies -- and the decisions recorded for the runtime
(store operations, outcomes, dirty queues, dispatch marks, page loads). It is also what
every ``Queue`` calls back (``QueueContext``): marking itself dirty, emitting a
delivery, recording a store op, asking for a page.

It decides nothing about messages itself: routing, subscriptions, acks, expiry and the
rest live in their own modules and change these tables. The one exception is where a
queue hands a message back (``expired``, ``dead_letter``): those go on to the
dead-letter policy set in ``dead_letters`` once the broker is assembled, a
late-bound collaborator rather than an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from meshmq.config.model import BrokerConfig, DestinationPolicy, StreamPolicy
from meshmq.core import destinations as dst
from meshmq.core.auth import Principal
from meshmq.core.consumer import Consumer
from meshmq.core.dedup import DEDUP_PROPERTY, DuplicateWindow, network_key
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message
from meshmq.core.paging import PageLoad
from meshmq.core.queue import Entry, Outcome, Queue
from meshmq.core.shard_relay import RelayDecision, RelayQueue, ShardSend
from meshmq.core.shards import ShardIdentity
from meshmq.core.stream import StreamQueue
from meshmq.core.topic_index import TopicIndex
from meshmq.core.trace import Tracer
from meshmq.core.usage import MemoryUsage
from meshmq.errors import TransactionError
from meshmq.store.base import DurableSubscription, Store, StoreOp


class DeadLetterPolicy(Protocol):
    """Where a queue's expired and undeliverable messages go (core/dead_letters.py)."""

    def expired(self, queue: Queue, entry: Entry) -> None: ...
    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None: ...


@dataclass(slots=True)
class Transaction:
    """What a transaction holds until COMMIT (core/transactions.py applies it)."""

    id: str
    sends: list[tuple[tuple[Destination, ...], Message]] = field(default_factory=list)
    acks: list[tuple[Consumer, int, bool]] = field(default_factory=list)
    nacks: list[tuple[Consumer, int, bool]] = field(default_factory=list)


# Broker links: a network bridge's connection and a shard link of the node. Neither is a
# client: not counted, listed or closed as one, and their sends are traced where they
# entered the node.
LINK_PROTOCOLS: Final = frozenset({"network", "shard"})


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
        # Set for an MQTT shared subscription group: its key in CoreState.shared.
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


class CoreState:
    """The broker's tables and decision queues (see the module docstring)."""

    def __init__(self, config: BrokerConfig, store: Store, clock: Callable[[], int]) -> None:
        self.config = config
        self.name = config.broker_name
        self.store = store
        self.clock = clock
        self.usage = MemoryUsage(config.usage.memory_limit)
        self.dedup = DuplicateWindow(config.duplicate_window)
        # Message trace (docs/pipeline.md); None when tracing is off. The runtime sets it.
        self.tracer: Tracer | None = None
        self.queues: dict[Destination, Queue] = {}
        self.topics: dict[Destination, TopicStats] = {}
        self.connections: dict[str, Connection] = {}
        self.client_ids: dict[str, str] = {}  # client id -> connection id
        self.durables: dict[tuple[str, str], TopicSubscription] = {}
        # The names of each client id's durable subscriptions (kept with ``durables``),
        # so another shard's removal for a client costs nothing for the others.
        self.durable_names: dict[str, set[str]] = {}
        self.topic_index: TopicIndex[TopicSubscription] = TopicIndex()
        self.shared: dict[tuple[str, tuple[Destination, ...], str | None],
                          TopicSubscription] = {}
        # Consumers with a wildcard queue destination: they join queues created later.
        self.queue_wildcards: list[Consumer] = []
        # Retained messages (MQTT): the last retained message per topic, and its store seq.
        self.retained: dict[Destination, tuple[int, Message]] = {}
        # One shard of several: the other owners' retained messages (owner, message),
        # copied here as they change and in full when a link comes up.
        self.retained_copies: dict[Destination, tuple[int, Message]] = {}
        # Small named records protocol layers keep in the store (MQTT session state).
        self.records: dict[str, tuple[int, bytes]] = {}
        # Last seq used per single-reference key (retained messages and records).
        self.single_seq: dict[str, int] = {}
        # Why the store takes no new persistent messages right now (disk full, the
        # store's size limit), or None; set by the runtime from the store's state.
        self.persistent_refusal: str | None = None
        # Decisions for the runtime, taken by the Broker facade's take_* methods.
        self.ops: list[StoreOp] = []
        self.outbox: list[Outcome] = []
        self.dirty: dict[Queue, None] = {}
        self.deferred: dict[Queue, None] = {}
        self.bursting_consumers: list[Consumer] = []
        # Dispatch marks (Queue._cover): off unless the runtime's store keeps them across
        # a restart. Marks written since the last take, and whether a delivery of this
        # pump waits for one to be durable.
        self.dispatch_marks = False
        self.marks: list[tuple[Queue, int]] = []
        self.hold = False
        # Pages of stored messages queues asked for (core/paging.py), for the runtime,
        # and queues whose last load failed, asked again on the next tick.
        self.page_loads: list[PageLoad] = []
        self.page_retry: dict[Queue, None] = {}
        self.policies = [(Destination.parse_uri(p.match), p) for p in config.policies]
        self.stream_policies = [(Destination.parse_uri(p.match), p) for p in config.streams]
        self.default_policy = DestinationPolicy()
        # Message ids: "ID:<broker>-<boot>-<connection>-<n>", the constant part built once
        # (again when a shard puts its index in front of ``boot``).
        self._boot = ""
        self._id_prefix = ""
        self.boot = format(clock(), "x")
        self._msg_seq = 0
        # One shard of a node with several (core/shard_relay.py); None: a whole broker.
        # Then the sends and subscriptions owned by other shards are decisions here.
        self.shard: ShardIdentity | None = None
        self.owners: dict[Destination, int] = {}  # the owning shard, computed once
        self.shard_sends: list[ShardSend] = []
        self.relay_ops: list[RelayDecision] = []
        self.relays: dict[int, RelayQueue] = {}  # relayed consumers' sources, by relay id
        self.next_relay = 1
        # Shards unreachable for longer than the node waits: sends to them are refused.
        self.owners_down: set[int] = set()
        # Set once the broker is assembled (core/dead_letters.py).
        self.dead_letters: DeadLetterPolicy | None = None

    # ------------------------------------------------------------ QueueContext
    def now_ms(self) -> int:
        return self.clock()

    def store_op(self, op: StoreOp) -> None:
        self.ops.append(op)

    def emit(self, outcome: Outcome) -> None:
        self.outbox.append(outcome)

    def mark_dirty(self, queue: Queue) -> None:
        self.dirty[queue] = None

    def defer(self, queue: Queue) -> None:
        self.deferred[queue] = None

    def bursting(self, consumer: Consumer) -> None:
        self.bursting_consumers.append(consumer)

    def remember_stored(self, message: Message) -> bool:
        """Put a stored message's window key back in the duplicate window (recovery,
        paging in): a bridged message by its network key, a producer's by its
        ``dedup-id``. True when it had one."""
        if message.broker_path:
            self.dedup.remember(network_key(message))
            return True
        if message.properties:
            dedup_id = message.properties.get(DEDUP_PROPERTY)
            if dedup_id is not None:
                self.dedup.remember(str(dedup_id))
                return True
        return False

    def dispatch_marked(self, queue: Queue, mark: int) -> None:
        self.marks.append((queue, mark))

    def hold_deliveries(self) -> None:
        self.hold = True

    def request_page(self, load: PageLoad) -> None:
        self.page_loads.append(load)

    def expired(self, queue: Queue, entry: Entry) -> None:
        assert self.dead_letters is not None
        self.dead_letters.expired(queue, entry)

    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None:
        assert self.dead_letters is not None
        self.dead_letters.dead_letter(queue, entry, cause)

    # ------------------------------------------------------------ dispatching
    def dispatch_dirty(self) -> None:
        # A new pump: consumers' per-pump delivery budgets start again, and queues that
        # stopped on a budget carry on.
        for consumer in self.bursting_consumers:
            consumer.burst = 0
        self.bursting_consumers.clear()
        if self.deferred:
            self.dirty.update(self.deferred)
            self.deferred.clear()
        # Dispatching can dirty other queues (DLQ, redelivery); loop until quiet.
        rounds = 0
        while self.dirty and rounds < 100:
            rounds += 1
            dirty, self.dirty = self.dirty, {}
            for queue in dirty:
                queue.dispatch()

    # ------------------------------------------------------------ lookups
    def policy_for(self, dest: Destination) -> DestinationPolicy:
        for pattern, policy in self.policies:
            if dst.matches(pattern, dest):
                return policy
        return self.default_policy

    def stream_policy_for(self, dest: Destination) -> StreamPolicy | None:
        """The stream policy making ``dest`` a stream, if any (queues only)."""
        if dest.kind is DestKind.QUEUE:
            for pattern, policy in self.stream_policies:
                if dst.matches(pattern, dest):
                    return policy
        return None

    @property
    def boot(self) -> str:
        """This run's mark in the ids the broker makes (the clock at start, in hex)."""
        return self._boot

    @boot.setter
    def boot(self, value: str) -> None:
        self._boot = value
        self._id_prefix = f"ID:{self.name}-{value}-"

    def new_message_id(self, connection_id: str) -> str:
        self._msg_seq += 1
        return f"{self._id_prefix}{connection_id}-{self._msg_seq}"

    def subs_for(self, dest: Destination) -> list[TopicSubscription]:
        return self.topic_index.match(dest)

    def owned_elsewhere(self, dest: Destination) -> bool:
        """One shard of several, and another owns ``dest`` (it has the queue, so "does
        it exist" is the owner's to say: a send or subscription here never creates it)."""
        shard = self.shard
        return shard is not None and not dest.is_wildcard \
            and self.owner_of(shard, dest) != shard.index

    def relay_decision(self, decision: RelayDecision) -> None:
        self.relay_ops.append(decision)

    def owner_of(self, shard: ShardIdentity, dest: Destination) -> int:
        """The shard owning ``dest`` (cached: the hash is computed once per name)."""
        owner = self.owners.get(dest)
        if owner is None:
            if len(self.owners) > 100_000:
                self.owners.clear()
            owner = self.owners[dest] = shard.owner(dest)
        return owner

    def exists(self, dest: Destination) -> bool:
        return dest in self.queues if dest.is_queue else dest in self.topics

    def temp_exists(self, dest: Destination) -> bool:
        """Whether temporary ``dest`` exists: here, or on the shard that made it, which
        is asked then (it refuses a send to one that is gone)."""
        shard = self.shard
        if shard is not None and self.owner_of(shard, dest) != shard.index:
            return True
        return dest in self.queues if dest.kind is DestKind.TEMP_QUEUE else dest in self.topics

    def get_queue(self, dest: Destination) -> Queue:
        """The queue of ``dest``, created (a stream when a stream policy says so) and
        joined by the wildcard consumers that match it if it is new."""
        queue = self.queues.get(dest)
        if queue is None:
            stream = self.stream_policy_for(dest)
            if stream is not None:
                queue = StreamQueue(dest, self.policy_for(dest), stream, self, self.store)
            else:
                key = str(dest) if dest.kind is DestKind.QUEUE else None
                queue = Queue(dest, key, self.policy_for(dest), self, self.store)
            self.queues[dest] = queue
            for consumer in self.queue_wildcards:
                if any(dst.matches(p, dest) for p in consumer.spec.destinations) and (
                        consumer.readable is None or consumer.readable(dest)):
                    consumer.sources.append(queue)
                    queue.add_consumer(consumer)
        return queue

    def producer_count(self, d: Destination) -> int:
        return sum(1 for c in self.connections.values() if d in c.producer_destinations)


def find_transaction(conn: Connection, txn_id: str) -> Transaction:
    """The connection's open transaction ``txn_id``, or TransactionError."""
    txn = conn.transactions.get(txn_id)
    if txn is None:
        raise TransactionError(f"transaction {txn_id!r} has not been started")
    return txn
