"""The links between the shards of one node: sends to owners, relayed consumers.

Each shard owns some destinations (core/shards.py); the core turns a send to a
destination owned elsewhere into a ``ShardSend`` and a subscription to one into a
relayed consumer (core/shard_relay.py). ``ShardPeers`` carries those decisions over a
full mesh of duplex links, one per pair of shards, on Unix sockets in the node's run
directory (mode 0700): the higher index dials, the lower accepts, and a lost link is
dialled again (0.05 s doubling to 1 s) for as long as the shard runs.

What is reused from the network of brokers: ``WireLink`` (framing, keep-alive,
back-pressure), the wire codec, and the ``Receiver`` (an owner stores what other shards
send it and answers ``STORED`` only once its store has synced it; the duplicate window
absorbs re-sends). What differs, all behind the ``"shard"`` feature no network peer
lists: the HELLO carries the supervisor's per-boot token instead of a user, the link
adds no ``broker_path`` entry (the node is one broker to the network) and skips
authorization (the shard a client is connected to checked its rights), and relayed
deliveries travel as ``DELIVER``/``SETTLE`` (docs/wire-protocol.md): the consumer's
shard does not store them again.

The sender keeps every send until its owner's ``STORED`` (``DUPLICATE``, ``DROPPED``),
counted against its memory limit meanwhile, and sends the unsettled ones again on the
next link; the owner knows those re-sends by sequence number (``Inbound``), so a first
send skips its duplicate window. ``owners()`` is what ``Durability`` waits on, so a
RECEIPT or PUBACK never leaves before the owner stored the message; an owner
unreachable for ``owner_wait_s`` fails those waits and has new sends refused, both
retriably. An auto-ack relayed consumer is auto-ack on the owner too (no ``SETTLE``
comes back): its window is credit instead, the owner keeping at most ``prefetch`` of
its deliveries in flight until the consumer's shard answers ``relay-credit`` for those
it wrote to the client (``RelayOut``). The pump takes the core's shard
decisions with each store batch (``take``) and writes each link once per pump
(``flush``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import logging
import os
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from meshmq.core.auth import Principal
from meshmq.core.consumer import AckMode, Consumer, ConsumerOrigin, ConsumerSpec
from meshmq.core.dedup import network_key
from meshmq.core.destinations import Destination
from meshmq.core.message_codec import decode_message, encoded
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.core.shard_relay import (
    SHARD_RETAIN,
    DurableDrop,
    ProducerNote,
    RelayClose,
    RelayCredit,
    RelayDecision,
    RelayOpen,
    RelayQueue,
    RetainedCopy,
    ShardSettle,
)
from meshmq.core.shard_txn import (
    Outcome,
    OutcomeUnknownError,
    TxnAsk,
    TxnCommitted,
    TxnDecide,
    TxnDecision,
    TxnForget,
    TxnPrepare,
)
from meshmq.core.shards import FRONT_SHARD
from meshmq.core.stream import StreamQueue
from meshmq.errors import (
    MeshmqError,
    RemoteProtocolError,
    ResourceLimitError,
    TransactionError,
)
from meshmq.network.interest import DestinationFilter
from meshmq.network.link import WireLink
from meshmq.network.node_interest import NodeInterest
from meshmq.network.receiver import Receiver
from meshmq.network.shard_clients import ClientClaims
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import (
    FEATURE_SHARD,
    WIRE_VERSION,
    AckStatus,
    FrameType,
    SettleKind,
    WireFrame,
    decode_acks,
    decode_deliver,
    decode_json,
    decode_messages,
    decode_settle,
    decode_txn,
    encode_deliver,
    encode_json,
    encode_records,
    encode_settle,
    encode_txn,
)

if TYPE_CHECKING:
    from meshmq.core.broker import Broker, ConsumerEvent
    from meshmq.core.message import Message
    from meshmq.core.shards import ShardIdentity
    from meshmq.core.state import Connection
    from meshmq.network.host import BrokerHost
    from meshmq.network.services import ReceiverServices

log = logging.getLogger("meshmq.shards")

HEARTBEAT_S = 5.0
HANDSHAKE_TIMEOUT_S = 10.0
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
# An owner that answered RETRY (its memory limit) is asked again when it says ``space``,
# or after this pause (a destination's own limit sends no ``space``).
RETRY_PAUSE_S = 0.5
# How long sends to an unreachable owner are held before new ones are refused and the
# confirmations waiting for it fail, retriably (``shards.owner_wait_ms``).
OWNER_WAIT_S = 10.0
BATCH_MESSAGES = 500
BATCH_BYTES = 1024 * 1024

# Kinds of what waits in a peer's output, written as one frame per run of one kind.
_SEND, _AGAIN, _DELIVER, _SETTLE, _FRAME = range(5)


class ShardLinkLostError(MeshmqError):
    """A shard link dropped before the owner answered what a confirmation waits for."""

    code = "shard-link-lost"


class Inbound:
    """What one peer shard's run has sent this shard, across its links: the highest
    sequence number taken, those answered RETRY below it (they come again), and, for
    the current link, up to which sequence number the sends may be re-sends."""

    __slots__ = ("boot", "gaps", "resent_upto", "upto")

    def __init__(self) -> None:
        self.boot: str | None = None
        self.upto = 0
        self.gaps: set[int] = set()
        self.resent_upto = 0

    def greeted(self, body: dict[str, Any]) -> None:
        """The peer's HELLO or WELCOME: its run and the last sequence number it had
        used when it greeted (anything above is a first send)."""
        boot, sent = body.get("boot"), body.get("sent")
        if not isinstance(boot, str) or boot != self.boot:
            self.boot = boot if isinstance(boot, str) else None
            self.upto = 0  # a new run numbers from 1 again
            self.gaps.clear()
        # A peer that does not say: everything may be a re-send (checked in the window).
        self.resent_upto = sent if isinstance(sent, int) and not isinstance(sent, bool) \
            else 1 << 63


class ShardReceiver(Receiver):
    """The owner's side of sends: stores what a shard forwards, ``STORED`` after its
    own sync. Advertises no interest: relayed consumers are explicit (``relay-open``).

    Producer flow control across shards: while this shard is at its memory limit,
    non-persistent sends from other shards are parked here as they came (in order, not
    routed, not answered), and routed once the limit lets go, at the moment it resumes
    a blocked producer of its own. Their ``STORED`` waits meanwhile, so the sending
    shard holds them against its own limit and pauses its producers: the limit holds
    for every producer of the node, with nothing sent twice. (Answering ``RETRY``
    instead made the senders send everything again each time the limit let go: most
    of it came back refused, and the refusals cost more than the deliveries.) A send
    refused for another reason (``on_limit = "fail"``, a destination's own limit) is
    answered ``RETRY``, and ``space`` tells the sender when the memory limit lets go."""

    _space_wanted = False  # waiting for the memory limit to let go, to say ``space``
    retried = 0  # sends answered RETRY (statistics)
    parked_total = 0  # sends parked at the memory limit (statistics)
    _parked: deque[tuple[list[tuple[int, Message]], bool]] | None = None
    _unpark_wanted = False

    def on_messages(self, batch: list[tuple[int, Message]], *, again: bool = False) -> None:
        if self._parked:  # behind what already waits, in order
            self._park(batch, again)
            return
        # Checked once per batch: a batch may take the shard past its limit by itself.
        if self.broker.usage.full and self.broker.config.usage.on_limit == "block":
            # Parked from the first non-persistent send on (a persistent one is paged,
            # as from a producer here).
            for i, (_seq, msg) in enumerate(batch):
                if not msg.persistent:
                    if i:
                        self._on_messages(batch[:i], again=again)
                    self._park(batch[i:], again)
                    return
        self._on_messages(batch, again=again)

    def _park(self, batch: list[tuple[int, Message]], again: bool) -> None:
        if self._parked is None:
            self._parked = deque()
        self._parked.append((batch, again))
        self.parked_total += len(batch)
        if not self._unpark_wanted:
            self._unpark_wanted = True
            self.broker.usage.wait_for_space(self._unpark)

    def _unpark(self) -> None:
        """The memory limit let go: route what was parked, until it is reached again."""
        self._unpark_wanted = False
        parked = self._parked
        if self.closed or not parked:
            return
        self._parked = deque()  # what the limit stops again collects here
        while parked:
            batch, again = parked.popleft()
            self.on_messages(batch, again=again)
            if self._parked:  # full again: the rest waits behind it
                self._parked.extend(parked)
                return

    @property
    def parked(self) -> int:
        """Sends parked now (statistics, tests)."""
        return sum(len(b) for b, _ in self._parked or ())

    def _want_space(self) -> None:
        usage = self.broker.usage
        # A destination's own limit has no wake-up: the sender's pause asks again.
        if self._space_wanted or self.closed or not usage.full:
            return
        self._space_wanted = True
        usage.wait_for_space(self._space)

    def _space(self) -> None:
        self._space_wanted = False
        if not self.closed:
            self.link.write(encode_json(FrameType.INTEREST, {"op": "space"}))

    def close(self) -> None:
        """Parked sends are dropped with the link: their sender sends them again (it
        holds every send until ``STORED``)."""
        if self._space_wanted:
            self._space_wanted = False
            self.broker.usage.cancel_wait(self._space)
        if self._unpark_wanted:
            self._unpark_wanted = False
            self.broker.usage.cancel_wait(self._unpark)
        self._parked = None
        super().close()

    inbound: Inbound  # set right after construction: what this sender sent before
    peer_index: int  # set right after construction: the sending shard
    # Set right after construction: told where each batch's new sends were routed.
    sends_routed: Callable[[int, Iterable[Destination]], None] | None

    def __init__(self, services: ReceiverServices, link: WireLink, remote: str,
                 flt: DestinationFilter, counters: LinkCounters, *, resync_s: float,
                 principal: Principal | None = None) -> None:
        # Set on the instance, before Receiver's __init__ reads them: the compiled
        # Receiver keeps its attributes in slots that class attributes here would not
        # reach.
        self.waits_for_owners = False
        self.protocol = "shard"
        super().__init__(services, link, remote, flt, counters, resync_s=resync_s,
                         principal=principal)

    def start(self) -> None:
        return

    def _on_messages(self, batch: list[tuple[int, Message]], *, again: bool) -> None:
        """As a bridge's receiver, but a first send (above the sender's ``sent`` at the
        handshake) skips the duplicate window unless it came over a bridge: only a send
        made before this link can have been stored already. Those are found by
        sequence number when they came over an earlier link of the same sender's run
        (``Inbound``), else (this shard restarted) in the window, which recovery
        refilled from the store."""
        inbound = self.inbound
        gaps = inbound.gaps
        now_acks: list[tuple[int, AckStatus]] = []
        after_sync: list[tuple[int, AckStatus]] = []
        routed: dict[Destination, None] = {}  # where this batch's new sends went, once each
        for seq, msg in batch:
            if seq <= inbound.resent_upto and seq not in gaps:
                if seq <= inbound.upto:  # stored (or settled) over an earlier link
                    self.counters.received_duplicates += 1
                    (after_sync if msg.persistent else now_acks).append(
                        (seq, AckStatus.DUPLICATE))
                    continue
                status, needs_sync = self._accept(msg, again)
            elif msg.broker_path:
                # A bridged message: a remote broker sends it again when the ingress
                # shard died before confirming it, and the restarted shard forwards it
                # as a first send of its new run; the window (filled by recovery from
                # this shard's store, and here as it arrives) finds it stored already.
                gaps.discard(seq)
                status, needs_sync = self._accept(msg, again)
            else:
                gaps.discard(seq)  # answered RETRY before: this is its next try
                status, needs_sync = self._route(msg, again, None)
            if status is AckStatus.RETRY:
                gaps.add(seq)
            elif status is AckStatus.STORED:
                routed[msg.destination] = None
            (after_sync if needs_sync else now_acks).append((seq, status))
        if batch:  # (a link's sequence numbers rise, but for RETRY's next tries)
            top = max(seq for seq, _ in batch)
            inbound.upto = max(inbound.upto, top)
        self._answer(len(batch), now_acks, after_sync)
        if routed and self.sends_routed is not None:
            # Push-back across shards: the sender's producers of a slow one are held.
            self.sends_routed(self.peer_index, routed)

    def _accept(self, msg: Message, again: bool = False) -> tuple[AckStatus, bool]:
        """A send that may have been stored before: checked in the duplicate window."""
        key = network_key(msg)
        if self.broker.dedup.check_and_add(key):
            self.counters.received_duplicates += 1
            return AckStatus.DUPLICATE, msg.persistent
        return self._route(msg, again, key)

    def _route(self, msg: Message, again: bool, key: str | None) -> tuple[AckStatus, bool]:
        """As a bridge's, less what the sending shard did already: the destination's
        checks and the client's rights (``Broker.send_from_shard``); no loop check (a
        shard link adds nothing to ``broker_path``), nothing to redistribute."""
        if SHARD_RETAIN in msg.properties:
            return self._route_retained(msg, again, key)
        broker = self.broker
        try:
            needs_sync = broker.send_from_shard(self.conn, msg, again)
        except ResourceLimitError:
            if key is not None:
                broker.dedup.forget(key)
            self.retried += 1
            self._want_space()
            return AckStatus.RETRY, False
        except MeshmqError as exc:
            log.info("message %s for %s from shard %s dropped: %s", msg.message_id,
                     msg.destination, self.remote, exc)
            return AckStatus.DROPPED, False
        if broker.tracer is not None:
            broker.trace_received_from_bridge(msg, from_broker=self.remote,
                                              connector=self.link.peer)
        return AckStatus.STORED, needs_sync

    def _route_retained(self, msg: Message, again: bool, key: str | None
                        ) -> tuple[AckStatus, bool]:
        """A retained publish (MQTT) to a topic owned here: routed, then kept as the
        topic's retained message (which copies it to the other shards)."""
        properties = dict(msg.properties)
        del properties[SHARD_RETAIN]
        plain = dataclasses.replace(msg, properties=properties, wire_cache=None)
        status, needs_sync = self._route(plain, again, key)
        if status is AckStatus.STORED:
            self.broker.retain(plain)
            needs_sync = True
        return status, needs_sync

    def _on_consumer_event(self, event: ConsumerEvent) -> None:
        return


