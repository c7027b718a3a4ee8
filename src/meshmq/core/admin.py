"""Operator actions on destinations and their messages (the management API's
``/api/destinations`` and ``/api/queues`` routes); sans-I/O like the rest of the core.

Durability: every change is a store operation appended to the broker's current batch,
exactly as sends (``AddMessage``) and acknowledgements (``RemoveRef``) are; the caller
writes the batch and waits for a store sync before it answers, so an answered purge,
delete, move or retry survives kill -9. A move, copy or retry routes the message to its
target *before* it removes it from the source, and hands the batch to the store every
:data:`BATCH` messages (``flush``): each batch is atomic, so a crash in the middle of a
large move leaves some messages moved and the others where they were, never lost (a store
that split a batch could at worst duplicate one).

Messages delivered to a consumer and not yet acknowledged (in flight) are listed by a
browse but never purged, deleted, moved or retried: the consumer still holds them, and an
acknowledgement or a redelivery would act on a message that is gone (ActiveMQ purges
only what is not in flight too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshmq.core import destinations as dst
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.queue import PENDING, Entry, Queue
from meshmq.core.selector import compile_selector, message_lookup
from meshmq.core.trace import DROPPED
from meshmq.errors import DestinationError, MeshmqError, ResourceLimitError

if TYPE_CHECKING:
    from meshmq.core.broker import Broker

# Messages routed and removed per store batch in a move, copy or retry.
BATCH = 1000
# Stored (paged-out) references read per store load while scanning a queue.
LOAD_PAGE = 500
DLQ_CAUSE = "dlqDeliveryFailureCause"


class NotFoundError(MeshmqError):
    """No such destination or message."""

    code = "not-found"


class ConflictError(MeshmqError):
    """The request contradicts the broker's state (it exists already, it is in use)."""

    code = "conflict"


@dataclass(slots=True)
class Queued:
    """One message of a queue as a browse sees it. ``entry`` is None for a message that
    lives only in the store (paged out); ``seq`` is its reference in the queue."""

    message: Message
    seq: int
    delivery_count: int
    in_flight: bool
    entry: Entry | None


# ------------------------------------------------------------------ destinations
def destination(kind: str, name: str) -> Destination:
    """The destination a path or body names; DestinationError for a bad kind or name."""
    if kind not in ("queue", "topic"):
        raise DestinationError(f"unknown destination type {kind!r}: use queue or topic")
    made = dst.make(DestKind(kind), name)
    if made.is_wildcard:
        raise DestinationError(f"{made} is a wildcard; name one destination")
    return made


def target(uri: str) -> Destination:
    """The target of a move or copy: ``queue://NAME`` or ``topic://NAME``."""
    kind, sep, name = uri.partition("://")
    if not sep:
        raise DestinationError(f"'to' must be queue://NAME or topic://NAME, not {uri!r}")
    made = destination(kind, name)
    if made.is_broker_owned:
        raise DestinationError(f"{made} is written only by the broker")
    return made


def exists(broker: Broker, dest: Destination) -> bool:
    return dest in broker.queues if dest.is_queue else dest in broker.topics


def _hidden(dest: Destination) -> bool:
    return dest.is_advisory or dest.name.startswith("$SYS.")


def list_destinations(broker: Broker, kind: str | None = None,
                      text: str | None = None) -> list[dict[str, object]]:
    """Every queue and topic (the broker's own advisory and ``$SYS`` topics left out),
    of ``kind`` and with ``text`` in their name when given."""
    producers = _producer_counts(broker)
    found: list[Destination] = []
    if kind in (None, "queue"):
        found += [d for d in broker.queues if d.kind is DestKind.QUEUE]
    if kind in (None, "topic"):
        found += [d for d in broker.topics if d.kind is DestKind.TOPIC and not _hidden(d)]
    if text:
        found = [d for d in found if text in d.name]
    found.sort(key=lambda d: (d.kind.value, d.name))
    return [describe(broker, d, producers) for d in found]


def _producer_counts(broker: Broker) -> dict[Destination, int]:
    counts: dict[Destination, int] = {}
    for conn in broker.connections.values():
        for d in conn.producer_destinations:
            counts[d] = counts.get(d, 0) + 1
    return counts


