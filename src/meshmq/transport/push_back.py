"""Slow consumers push back on the producers that feed them, for STOMP and MQTT alike.

A consumer whose transport passes its high-water mark is paused in the core, and one
with client acks stops taking messages once its prefetch window is full; what is sent
to its destination meanwhile waits in the broker. Reading on from the producers would
let that backlog grow without bound: seconds of end-to-end latency, memory up to the
broker's limit, and more CPU per message (a queued message costs more than one handed
straight to a consumer). Instead, after each read a session asks whether the
destinations that read sent to (each once in a row) are *slow*, and if one is, stops
reading that connection until none is, as TCP pushes back on a client that does not
read. A destination is slow when some queue a message sent to it waits in (the queue
itself, or each topic subscription's) has consumers and none of them can take more,
and either all of them are paused by their transport or more than ``BACKLOG_LIMIT``
messages wait there already; a held producer is read again once its destinations'
consumers are not all paused and at most half the bound waits (so a consumer acking
one message at a time does not let a whole read in per ack). So:

* producers of other destinations, and other connections, are read on;
* a queue (or shared subscription) with a consumer that can take more holds nobody;
* a queue without consumers holds nobody: its backlog is what the memory limit
  (``usage.memory_limit``, producer flow control) and paging to the store bound;
* a connection is never held by its own consumers (it could not ack, or read, while
  we do not read it);
* a bridge's demand consumer counts as a client-ack consumer whose window is the
  connector's ``prefetch_size`` of forwards the remote has not acknowledged: with it
  full (or the link full, or the remote answering ``RETRY``) it has no room, but is no
  stalled transport, so it holds the forwarding broker's producers only once the
  backlog passes the bound. Otherwise a producer faster than the link would fill the
  queue with the whole run: latency, memory, and more CPU per message for the
  forwarding broker (a message that waits is collected by the garbage collector and
  read back from cold memory);
* a broker that receives over a bridge holds the forwarding broker the same way, by a
  note: after each batch the link brought, the destinations it went to are looked at
  (``PeerHolds``), and while one is slow here the link's forwarder is asked to hold it
  (network/receiver.py); it pauses its demand consumers of it, and the rule above then
  holds its producers, or, on the middle broker of a longer path, notes the broker
  before it;
* on a node of shards, an owner's stand-in for another shard's consumer (a relayed
  consumer) counts as that consumer, its relay's window (what the consumer's shard has
  not yet written to its client) as its room; a stand-in paused because that window or
  its link is full has no room, but is not a stalled transport, so it holds producers
  only once the backlog passes the bound;
* a producer on another shard than the destination's owner is held by the owner's
  note: the owner looks at each destination a batch of sends from another shard went
  to, as a session does after a read, and while one is slow asks that shard to hold its
  producers of it (``ShardHolds``); the ingress shard holds them as if the destination
  were slow there, unless the producer consumes it itself, and reads them again when
  the owner's release comes (or the link to the owner drops);
* a SEND inside a transaction is not delivered before its COMMIT, so it holds nothing;
* a consumer with client acks that stops acking holds its producers once its window is
  full and the backlog passes the bound, as ActiveMQ's producer flow control does.

What wakes a held producer: a consumer's transport draining (``resume_writing``, STOMP
or MQTT) and a STOMP ACK or NACK, after the pump that follows them
(:meth:`PushBack.wake_after_pump`); a timer (1 ms doubling to
50 ms) covers the other ways a destination stops being slow (a consumer leaving or
joining, a queue drained by the management API).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Generic, TypeVar

from meshmq.core.consumer import AckMode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from meshmq.core.broker import Broker
    from meshmq.core.destinations import Destination
    from meshmq.core.queue import Queue

# A held producer is looked at again after this long (doubling up to the second value)
# unless something wakes it sooner.
RECHECK_S = 0.001
RECHECK_MAX_S = 0.05
# Messages that may wait in a queue whose consumers all have a full window before its
# producers are held: the default queue prefetch, tens of milliseconds of a fast
# producer, and enough that a consumer acking one message at a time does not stop and
# start its producer on every ack.
BACKLOG_LIMIT = 1000

K = TypeVar("K")  # who a PeerHolds notes: a shard's index, a bridge's receiving half


def _holds(queue: Queue, connection_id: str, held: bool) -> bool:
    """Whether a message sent by ``connection_id`` would wait in ``queue`` behind
    consumers that cannot take more (see the module docstring). A producer ``held``
    already stays held until the backlog is down to half the bound: a consumer acking
    one message opens its window for a moment, not for a whole read."""
    if queue.retains_all:
        return False  # a stream: its consumers read at their own offsets
    all_paused = True
    any_consumer = room = False
    for c in queue.consumers:
        if c.closed or c.spec.browser:
            continue
        if c.connection_id == connection_id:
            return False
        spec = c.spec
        any_consumer = True
        if c.paused:
            if spec.origin is not None or spec.network_path is not None:
                # Another shard's consumer whose relay window (or link) is full, or a
                # bridge's demand consumer whose link is full: no room, but not a
                # stalled transport of its own.
                all_paused = False
            continue
        all_paused = False
        if spec.ack_mode is AckMode.AUTO or len(c.dispatched) < c.prefetch:
            room = True
    if not any_consumer:
        return False
    if all_paused:
        return True
    if held:
        return queue.backlog_over(BACKLOG_LIMIT // 2)
    return not room and queue.backlog_over(BACKLOG_LIMIT)


def slow(broker: Broker, dest: Destination, connection_id: str, *,
         held: bool = False) -> bool:
    """Whether a producer (``connection_id``) of ``dest`` should not be read for now;
    ``held``: it is not read now (see :func:`_holds`)."""
    return any(_holds(queue, connection_id, held) for queue in broker.waiting_queues(dest))


class PushBack:
    """The producers held now, so that a consumer that drains wakes them. One per
    broker runtime, shared by its STOMP and MQTT sessions."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.held: set[ProducerHold] = set()
        # A shard of a node: the destinations owned elsewhere whose owner asked this
        # shard to hold their producers, by owner (``ShardHolds``).
        self.held_by_owner: dict[Destination, int] = {}

    def slow(self, dest: Destination, connection_id: str, *, held: bool = False) -> bool:
        """:func:`slow` here, or ``dest``'s owner (another shard) holds its producers
        and ``connection_id`` does not consume it itself."""
        if slow(self.broker, dest, connection_id, held=held):
            return True
        return bool(self.held_by_owner) and dest in self.held_by_owner and \
            not self.broker.consumes(connection_id, dest)

    def wake(self) -> None:
        """A consumer can take more: held producers look again."""
        for hold in list(self.held):
            hold.recheck()

    def wake_after_pump(self) -> None:
        """As :meth:`wake`, once the pump already requested in this turn has handed the
        waiting messages to the consumers that can take more now."""
        if self.held:
            asyncio.get_running_loop().call_soon(self.wake)