class RelayWindow:
    """An auto-ack relay's deliveries in flight: dispatched, not yet credited back.

    For a relay of queues the count is taken as the queue hands a message over: the
    consumer's network filter is asked last, only of the consumer the message then
    goes to (between pumps too, when a send meets an idle queue), so ``admit`` counts
    dispatches exactly and stops the consumer once the window is full. A topic
    subscription's filter is also asked when a message is routed, and a stream's is
    not asked at all, so those relays are counted as their deliveries are written to
    the link instead (``RelayOut.deliver``): the window there can be passed by what one
    pump dispatches."""

    __slots__ = ("at_dispatch", "consumer", "inflight", "size", "stats")

    def __init__(self, consumer: Consumer, stats: PeerStats) -> None:
        self.consumer = consumer
        self.stats = stats
        self.size = consumer.prefetch
        self.inflight = 0
        # (A stream's dispatch asks no filter: counted as a topic relay is.)
        self.at_dispatch = all(d.kind.is_queue for d in consumer.spec.destinations) \
            and not any(isinstance(s, StreamQueue) for s in consumer.sources)

    def admit(self, message: Message) -> bool:
        """The net filter of a relay of queues: ``message`` goes to it now."""
        self.inflight += 1
        if self.inflight >= self.size:
            self.stats.window_full += 1
            self.consumer.paused = True  # (as Broker.pause_relayed; nothing to mark)
        return True


