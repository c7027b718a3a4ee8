"""The forwarding half of a link: this broker's messages, to the remote consumers.

Demand subscriptions are ordinary consumers of the local broker (client-individual
acks, a prefetch window), so everything the core does for consumers — selectors,
priorities, round-robin, redelivery when the link drops — applies to bridges too. A
forwarded message is acknowledged locally only once the remote broker reports it
stored (store-and-forward; ``always_sync_send``), so a crash on either side loses
nothing that was persistent.

The remote may ask it to hold a destination (an INTEREST ``hold`` note, to a peer that
listed the ``holds`` feature): its consumers there cannot take more. The demand
consumers fed by that destination here are paused until the ``release``, so what
waits for the slow consumer waits here, where push-back holds the producers
(transport/push_back.py) or, on the middle broker of a longer path, notes the hold on
towards the broker before it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from meshmq.core.auth import Principal
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.destinations import Destination, matches
from meshmq.core.message_codec import str_bytes
from meshmq.core.network_view import has_durable
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.errors import (
    AuthorizationError,
    DestinationError,
    MeshmqError,
    RemoteProtocolError,
)
from meshmq.network.inflight import InFlight
from meshmq.network.interest import Demand, InterestItem, plan_demand
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import AckStatus, FrameType, RecordsBuilder

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.core.broker import Connection
    from meshmq.core.message import Message
    from meshmq.network.link import WireLink
    from meshmq.network.services import ForwarderServices

log = logging.getLogger("meshmq.network")

_FRAME: Final = {False: FrameType.MESSAGES, True: FrameType.MESSAGES_AGAIN}
_STORED: Final = AckStatus.STORED
BATCH_MESSAGES: Final = 500  # messages per MESSAGES frame ...
BATCH_BYTES: Final = 1024 * 1024  # ... and bodies per frame (one big message may exceed it)
RETRY_PAUSE_S: Final = 0.5
PRODUCERS_KEPT: Final = 1024  # forwarded producer ids remembered (cleared when full)


class Forwarder:
    """A hosted session whose consumers are the remote broker's demand."""

    def __init__(self, services: ForwarderServices, link: WireLink, config: NetworkConnectorConfig,
                 remote: str, client_id: str, counters: LinkCounters,
                 static: tuple[Destination, ...] = (), *,
                 peer_takes_again: bool = False, principal: Principal | None = None) -> None:
        self.services = services
        # The remote flags messages sent in MESSAGES_AGAIN frames redelivered (a peer of
        # an older version gets everything in MESSAGES).
        self.peer_takes_again = peer_takes_again
        self.host = services.host
        self.broker = services.host.broker
        self.link = link
        self.config = config
        self.remote = remote
        self.local = self.broker.name
        self.counters = counters
        self.static = static
        ttl = config.network_ttl if config.message_ttl is None else config.message_ttl
        self.message_ttl = ttl
        if principal is None:  # the dialing side acts for its own connector
            principal = Principal(f"network:{config.name}", frozenset({"network"}),
                                  internal=True)
        self.conn: Connection | None = self.broker.open_connection(
            principal, client_id=client_id, remote=link.peer, protocol="network")
        self.items: dict[str, InterestItem] = {}
        self.demands: dict[str, tuple[Demand, Consumer]] = {}
        self.synced = False
        self._seq = 0
        self._inflight: InFlight[Delivery] = InFlight()  # by sequence number, until its ACK
        self._out: list[Delivery] = []  # to write at the next flush
        self._local_acks: list[Delivery] = []  # not waiting for the remote
        self._records = RecordsBuilder()
        # The path of a message produced here, as encoded (message_codec.str_bytes).
        self._own_path = str_bytes(self.local)
        # producer id -> the id it is forwarded under (this broker's name in front),
        # encoded: the same few producers send most messages
        self._producers: dict[str, bytes] = {}
        self._window_start = 0.0
        self._window_count = 0
        self._rate_timer: asyncio.TimerHandle | None = None
        self._redispatch: asyncio.TimerHandle | None = None
        self._draining: dict[Consumer, bool] = {}  # demand gone, waiting for acks
        self._retry_pause: asyncio.TimerHandle | None = None
        # Destinations the remote refused for this link's user (AckStatus.REFUSED): not
        # forwarded until its next full interest sync, so a change of rights heals.
        self.refused: set[Destination] = set()
        # Destinations the remote asked this link to hold (INTEREST hold/release): the
        # demand consumers they feed take nothing until the release or the link drops.
        self.held: set[Destination] = set()
        self._held_consumers: set[Consumer] = set()  # the demand consumers they feed
        # Deliveries of a held consumer that came anyway (a consumer relayed from
        # another shard of this node: its owner dispatches, within the window): kept
        # unforwarded and unsettled, so the owner's window fills, until the release.
        self._deferred: list[Delivery] = []
        self.host.register(self)
        self.host.accepted(self)

    # ------------------------------------------------------------ interest
    def apply_interest(self, op: str, body: dict[str, object]) -> None:
        if op in {"hold", "release"}:
            self.hold(noted_destination(body), op == "hold")
            return
        if op == "sync":
            self.items = {i.id: i for i in map(InterestItem.from_json, _list(body, "items"))}
            self.synced = True
            if self.refused:
                self.refused.clear()
                self.redispatch()
        else:
            for x in _list(body, "add"):
                item = InterestItem.from_json(x)
                self.items[item.id] = item
            for item_id in _list(body, "remove"):
                self.items.pop(str(item_id), None)
        self.replan(drop_gone_durables=True)

    def replan(self, *, drop_gone_durables: bool = False) -> None:
        conn = self.conn
        if conn is None or conn.closed:
            return
        plan = plan_demand(self.items, self.config, local=self.local, remote=self.remote,
                           static=self.static)
        plan = self.services.suppress_duplicates(self, plan)
        changed = set(plan) != set(self.demands)
        for key, (old, consumer) in list(self.demands.items()):
            if key in plan and plan[key] != old and plan[key].same_subscription(old):
                self.demands[key] = (plan[key], consumer)
        for key in [k for k in self.demands if k not in plan or plan[k] != self.demands[k][0]]:
            demand, consumer = self.demands.pop(key)
            drop = demand.durable_name is not None and drop_gone_durables and key not in plan
            if consumer.dispatched:
                # Messages on their way: the remote will store them, so unsubscribing
                # now would put them back here and forward them twice. Take nothing
                # new and close once they are settled.
                consumer.paused = True
                self._draining[consumer] = drop
            else:
                self._close_demand(consumer, demand.durable_name if drop else None)
        for key, demand in plan.items():
            if key in self.demands:
                continue
            dest = demand.destination
            if dest.is_temporary and not self.broker.temp_exists(dest):
                self.broker.adopt_temp(conn, dest)
            spec = ConsumerSpec(destinations=(dest,), ack_mode=AckMode.CLIENT_INDIVIDUAL,
                                prefetch=self.config.prefetch_size, priority=demand.priority,
                                selector=demand.selector, network_path=demand.path,
                                network_origins=tuple(sorted(demand.origins)),
                                subscription_name=demand.durable_name)
            try:
                consumer = self.broker.subscribe(conn, f"nc{len(self.demands)}-{key}", spec)
            except AuthorizationError:
                continue  # the link's user may not read it here (the core logged it)
            except MeshmqError as exc:
                log.warning("bridge %s -> %s: cannot create demand for %s: %s",
                            self.config.name, self.remote, dest, exc)
                continue
            consumer.net_filter = self._may_forward
            self.demands[key] = (demand, consumer)
        if self.held:
            self._apply_holds()  # a new demand for a held destination starts paused
        if changed:
            # A shorter route here may make another bridge's route redundant (or a
            # route that went away may bring one back).
            self.services.demand_changed(self)
        self.host.request_pump()

    def hold(self, dest: Destination, held: bool) -> None:
        """The remote asks to stop (``held``) or resume forwarding ``dest``."""
        if held:
            self.counters.holds_received += 1
            self.held.add(dest)
        elif dest in self.held:
            self.held.discard(dest)
        else:
            return
        self._apply_holds()
        self.host.request_pump()

    def _apply_holds(self) -> None:
        """Pause each demand consumer that a held destination feeds (a queue's, or a
        topic subscription's that matches it, a wildcard's included; on a node of
        shards also one relayed from the destination's owner); resume the others this
        link's state does not pause (its writes full, a RETRY pause, draining), and
        forward what was deferred for them."""
        held = self.held
        held_consumers = self._held_consumers
        held_consumers.clear()
        link_paused = self.link.paused or self._retry_pause is not None
        for _, consumer in self.demands.values():
            if any(matches(pattern, dest) for pattern in consumer.spec.destinations
                   for dest in held):
                consumer.paused = True
                held_consumers.add(consumer)
            elif consumer.paused and not link_paused and consumer not in self._draining \
                    and not consumer.closed:
                consumer.paused = False
                for queue in consumer.sources:
                    self.broker.mark_dirty(queue)
        if self._deferred:
            deferred = self._deferred
            self._deferred = [d for d in deferred if d.consumer in held_consumers]
            for delivery in deferred:
                if delivery.consumer not in held_consumers and not delivery.consumer.closed:
                    self._queue_out(delivery)

    def _close_demand(self, consumer: Consumer, drop_durable: str | None) -> None:
        conn = self.conn
        if conn is None:
            return
        self.broker.unsubscribe(conn, consumer)
        if drop_durable is not None and conn.client_id is not None:
            durable_key = (conn.client_id, drop_durable)
            if has_durable(self.broker, durable_key):
                self.broker.drop_durable(durable_key)

    # ------------------------------------------------------------ what may cross
    def _may_forward(self, msg: Message) -> bool:
        if self.refused and msg.destination in self.refused:
            return False  # stays here for local consumers
        path = msg.broker_path
        if self.remote in path:
            # Back towards a broker it came from: only queue messages stuck here.
            if not msg.destination.is_queue:
                return False
            return self.services.may_return(msg, self.config, self)
        if 0 <= self.message_ttl <= len(path):
            return False
        if self.config.rate_limit > 0 and msg.destination.is_queue:
            return self._rate_allows()
        return True

    def _rate_allows(self) -> bool:
        loop = asyncio.get_running_loop()
        now = loop.time()
        duration = self.config.rate_duration_ms / 1000
        if now - self._window_start >= duration:
            self._window_start = now
            self._window_count = 0
        if self._window_count < self.config.rate_limit:
            # The queue hands the message to the first consumer that accepts it, so
            # accepting is dispatching: count it now (deliveries reach deliver() only
            # after the whole dispatch pass).
            self._window_count += 1
            return True
        if self._rate_timer is None:
            # Messages held back now may go when the window rolls over.
            self._rate_timer = loop.call_at(self._window_start + duration, self._rate_rolled)
        return False

    def _rate_rolled(self) -> None:
        self._rate_timer = None
        self.redispatch()

    def redispatch(self) -> None:
        for _, consumer in self.demands.values():
            for queue in consumer.sources:
                self.broker.mark_dirty(queue)
        self.host.request_pump()

    def redispatch_later(self, delay_s: float) -> None:
        if self._redispatch is None or self._redispatch.when() > \
                asyncio.get_running_loop().time() + delay_s:
            if self._redispatch is not None:
                self._redispatch.cancel()
            self._redispatch = asyncio.get_running_loop().call_later(
                delay_s, self._redispatch_now)

    def _redispatch_now(self) -> None:
        self._redispatch = None
        self.redispatch()

    # ------------------------------------------------------------ Session protocol
    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        if not isinstance(outcome, Delivery) or self.link.closed:
            return
        if self._held_consumers and outcome.consumer in self._held_consumers:
            self._deferred.append(outcome)
            return
        self._queue_out(outcome)

    def _queue_out(self, outcome: Delivery) -> None:
        out = self._out
        if not out:
            # flush() empties the list, so a non-empty one is marked already.
            self.host.mark_flush(self)
        # The delivery itself is kept (it names the consumer and tag to settle): no
        # record of our own per message.
        out.append(outcome)
        if self.broker.tracer is not None:  # the message trace (core/trace.py), if on
            self.broker.trace_forwarded(outcome.message, to_broker=self.remote,
                                        connector=self.config.name)

    def flush(self) -> None:
        out = self._out
        if out:
            self._out = []
            self.counters.forwarded += len(out)  # (per batch: deliver() runs per message)
            self.counters.forward_rate.add(len(out))
            local = self.local
            own_path = self._own_path
            producers = self._producers
            inflight = self._inflight
            sync_all = self.config.always_sync_send
            local_acks = self._local_acks
            records = self._records
            write = self.link.write
            takes_again = self.peer_takes_again
            seq = self._seq
            again = False  # the kind of frame ``records`` goes in
            for outcome in out:
                msg = outcome.message
                # Dispatched before (to a bridge whose link dropped, a consumer here, or
                # before a restart): the remote may have it already, and must say so to
                # its consumers.
                sent_before = takes_again and outcome.delivery_count > 1
                if sent_before is not again:
                    if records.count:
                        write(records.frame(_FRAME[again]))
                    again = sent_before
                # The hop is added while encoding: the message itself is shared and
                # immutable, and copying it per forward costs more than the encoding.
                path = msg.broker_path
                producer = msg.producer_id
                forwarded_as = producers.get(producer)
                if forwarded_as is None:
                    forwarded_as = str_bytes(
                        producer if "/" in producer else f"{local}/{producer}")
                    if len(producers) >= PRODUCERS_KEPT:
                        producers.clear()
                    producers[producer] = forwarded_as
                seq += 1
                if path:
                    records.add_message(
                        seq, msg, b"".join([str_bytes(name) for name in path]) + own_path,
                        len(path) + 1, forwarded_as)
                else:
                    records.add_message(seq, msg, own_path, 1, forwarded_as)
                if sync_all or msg.persistent:
                    inflight.add(seq, outcome)  # a number skipped here becomes a hole
                else:
                    local_acks.append(outcome)
                if records.count >= BATCH_MESSAGES or records.size >= BATCH_BYTES:
                    write(records.frame(_FRAME[again]))
            if records.count:
                write(records.frame(_FRAME[again]))
            self._seq = seq
        if self._local_acks and self.conn is not None:
            acks, self._local_acks = self._local_acks, []
            self._settle(acks)
            self.host.request_pump()
        if self.link.paused and self.conn is not None:
            self.broker.set_paused(self.conn, True)

    def on_writable(self) -> None:
        if self.conn is not None and self._retry_pause is None:
            self.broker.set_paused(self.conn, False)
            for consumer in self._draining:
                consumer.paused = True  # still draining: nothing new
            if self.held:
                self._apply_holds()  # held by the remote: still nothing new
            self.host.request_pump()

    def on_acks(self, acks: list[tuple[int, AckStatus]]) -> None:
        if self.conn is None:
            return
        pop = self._inflight.pop
        settled: list[Delivery] = []
        for seq, status in acks:
            held = pop(seq)
            if held is None:
                continue
            if status is _STORED or self._answered(held, status):
                settled.append(held)  # STORED: the usual answer
        self._acked(settled)

    def on_ack_ranges(self, runs: list[tuple[int, int, AckStatus]]) -> None:
        """ACK_RANGES: each (first, last, status) settles every sequence of the run."""
        if self.conn is None:
            return
        pop_range = self._inflight.pop_range
        settled: list[Delivery] = []
        for first, last, status in runs:
            held = pop_range(first, last)
            if status is _STORED:  # the usual answer, for the whole run at once
                settled.extend(held)
            else:
                settled.extend(d for d in held if self._answered(d, status))
        self._acked(settled)

    def _answered(self, held: Delivery, status: AckStatus) -> bool:
        """A status other than STORED for ``held`` (out of flight now); True when it is
        settled here too (DUPLICATE, DROPPED), False when it went back to its queue."""
        consumer, tag = held.consumer, held.tag
        if status is AckStatus.RETRY:
            # The remote cannot take it now (memory): put it back without counting
            # a delivery, and give the remote a moment.
            entry = consumer.dispatched.pop(tag, None)
            if entry is not None:
                entry.queue.release(entry, count_delivery=False,
                                    cause="the remote broker asked to retry later")
            self._pause_for_retry()
            return False
        if status is AckStatus.REFUSED:
            # The remote's rights do not let this link's user send it there: keep it
            # for local consumers, and stop offering that destination for a while.
            entry = consumer.dispatched.pop(tag, None)
            if entry is not None:
                dest = entry.message.destination
                if dest not in self.refused:
                    log.warning("bridge %s -> %s: broker %s refuses %s from this "
                                "link's user; its messages stay here (see the remote's "
                                "log and authorization map)", self.config.name,
                                self.remote, self.remote, dest)
                    self.refused.add(dest)
                self.counters.refused += 1
                entry.queue.release(entry, count_delivery=False,
                                    cause="the remote broker refused it (not authorized)")
            return False
        if status is AckStatus.DUPLICATE:
            self.counters.duplicates += 1
        elif status is AckStatus.DROPPED:
            self.counters.dropped += 1
        return True

    def _acked(self, settled: list[Delivery]) -> None:
        """Settle what the remote took (STORED, DUPLICATE, DROPPED), and close demand
        that was waiting for its last acknowledgement."""
        if settled:
            self.counters.acknowledged += len(settled)
            self._settle(settled)
        if self._draining:
            for consumer, drop in list(self._draining.items()):
                if not consumer.dispatched:
                    del self._draining[consumer]
                    name = consumer.spec.subscription_name if drop else None
                    self._close_demand(consumer, name)
        self.host.request_pump()

    def _pause_for_retry(self) -> None:
        if self._retry_pause is not None or self.conn is None:
            return
        self.broker.set_paused(self.conn, True)

        def resume() -> None:
            self._retry_pause = None
            if not self.link.paused:
                self.on_writable()
        self._retry_pause = asyncio.get_running_loop().call_later(RETRY_PAUSE_S, resume)

    def _settle(self, deliveries: list[Delivery]) -> None:
        """Acknowledge ``deliveries`` locally: the tags of each run of one consumer in
        one pass of the core (as an ACK of each; a tag already gone is skipped)."""
        if self.conn is None:
            return
        settle = self.broker.settle_relayed
        consumer: Consumer | None = None
        tags: list[int] = []
        for delivery in deliveries:
            if delivery.consumer is not consumer:
                if consumer is not None and not consumer.closed:
                    settle(consumer, tags, acked=True)
                consumer, tags = delivery.consumer, []
            tags.append(delivery.tag)
        if consumer is not None and not consumer.closed:
            settle(consumer, tags, acked=True)

    def check_timeouts(self, now: float) -> None:
        return

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def close_by_admin(self) -> None:
        # The bridge's link: the dialing side reconnects with its backoff, as after any
        # dropped link (stopping for good is the connector's stop).
        self.link.close("closed by an administrator")

    def close(self) -> None:
        """The link is gone: unsettled messages go back to their queues (for the next
        link, or for local consumers); durable demand stays, offline, and keeps
        collecting messages for the remote broker."""
        self.host.unregister(self)
        conn, self.conn = self.conn, None
        for timer in (self._rate_timer, self._redispatch, self._retry_pause):
            if timer is not None:
                timer.cancel()
        self.host.forget(self)
        if conn is not None:
            self.broker.close_connection(conn)
            self.host.request_pump()
        self.demands.clear()
        self._draining.clear()
        self._inflight.clear()
        self.held.clear()
        self._held_consumers.clear()
        self._deferred.clear()  # (unsettled: the core took them back with the connection)


def noted_destination(body: dict[str, object]) -> Destination:
    """The destination a hold or release note names."""
    dest = body.get("dest")
    if not isinstance(dest, str) or not dest:
        raise RemoteProtocolError("INTEREST hold and release need a destination")
    try:
        return Destination.parse_uri(dest)
    except DestinationError as exc:
        raise RemoteProtocolError(f"INTEREST hold names a bad destination: {exc}") from None


def _list(body: dict[str, object], key: str) -> list[object]:
    value = body.get(key) or []
    if not isinstance(value, list):
        raise RemoteProtocolError(f"INTEREST {key} must be a list")
    return value