def describe(broker: Broker, dest: Destination,
             producers: dict[Destination, int] | None = None) -> dict[str, object]:
    """The management API's view of one destination (NotFoundError when it is absent)."""
    if producers is None:
        producers = _producer_counts(broker)
    enqueue_rate, dequeue_rate = broker.rates.rates(dest)
    view: dict[str, object] = {"type": dest.kind.value, "name": dest.name}
    if dest.is_queue:
        queue = broker.queues.get(dest)
        if queue is None:
            raise NotFoundError(f"no queue named {dest.name!r}")
        stats = queue.stats
        store_bytes = broker.store.key_info(queue.key).bytes if queue.key is not None else 0
        view.update(depth=queue.depth, enqueued=stats.enqueued, dequeued=stats.dequeued,
                    dispatched=stats.dispatched, expired=stats.expired,
                    dead_lettered=stats.dead_lettered, in_flight=queue.inflight,
                    consumers=len(queue.consumers), memory_bytes=queue.in_memory_bytes,
                    store_bytes=store_bytes)
    else:
        topic = broker.topics.get(dest)
        if topic is None:
            raise NotFoundError(f"no topic named {dest.name!r}")
        view.update(depth=0, enqueued=topic.enqueued, dequeued=topic.dispatched,
                    dispatched=topic.dispatched, expired=0, dead_lettered=0, in_flight=0,
                    consumers=len(broker.subs_for(dest)), memory_bytes=0, store_bytes=0)
    view.update(producers=producers.get(dest, 0), enqueue_rate=enqueue_rate,
                dequeue_rate=dequeue_rate)
    return view


def create_destination(broker: Broker, dest: Destination) -> None:
    """Make an empty queue or topic exist (until the broker restarts, for an empty one,
    as with ActiveMQ's addQueue); ConflictError when it exists."""
    if exists(broker, dest):
        raise ConflictError(f"{dest.kind.value} {dest.name!r} already exists")
    if dest.is_queue:
        broker.get_queue(dest)
    else:
        from meshmq.core.broker import TopicStats

        broker.topics[dest] = TopicStats()


def delete_destination(broker: Broker, dest: Destination) -> int:
    """Remove a destination with its messages; returns how many messages went with it.
    Refused (ConflictError) while it has consumers or holds messages in flight."""
    if dest.is_queue:
        queue = _queue(broker, dest)
        if queue.consumers:
            raise ConflictError(f"queue {dest.name!r} has {len(queue.consumers)} consumer(s); "
                                "close them first (DELETE /api/connections/{id})")
        count = queue.purge()
        queue.deleted = True
        del broker.queues[dest]
        if queue.key is not None:
            from meshmq.store.base import DropKey

            broker.store_op(DropKey(queue.key))
        return count
    if dest not in broker.topics:
        raise NotFoundError(f"no topic named {dest.name!r}")
    subscribers = len(broker.subs_for(dest))
    if subscribers:
        raise ConflictError(f"topic {dest.name!r} has {subscribers} subscriber(s); close "
                            "them first (DELETE /api/connections/{id})")
    del broker.topics[dest]
    return 0


def purge(broker: Broker, dest: Destination) -> int:
    """Remove every message of a queue that is not in flight; returns how many."""
    if not dest.is_queue:
        raise DestinationError("only queues hold messages to purge; a topic keeps none")
    return _queue(broker, dest).purge()


def send(broker: Broker, dest: Destination, body: bytes,
         properties: dict[str, PropertyValue], *, persistent: bool) -> Message:
    """Route a test message from the operator; returns it (its id)."""
    if dest.is_broker_owned:
        raise DestinationError(f"{dest} is written only by the broker")
    if persistent and broker.persistent_refusal is not None:
        raise ResourceLimitError(f"persistent message refused: {broker.persistent_refusal}; "
                                 "send it with persistent false")
    message = Message(broker.new_message_id("admin"), dest, body, properties,
                      persistent=persistent, timestamp=broker.now_ms(), user_id=None)
    broker.route_admin(message)
    return message


# ------------------------------------------------------------------ messages
def _queue(broker: Broker, dest: Destination) -> Queue:
    queue = broker.queues.get(dest)
    if queue is None or not dest.is_queue:
        raise NotFoundError(f"no queue named {dest.name!r}")
    if queue.retains_all:
        raise ConflictError(f"queue {dest.name!r} is a stream: it keeps every message until "
                            "its retention drops it; read it with a stream consumer")
    return queue


def matcher(selector: str | None) -> Callable[[Queued], bool] | None:
    """A JMS selector as a test on queued messages (SelectorError when it is invalid)."""
    if selector is None or not selector.strip():
        return None
    compiled = compile_selector(selector)

    def matches(item: Queued) -> bool:
        count = item.delivery_count
        return compiled.matches(message_lookup(item.message, delivery_count=count + 1,
                                               redelivered=count > 0))
    return matches


def _pending(queue: Queue) -> list[Entry]:
    """In-memory entries waiting for a consumer, in dispatch order (once each: the queue
    deletes lazily, so a returned entry may sit in it twice)."""
    live = sorted((item for item in queue._pending.items()
                   if item[2].state == PENDING),
                  key=lambda item: (item[0], item[1]))
    seen: set[int] = set()
    out: list[Entry] = []
    for item in live:
        if id(item[2]) not in seen:
            seen.add(id(item[2]))
            out.append(item[2])
    return out


def _in_flight(queue: Queue) -> list[Entry]:
    return sorted((e for c in queue.consumers for e in c.dispatched.values()
                   if e.queue is queue), key=lambda e: e.seq)