class ProducerHold:
    """One producer connection's push-back: which destinations hold it, and the timer.
    ``released`` is called once none does; the session resumes reading then unless
    something else still holds it."""

    def __init__(self, registry: PushBack, released: Callable[[], None]) -> None:
        self._registry = registry
        self._released = released
        self._connection_id = ""
        self.held: list[Destination] = []  # non-empty while the producer is held
        self._timer: asyncio.TimerHandle | None = None
        self._delay = RECHECK_S

    def check(self, published: list[Destination], connection_id: str) -> bool:
        """After a read that sent to ``published``: True when the producer is held now
        (the caller pauses reading)."""
        slow_here = self._registry.slow
        slow_now = [dest for dest in published if slow_here(dest, connection_id)]
        if not slow_now:
            return bool(self.held)
        self._connection_id = connection_id
        if not self.held:
            self._registry.held.add(self)
            self._delay = RECHECK_S
            self._schedule()
        self.held = slow_now
        return True

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._delay, self.recheck)
        self._delay = min(self._delay * 2, RECHECK_MAX_S)

    def recheck(self) -> None:
        """Release the producer once none of its destinations is slow."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.held:
            return
        slow_here = self._registry.slow
        slow_now = [dest for dest in self.held
                    if slow_here(dest, self._connection_id, held=True)]
        if slow_now:
            self.held = slow_now
            self._schedule()
            return
        self.end()
        self._released()

    def end(self) -> None:
        """Not held any more (released, or the connection ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.held = []
        self._registry.held.discard(self)


class PeerHolds(Generic[K]):
    """Push-back carried to a peer that sends here on its producers' behalf (another
    shard of the node, or a broker forwarding over a bridge), the holding side: after
    each batch a peer sent, each destination it went to is looked at as a session
    looks after a read (:meth:`routed`); a slow one gets a ``ProducerHold`` of its own
    for that peer, and ``note(peer, dest, True)`` asks the peer to hold what feeds it,
    until the hold is released (the same hysteresis and wake-ups as a local
    producer's), which ``note(peer, dest, False)`` says. A link that drops ends the
    peer's holds (a peer that links again is noted again when its next sends arrive).
    """

    def __init__(self, registry: PushBack, note: Callable[[K, Destination, bool], None]) -> None:
        self._registry = registry
        self._note = note
        self._holding: dict[tuple[K, Destination], ProducerHold] = {}

    @property
    def holding(self) -> int:
        """(Peer, destination) pairs held now (statistics, tests)."""
        return len(self._holding)

    def routed(self, peer: K, dests: Iterable[Destination]) -> None:
        """Sends from ``peer`` to ``dests`` were routed here."""
        holding = self._holding
        registry = self._registry
        for dest in dests:
            key = (peer, dest)
            # No consumer here is the peer's producer (""): its own consumers of ``dest``
            # are the peer's to look at, as it applies the note.
            if key in holding or not registry.slow(dest, ""):
                continue
            hold = ProducerHold(registry, functools.partial(self._released, key))
            hold.check([dest], "")
            holding[key] = hold
            self._note(peer, dest, True)

    def _released(self, key: tuple[K, Destination]) -> None:
        if self._holding.pop(key, None) is not None:
            self._note(key[0], key[1], False)

    def link_lost(self, peer: K) -> None:
        """The link to ``peer`` dropped: nothing is held for it any more."""
        for key in [k for k in self._holding if k[0] == peer]:
            self._holding.pop(key).end()


class ShardHolds(PeerHolds[int]):
    """Push-back across the shards of a node (docs/shards.md), both sides of it: as the
    owner, :class:`PeerHolds` by shard index; as the ingress shard, :meth:`noted`
    records what an owner asked, in ``PushBack.held_by_owner``, which the sessions'
    holds read; a release wakes them. A link that drops ends both sides' holds for
    that shard (a restarted owner notes again what is still slow when the next sends
    arrive).
    """

    def noted(self, owner: int, dest: Destination, held: bool) -> None:
        """Shard ``owner`` asks to hold (``held``) or release the producers here of
        ``dest``, which it owns."""
        by_owner = self._registry.held_by_owner
        if held:
            by_owner[dest] = owner
        elif by_owner.pop(dest, None) is not None:
            self._registry.wake()

    def link_lost(self, peer: int) -> None:
        """The link to shard ``peer`` dropped: nothing is held for it or by it any more."""
        super().link_lost(peer)
        by_owner = self._registry.held_by_owner
        lost = [dest for dest, owner in by_owner.items() if owner == peer]
        for dest in lost:
            del by_owner[dest]
        if lost:
            self._registry.wake()
