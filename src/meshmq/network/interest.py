"""Interest: which consumers a broker has, as its bridges advertise them, and the
demand subscriptions a forwarding broker derives from them. Pure logic, no I/O.

A broker's *interest* is one item per (consumer, destination): composite consumers
are split, browsers never count. Items carry the brokers the interest already crossed
(``path``, nearest last), so the broker receiving them can apply ``consumerTTL`` and
never route a consumer's interest back through a broker it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshmq.core.destinations import Destination, matches
from meshmq.core.network_view import consumer_interest, durable_interest
from meshmq.errors import RemoteProtocolError

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.core.broker import Broker


@dataclass(frozen=True, slots=True)
class InterestItem:
    id: str  # unique at the advertising broker
    destination: Destination
    selector: str | None = None
    path: tuple[str, ...] = ()  # brokers this interest crossed before the advertiser
    durable: bool = False  # a durable topic subscriber (possibly offline)
    # "<broker>/<consumer id>" of the real consumer(s) behind it (duplicate-route
    # suppression recognises one consumer heard through several bridges).
    origins: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "dest": str(self.destination), "selector": self.selector,
                "path": list(self.path), "durable": self.durable, "origins": list(self.origins)}

    @staticmethod
    def from_json(data: object) -> InterestItem:
        if not isinstance(data, dict):
            raise RemoteProtocolError("interest item must be an object")
        try:
            dest = Destination.parse_uri(str(data["dest"]))
            path = tuple(str(p) for p in data.get("path") or ())
            selector = data.get("selector")
            return InterestItem(id=str(data["id"]), destination=dest,
                                selector=None if selector is None else str(selector),
                                path=path, durable=bool(data.get("durable", False)),
                                origins=tuple(str(o) for o in data.get("origins") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteProtocolError(f"bad interest item {data!r}: {exc}") from None
        except Exception as exc:  # destination parse errors
            raise RemoteProtocolError(f"bad interest item {data!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class DestinationFilter:
    """excludedDestinations / dynamicallyIncludedDestinations / bridgeTempDestinations."""

    excluded: tuple[Destination, ...] = ()
    dynamically_included: tuple[Destination, ...] = ()
    bridge_temp: bool = True
    # dynamicOnly: offline durable subscribers create no demand.
    dynamic_only: bool = False

    @staticmethod
    def of(config: NetworkConnectorConfig) -> DestinationFilter:
        return DestinationFilter(
            excluded=tuple(Destination.parse_uri(u) for u in config.excluded_destinations),
            dynamically_included=tuple(Destination.parse_uri(u)
                                       for u in config.dynamically_included_destinations),
            bridge_temp=config.bridge_temp_destinations, dynamic_only=config.dynamic_only)

    def permits(self, dest: Destination) -> bool:
        if dest.is_advisory:
            return False
        if dest.is_temporary:
            return self.bridge_temp
        if any(_covers(p, dest) for p in self.excluded):
            return False  # checked first, as ActiveMQ does
        if self.dynamically_included:
            return any(_covers(p, dest) for p in self.dynamically_included)
        return True

    def to_json(self) -> dict[str, Any]:
        return {"excluded": [str(d) for d in self.excluded],
                "included": [str(d) for d in self.dynamically_included],
                "temp": self.bridge_temp, "dynamic_only": self.dynamic_only}

    @staticmethod
    def from_json(data: object) -> DestinationFilter:
        if not isinstance(data, dict):
            raise RemoteProtocolError("interest filter must be an object")
        try:
            return DestinationFilter(
                excluded=tuple(Destination.parse_uri(str(u)) for u in data.get("excluded", ())),
                dynamically_included=tuple(Destination.parse_uri(str(u))
                                           for u in data.get("included", ())),
                bridge_temp=bool(data.get("temp", True)),
                dynamic_only=bool(data.get("dynamic_only", False)))
        except Exception as exc:
            raise RemoteProtocolError(f"bad interest filter: {exc}") from None


def _covers(pattern: Destination, dest: Destination) -> bool:
    """Does ``pattern`` cover ``dest``? (Also true for a wildcard consumer, e.g.
    ``foo.>``, named exactly by the pattern.)"""
    return matches(pattern, dest) or (pattern.kind.is_queue == dest.kind.is_queue
                                       and pattern.name == dest.name)


def local_interest(broker: Broker, peer: str, flt: DestinationFilter) -> dict[str, InterestItem]:
    """Everything ``broker`` would advertise to ``peer`` under ``flt``: its consumers
    (local ones and other bridges' demand subscriptions), and offline durable
    subscribers (their messages must keep flowing to this broker)."""
    items: dict[str, InterestItem] = {}
    active_durables: set[tuple[str, str]] = set()
    for c in consumer_interest(broker):
        path = c.network_path or ()
        if peer in path:
            continue  # the peer's own interest, coming back: never
        if c.durable_key is not None:
            active_durables.add(c.durable_key)
        for dest in c.destinations:
            if not flt.permits(dest):
                continue
            item_id = f"{c.consumer_id}|{dest}"
            origins = (f"{broker.name}/{c.consumer_id}",) if c.network_path is None \
                else c.network_origins
            items[item_id] = InterestItem(item_id, dest, c.selector, path,
                                          c.durable_key is not None and dest.is_topic, origins)
    if flt.dynamic_only:
        return items
    for d in durable_interest(broker, skip=active_durables):
        for dest in d.patterns:
            if not flt.permits(dest):
                continue
            item_id = f"durable:{d.client_id}:{d.subscription_name}|{dest}"
            items[item_id] = InterestItem(item_id, dest, d.selector, (), True,
                                          (f"{broker.name}/durable:{d.client_id}:"
                                           f"{d.subscription_name}",))
    return items


@dataclass(frozen=True, slots=True)
class Demand:
    """One demand subscription the forwarding broker keeps for a remote broker."""

    key: str
    destination: Destination
    selector: str | None
    priority: int
    path: tuple[str, ...]  # the interest's path plus the remote broker (network_path)
    durable_name: str | None  # stable name of a network durable subscription
    origins: frozenset[str] = frozenset()  # the real consumers behind it

    def same_subscription(self, other: Demand) -> bool:
        """Whether ``other`` needs no new subscription (only who is behind it changed:
        re-subscribing would bounce the messages in flight)."""
        return (self.destination, self.selector, self.priority, self.path,
                self.durable_name) == (other.destination, other.selector, other.priority,
                                       other.path, other.durable_name)


def plan_demand(items: dict[str, InterestItem], config: NetworkConnectorConfig, *,
                local: str, remote: str, static: tuple[Destination, ...] = ()
                ) -> dict[str, Demand]:
    """The demand subscriptions a bridge should hold for ``remote``'s interest.

    Topics are always merged per destination (one copy per message crosses the bridge,
    whatever the number of subscribers; their selectors are OR-ed). Queues are merged
    per destination with ``conduit_subscriptions`` (selectors dropped, as ActiveMQ
    does), or get one demand per remote consumer (selectors kept) without it.
    """
    consumer_ttl = config.network_ttl if config.consumer_ttl is None else config.consumer_ttl
    base = config.consumer_priority_base
    groups: dict[str, list[InterestItem]] = {}
    for item in items.values():
        if local in item.path or remote in item.path:
            continue  # a loop
        if consumer_ttl >= 0 and len(item.path) >= consumer_ttl:
            continue  # consumerTTL: interest may cross this many brokers
        dest = item.destination
        # One demand per topic (durable if any subscriber behind it is), so one copy
        # of each message crosses the bridge; per consumer for queues without conduit.
        key = str(dest) if dest.is_topic or config.conduit_subscriptions \
            else f"{dest}|{item.id}"
        groups.setdefault(key, []).append(item)
    plan: dict[str, Demand] = {}
    for key, group in groups.items():
        first = group[0]
        dest = first.destination
        hops = min(len(i.path) for i in group)
        priority = base - hops if config.decrease_network_consumer_priority else 0
        if dest.is_topic:
            selector = _or_selectors([i.selector for i in group])
        elif config.conduit_subscriptions:
            selector = None
        else:
            selector = first.selector
        durable_name = None
        if dest.is_topic and any(i.durable for i in group):
            durable_name = f"NC-DS_{remote}_{dest.name}"
        shortest = min(group, key=lambda i: len(i.path))
        plan[key] = Demand(key, dest, selector, priority, (*shortest.path, remote),
                           durable_name, frozenset(o for i in group for o in i.origins))
    for dest in static:
        key = f"{dest}|static"
        if key not in plan:
            priority = base if config.decrease_network_consumer_priority else 0
            plan[key] = Demand(key, dest, None, priority, (remote,), None)
    return plan


def _or_selectors(selectors: list[str | None]) -> str | None:
    if any(s is None for s in selectors):
        return None
    unique = sorted({s for s in selectors if s is not None})
    if len(unique) == 1:
        return unique[0]
    return " OR ".join(f"({s})" for s in unique)