class RelayOut:
    """The owner's side of relayed consumers of one peer shard: a hosted session whose
    consumers are that shard's clients' subscriptions, delivering through DELIVER.

    An auto-ack relay's consumer here settles each message as it leaves, so its
    prefetch window never fills; ``RelayWindow`` is the window instead: at most
    ``prefetch`` deliveries in flight, until ``relay-credit`` says the consumer's shard
    wrote them to its client. A client that does not read so stops this consumer after
    one window, and the rest waits in the queue here, as on one broker."""

    def __init__(self, peers: ShardPeers, peer: _Peer) -> None:
        self.peers = peers
        self.peer = peer
        self.host = peers.host
        self.broker = peers.host.broker
        principal = Principal(f"shard:{peer.label}", frozenset({"network"}), internal=True)
        self._conn = self.broker.open_connection(principal, remote=peer.label,
                                                 protocol="shard")
        self.conn: Connection | None = self._conn
        self.consumers: dict[int, Consumer] = {}  # relay id -> consumer here
        self.relay_of: dict[str, int] = {}  # consumer id -> relay id
        self.windows: dict[int, RelayWindow] = {}  # auto-ack relays' deliveries in flight
        # Subscription relays' own connections (durable client id, subscriber's rights).
        self.relay_conns: dict[int, Connection] = {}
        self.link_paused = False  # the link's buffer is full: nobody gets more
        self.closed = False
        # Registered for deliveries, but not among the client sessions a stopping
        # broker closes first: it lives as long as its link, which stops after them.
        self.host.register(self)

    def open(self, body: dict[str, Any]) -> None:
        relay = _int(body, "relay")
        self.close_relay(relay)  # an open for a relay that exists replaces it
        selector = body.get("selector")
        try:
            dest = Destination.parse_uri(str(body.get("dest")))
            # Auto-ack: settled here as it leaves (no SETTLE comes back), as one broker
            # settles an auto-ack delivery once it is written to its client.
            ack_mode = AckMode.AUTO if body.get("auto") is True else AckMode.CLIENT_INDIVIDUAL
            spec = ConsumerSpec(destinations=(dest,), ack_mode=ack_mode,
                                prefetch=max(1, _int(body, "prefetch")),
                                priority=_int(body, "priority"),
                                exclusive=bool(body.get("exclusive")),
                                selector=selector if isinstance(selector, str) else None)
            spec, conn = self._subscription_relay(relay, spec, body)
            origin = _origin(body.get("origin"))
            if origin is not None:  # whom this shard's advisories show
                spec = dataclasses.replace(spec, origin=origin)
            path = body.get("network_path")
            if isinstance(path, list):  # a bridge's demand on the front shard
                spec = dataclasses.replace(spec, network_path=tuple(str(b) for b in path))
            consumer = self.broker.subscribe(conn, f"relay-{relay}", spec)
            if spec.network_path:
                consumer.net_filter = _not_back_to(spec.network_path[-1])
        except MeshmqError as exc:
            self._close_relay_conn(relay)
            # Not a reason to drop the link (it would be opened again on the next one):
            # the consumer's shard checked it, so this is a disagreement to log.
            log.warning("shard %s: cannot relay %s to shard %s: %s",
                        self.peers.identity.label, body.get("dest"), self.peer.label, exc)
        else:
            self.consumers[relay] = consumer
            self.relay_of[consumer.id] = relay
            if ack_mode is AckMode.AUTO:
                window = self.windows[relay] = RelayWindow(consumer, self.peer.stats)
                if window.at_dispatch:
                    consumer.net_filter = window.admit
            if self.link_paused:
                self.broker.pause_relayed(consumer, True)
            self.host.request_pump()
        # Answered either way: the subscriber's confirmation waits for it.
        self.peers.queue(self.peer, _FRAME, encode_json(FrameType.INTEREST, {
            "op": "relay-opened", "relay": relay}))

    def _subscription_relay(self, relay: int, spec: ConsumerSpec, body: dict[str, Any]
                            ) -> tuple[ConsumerSpec, Connection]:
        """A wildcard's or durable subscription's relay (``SubscriptionRelay``): all its
        patterns, and, for a durable one or one whose user's rights limit it, a
        connection of its own that holds the durable's client id (no claim on it: the
        client is connected elsewhere) and the subscriber's groups, so a wildcard
        carries only what the user may read. Others: the link's session."""
        dests = body.get("dests")
        durable = body.get("durable")
        reader = body.get("reader")
        shared = body.get("shared")
        if isinstance(shared, str):  # a member of this group, with the owner's members
            spec = dataclasses.replace(spec, shared_group=shared)
        if dests:
            spec = dataclasses.replace(spec, destinations=tuple(
                Destination.parse_uri(str(d)) for d in dests))
        if durable is None and reader is None:
            return spec, self._conn
        client_id = None
        if durable is not None:
            if not isinstance(durable, list) or len(durable) != 2 \
                    or not all(isinstance(x, str) for x in durable):
                raise RemoteProtocolError("shard INTEREST field 'durable' must be "
                                          "[client id, name]")
            client_id, name = durable
            spec = dataclasses.replace(spec, subscription_name=name,
                                       no_local=body.get("no_local") is True)
        principal = Principal(f"shard:{self.peer.label}", frozenset({"network"}),
                              internal=True)
        if isinstance(reader, list) and len(reader) == 2 and isinstance(reader[1], list):
            principal = Principal(str(reader[0]), frozenset(str(g) for g in reader[1]))
        conn = self.broker.open_connection(principal, remote=self.peer.label,
                                           protocol="shard")
        conn.client_id = client_id  # (after opening: not a claim of the client id)
        self.relay_conns[relay] = conn
        self.host.register(_RelayConnSession(self, conn))  # its deliveries: this link's
        return spec, conn

    def _close_relay_conn(self, relay: int) -> None:
        conn = self.relay_conns.pop(relay, None)
        if conn is not None:
            conn.client_id = None  # never the client's claim, whoever holds it now
            self.broker.close_connection(conn)
            self.host.unregister(_RelayConnSession(self, conn))

    def credit(self, relay: int, count: int) -> None:
        """The relaying shard wrote ``count`` more of ``relay``'s deliveries to its
        client: that many more may go."""
        window = self.windows.get(relay)
        consumer = self.consumers.get(relay)
        if window is None or consumer is None or count <= 0:
            return  # closed meanwhile, or not an auto-ack relay
        # (Never below zero: credit for a closed relay's deliveries may cross a reopen.)
        window.inflight = max(0, window.inflight - count)
        if window.inflight < window.size and consumer.paused and not self.link_paused:
            self.broker.pause_relayed(consumer, False)
            self.host.request_pump()  # what the credit allows goes with the next pump

    def link_writable(self, writable: bool) -> None:
        """The link's write buffer filled (or drained): stop (or resume) every relay,
        so a peer that reads slower than this shard dispatches never grows it."""
        if self.link_paused is not writable:
            return
        self.link_paused = not writable
        if not writable:
            self.peer.stats.link_pauses += 1
        windows = self.windows
        for relay, consumer in self.consumers.items():
            window = windows.get(relay)
            self.broker.pause_relayed(consumer, self.link_paused or (
                window is not None and window.inflight >= window.size))
        if writable:
            self.host.request_pump()

    def close_relay(self, relay: int) -> None:
        self.windows.pop(relay, None)
        consumer = self.consumers.pop(relay, None)
        if consumer is not None:
            self.relay_of.pop(consumer.id, None)
            self.broker.unsubscribe(self.relay_conns.get(relay, self._conn), consumer)
            self.host.request_pump()
        self._close_relay_conn(relay)

    def settle(self, settles: list[tuple[int, int, SettleKind]]) -> None:
        """What the peer's clients did with relayed deliveries: each run of one relay
        and one kind is settled in one call (one window update, one dispatch mark)."""
        run: list[int] = []
        run_relay, run_kind = -1, SettleKind.ACK
        for relay, tag, kind in settles:
            if relay != run_relay or kind is not run_kind:
                self._settle_run(run_relay, run_kind, run)
                run, run_relay, run_kind = [], relay, kind
            run.append(tag)
        self._settle_run(run_relay, run_kind, run)
        self.host.request_pump()

    def _settle_run(self, relay: int, kind: SettleKind, tags: list[int]) -> None:
        consumer = self.consumers.get(relay)
        if consumer is None or not tags:
            return  # closed meanwhile (its messages went back then)
        if kind is not SettleKind.RETURNED:
            # A tag no longer in the window (settled, or taken back) is skipped.
            self.broker.settle_relayed(consumer, tags, acked=kind is SettleKind.ACK)
            return
        for tag in tags:
            entry = consumer.dispatched.pop(tag, None)
            if entry is not None:
                consumer.by_message_id.pop(entry.message.message_id, None)
                entry.queue.release(entry, count_delivery=False,
                                    cause="its relayed consumer closed before delivery")

    # ------------------------------------------------------------ hosted session
    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        if not isinstance(outcome, Delivery):
            return
        consumer = outcome.consumer
        relay = self.relay_of.get(consumer.id)
        if relay is not None:
            self.peers.queue(self.peer, _DELIVER, (relay, outcome.tag, outcome.delivery_count,
                                                   encoded(outcome.message)))
            stats = self.peer.stats
            stats.delivered_out += 1
            window = self.windows.get(relay)
            if window is not None and not window.at_dispatch:
                window.inflight += 1
                if window.inflight >= window.size:
                    stats.window_full += 1
                    self.broker.pause_relayed(consumer, True)

    def flush(self) -> None:
        return  # the peers' flush writes the link once per pump

    def check_timeouts(self, now: float) -> None:
        return

    def close_by_admin(self) -> None:
        link = self.peer.link
        if link is not None:
            link.close("closed by an administrator")

    def close(self) -> None:
        """The link is gone: the relayed consumers' unsettled messages go back to their
        queues, counted as a delivery (as when a client disconnects)."""
        if self.closed:
            return
        self.closed = True
        self.host.unregister(self)
        self.host.forget(self)
        self.broker.close_connection(self._conn)
        for relay in list(self.relay_conns):
            self._close_relay_conn(relay)
        self.consumers.clear()
        self.relay_of.clear()
        self.windows.clear()
        self.host.request_pump()


class PeerStats:
    """What went over one shard link, both ways (``/api/stat``'s ``shard_links``): how
    a crossing is paid for and where it waits."""

    __slots__ = ("credits_in", "delivered_in", "delivered_out", "holds_in", "holds_out",
                 "link_pauses", "retried", "sent", "spaces", "window_full", "writes")

    def __init__(self) -> None:
        self.sent = 0  # sends forwarded to the peer as owner (first tries)
        self.retried = 0  # of those, answered RETRY (the owner's memory limit)
        self.spaces = 0  # ``space`` answers: the owner's limit let go
        self.delivered_out = 0  # deliveries to the peer's relayed consumers
        self.delivered_in = 0  # deliveries from the peer to this shard's relays
        self.credits_in = 0  # ``relay-credit`` frames from the peer
        self.window_full = 0  # times an auto-ack relay's window filled here
        self.link_pauses = 0  # times the link's write buffer filled
        self.writes = 0  # link writes (one per flush with output)
        self.holds_out = 0  # as owner: times it asked the peer to hold its producers
        self.holds_in = 0  # times the peer, as owner, asked this shard to hold them

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class _RelayConnSession:
    """What the host pumps a subscription relay's own connection's deliveries to: its
    link's ``RelayOut`` (which knows the relay by the consumer)."""

    def __init__(self, relay_out: RelayOut, conn: Connection) -> None:
        self.relay_out = relay_out
        self.conn: Connection | None = conn

    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        self.relay_out.deliver(outcome)

    def flush(self) -> None:
        return

    def close(self) -> None:
        return  # closed with its relay or its link

    def close_by_admin(self) -> None:
        self.relay_out.close_by_admin()

    def check_timeouts(self, now: float) -> None:
        return


