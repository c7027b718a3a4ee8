"""A node's interest for its network links: the consumers of every shard, advertised by
the front shard (shard 0), which alone holds the node's bridges (docs/design.md,
"Shards", Networks).

The front shard's bridges advertise what its core knows: its own clients' consumers,
and the consumers other shards' clients opened on destinations it owns (relayed, so run
here). A consumer another shard runs for a destination it owns itself (its clients', or
relayed from a third shard), and that shard's durable subscriptions, are unknown here;
without them a remote broker would never forward to the node what they wait for.

So each other shard tells the front what it runs (``front-interest``, an INTEREST op on
the shard link, a full list each time it changes, coalesced per loop turn), and the
front's receivers add those items to their own interest (``interest_for``). What a
remote broker then forwards arrives on the front shard and is routed to its owner as
any send. Left out on the sending shard: the consumers it only relays (stand-ins of a
subscription served by another shard, which reports it) and network demand (relayed
from the front's bridges: advertising it back would make a loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshmq.core.network_view import durable_interest
from meshmq.core.shard_relay import RelayQueue
from meshmq.errors import RemoteProtocolError
from meshmq.network.interest import DestinationFilter, InterestItem

if TYPE_CHECKING:
    from meshmq.core.broker import Broker, ConsumerEvent

__all__ = ["NodeInterest", "interest_of", "shard_items"]

# By ``id`` of the core, with the core itself (a compiled ``Broker`` takes no weak
# reference): an entry lives from ``start`` to ``stop``.
_BY_BROKER: dict[int, tuple[Broker, NodeInterest]] = {}


def interest_of(broker: Broker) -> NodeInterest | None:
    """The node's interest kept by the front shard whose core is ``broker`` (None: not a
    front shard of a node)."""
    entry = _BY_BROKER.get(id(broker))
    return entry[1] if entry is not None and entry[0] is broker else None


def shard_items(broker: Broker, shard: int) -> list[InterestItem]:
    """What shard ``shard`` (not the front) runs that the front's bridges must
    advertise: its consumers served here (not relay stand-ins, not network demand) and
    its offline durable subscriptions."""
    items: list[InterestItem] = []
    open_durables: set[tuple[str, str]] = set()
    for conn in broker.connections.values():
        for consumer in conn.consumers.values():
            spec = consumer.spec
            if consumer.closed or spec.browser or spec.network_path is not None:
                continue
            if consumer.sources and all(isinstance(s, RelayQueue) for s in consumer.sources):
                continue  # served by another shard, which tells the front itself
            durable = None
            if spec.subscription_name is not None and conn.client_id is not None:
                durable = (conn.client_id, spec.subscription_name)
                open_durables.add(durable)
            for dest in spec.destinations:
                item_id = f"s{shard}:{consumer.id}|{dest}"
                items.append(InterestItem(item_id, dest, spec.selector, (),
                                          durable is not None and dest.is_topic,
                                          (f"{broker.name}/s{shard}:{consumer.id}",)))
    for d in durable_interest(broker, skip=open_durables):
        for dest in d.patterns:
            key = f"s{shard}:durable:{d.client_id}:{d.subscription_name}"
            items.append(InterestItem(f"{key}|{dest}", dest, d.selector, (), True,
                                      (f"{broker.name}/{key}",)))
    return items


class NodeInterest:
    """One shard's side of the node's interest. On a shard other than the front: sends
    its items to the front (``send`` is given the INTEREST body) when they change and
    when the link to the front comes up. On the front: keeps each shard's items and
    tells its receivers (``listeners``) when they change."""

    def __init__(self, broker: Broker, index: int, *, front: bool,
                 send: Callable[[dict[str, Any]], None]) -> None:
        self.broker = broker
        self.index = index
        self.front = front
        self._send = send
        self._scheduled = False
        self._sent: list[dict[str, Any]] | None = None
        self.items: dict[int, dict[str, InterestItem]] = {}  # the front: by shard
        self.listeners: list[Callable[[], None]] = []

    def start(self) -> None:
        if self.front:
            _BY_BROKER[id(self.broker)] = (self.broker, self)
        else:
            self.broker.add_listener(self._on_consumer_event)

    def stop(self) -> None:
        if self.front:
            if interest_of(self.broker) is self:
                del _BY_BROKER[id(self.broker)]
        else:
            self.broker.remove_listener(self._on_consumer_event)

    # ------------------------------------------------------------ another shard
    def _on_consumer_event(self, event: ConsumerEvent) -> None:
        if not self._scheduled:
            self._scheduled = True  # many consumers may come and go in one loop turn
            asyncio.get_running_loop().call_soon(self._update)

    def _update(self) -> None:
        self._scheduled = False
        items = [i.to_json() for i in shard_items(self.broker, self.index)]
        if items != self._sent:
            self._sent = items
            self._send({"op": "front-interest", "items": items})

    def front_linked(self) -> None:
        """The link to the front is (again) up: it knows nothing of this shard yet."""
        self._sent = None
        self._update()

    # ------------------------------------------------------------ the front
    def received(self, shard: int, body: dict[str, Any]) -> None:
        raw = body.get("items")
        if not isinstance(raw, list):
            raise RemoteProtocolError("shard INTEREST front-interest needs 'items'")
        items = {item.id: item for item in map(InterestItem.from_json, raw)}
        if items != self.items.get(shard):
            self.items[shard] = items
            self._changed()

    def shard_lost(self, shard: int) -> None:
        if self.items.pop(shard, None):
            self._changed()

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener()

    def interest_for(self, peer: str, flt: DestinationFilter) -> dict[str, InterestItem]:
        """The other shards' items a bridge to ``peer`` advertises under ``flt``."""
        return {key: item for items in self.items.values() for key, item in items.items()
                if peer not in item.path and flt.permits(item.destination)}
