"""The receiving half of a link: advertise this broker's consumers to the remote
broker, take the messages it forwards, and settle them once they are stored here.

Only interest the link's user may act on goes out: under an authorization map, a
destination it may not write here is not advertised, so the remote never forwards what
this broker would refuse (docs/security.md). A message that arrives anyway (a wildcard
demand covering destinations it may not write) is REFUSED, and stays on the remote.

Push-back travels back over the link too, to a forwarder that listed the ``holds``
feature: after each batch the runtime's ``LinkHolds`` looks at the destinations it
went to, and while one is slow here (its consumers cannot take more and the bound
waits; transport/push_back.py) this half sends an INTEREST ``hold`` for it, then
``release``. The forwarder stops feeding that destination's demand meanwhile, so what
waits for a slow consumer here waits on the forwarding broker, whose producers are
held in turn, hop by hop.

Interest goes out as explicit INTEREST frames — a full ``sync`` first, then ``update``s
as consumers come and go, and a full ``sync`` again every ``interest_resync_ms`` so an
update lost to a bug or a race heals by itself (anti-entropy) instead of leaving a
bridge that silently forwards nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from meshmq.core.auth import Principal
from meshmq.core.authorization import Right
from meshmq.core.dedup import network_key
from meshmq.errors import AuthorizationError, DestinationError, MeshmqError, ResourceLimitError
from meshmq.network.interest import DestinationFilter, InterestItem, local_interest
from meshmq.network.node_interest import interest_of
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import AckStatus, FrameType, encode_acks, encode_json

try:  # mypyc reads the decorator when compiling; running needs no mypy_extensions
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - installed wherever mypy is
    def mypyc_attr(*_names: str, **_attrs: object) -> Callable[[type], type]:  # type: ignore[misc]
        return lambda cls: cls

if TYPE_CHECKING:
    from meshmq.core.broker import ConsumerEvent
    from meshmq.core.destinations import Destination
    from meshmq.core.message import Message
    from meshmq.network.link import WireLink
    from meshmq.network.services import ReceiverServices

log = logging.getLogger("meshmq.network")

_STORED: Final = AckStatus.STORED
_DUPLICATE: Final = AckStatus.DUPLICATE
_DROPPED: Final = AckStatus.DROPPED


# Compiled with mypyc (pyproject's compile list); network/shards.py's ShardReceiver, an
# interpreted subclass, overrides methods and sets ``protocol`` and ``waits_for_owners``
# on the instance in its __init__.
@mypyc_attr(allow_interpreted_subclasses=True)
class Receiver:
    # Whether a STORED also waits for what this broker sent on to other shards of its
    # node (transport/durability.py); a shard link's receiver waits for its own store.
    waits_for_owners = True
    # The core connection's protocol: a broker link, neither counted nor listed as a client.
    protocol = "network"

    def __init__(self, services: ReceiverServices, link: WireLink, remote: str,
                 flt: DestinationFilter, counters: LinkCounters, *, resync_s: float,
                 refusals: bool = False, ack_ranges: bool = False,
                 hold_notes: bool = False, principal: Principal | None = None) -> None:
        self.services = services
        self.host = services.host
        self.broker = services.host.broker
        self.link = link
        self.remote = remote
        self.filter = flt
        self.counters = counters
        self.resync_s = resync_s
        # The sender understands REFUSED (FEATURE_REFUSALS); else it gets RETRY.
        self.refusals = refusals
        # The sender takes ACK_RANGES (FEATURE_ACK_RANGES): a batch is settled in a
        # record per run of sequence numbers, not one per message.
        self.ack_ranges = ack_ranges
        # The sender takes hold notes (FEATURE_HOLDS), and the host carries push-back.
        self.holds = services.host.link_holds if hold_notes else None
        # The accepting side passes who authenticated the link; the dialing side acts
        # for its own connector.
        if principal is None:
            principal = Principal(f"network:{remote}", frozenset({"network"}), internal=True)
        self.conn = self.broker.open_connection(principal, remote=link.peer,
                                                protocol=self.protocol)
        self.advertised: dict[str, InterestItem] = {}
        self._update_scheduled = False
        self._resync: asyncio.TimerHandle | None = None
        self.closed = False
        self.broker.add_listener(self._on_consumer_event)
        # The front shard of a node: the other shards' consumers are advertised too.
        self.node = interest_of(self.broker) if self.protocol == "network" else None
        if self.node is not None:
            self.node.listeners.append(self._on_node_interest)

    def start(self) -> None:
        self._send_sync()

    # ------------------------------------------------------------ interest out
    def _send_sync(self) -> None:
        if self.closed:
            return
        self.advertised = self._interest()
        self.link.write(encode_json(FrameType.INTEREST, {
            "op": "sync", "items": [i.to_json() for i in self.advertised.values()]}))
        if self.resync_s > 0:
            self._resync = asyncio.get_running_loop().call_later(self.resync_s,
                                                                 self._send_sync)

    def _interest(self) -> dict[str, InterestItem]:
        items = local_interest(self.broker, self.remote, self.filter)
        if self.node is not None:
            items.update(self.node.interest_for(self.remote, self.filter))
        if self.broker.authz is None or self.conn.principal.internal:
            return items
        may, principal = self.broker.may, self.conn.principal
        return {k: i for k, i in items.items() if may(principal, Right.WRITE, i.destination)}

    def _on_node_interest(self) -> None:
        """Another shard's consumers changed (the front shard of a node)."""
        if not self._update_scheduled and not self.closed:
            self._update_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_update)

    def _on_consumer_event(self, event: ConsumerEvent) -> None:
        if not self._update_scheduled and not self.closed:
            # Coalesce: many consumers may come and go in one loop turn.
            self._update_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_update)

    def _send_update(self) -> None:
        self._update_scheduled = False
        if self.closed:
            return
        now = self._interest()
        added = [i.to_json() for k, i in now.items() if self.advertised.get(k) != i]
        removed = [k for k in self.advertised if k not in now]
        self.advertised = now
        if added or removed:
            self.link.write(encode_json(FrameType.INTEREST, {
                "op": "update", "add": added, "remove": removed}))

    # ------------------------------------------------------------ messages in
    def on_messages(self, batch: list[tuple[int, Message]], *, again: bool = False) -> None:
        """``again``: the sender may have delivered these before (MESSAGES_AGAIN); those
        not found in the duplicate window are stored flagged redelivered."""
        # ``_accept`` inlined for the usual message (new, routed without a refusal):
        # per message, only the loop check, the duplicate window and the core's send.
        # Methods are called through their objects, not bound to locals: compiled, a
        # call through the object is a direct C call, a bound method a generic one.
        broker = self.broker
        local = broker.name
        dedup = broker.dedup
        # Arrival times first, one call for the batch: routing may hand a message to a
        # bridge's consumer at once, and ``may_return`` reads its arrival time (a
        # duplicate's counts too, which only delays its return).
        self.services.arrived([msg.message_id for _, msg in batch])
        conn = self.conn
        dests: dict[Destination, tuple[Destination, ...]] = {}
        now_acks: list[tuple[int, AckStatus]] = []
        after_sync: list[tuple[int, AckStatus]] = []
        for seq, msg in batch:
            dest = msg.destination
            if dest.is_topic and local in msg.broker_path:
                now_acks.append((seq, _DROPPED))  # a topic message looping back
                continue
            key = network_key(msg)
            if dedup.check_and_add(key):
                self.counters.received_duplicates += 1
                (after_sync if msg.persistent else now_acks).append((seq, _DUPLICATE))
                continue
            targets = dests.get(dest)
            if targets is None:
                targets = dests[dest] = (dest,)
            try:
                needs_sync = broker.send(conn, targets, msg, redelivered=again)
            except MeshmqError as exc:
                now_acks.append((seq, self._not_taken(msg, key, exc)))
                continue
            if broker.tracer is not None:  # the message trace (core/trace.py), if on
                broker.trace_received_from_bridge(msg, from_broker=self.remote,
                                                  connector=self.link.peer)
            (after_sync if needs_sync else now_acks).append((seq, _STORED))
        self._answer(len(batch), now_acks, after_sync)
        if self.holds is not None and dests:
            self.holds.routed(self, dests)

    def note_hold(self, dest: Destination, held: bool) -> None:
        """Ask the forwarder to stop (``held``) or resume forwarding ``dest``: its
        consumers here cannot take more (``LinkHolds``)."""
        if self.closed:
            return
        if held:
            self.counters.holds_sent += 1
        log.debug("network link to %s: %s %s", self.remote,
                  "hold" if held else "release", dest)
        self.link.write(encode_json(FrameType.INTEREST, {
            "op": "hold" if held else "release", "dest": str(dest)}))

    def _answer(self, received: int, now_acks: list[tuple[int, AckStatus]],
                after_sync: list[tuple[int, AckStatus]]) -> None:
        """ACK a batch: ``now_acks`` at once, ``after_sync`` once the store synced."""
        self.counters.received += received  # (rates per batch: one clock read)
        self.counters.receive_rate.add(received)
        self.host.trace_barrier()  # trace.exact: arrivals traced before they are acked
        ranges = self.ack_ranges
        if now_acks:
            self.link.write(encode_acks(now_acks, as_ranges=ranges))
        if after_sync:
            # ACKs name their sequence numbers, so they need no order. Not durable: no
            # ACK, the link is aborted; the sender redelivers after the link drops, and
            # the duplicate window absorbs repeats.
            link = self.link
            self.host.durability.when_durable(
                lambda: link.write(encode_acks(after_sync, as_ranges=ranges)), link.abort,
                who=f"bridge link {link.peer}", owners=self.waits_for_owners)
        self.host.request_pump()

    def _accept(self, msg: Message, again: bool = False) -> tuple[AckStatus, bool]:
        """One message (``on_messages`` does the same for each of a batch)."""
        local = self.broker.name
        dest = msg.destination
        if dest.is_topic and local in msg.broker_path:
            return AckStatus.DROPPED, False  # a topic message looping back
        key = network_key(msg)
        dedup = self.broker.dedup
        if dedup.check_and_add(key):
            self.counters.received_duplicates += 1
            return AckStatus.DUPLICATE, msg.persistent
        self.services.arrived([msg.message_id])
        try:
            needs_sync = self.broker.send(self.conn, (dest,), msg, redelivered=again)
        except MeshmqError as exc:
            return self._not_taken(msg, key, exc), False
        if self.broker.tracer is not None:  # the message trace (core/trace.py), if on
            self.broker.trace_received_from_bridge(msg, from_broker=self.remote,
                                                   connector=self.link.peer)
        return AckStatus.STORED, needs_sync

    def _not_taken(self, msg: Message, key: str, exc: MeshmqError) -> AckStatus:
        """The answer for a message the core refused with ``exc`` (it is not stored, so
        it leaves the duplicate window again where it may come back)."""
        dest = msg.destination
        if isinstance(exc, ResourceLimitError):
            self.broker.dedup.forget(key)
            return AckStatus.RETRY
        if isinstance(exc, AuthorizationError):
            self.broker.dedup.forget(key)
            if dest.is_broker_owned:
                # The remote's statistics or advisories: each broker writes its own.
                return AckStatus.DROPPED
            # The link's user may not send it here (logged and counted by the core):
            # it stays on the remote, for its own consumers.
            return AckStatus.REFUSED if self.refusals else AckStatus.RETRY
        if isinstance(exc, DestinationError):
            log.info("network message %s for %s dropped: %s", msg.message_id, dest, exc)
            return AckStatus.DROPPED
        log.warning("network message %s for %s refused: %s", msg.message_id, dest, exc)
        return AckStatus.DROPPED

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._resync is not None:
            self._resync.cancel()
        if self.holds is not None:
            self.holds.link_lost(self)
        self.broker.remove_listener(self._on_consumer_event)
        if self.node is not None and self._on_node_interest in self.node.listeners:
            self.node.listeners.remove(self._on_node_interest)
        self.broker.close_connection(self.conn)
        self.host.request_pump()