def _stored(queue: Queue, broker: Broker) -> Iterator[Queued]:
    """Messages that live only in the store (paged out), by seq."""
    if not queue._paging or queue.key is None:
        return
    after = queue._mem_high
    while True:
        page = broker.store.load(queue.key, after, LOAD_PAGE)
        for stored in page:
            after = stored.seq
            yield Queued(stored.message, stored.seq, stored.delivery_count, False, None)
        if len(page) < LOAD_PAGE:
            return


def queued(broker: Broker, dest: Destination, *, in_flight: bool = True) -> Iterator[Queued]:
    """A queue's messages: pending ones in dispatch order, then (``in_flight``) those
    delivered and not yet acknowledged, then those paged out to the store."""
    queue = _queue(broker, dest)
    for entry in _pending(queue):
        yield Queued(entry.message, entry.seq, entry.delivery_count, False, entry)
    if in_flight:
        for entry in _in_flight(queue):
            yield Queued(entry.message, entry.seq, entry.delivery_count, True, entry)
    yield from _stored(queue, broker)


def browse(broker: Broker, dest: Destination, offset: int, limit: int,
           selector: str | None) -> tuple[int, list[Queued]]:
    """(how many messages match, the ``limit`` of them from ``offset``)."""
    test = matcher(selector)
    queue = _queue(broker, dest)
    page: list[Queued] = []
    total = 0
    for item in queued(broker, dest):
        if test is not None and not test(item):
            continue
        if offset <= total < offset + limit:
            page.append(item)
        total += 1
        if test is None and total >= offset + limit:
            return queue.depth, page  # without a selector the depth is the total
    return total, page


def find(broker: Broker, dest: Destination, message_id: str) -> Queued:
    for item in queued(broker, dest):
        if item.message.message_id == message_id:
            return item
    raise NotFoundError(f"no message {message_id!r} in queue {dest.name!r}")


def _remove(broker: Broker, queue: Queue, item: Queued) -> None:
    if item.entry is not None:
        queue.remove_entry(item.entry)
    else:
        queue.remove_paged(item.seq)


def delete_message(broker: Broker, dest: Destination, message_id: str) -> None:
    item = find(broker, dest, message_id)
    if item.in_flight:
        raise ConflictError(f"message {message_id!r} is delivered to a consumer and not yet "
                            "acknowledged; it can be deleted once it is back in the queue")
    queue = _queue(broker, dest)
    _remove(broker, queue, item)
    if broker.tracer is not None:
        broker.tracer.message(DROPPED, item.message, dest, reason="deleted by an operator")


@dataclass(slots=True)
class Transfer:
    done: int = 0  # messages moved, copied or retried
    skipped: int = 0  # retries without an original destination (or back to the DLQ)
    ids: list[str] = field(default_factory=list)  # of the messages done


def remove_messages(broker: Broker, dest: Destination, message_ids: list[str]) -> int:
    """Remove the messages of ``message_ids`` still in queue ``dest`` and not in flight
    (the second half of a move whose copies had to reach another shard first)."""
    queue = _queue(broker, dest)
    wanted = set(message_ids)
    removed = 0
    for item in list(queued(broker, dest, in_flight=False)):
        if item.message.message_id in wanted:
            _remove(broker, queue, item)
            wanted.discard(item.message.message_id)
            removed += 1
            if not wanted:
                break
    return removed


def transfer(broker: Broker, dest: Destination, *, to: Destination | None,
             selector: str | None = None, message_ids: list[str] | None = None,
             copy: bool = False, flush: Callable[[], None] | None = None) -> Transfer:
    """Move (or ``copy``) the matching messages that are not in flight to ``to``; with
    ``to`` None, retry them: each goes back to its original destination, without the
    DLQ's failure cause. ``flush`` hands the store batch over every :data:`BATCH`
    messages. The message keeps its id; its delivery count starts again."""
    test = matcher(selector)
    queue = _queue(broker, dest)
    if to is not None and to == dest:
        raise DestinationError(f"{to} is the queue the messages are in; name another one")
    wanted = set(message_ids) if message_ids is not None else None
    result = Transfer()
    # Snapshot first: routing may add to other queues, never to this one (checked above
    # for moves; retries skip messages whose original destination is this queue).
    items: Iterator[Queued] = queued(broker, dest, in_flight=False)
    in_batch = 0
    for item in items:
        msg = item.message
        if wanted is not None:
            if msg.message_id not in wanted:
                continue
            wanted.discard(msg.message_id)
        if test is not None and not test(item):
            continue
        if to is None:
            original = msg.original_destination
            if original is None or original == dest:
                result.skipped += 1
                continue
            props = {k: v for k, v in msg.properties.items() if k != DLQ_CAUSE}
            broker.route_admin(msg.copy_to(original, properties=props,
                                           original_destination=None))
        else:
            broker.route_admin(msg.copy_to(to))
        if not copy:
            _remove(broker, queue, item)  # after the add: a crash may duplicate, not lose
        result.done += 1
        result.ids.append(msg.message_id)
        in_batch += 1
        if in_batch >= BATCH and flush is not None:
            flush()
            in_batch = 0
        if wanted is not None and not wanted:
            break
    return result