class _Peer:
    """Another shard: its link (when up), what was sent to it and not yet settled."""

    def __init__(self, index: int, label: str, socket: str) -> None:
        self.index = index
        self.label = label
        self.socket = socket
        self.link: WireLink | None = None
        self.receiver: ShardReceiver | None = None
        self.relay_out: RelayOut | None = None
        self.seq = 0
        # Sends not yet settled by the owner, in seq order: (message bytes, redelivered).
        self.unacked: dict[int, tuple[bytes, bool]] = {}
        self.out: list[tuple[int, Any]] = []
        self.retry: asyncio.TimerHandle | None = None
        # The owner answered RETRY: sends to it are held (not written) until it says
        # ``space`` or RETRY_PAUSE_S passed, then go with the refused ones in order.
        self.full = False
        self.retrying: list[int] = []
        self.stats = PeerStats()
        self.inbound = Inbound()  # what the peer sent here (it as the sender)
        self.wait: asyncio.TimerHandle | None = None  # unreachable: owner_wait_s runs
        self.down = False  # unreachable for longer than owner_wait_s
        self.links = 0  # links made so far (statistics, tests)
        # ``settle-sync`` asks not yet answered, and the confirmations waiting on each.
        self.asks: dict[int, list[asyncio.Future[None]]] = {}
        # Durable subscriptions removed while the link was down: asked of it when up.
        self.drops: list[DurableDrop] = []


class _LinkEnd:
    """The handler of one link: the handshake, then frames for its peer."""

    def __init__(self, peers: ShardPeers, peer: _Peer | None) -> None:
        self.peers = peers
        self.peer = peer  # None on the accepting side until the HELLO names it
        self.up = False
        self.welcomed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def on_frame(self, link: WireLink, frame: WireFrame) -> None:
        if not self.up:
            self._handshake(link, frame)
            return
        peer = self.peer
        assert peer is not None
        kind = frame.type
        if kind is FrameType.MESSAGES or kind is FrameType.MESSAGES_AGAIN:
            assert peer.receiver is not None
            peer.receiver.on_messages(decode_messages(frame),
                                      again=kind is FrameType.MESSAGES_AGAIN)
        elif kind is FrameType.ACKS:
            self.peers.on_acks(peer, decode_acks(frame))
        elif kind is FrameType.DELIVER:
            broker = self.peers.broker
            delivered = decode_deliver(frame)
            peer.stats.delivered_in += len(delivered)
            for relay, tag, count, msg in delivered:
                broker.relay_deliver(peer.index, relay, tag, count, msg)
            self.peers.host.request_pump()
        elif kind is FrameType.SETTLE:
            assert peer.relay_out is not None
            peer.relay_out.settle(decode_settle(frame))
        elif kind is FrameType.INTEREST:
            body = decode_json(frame)
            assert peer.relay_out is not None
            if body.get("op") == "relay-open":
                peer.relay_out.open(body)
            elif body.get("op") == "relay-close":
                peer.relay_out.close_relay(_int(body, "relay"))
            elif body.get("op") == "relay-opened":
                self.peers.relay_opened(peer.index, _int(body, "relay"))
            elif body.get("op") == "settle-sync":
                self.peers.settle_sync(peer, link, _int(body, "ask"))
            elif body.get("op") == "settle-synced":
                for fut in peer.asks.pop(_int(body, "ask"), ()):
                    if not fut.done():
                        fut.set_result(None)
            elif body.get("op") == "relay-credit":
                peer.stats.credits_in += 1
                peer.relay_out.credit(_int(body, "relay"), _int(body, "count"))
            elif body.get("op") == "space":
                peer.stats.spaces += 1
                if peer.full or peer.retrying:
                    self.peers._resend(peer)
            elif body.get("op") == "durable-drop":
                self.peers.durable_drop(peer, body)
            elif body.get("op") == "producer":
                self.peers.producer_note(peer, body)
            elif body.get("op") in ("hold", "release"):
                self.peers.hold_note(peer, body, body.get("op") == "hold")
            elif body.get("op") == "front-interest":
                self.peers.node_interest.received(peer.index, body)
            elif str(body.get("op")).startswith(("client-", "session-")):
                self.peers.clients.on_interest(peer, body)
            elif body.get("op") == "retained":
                text = body.get("msg")
                self.peers.broker.retained_copied(
                    peer.index, Destination.parse_uri(str(body.get("dest"))),
                    None if text is None else _unb64(text))
            elif body.get("op") == "retained-sync":
                msgs = body.get("msgs")
                if not isinstance(msgs, list):
                    raise RemoteProtocolError("shard retained-sync needs a list of messages")
                self.peers.broker.retained_synced(peer.index, [_unb64(m) for m in msgs],
                                                  first=body.get("first") is not False)
            else:
                raise RemoteProtocolError(f"unknown shard INTEREST op {body.get('op')!r}")
        elif kind is FrameType.TXN:
            self.peers.on_txn(peer, link, frame)
        elif kind is FrameType.BYE:
            link.close("the peer shard is stopping")
        else:
            raise RemoteProtocolError(f"{kind.name} frame is not allowed on a shard link")

    def _handshake(self, link: WireLink, frame: WireFrame) -> None:
        peers = self.peers
        if frame.type is FrameType.HELLO and self.peer is None:
            hello = decode_json(frame)
            peer = peers.admit(hello)
            if peer is None:
                link.refuse("authentication-failed", "not a shard of this node (token, node "
                            "or shard index)")
                return
            link.write(encode_json(FrameType.WELCOME, peers.greeting(peer)))
            peer.inbound.greeted(hello)
            self.peer = peer
        elif frame.type is FrameType.WELCOME and self.peer is not None:
            body = decode_json(frame)
            if FEATURE_SHARD not in (body.get("features") or ()) or \
                    body.get("shard") != self.peer.index:
                link.refuse("protocol-error", "the peer is not the expected shard")
                return
            self.peer.inbound.greeted(body)
        elif frame.type is FrameType.REFUSE:
            body = decode_json(frame)
            log.error("shard %s: shard %s refused the link: %s", peers.identity.label,
                      self.peer.label if self.peer else "?", body.get("message"))
            link.close("refused")
            return
        else:
            raise RemoteProtocolError(f"{frame.type.name} frame before the shard handshake")
        self.up = True
        assert self.peer is not None
        peers.link_up(self.peer, link)
        if not self.welcomed.done():
            self.welcomed.set_result(True)

    def on_lost(self, link: WireLink, cause: str) -> None:
        if not self.welcomed.done():
            self.welcomed.set_result(False)
        if self.up and self.peer is not None and self.peer.link is link:
            self.peers.link_down(self.peer, cause)

    def on_writable(self, link: WireLink) -> None:
        peer = self.peer
        if peer is not None and peer.link is link and peer.relay_out is not None:
            peer.relay_out.link_writable(True)


