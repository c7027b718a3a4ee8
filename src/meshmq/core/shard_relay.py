"""What a shard decides about destinations another shard of its node owns.

A node's shards each own some destinations (core/shards.py); only the owner has the
queue and stores its messages (docs/design.md, "Shards"). The core stays without I/O,
so the crossings are decisions, taken by the runtime with the store batch and carried
over the shard links by ``network/shards.py``:

* ``ShardSend``: a routed message whose destination is owned elsewhere, instead of an
  enqueue; the sender's confirmation waits for the owner's ``STORED``.
* a **relayed consumer**: a subscription here to a destination owned elsewhere. Its
  one source is a ``RelayQueue``, a stand-in that holds nothing and never dispatches:
  the owner runs the real consumer (selector, prefetch, priority, exclusivity) and its
  deliveries arrive with ``deliver``. ``RelayOpen``/``RelayClose`` ask the owner to
  start and stop it; acks, nacks and a closed consumer's unsettled deliveries become
  ``ShardSettle`` decisions. An auto-ack consumer is auto-ack on the owner too (as on
  one broker, a message is gone once handed on), so no settlement travels back for it;
  its window is ``RelayCredit`` instead: the owner keeps at most ``prefetch`` of its
  deliveries in flight, and this shard gives credit back, once per pump, for those its
  session wrote to the client. A delivery that arrives while the client's transport is
  paused waits here (at most ``prefetch`` of them) and earns credit once written.

A relayed delivery is not stored on this shard: the owner keeps it until it is settled,
so this shard never becomes a second queue of the destination.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from meshmq.core.consumer import AckMode, Consumer, ConsumerOrigin
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.queue import DONE, INFLIGHT, Delivery, Entry, Queue

if TYPE_CHECKING:
    from meshmq.config.model import DestinationPolicy
    from meshmq.core.queue import QueueContext

# ShardSettle kinds; the wire's SettleKind has the same values.
SETTLE_ACK: Final = 0
SETTLE_NACK: Final = 1
SETTLE_RETURNED: Final = 2


@dataclass(frozen=True, slots=True)
class ShardSend:
    """Decision: hand ``message`` to shard ``owner``, which stores and enqueues it."""

    owner: int
    message: Message
    redelivered: bool


@dataclass(frozen=True, slots=True)
class RelayOpen:
    """Decision: ask ``owner`` to run a consumer of ``destination`` for relay
    ``relay_id`` (this shard's id of the relayed consumer)."""

    owner: int
    relay_id: int
    destination: Destination
    selector: str | None
    prefetch: int
    priority: int
    exclusive: bool
    # Auto-ack: the owner's consumer settles each message as it hands it on, so no
    # SETTLE comes back; ``RelayCredit`` stands in for the window a SETTLE would hold.
    auto: bool = False
    # A subscription relayed from every owner (``SubscriptionRelay``): all its patterns
    # (``destination`` is the first), the durable subscription it attaches to on the
    # owner (client id, name), and the user whose read rights limit what a wildcard
    # carries there (None: no rights to check).
    destinations: tuple[Destination, ...] = ()
    durable: tuple[str, str] | None = None
    reader: tuple[str, tuple[str, ...]] | None = None
    no_local: bool = False  # (kept with a durable's record: a change replaces it)
    # A bridge's demand (the front shard's network links): the brokers its interest
    # crossed, nearest last; the owner keeps what came from the nearest one off it.
    network_path: tuple[str, ...] | None = None
    # An MQTT shared subscription's group: the owner's consumer joins that group there,
    # with the group's members on the owner and on every other shard.
    shared: str | None = None
    # The client's consumer, as the owner's advisories name it.
    origin: ConsumerOrigin | None = None


@dataclass(frozen=True, slots=True)
class RelayCredit:
    """Decision: ``count`` more deliveries of auto-ack relay ``relay_id`` were written
    to its client; the owner may send that many more."""

    owner: int
    relay_id: int
    count: int


@dataclass(frozen=True, slots=True)
class RelayClose:
    owner: int
    relay_id: int


@dataclass(frozen=True, slots=True)
class ShardSettle:
    """Decision: the delivery ``tag`` (the owner's) of relay ``relay_id`` is settled."""

    owner: int
    relay_id: int
    tag: int
    kind: int


@dataclass(frozen=True, slots=True)
class DurableDrop:
    """Decision: ``owner`` deletes durable subscription ``name`` of ``client_id`` if it
    holds it and no consumer is attached (UNSUBSCRIBE by name, MQTT clean start). The
    name does not say which topic it was on, so every other shard is asked.
    ``name`` None: every MQTT session subscription (``mqtt``-prefixed names) of the
    client."""

    owner: int
    client_id: str
    name: str | None


@dataclass(frozen=True, slots=True)
class RetainedCopy:
    """Decision: shard ``owner`` (here the one told: every other shard is) keeps
    ``message`` as the retained message of ``destination``, a topic this shard owns
    (None: it was cleared), so a subscription there gets it without asking."""

    owner: int
    destination: Destination
    message: Message | None


@dataclass(frozen=True, slots=True)
class ProducerNote:
    """Decision: connection ``connection_id`` (the node's name for it) of this shard
    started sending to ``destination`` (``added``) or closed; its owner, ``owner``,
    counts it among the destination's producers and raises the advisory, as the one
    broker that sees every producer of it."""

    owner: int
    destination: Destination
    connection_id: str
    added: bool


RelayDecision = RelayOpen | RelayClose | ShardSettle | RelayCredit | DurableDrop \
    | RetainedCopy | ProducerNote

# Marks a forwarded send whose owner keeps it as the topic's retained message too
# (stripped by the owner before it routes it).
SHARD_RETAIN: Final = "meshmq.shard-retain"


def retain_with_send(sends: list[ShardSend], message: Message) -> bool:
    """A retained publish to a topic another shard owns: mark its ``ShardSend`` (made
    by the send just before) so the owner retains it, in the order of the topic's
    messages and as reliably as the send. False: no such send (retain it here)."""
    for i in range(len(sends) - 1, -1, -1):
        send = sends[i]
        if send.message is message:
            marked = replace(message, properties={**message.properties, SHARD_RETAIN: True},
                             wire_cache=None)
            sends[i] = replace(send, message=marked)
            return True
    return False


def copy_retained(shard_count: int, index: int, destination: Destination,
                  message: Message | None) -> list[RetainedCopy]:
    """The copies of an owned topic's new retained message (or its clearing) for every
    other shard."""
    return [RetainedCopy(k, destination, message) for k in range(shard_count) if k != index]


def retained_view(own: dict[Destination, tuple[int, Message]],
                  copies: dict[Destination, tuple[int, Message]]
                  ) -> dict[Destination, Message]:
    """Every retained message a subscription on this shard may get: this shard's and
    the copies of the other owners' (theirs win: the owner decides)."""
    view = {dest: msg for dest, (_, msg) in own.items()}
    view.update((dest, msg) for dest, (_, msg) in copies.items())
    return view


class RelayQueue(Queue):
    """The source of one relayed consumer: its window is filled by the owner's
    deliveries, and settling an entry records a ``ShardSettle`` instead of touching a
    queue here. Entries carry the owner's delivery tag as their ``seq``."""

    def __init__(self, destination: Destination, policy: DestinationPolicy,
                 ctx: QueueContext, owner: int, relay_id: int,
                 decide: Callable[[RelayDecision], None]) -> None:
        super().__init__(destination, None, policy, ctx, None)
        self.owner = owner
        self.relay_id = relay_id
        self.decide = decide  # records a decision for the runtime
        # Auto-ack: deliveries that arrived while the client's transport was paused
        # (message, delivery count), the credit earned since the last ``RelayCredit``,
        # and how many of the held ones came over a lost link (they earn none).
        self._held: deque[tuple[Message, int]] = deque()
        self._credit = 0
        self._stale = 0
        self.origin: ConsumerOrigin | None = None  # carried by its RelayOpen

    def open_decision(self, consumer: Consumer) -> RelayOpen:
        spec = consumer.spec
        return RelayOpen(self.owner, self.relay_id, self.destination, spec.selector,
                         consumer.prefetch, spec.priority, spec.exclusive,
                         spec.ack_mode is AckMode.AUTO, network_path=spec.network_path,
                         shared=spec.shared_group, origin=self.origin)

    @property
    def held(self) -> int:
        """Auto-ack deliveries waiting for the client's transport (statistics, tests)."""
        return len(self._held)

    def dispatch(self) -> None:
        """The owner dispatches; here an auto-ack consumer that can take more gets the
        deliveries that waited for it, and the credit earned in this pump goes back
        (one ``RelayCredit`` per pump, however many deliveries it covers)."""
        consumer = self.consumers[0] if self.consumers else None
        if consumer is None or consumer.closed:
            self._held.clear()
            self._credit = self._stale = 0
            return
        held = self._held
        if held and not consumer.paused:
            credit = len(held)
            if self._stale:
                stale = min(self._stale, credit)
                self._stale -= stale
                credit -= stale
            self._credit += credit
            while held:
                message, count = held.popleft()
                self._emit(consumer, message, count)
        if self._credit:
            self.decide(RelayCredit(self.owner, self.relay_id, self._credit))
            self._credit = 0

    def _emit(self, consumer: Consumer, message: Message, delivery_count: int) -> int:
        tag = consumer.next_tag
        consumer.next_tag = tag + 1
        consumer.dispatched_count += 1
        self.stats.dispatched += 1
        self.ctx.emit(Delivery(consumer, message, tag, delivery_count))
        return tag

    def deliver(self, message: Message, owner_tag: int, delivery_count: int) -> None:
        """A delivery from the owner: into the consumer's window (an auto-ack one's
        owner settled it already), handed to the session by the next pump."""
        consumer = self.consumers[0] if self.consumers else None
        if consumer is None or consumer.closed:
            self.decide(ShardSettle(self.owner, self.relay_id, owner_tag, SETTLE_RETURNED))
            return
        if consumer.spec.ack_mode is AckMode.AUTO:
            # Settled on the owner already. While the client's transport is paused it
            # waits here, unwritten and uncredited: the owner stops once its window is
            # in flight, so at most ``prefetch`` wait, and the transport's buffer grows
            # past its high-water mark by at most the window that was under way.
            if consumer.paused or self._held:
                self._held.append((message, delivery_count))
                if not consumer.paused:
                    self.ctx.mark_dirty(self)
                return
            self._emit(consumer, message, delivery_count)
            if not self._credit:
                self.ctx.mark_dirty(self)  # the credit goes back with the next pump
            self._credit += 1
            return
        tag = self._emit(consumer, message, delivery_count)
        entry = Entry(self, owner_tag, message, False, delivery_count)
        entry.state = INFLIGHT
        entry.consumer = consumer
        consumer.dispatched[tag] = entry
        consumer.by_message_id[message.message_id] = tag

    def ack_entry(self, entry: Entry) -> None:
        if entry.state == INFLIGHT:
            entry.state = DONE
            entry.consumer = None
            self.stats.dequeued += 1
            self.decide(ShardSettle(self.owner, self.relay_id, entry.seq, SETTLE_ACK))

    def release(self, entry: Entry, *, count_delivery: bool = True, cause: str = "",
                reason: str | None = None) -> None:
        """The owner redelivers it (or dead-letters it: it keeps the count)."""
        if entry.state == INFLIGHT:
            entry.state = DONE
            entry.consumer = None
            self.decide(ShardSettle(
                self.owner, self.relay_id, entry.seq,
                SETTLE_NACK if count_delivery else SETTLE_RETURNED))

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        # Held auto-ack deliveries were settled on the owner: lost with the consumer,
        # as those written to a client that disconnects are.
        self._held.clear()
        self._credit = self._stale = 0
        if consumer.closed:
            self.decide(RelayClose(self.owner, self.relay_id))

    def link_lost(self) -> None:
        """The owner's link dropped: it takes back what it had delivered (and will
        deliver it again, flagged), so settling those entries here means nothing now.
        The next link opens an owner's consumer with a fresh window: credit earned on
        this one, and by the deliveries it carried that still wait here, is void."""
        self._credit = 0
        self._stale = len(self._held)
        for consumer in self.consumers:
            for entry in consumer.dispatched.values():
                if entry.queue is self:
                    entry.state = DONE


class SubscriptionRelay(RelayQueue):
    """The source of a subscription that other shards serve too: a wildcard (or a
    composite of topic patterns) runs on every owner for the destinations that owner
    holds, and a durable topic subscription lives on its topic's owner (on every owner,
    for a durable wildcard). The relay's ``RelayOpen`` carries all the patterns, the
    durable key and the subscriber's groups, so the owner opens the same subscription
    and limits a wildcard to what the user may read there."""

    def __init__(self, destinations: tuple[Destination, ...], policy: DestinationPolicy,
                 ctx: QueueContext, owner: int, relay_id: int,
                 decide: Callable[[RelayDecision], None], *,
                 durable: tuple[str, str] | None,
                 reader: tuple[str, tuple[str, ...]] | None) -> None:
        super().__init__(destinations[0], policy, ctx, owner, relay_id, decide)
        self.patterns = destinations
        self.durable = durable
        self.reader = reader

        # Client-acknowledged deliveries that arrived while the consumer's window was
        # full (message, owner's tag, delivery count): each owner keeps its own window,
        # so without this a subscription fed by N shards could hold N windows at once
        # (an MQTT client's Receive Maximum is its window).
        self._waiting: deque[tuple[Message, int, int]] = deque()

    def open_decision(self, consumer: Consumer) -> RelayOpen:
        return replace(super().open_decision(consumer), destinations=self.patterns,
                       durable=self.durable, reader=self.reader,
                       no_local=consumer.spec.no_local)

    def deliver(self, message: Message, owner_tag: int, delivery_count: int) -> None:
        consumer = self.consumers[0] if self.consumers else None
        if consumer is not None and not consumer.closed \
                and consumer.spec.ack_mode is not AckMode.AUTO \
                and (self._waiting or len(consumer.dispatched) >= consumer.prefetch):
            self._waiting.append((message, owner_tag, delivery_count))
            return
        super().deliver(message, owner_tag, delivery_count)

    def dispatch(self) -> None:
        """As a relay's, and the deliveries that waited for the window go once it has
        room again (an acknowledgement marks every source of its consumer)."""
        super().dispatch()
        waiting = self._waiting
        consumer = self.consumers[0] if self.consumers else None
        if consumer is None or consumer.closed:
            return
        while waiting and len(consumer.dispatched) < consumer.prefetch:
            # (Unpacked by name: mypyc passes a starred tuple through super() as one
            # argument.)
            message, owner_tag, delivery_count = waiting.popleft()
            super().deliver(message, owner_tag, delivery_count)

    def remove_consumer(self, consumer: Consumer) -> None:
        # Never given to the client: back to the owner uncounted, before the close.
        while self._waiting:
            _, tag, _ = self._waiting.popleft()
            self.decide(ShardSettle(self.owner, self.relay_id, tag, SETTLE_RETURNED))
        super().remove_consumer(consumer)

    def link_lost(self) -> None:
        self._waiting.clear()  # the owner takes them back and delivers them again
        super().link_lost()