class ShardPeers:
    """This shard's links to every other shard of its node (see the module docstring)."""

    def __init__(self, host: BrokerHost, identity: ShardIdentity, *,
                 heartbeat_s: float = HEARTBEAT_S, owner_wait_s: float = OWNER_WAIT_S) -> None:
        self._host = host
        self.broker: Broker = host.broker
        self.identity = identity
        self.heartbeat_s = heartbeat_s
        self.owner_wait_s = owner_wait_s
        self.boot = secrets.token_hex(8)  # this run: a peer's sequence numbers restart
        self.peers = {k: _Peer(k, f"{identity.node}#{k}", identity.link_socket(k))
                      for k in range(identity.count) if k != identity.index}
        self._server: asyncio.AbstractServer | None = None
        self._dialers: list[asyncio.Task[None]] = []
        self._waiters: list[tuple[dict[int, int], asyncio.Future[None]]] = []
        # Owners sent to since the last ``owners()``: what a confirmation asked for now
        # must wait for (a send to a destination owned here waits for nobody).
        self._touched: set[int] = set()
        # Relayed consumers whose owner has not yet answered ``relay-opened``: what
        # their subscriptions' confirmations wait for, by (owner, relay id).
        self._opening: dict[tuple[int, int], asyncio.Future[None]] = {}
        # Confirmations waiting for owners to store settlements, asked with the next
        # ``take`` (after those settlements on the link), and the last ask's number.
        self._asking: dict[int, list[asyncio.Future[None]]] = {}
        self._ask = 0
        # The last retained-message copy encoded (message, topic, frame): reused for
        # the next peers.
        self._retained_frame: tuple[Message | None, Destination, bytes] | None = None
        self._flush_scheduled = False
        self._stopping = False
        # Transactions across shards coordinated here: the COMMITs waiting for their
        # decision (``committing``), and how many frames of each TXN op went out.
        self._txn_waits: dict[str, asyncio.Future[None]] = {}
        self.txn_sent: dict[str, int] = {}
        # Commits waiting for their participants: a one-phase one given up after
        # ``owner_wait_s`` (its COMMIT then fails, the outcome unknown here), a
        # two-phase one whose votes are not all in by then rolled back.
        self._txn_timers: dict[str, asyncio.TimerHandle] = {}
        # The consumers of every shard, for the front shard's network links.
        self.node_interest = NodeInterest(self.broker, identity.index,
                                          front=identity.is_front, send=self._to_front)
        # The node's client ids: claims made here, and the table of those owned here.
        self.clients = ClientClaims(self)
        # Push-back across shards (transport/push_back.py ``ShardHolds``), set by the
        # runtime: as an owner, told where each batch of another shard's sends went
        # (``note_hold`` answers); as an ingress shard, told an owner's hold or release
        # of its producers of a destination; and told a link dropped.
        self.sends_routed: Callable[[int, Iterable[Destination]], None] | None = None
        self.hold_noted: Callable[[int, Destination, bool], None] | None = None
        self.holds_lost: Callable[[int], None] | None = None

    # ------------------------------------------------------------ ReceiverServices
    @property
    def host(self) -> BrokerHost:
        return self._host

    def arrived(self, message_ids: list[str]) -> None:
        return  # no redistribution between shards: each destination has one place

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        path = self.identity.link_socket(self.identity.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a shard that was killed
        self._server = await loop.create_unix_server(self._accept, path)
        os.chmod(path, 0o600)
        self.node_interest.start()
        self.clients.start()  # the expiry of the MQTT sessions kept here
        for peer in self.peers.values():
            self._start_wait(peer)
            if peer.index < self.identity.index:
                self._dialers.append(loop.create_task(self._dial(peer),
                                                      name=f"shard link {peer.label}"))

    async def stop(self) -> None:
        self._stopping = True
        self.node_interest.stop()
        self.clients.stop()
        for task in self._dialers:
            task.cancel()
        for task in self._dialers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._dialers.clear()
        for timer in self._txn_timers.values():
            timer.cancel()
        self._txn_timers.clear()
        self.flush()
        for peer in self.peers.values():
            link = peer.link
            if link is not None:
                link.write(encode_json(FrameType.BYE, {"reason": "shard stopping"}))
                link.close("shard stopping")
                self.link_down(peer, "shard stopping")
            if peer.retry is not None:
                peer.retry.cancel()
            if peer.wait is not None:
                peer.wait.cancel()
                peer.wait = None
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.identity.link_socket(self.identity.index))

    def _accept(self) -> WireLink:
        return WireLink(_LinkEnd(self, None), initiator=False, heartbeat_s=self.heartbeat_s)

    async def _dial(self, peer: _Peer) -> None:
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST_S
        while not self._stopping:
            end = _LinkEnd(self, peer)
            link = WireLink(end, initiator=True, heartbeat_s=self.heartbeat_s)
            try:
                await loop.create_unix_connection(lambda link=link: link,  # type: ignore[misc]
                                                  peer.socket)
            except OSError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            link.write(encode_json(FrameType.HELLO, self.greeting(peer)))
            try:
                welcomed = await asyncio.wait_for(asyncio.shield(end.welcomed),
                                                  HANDSHAKE_TIMEOUT_S)
            except TimeoutError:
                link.abort("no WELCOME in time")
                welcomed = False
            if welcomed:
                delay = RETRY_FIRST_S
            await link.lost
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def greeting(self, peer: _Peer) -> dict[str, Any]:
        """HELLO or WELCOME to ``peer``; ``boot`` and ``sent`` tell it which of the
        sends that follow may be re-sends (``Inbound``)."""
        ident = self.identity
        return {"protocol": "meshmq", "versions": [WIRE_VERSION], "version": WIRE_VERSION,
                "broker": ident.node, "shard": ident.index, "token": ident.token,
                "features": [FEATURE_SHARD], "boot": self.boot, "sent": peer.seq}

    def admit(self, hello: dict[str, Any]) -> _Peer | None:
        """The peer a HELLO comes from, or None when it is not a shard of this node."""
        ident = self.identity
        token = hello.get("token")
        shard = hello.get("shard")
        if FEATURE_SHARD not in (hello.get("features") or ()) or not isinstance(token, str) \
                or not hmac.compare_digest(token.encode(), ident.token.encode()) \
                or hello.get("broker") != ident.node or not isinstance(shard, int) \
                or WIRE_VERSION not in (hello.get("versions") or ()):
            return None
        return self.peers.get(shard)

    # ------------------------------------------------------------ links
    def link_up(self, peer: _Peer, link: WireLink) -> None:
        old = peer.link
        if old is not None:  # the peer restarted before this side noticed
            old.close("replaced by a new link")
            self.link_down(peer, "replaced by a new link")
        link.peer = peer.label
        peer.link = link
        peer.links += 1
        if peer.wait is not None:
            peer.wait.cancel()
            peer.wait = None
        if peer.down:
            peer.down = False
            self.broker.owner_unreachable(peer.index, False)
            log.info("shard %s: shard %s is back: sends to it are accepted again",
                     self.identity.label, peer.label)
        principal = Principal(f"shard:{peer.label}", frozenset({"network"}), internal=True)
        peer.receiver = ShardReceiver(self, link, peer.label, DestinationFilter(),
                                      LinkCounters(), resync_s=0, principal=principal)
        peer.receiver.inbound = peer.inbound
        peer.receiver.peer_index = peer.index
        peer.receiver.sends_routed = self.sends_routed
        peer.relay_out = RelayOut(self, peer)
        log.info("shard %s: linked to shard %s", self.identity.label, peer.label)
        # Everything not yet settled goes again (the owner's duplicate window drops
        # what it had stored), then this shard's relayed consumers are opened again.
        peer.out = [(_AGAIN if again else _SEND, (seq, data))
                    for seq, (data, again) in peer.unacked.items()]
        if peer.retry is not None:
            peer.retry.cancel()
            peer.retry = None
        peer.full, peer.retrying = False, []
        # The retained messages of the topics this shard owns, in full (MQTT), and the
        # durable subscriptions removed meanwhile (before the opens: they came first).
        peer.out.extend((_FRAME, frame) for frame in _retained_sync(
            self.broker.retained_owned()))
        drops, peer.drops = peer.drops, []
        for drop in drops:
            self._queue_decision(peer, drop)
        for relay in self.broker.relay_opens(peer.index):
            self._queue_decision(peer, relay)
        for note in self.broker.producer_notes(peer.index):
            self._queue_decision(peer, note)
        for txn in self.broker.shard_transactions.resume(peer.index):
            self._queue_txn(txn)
        if peer.index == FRONT_SHARD:
            self.node_interest.front_linked()
        self.clients.link_up(peer)
        self._schedule_flush()

    def link_down(self, peer: _Peer, cause: str) -> None:
        if peer.link is None:
            return
        peer.link = None
        peer.out = []
        # What the lost link may have carried, the owner may have stored, delivered and
        # seen acknowledged before it died: sent again, it goes as MESSAGES_AGAIN, so a
        # copy its restarted store no longer recognises reaches consumers flagged.
        peer.unacked = {seq: (data, True) for seq, (data, _) in peer.unacked.items()}
        # Settlements the lost link carried may not have reached the owner's store:
        # their confirmations are never sent (the owner delivers those messages again).
        asks, peer.asks = peer.asks, {}
        for futs in asks.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(_lost(peer))
        log.info("shard %s: link to shard %s lost: %s", self.identity.label, peer.label,
                 cause)
        if peer.receiver is not None:
            peer.receiver.close()
            peer.receiver = None
        if peer.relay_out is not None:
            peer.relay_out.close()
            peer.relay_out = None
        self.broker.relay_link_lost(peer.index)
        self.node_interest.shard_lost(peer.index)
        if self.holds_lost is not None:
            self.holds_lost(peer.index)
        for txn_id in self.broker.shard_transactions.link_lost(peer.index):
            self._txn_failed(txn_id, f"shard {peer.label} was lost before it prepared")
        self.clients.link_down(peer)
        if not self._stopping:
            self._start_wait(peer)
        self.host.request_pump()

    def _start_wait(self, peer: _Peer) -> None:
        if peer.wait is None and not peer.down:
            peer.wait = asyncio.get_running_loop().call_later(self.owner_wait_s,
                                                              self._owner_down, peer)

    def _owner_down(self, peer: _Peer) -> None:
        """``peer`` stayed unreachable for ``owner_wait_s``: what waits for it fails and
        new sends to it are refused, both retriably, so producers neither wait without
        end nor fill this shard's memory. What is held still goes once it is back."""
        peer.wait = None
        if peer.link is not None or self._stopping:
            return
        peer.down = True
        self.broker.owner_unreachable(peer.index, True)
        self._opened_without(peer)
        self.clients.owner_down(peer)
        log.warning("shard %s: shard %s unreachable for %.1f s: sends to its destinations "
                    "are refused until it is back", self.identity.label, peer.label,
                    self.owner_wait_s)
        self._check_waiters()

    def links_up(self) -> int:
        return sum(1 for p in self.peers.values() if p.link is not None)

    def owner_up(self, index: int) -> bool:
        """Whether the link to shard ``index`` is up (a connection may be handed to it)."""
        peer = self.peers.get(index)
        return peer is not None and peer.link is not None and not peer.full

    def summary(self) -> list[dict[str, object]]:
        """Each link's state and counters (``/api/stat``'s ``shard_links``)."""
        out: list[dict[str, object]] = []
        for peer in self.peers.values():
            relays = peer.relay_out.consumers if peer.relay_out is not None else {}
            receiver = peer.receiver
            out.append({"shard": peer.index, "up": peer.link is not None,
                        "links": peer.links, "unsettled_sends": len(peer.unacked),
                        "owner_full": peer.full, "relays_served": len(relays),
                        **peer.stats.as_dict(),
                        # As the owner: the peer's sends parked at this shard's limit.
                        "parked": receiver.parked if receiver is not None else 0,
                        "parked_total": receiver.parked_total if receiver else 0,
                        "refused": receiver.retried if receiver is not None else 0})
        return out

    # ------------------------------------------------------------ decisions out
    def take(self) -> None:
        """The core's sends and relay decisions, into each peer's output (the pump)."""
        broker = self.broker
        sends = broker.take_shard_sends()
        held = 0
        for send in sends:
            peer = self.peers[send.owner]
            peer.seq += 1
            data = encoded(send.message)
            held += len(data)
            peer.unacked[peer.seq] = (data, send.redelivered)
            self._touched.add(send.owner)
            peer.stats.sent += 1
            if peer.link is not None:
                if peer.full:  # after the refused ones, in order, once it has room
                    peer.retrying.append(peer.seq)
                else:
                    peer.out.append((_AGAIN if send.redelivered else _SEND,
                                     (peer.seq, data)))
        if held:
            # Counted against the memory limit until the owner settles them: producers
            # of a shard whose owners are slow or down meet the limit's flow control.
            broker.usage.charge(held)
        decisions = broker.take_relay_decisions()
        for decision in decisions:
            if isinstance(decision, RelayClose):  # nobody waits for a closed one's open
                self.relay_opened(decision.owner, decision.relay_id)
            peer = self.peers[decision.owner]
            if peer.link is not None:  # else opened again with the next link
                self._queue_decision(peer, decision)
            elif isinstance(decision, DurableDrop):  # not remade by the next link: kept
                peer.drops.append(decision)
        asked = bool(self._asking)
        if asked:  # after the settlements they wait for
            self._ask_settled()
        txns = broker.shard_transactions.take()
        for txn in txns:  # after the settlements of the same transaction's window
            self._queue_txn(txn)
        if sends or decisions or asked or txns:
            self._schedule_flush()

    def _queue_decision(self, peer: _Peer, decision: RelayDecision) -> None:
        if isinstance(decision, ShardSettle):  # (its kind is the wire's value)
            peer.out.append((_SETTLE, (decision.relay_id, decision.tag, decision.kind)))
        elif isinstance(decision, RelayOpen):
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "relay-open", "relay": decision.relay_id,
                "dest": str(decision.destination), "selector": decision.selector,
                "prefetch": decision.prefetch, "priority": decision.priority,
                "exclusive": decision.exclusive, "auto": decision.auto,
                **_subscription_fields(decision)})))
        elif isinstance(decision, RelayCredit):
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "relay-credit", "relay": decision.relay_id, "count": decision.count})))
        elif isinstance(decision, RetainedCopy):
            # One change goes to every peer in a row: its frame is encoded once.
            message, dest = decision.message, decision.destination
            last = self._retained_frame
            if last is None or last[0] is not message or last[1] != dest:
                last = self._retained_frame = (message, dest, encode_json(
                    FrameType.INTEREST, {"op": "retained", "dest": str(dest),
                                         "msg": None if message is None else _b64(message)}))
            peer.out.append((_FRAME, last[2]))
        elif isinstance(decision, DurableDrop):
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "durable-drop", "client": decision.client_id, "name": decision.name})))
        elif isinstance(decision, ProducerNote):
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "producer", "dest": str(decision.destination),
                "conn": decision.connection_id, "added": decision.added})))
        else:
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "relay-close", "relay": decision.relay_id})))

    def durable_drop(self, peer: _Peer, body: dict[str, Any]) -> None:
        """A client removed a durable subscription through ``peer`` (or its MQTT
        session ended there): deleted here if this shard keeps it, unattached."""
        client, name = body.get("client"), body.get("name")
        if not isinstance(client, str) or not (name is None or isinstance(name, str)):
            raise RemoteProtocolError("shard durable-drop needs a client id and a name")
        if self.broker.drop_durable_relayed(client, name):
            self.host.request_pump()  # (the deletions go to the store with the pump)

    def producer_note(self, peer: _Peer, body: dict[str, Any]) -> None:
        """A connection of ``peer`` started (stopped) sending to a destination this
        shard owns: counted and advised here, as its owner (core/advisories.py)."""
        conn = body.get("conn")
        if not isinstance(conn, str):
            raise RemoteProtocolError("shard producer needs a connection id")
        self.broker.producer_relayed(peer.index, Destination.parse_uri(str(body.get("dest"))),
                                     conn, body.get("added") is True)
        self.host.request_pump()

    def note_hold(self, shard: int, dest: Destination, held: bool) -> None:
        """As ``dest``'s owner: ask ``shard`` to hold (``held``) or to read again its
        producers of ``dest`` (push-back across shards)."""
        peer = self.peers.get(shard)
        if peer is not None:
            if held:
                peer.stats.holds_out += 1
            self.queue(peer, _FRAME, encode_json(FrameType.INTEREST, {
                "op": "hold" if held else "release", "dest": str(dest)}))

    def hold_note(self, peer: _Peer, body: dict[str, Any], held: bool) -> None:
        """``peer``, a destination's owner, holds (releases) this shard's producers."""
        dest = body.get("dest")
        if not isinstance(dest, str):
            raise RemoteProtocolError("shard hold and release need a destination")
        if held:
            peer.stats.holds_in += 1
        if self.hold_noted is not None:
            self.hold_noted(peer.index, Destination.parse_uri(dest), held)

    def _to_front(self, body: dict[str, Any]) -> None:
        front = self.peers.get(FRONT_SHARD)
        if front is not None:
            self.queue(front, _FRAME, encode_json(FrameType.INTEREST, body))

    def queue(self, peer: _Peer, kind: int, item: Any) -> None:
        if peer.link is not None:
            peer.out.append((kind, item))
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        # The pump flushes once per turn; this covers what is queued outside a pump.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write each peer's output: one frame per run of one kind (cut at 500 messages
        or 1 MiB), one write per link."""
        self._flush_scheduled = False
        for peer in self.peers.values():
            out, link = peer.out, peer.link
            if not out or link is None:
                continue
            peer.out = []
            frames: list[bytes] = []
            run: list[Any] = []
            run_kind = -1
            size = 0
            for kind, item in out:
                if kind != run_kind or len(run) >= BATCH_MESSAGES or size >= BATCH_BYTES:
                    _encode_run(frames, run_kind, run)
                    run, run_kind, size = [], kind, 0
                run.append(item)
                if kind == _DELIVER:
                    size += len(item[3])
                elif kind not in (_SETTLE, _FRAME):
                    size += len(item[1])
            _encode_run(frames, run_kind, run)
            link.write(b"".join(frames))
            peer.stats.writes += 1
            if link.paused and peer.relay_out is not None:
                peer.relay_out.link_writable(False)

    # ------------------------------------------------------------ owners' answers
    def on_acks(self, peer: _Peer, acks: list[tuple[int, AckStatus]]) -> None:
        retry = False
        released = 0
        unacked = peer.unacked
        for seq, status in acks:
            if status is AckStatus.RETRY or status is AckStatus.REFUSED:
                retry = True  # kept: sent again when the owner has room
                peer.retrying.append(seq)
                peer.stats.retried += 1
                continue
            held = unacked.pop(seq, None)
            if held is None:
                continue
            released += len(held[0])
            if status is AckStatus.DROPPED:
                log.warning("shard %s: shard %s dropped a message sent to it",
                            self.identity.label, peer.label)
        if released:
            self.broker.usage.refund(released)
        if retry:
            peer.full = True
            if peer.retry is None:
                peer.retry = asyncio.get_running_loop().call_later(RETRY_PAUSE_S,
                                                                   self._resend, peer)
        self._check_waiters()

    def _resend(self, peer: _Peer) -> None:
        """Send the refused and the held sends again, in order (the owner said
        ``space``, or the pause passed)."""
        if peer.retry is not None:
            peer.retry.cancel()
            peer.retry = None
        peer.full = False
        seqs, peer.retrying = sorted(set(peer.retrying)), []
        for seq in seqs:
            held = peer.unacked.get(seq)
            if held is not None:
                self.queue(peer, _AGAIN if held[1] else _SEND, (seq, held[0]))

    def opened(self, consumers: Iterable[Consumer]) -> asyncio.Future[None] | None:
        """Done once the owners of ``consumers``' relayed sources run their consumers
        for them (None: none is relayed), so that a subscription's confirmation means
        what it means on one broker: a message published after it reaches it."""
        waits = []
        for source in (s for c in consumers for s in c.sources):
            if isinstance(source, RelayQueue) and not self.peers[source.owner].down:
                key = (source.owner, source.relay_id)
                fut = self._opening.get(key)
                if fut is None:
                    fut = self._opening[key] = asyncio.get_running_loop().create_future()
                waits.append(fut)
        if not waits:
            return None
        return waits[0] if len(waits) == 1 else asyncio.ensure_future(_all(waits))

    def _opened_without(self, peer: _Peer) -> None:
        """``peer`` is down for longer than the node waits: subscriptions waiting for it
        to run their relays are confirmed without it (they open there once it is back;
        sends to it are refused meanwhile), so a wildcard's confirmation does not wait
        for every shard to be up."""
        for key in [k for k in self._opening if k[0] == peer.index]:
            self.relay_opened(*key)

    def relay_opened(self, owner: int, relay_id: int) -> None:
        fut = self._opening.pop((owner, relay_id), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def owners(self) -> asyncio.Future[None] | None:
        """Done once the owners sent to since the last call have settled everything
        sent to them so far (None: nothing to wait for). ``Durability`` calls it right
        after writing the core's decisions for a confirmation, so those are the sends
        being confirmed (and maybe others' of the same turn): a confirmation waits for
        the owners it concerns, not for an owner that is down and unrelated."""
        touched, self._touched = self._touched, set()
        targets = {k: self.peers[k].seq for k in touched if self.peers[k].unacked}
        if not targets:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((targets, fut))
        if any(self.peers[k].down for k in targets):
            self._check_waiters()
        return fut

    def settled(self, consumers: Iterable[Consumer]) -> asyncio.Future[None] | None:
        """Done once the owners of ``consumers``' relayed sources have stored what this
        shard settled with them so far (None: none is relayed), so an ACK's RECEIPT
        means the acknowledgement is stored, as on one broker. Only a confirmation
        asks (``settle-sync``, after those settlements on the ordered link, with the
        next ``take``): plain settlements cost no answer. Fails if the link drops first
        (the owner then delivers those messages again)."""
        waits = []
        loop = asyncio.get_running_loop()
        for owner in {s.owner for c in consumers for s in c.sources
                      if isinstance(s, RelayQueue)}:
            fut: asyncio.Future[None] = loop.create_future()
            self._asking.setdefault(owner, []).append(fut)
            waits.append(fut)
        if not waits:
            return None
        self._host.request_pump()  # takes the settlements and the ask
        return waits[0] if len(waits) == 1 else asyncio.ensure_future(_all(waits))

    def _ask_settled(self) -> None:
        asking, self._asking = self._asking, {}
        for owner, futs in asking.items():
            peer = self.peers[owner]
            if peer.link is None:
                for fut in futs:
                    if not fut.done():
                        fut.set_exception(_lost(peer))
                continue
            self._ask += 1
            peer.asks[self._ask] = futs
            peer.out.append((_FRAME, encode_json(FrameType.INTEREST, {
                "op": "settle-sync", "ask": self._ask})))

    def settle_sync(self, peer: _Peer, link: WireLink, ask: int) -> None:
        """The owner's side: answer once what was settled before the ask is stored."""
        def synced() -> None:
            self.queue(peer, _FRAME, encode_json(FrameType.INTEREST, {
                "op": "settle-synced", "ask": ask}))

        self.host.durability.when_durable(
            synced, link.abort, who=f"shard link {peer.label}",
            owners=False)

    def _check_waiters(self) -> None:
        if not self._waiters:
            return
        keep = []
        for targets, fut in self._waiters:
            if fut.done():
                continue
            down = [self.peers[k] for k in targets if self.peers[k].down]
            if down:
                fut.set_exception(ResourceLimitError(
                    f"the destination's shard is restarting (shard {down[0].label} "
                    f"unreachable for longer than {self.owner_wait_s:g} s); the send may "
                    "still arrive: send it again with the same dedup-id"))
            elif all(_settled(self.peers[k], seq) for k, seq in targets.items()):
                fut.set_result(None)
            else:
                keep.append((targets, fut))
        self._waiters = keep

    # ------------------------------------------------------------ transactions
    def committing(self, conn: Connection) -> asyncio.Future[None] | None:
        """What the COMMIT just made on ``conn`` waits for when it spans shards (None
        when it did not): the decision to commit, durable here, after every
        participant prepared; it fails when the transaction aborts instead."""
        txn_id = self.broker.shard_transactions.started(conn)
        if txn_id is None:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._txn_waits[txn_id] = fut
        self._host.request_pump()  # takes the prepares
        return fut

    def _queue_txn(self, txn: TxnDecision) -> None:
        if isinstance(txn, TxnPrepare):
            peer = self.peers[txn.owner]
            if peer.link is None:  # a vote no, answered at once
                self._voted(txn.txn, peer, False, f"shard {peer.label} is unreachable")
                return
            self._txn_out(peer, {"op": "commit-one" if txn.one_phase else "prepare",
                                 "txn": txn.txn, "acks": [list(a) for a in txn.acks]},
                          [encoded(m) for m in txn.sends])
            if txn.one_phase:  # its answer is waited for as long as any owner's
                self._txn_timers[txn.txn] = asyncio.get_running_loop().call_later(
                    self.owner_wait_s, self._one_phase_unanswered, txn.txn, peer)
            elif txn.txn not in self._txn_timers:  # (one per transaction)
                # The votes, as long: a participant stopped with its link up would
                # otherwise hold the COMMIT until the link's keep-alive gives up.
                self._txn_timers[txn.txn] = asyncio.get_running_loop().call_later(
                    self.owner_wait_s, self._prepare_unanswered, txn.txn)
        elif isinstance(txn, TxnDecide):
            # An abort to an unreachable participant is presumed; a commit is driven
            # again on the next link (the decision record says to whom).
            self._txn_out(self.peers[txn.owner], {
                "op": "commit" if txn.commit else "abort", "txn": txn.txn})
        elif isinstance(txn, TxnAsk):
            self._txn_out(self.peers[txn.peer], {"op": "ask", "txn": txn.txn})
        elif isinstance(txn, TxnCommitted):
            self._committed_one(self.peers[txn.coordinator], txn.txn)
        elif isinstance(txn, TxnForget):
            # Unreachable: the owner sends its outcome again on the next link.
            self._txn_out(self.peers[txn.owner], {"op": "forget", "txn": txn.txn})

    def _txn_out(self, peer: _Peer, head: dict[str, Any],
                 messages: Sequence[bytes] = ()) -> None:
        if peer.link is not None:
            op = str(head["op"])
            self.txn_sent[op] = self.txn_sent.get(op, 0) + 1
            self.queue(peer, _FRAME, encode_txn(head, messages))

    def on_txn(self, peer: _Peer, link: WireLink, frame: WireFrame) -> None:
        """A TXN frame: a participant's prepare, vote, decision, confirmation, ask."""
        head, messages = decode_txn(frame)
        op, txn_id = head.get("op"), head.get("txn")
        if not isinstance(txn_id, str):
            raise RemoteProtocolError("TXN frame without a transaction id")
        txns = self.broker.shard_transactions
        who = f"shard link {peer.label}"
        if op in ("prepare", "commit-one"):
            self._prepare(peer, link, txn_id, head, messages, one_phase=op == "commit-one")
        elif op in ("prepared", "refused"):
            self._voted(txn_id, peer, op == "prepared", str(head.get("reason") or ""))
        elif op == "committed-one":
            outcome = txns.committed_one(txn_id, peer.index)
            if outcome is Outcome.COMMITTED:
                self._txn_done(txn_id)
        elif op == "forget":
            txns.forget(txn_id)
        elif op in ("commit", "abort"):
            txns.finish(txn_id, op == "commit")
            if op == "commit":  # answered once the commit is durable here
                self.host.durability.when_durable(
                    lambda: self._txn_out(peer, {"op": "committed", "txn": txn_id}),
                    link.abort, who=who, owners=False)
        elif op == "committed":
            txns.confirmed(txn_id, peer.index)
        elif op == "ask":
            if not txn_id.startswith(f"{self.identity.index}."):
                # A coordinator asks the owner of a one-phase commit it lost: committed
                # here durably, or never (a batch not synced died with this shard).
                if txns.committed_here(txn_id):
                    self._committed_one(peer, txn_id)
                else:
                    self._txn_out(peer, {"op": "refused", "txn": txn_id, "reason":
                                         f"shard {self.identity.label} was lost before "
                                         f"it committed"})
            else:
                answer = txns.answer(txn_id)
                if answer is not None:
                    self._txn_out(peer, {"op": "commit" if answer else "abort",
                                         "txn": txn_id})
        else:
            raise RemoteProtocolError(f"unknown TXN op {op!r}")
        self.host.request_pump()

    def _committed_one(self, peer: _Peer, txn_id: str) -> None:
        """Tell coordinator ``peer`` that one-phase ``txn_id`` committed, once durable."""
        link = peer.link
        if link is None:
            return  # sent again on the next link (the record is kept until forgotten)
        self.host.durability.when_durable(
            lambda: self._txn_out(peer, {"op": "committed-one", "txn": txn_id}),
            link.abort, who=f"shard link {peer.label}", owners=False)

    def _prepare(self, peer: _Peer, link: WireLink, txn_id: str, head: dict[str, Any],
                 messages: list[Message], *, one_phase: bool = False) -> None:
        """The participant's side: prepare, then vote once the record is durable; or,
        for a one-phase commit, commit and answer once that is durable."""
        acks: list[tuple[Consumer, int]] = []
        relay_out = peer.relay_out
        reason = None
        for pair in head.get("acks") or ():
            try:
                relay, tag = int(pair[0]), int(pair[1])
            except (TypeError, ValueError, IndexError, KeyError):
                raise RemoteProtocolError("TXN prepare: acks must be [relay, tag] pairs") \
                    from None
            consumer = relay_out.consumers.get(relay) if relay_out is not None else None
            if consumer is None:
                reason = "a relayed consumer of the transaction closed meanwhile"
                break
            acks.append((consumer, tag))
        if reason is None:
            txns = self.broker.shard_transactions
            try:
                if one_phase:
                    txns.commit_one(peer.index, txn_id, messages, acks)
                else:
                    txns.prepare(peer.index, txn_id, messages, acks)
            except MeshmqError as exc:
                reason = str(exc)
        if reason is not None:
            log.info("shard %s: transaction %s from shard %s refused: %s",
                     self.identity.label, txn_id, peer.label, reason)
            self._txn_out(peer, {"op": "refused", "txn": txn_id, "reason": reason})
            return
        if one_phase:
            self._committed_one(peer, txn_id)
            return
        self.host.durability.when_durable(
            lambda: self._txn_out(peer, {"op": "prepared", "txn": txn_id}), link.abort,
            who=f"shard link {peer.label}", owners=False)

    def _voted(self, txn_id: str, peer: _Peer, ok: bool, reason: str) -> None:
        """The coordinator's side: a participant's vote."""
        txns = self.broker.shard_transactions
        outcome = txns.voted(txn_id, peer.index, ok)
        if outcome is Outcome.COMMITTED:  # one phase: durable on its owner already
            self._txn_done(txn_id)
        elif outcome is Outcome.ABORT:
            self._txn_failed(txn_id, reason)
            self._schedule_flush_txns()
        elif outcome is Outcome.COMMIT:
            self._txn_settled(txn_id)  # decided: the wait for the votes is over

            def decided() -> None:
                for owner in txns.participants(txn_id):
                    self._queue_txn(TxnDecide(owner, txn_id, True))
                fut = self._txn_waits.pop(txn_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)

            def not_logged(reason: str) -> None:
                self._txn_failed(txn_id, reason)

            self.host.durability.when_durable(decided, not_logged,
                                              who=f"transaction {txn_id}", owners=False)

    def _one_phase_unanswered(self, txn_id: str, peer: _Peer) -> None:
        """One-phase ``txn_id``'s owner did not answer within ``owner_wait_s``: the
        COMMIT fails, its outcome unknown here (the owner may have synced it before it
        stopped answering, and rolling back is not this shard's to do); the
        connection closes, as after a failed sync."""
        self._txn_timers.pop(txn_id, None)
        if not self.broker.shard_transactions.give_up(txn_id):
            return
        state = "is unreachable and " if peer.link is None else ""
        log.warning("shard %s: one-phase transaction %s: shard %s %sdid not answer within "
                    "%.1f s; its outcome is that shard's", self.identity.label, txn_id,
                    peer.label, state, self.owner_wait_s)
        fut = self._txn_waits.pop(txn_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(OutcomeUnknownError(
                f"may have committed: its outcome is unknown because shard {peer.label}, "
                f"which commits all of it, {state}did not answer within "
                f"{self.owner_wait_s:g} s (shards.owner_wait_ms); check before doing it "
                "again"))

    def _prepare_unanswered(self, txn_id: str) -> None:
        """Two-phase ``txn_id``'s votes did not all come within ``owner_wait_s``: not
        decided yet, it aborts on every shard (a participant that prepares later is
        told to abort behind the prepare, or asks once linked again), and the COMMIT
        fails saying it was rolled back."""
        self._txn_timers.pop(txn_id, None)
        unvoted = self.broker.shard_transactions.time_out(txn_id)
        if unvoted is None:
            return
        labels = ", ".join(self.peers[k].label for k in unvoted)
        who = f"shard {labels}" if len(unvoted) == 1 else f"shards {labels}"
        log.warning("shard %s: transaction %s: %s did not prepare within %.1f s: "
                    "rolled back", self.identity.label, txn_id, who, self.owner_wait_s)
        part = "its part" if len(unvoted) == 1 else "their parts"
        self._txn_failed(txn_id, f"{who} did not prepare {part} within "
                                 f"{self.owner_wait_s:g} s (shards.owner_wait_ms)")
        self._schedule_flush_txns()  # the participants' aborts

    def _schedule_flush_txns(self) -> None:
        # Aborts recorded outside a pump (a vote, a lost link) go with the next one.
        self._host.request_pump()

    def _txn_done(self, txn_id: str) -> None:
        self._txn_settled(txn_id)
        fut = self._txn_waits.pop(txn_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _txn_failed(self, txn_id: str, reason: str) -> None:
        self._txn_settled(txn_id)
        fut = self._txn_waits.pop(txn_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(TransactionError(reason))

    def _txn_settled(self, txn_id: str) -> None:
        timer = self._txn_timers.pop(txn_id, None)
        if timer is not None:
            timer.cancel()

    def outstanding(self) -> int:
        """Sends not yet settled by their owners (statistics, tests)."""
        return sum(len(p.unacked) for p in self.peers.values())


def _settled(peer: _Peer, seq: int) -> bool:
    """Has ``peer`` settled everything up to ``seq``? (``unacked`` is in seq order.)"""
    for first in peer.unacked:
        return first > seq
    return True


def _lost(peer: _Peer) -> ShardLinkLostError:
    return ShardLinkLostError(f"shard {peer.label} stopped before it stored an "
                              "acknowledgement")


async def _all(waits: list[asyncio.Future[None]]) -> None:
    await asyncio.gather(*waits)


def _encode_run(frames: list[bytes], kind: int, run: list[Any]) -> None:
    if not run:
        return
    if kind == _SEND:
        frames.append(encode_records(run))
    elif kind == _AGAIN:
        frames.append(encode_records(run, FrameType.MESSAGES_AGAIN))
    elif kind == _DELIVER:
        frames.append(encode_deliver(run))
    elif kind == _SETTLE:
        frames.append(encode_settle(run))
    else:
        frames.extend(run)


def _not_back_to(remote: str) -> Callable[[Message], bool]:
    """The owner's half of a bridge's loop check (network/forwarder.py): a message that
    came from the bridge's remote broker is not relayed to go back to it."""
    def may_go(msg: Message) -> bool:
        return remote not in msg.broker_path
    return may_go


def _subscription_fields(decision: RelayOpen) -> dict[str, Any]:
    """A ``SubscriptionRelay``'s part of its ``relay-open`` (nothing for the others)."""
    fields: dict[str, Any] = {}
    if decision.destinations:
        fields["dests"] = [str(d) for d in decision.destinations]
    if decision.durable is not None:
        fields["durable"] = list(decision.durable)
        fields["no_local"] = decision.no_local
    if decision.reader is not None:
        fields["reader"] = [decision.reader[0], list(decision.reader[1])]
    if decision.network_path is not None:
        fields["network_path"] = list(decision.network_path)
    if decision.shared is not None:
        fields["shared"] = decision.shared
    origin = decision.origin
    if origin is not None:
        fields["origin"] = [origin.consumer_id, origin.connection_id, origin.client_id,
                            origin.ack_mode, origin.no_local]
    return fields


def _origin(raw: object) -> ConsumerOrigin | None:
    """A ``relay-open``'s ``origin``: the client's consumer the stand-in runs for."""
    if not isinstance(raw, list) or len(raw) != 5:
        return None
    consumer_id, connection_id, client_id, ack_mode, no_local = raw
    if not isinstance(consumer_id, str) or not isinstance(connection_id, str) \
            or not isinstance(ack_mode, str):
        return None
    return ConsumerOrigin(consumer_id, connection_id,
                          client_id if isinstance(client_id, str) else None, ack_mode,
                          no_local is True)


def _retained_sync(messages: list[Message]) -> list[bytes]:
    """``retained-sync`` frames for ``messages``: at most ``BATCH_MESSAGES`` or about
    ``BATCH_BYTES`` each, the first saying that they replace what came before."""
    frames: list[bytes] = []
    run: list[str] = []
    size = 0
    for message in messages:
        text = _b64(message)
        run.append(text)
        size += len(text)
        if len(run) >= BATCH_MESSAGES or size >= BATCH_BYTES:
            frames.append(encode_json(FrameType.INTEREST, {
                "op": "retained-sync", "first": not frames, "msgs": run}))
            run, size = [], 0
    if run or not frames:
        frames.append(encode_json(FrameType.INTEREST, {
            "op": "retained-sync", "first": not frames, "msgs": run}))
    return frames


def _b64(message: Message) -> str:
    """A retained message in a JSON ``INTEREST`` (rare, so not worth a frame type)."""
    return base64.b64encode(encoded(message)).decode("ascii")


def _unb64(text: object) -> Message:
    if not isinstance(text, str):
        raise RemoteProtocolError("a shard retained message must be a base64 string")
    try:
        return decode_message(base64.b64decode(text, validate=True))
    except (ValueError, IndexError) as exc:
        raise RemoteProtocolError(f"a shard retained message does not decode: {exc}") \
            from None


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RemoteProtocolError(f"shard INTEREST field {key!r} must be an integer")
    return value
