"""The node's admin API as one broker's, from its shards' answers: pure, so every rule is
unit-tested without sockets (node/admin_routes.py asks the shards).

* Which shard a request goes to: a destination's owner (core/shards.py; a temporary
  destination's name says its shard), a connection's shard (the node's connection ids
  name it: ``s1-c3`` is shard 1's ``c3``, since every shard counts its own ``c1, c2,
  ...``), the front shard (0) for what belongs to no destination.
* Lists merged: every shard's destinations once, with the owner's figures and
  ``shard``; every shard's connections and subscriptions with ``shard`` and node-wide
  ids; ``shards`` says which shards answered (as ``/api/stat``'s).
* Jolokia: the Broker mbean's totals are the node's (summed; the memory and store
  percentages of the summed limits), its ``Queues`` and ``Topics`` every shard's;
  pattern reads, ``search`` and ``list`` merged; a destination mbean read or an
  operation on it goes to the owner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshmq.core import admin
from meshmq.core.destinations import Destination
from meshmq.core.shards import FRONT_SHARD, HASH_NAME, owner, temp_shard
from meshmq.errors import DestinationError

__all__ = [
    "Answer", "JolokiaPlan", "NodeFigures", "broker_mbean", "connection_shard",
    "destination_owner", "jolokia_error", "jolokia_merge", "jolokia_plan",
    "merge_connections", "merge_destinations", "merge_subscriptions", "node_connection_id",
    "owner_of", "queue_owner", "shard_states",
]

NO_ATTRIBUTE = "javax.management.AttributeNotFoundException"
UNAVAILABLE = "java.lang.IllegalStateException"


@dataclass(frozen=True, slots=True)
class Answer:
    """One shard's HTTP answer: ``status`` 0 and ``error`` when it gave none."""

    shard: int
    status: int = 0
    body: Any = None
    error: str = ""

    @property
    def up(self) -> bool:
        return self.status != 0


def shard_states(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """``shards`` of a merged answer: each shard up or down (why), as ``/api/stat``."""
    return [{"shard": a.shard, "state": "up" if a.up else "down",
             **({} if a.up else {"error": a.error})}
            for a in sorted(answers, key=lambda a: a.shard)]


# ------------------------------------------------------------------ owners
def owner_of(dest: Destination, count: int, node: str, placement: str = HASH_NAME) -> int:
    """The shard that keeps ``dest``: its name's shard for a temporary destination the
    node named (the admin API sees it as a plain queue or topic name), else the hash."""
    shard = temp_shard(dest.name, node)
    if shard is not None:
        return shard if shard < count else FRONT_SHARD
    return owner(dest, count, node=node, placement=placement)


def _owner(kind: str, name: str, count: int, node: str, placement: str) -> int | None:
    try:
        return owner_of(admin.destination(kind, name), count, node, placement)
    except (DestinationError, ValueError):
        return None  # a bad type or name: any shard refuses it as one broker does


def destination_owner(kind: str, name: str, count: int, node: str,
                      placement: str = HASH_NAME) -> int | None:
    """The owner of the destination an admin path names (None: not a valid one)."""
    return _owner(kind, name, count, node, placement)


def queue_owner(name: str, count: int, node: str, placement: str = HASH_NAME) -> int | None:
    return _owner("queue", name, count, node, placement)


# ------------------------------------------------------------------ destinations
def merge_destinations(answers: Sequence[Answer], count: int, node: str,
                       placement: str = HASH_NAME) -> list[dict[str, Any]]:
    """Every destination once, sorted as one broker sorts them: the owner's row (another
    shard's when the owner did not list it) with ``shard``, the shard whose figures these
    are. The owner counts the consumers of every shard (another shard's client reads
    through a relayed consumer on the owner) and, as producers, its own clients plus
    those of the other shards that send to it (each shard's ``producers_elsewhere``)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in sorted(answers, key=lambda a: a.shard):
        if answer.status != 200 or not isinstance(answer.body, Mapping):
            continue
        for row in answer.body.get("destinations") or ():
            if not isinstance(row, Mapping):
                continue
            kind, name = str(row.get("type", "")), str(row.get("name", ""))
            key = (kind, name)
            keeper = _owner(kind, name, count, node, placement)
            if key not in rows or answer.shard == keeper:
                rows[key] = {**row, "shard": answer.shard}
    for answer in answers:
        if answer.status != 200 or not isinstance(answer.body, Mapping):
            continue
        for elsewhere in answer.body.get("producers_elsewhere") or ():
            if not isinstance(elsewhere, Mapping):
                continue
            found = rows.get((str(elsewhere.get("type", "")), str(elsewhere.get("name", ""))))
            if found is not None:
                found["producers"] = int(found.get("producers", 0)) + int(
                    elsewhere.get("producers", 0))
    return [rows[k] for k in sorted(rows)]


# ------------------------------------------------------------------ connections
_NODE_ID = re.compile(r"s(\d{1,3})-(.+)")


def node_connection_id(shard: int, connection_id: str) -> str:
    """A shard's connection id as the node shows it: unique across the node."""
    return f"s{shard}-{connection_id}"


def connection_shard(node_id: str, count: int) -> tuple[int, str] | None:
    """(shard, the shard's own id) of a node connection id; None when it names none."""
    match = _NODE_ID.fullmatch(node_id)
    if match is None or int(match.group(1)) >= count:
        return None
    return int(match.group(1)), match.group(2)


def _rows(answers: Sequence[Answer], key: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for answer in sorted(answers, key=lambda a: a.shard):
        if answer.status == 200 and isinstance(answer.body, Mapping):
            out += [(answer.shard, dict(row)) for row in answer.body.get(key) or ()
                    if isinstance(row, Mapping)]
    return out


def merge_connections(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """Every shard's client connections, oldest first as on one broker, each with its
    node-wide ``id`` and its ``shard``."""
    rows = [{**row, "id": node_connection_id(shard, str(row.get("id"))), "shard": shard}
            for shard, row in _rows(answers, "connections")]
    return sorted(rows, key=lambda r: (str(r.get("connected_at") or ""), r["id"]))


def merge_subscriptions(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """Every shard's subscriptions (a durable one on the shard that keeps it: its
    topic's owner, a wildcard one on every shard), ``connection`` node-wide."""
    out = []
    for shard, row in _rows(answers, "subscriptions"):
        conn = row.get("connection")
        if conn is not None:
            row["connection"] = node_connection_id(shard, str(conn))
        out.append({**row, "shard": shard})
    return out


# ------------------------------------------------------------------ Jolokia
def parse_mbean(text: str) -> dict[str, str] | None:
    """An mbean name's key properties (``""``: the domain); None when malformed (the
    shard answers the error, as one broker words it)."""
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        return None
    props = {"": domain}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key or not value:
            return None
        props[key] = value
    return props


def _is_pattern(props: Mapping[str, str]) -> bool:
    return any("*" in v or "?" in v for v in props.values())


def _mbean_owner(props: Mapping[str, str], count: int, node: str,
                 placement: str) -> int | None:
    kind = props.get("destinationType", "").lower()
    name = props.get("destinationName")
    if name is None or kind not in ("queue", "topic"):
        return None
    return _owner(kind, name, count, node, placement)


# Broker operations that name a destination in their first argument.
_BROKER_DESTINATION_OPS = {"addQueue": "queue", "removeQueue": "queue",
                           "addTopic": "topic", "removeTopic": "topic"}


@dataclass(frozen=True, slots=True)
class JolokiaPlan:
    """Where one Jolokia request goes: ``shard`` (one shard answers as it would on one
    broker) or, with ``shard`` None, every shard and ``merge`` says how: ``broker`` (the
    Broker mbean), ``read`` (a pattern read), ``search`` or ``list``."""

    shard: int | None
    merge: str = ""


def jolokia_plan(request: Mapping[str, Any], count: int, node: str,
                 placement: str = HASH_NAME) -> JolokiaPlan:
    kind = request.get("type")
    mbean = request.get("mbean")
    props = parse_mbean(mbean) if isinstance(mbean, str) else None
    if kind in ("search", "list"):
        return JolokiaPlan(None, str(kind))
    if kind not in ("read", "exec") or props is None:
        return JolokiaPlan(FRONT_SHARD)  # version, or an error the front words
    keys = set(props) - {""}
    if kind == "read" and _is_pattern(props):
        return JolokiaPlan(None, "read")
    dest_owner = _mbean_owner(props, count, node, placement)
    if dest_owner is not None:
        return JolokiaPlan(dest_owner)
    if kind == "read" and keys == {"type", "brokerName"} and props["type"] == "Broker":
        return JolokiaPlan(None, "broker")
    if kind == "exec":
        op = str(request.get("operation") or "").split("(", 1)[0]
        args = request.get("arguments")
        if op in _BROKER_DESTINATION_OPS and isinstance(args, list) and args \
                and isinstance(args[0], str):
            target = _owner(_BROKER_DESTINATION_OPS[op], args[0], count, node, placement)
            if target is not None:
                return JolokiaPlan(target)
    return JolokiaPlan(FRONT_SHARD)


def jolokia_error(request: Mapping[str, Any], status: int, error_type: str,
                  message: str) -> dict[str, Any]:
    return {"request": dict(request), "error_type": error_type, "error": message,
            "status": status}


# Broker attributes that are the node's sums of its shards'.
_SUMMED = ("TotalEnqueueCount", "TotalDequeueCount", "TotalConsumerCount",
           "TotalProducerCount", "TotalMessageCount", "CurrentConnectionsCount",
           "TotalConnectionsCount", "MemoryLimit", "StoreLimit", "TempLimit")


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else 0.0


def _percent_of_sum(values: Sequence[Mapping[str, Any]], percent: str, limit: str) -> int:
    """A usage percentage of the summed limits: each shard's use is its percent of its
    limit; a node without limits shows its fullest shard."""
    total = sum(_num(v.get(limit)) for v in values)
    if total <= 0:
        return int(max((_num(v.get(percent)) for v in values), default=0))
    used = sum(_num(v.get(percent)) * _num(v.get(limit)) / 100 for v in values)
    return int(100 * used / total)


def _object_names(values: Sequence[Mapping[str, Any]], key: str) -> list[dict[str, str]]:
    names = {str(item.get("objectName")): dict(item) for v in values
             for item in v.get(key) or () if isinstance(item, Mapping)}
    return [names[n] for n in sorted(names)]


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """What the node's Broker mbean shows of the supervisor rather than of a shard."""

    uptime_ms: int
    uptime_text: str
    data_directory: str


def broker_mbean(values: Sequence[Mapping[str, Any]], node: NodeFigures) -> dict[str, Any]:
    """The node's Broker mbean from every answering shard's (the front shard's first):
    counters and limits summed, the supervisor's uptime and data directory, every
    shard's queues and topics."""
    if not values:
        return {}
    merged: dict[str, Any] = dict(values[0])
    for key in _SUMMED:
        if key in merged:
            total = sum(_num(v.get(key)) for v in values)
            merged[key] = int(total)
    merged["MemoryPercentUsage"] = _percent_of_sum(values, "MemoryPercentUsage",
                                                   "MemoryLimit")
    merged["StorePercentUsage"] = _percent_of_sum(values, "StorePercentUsage", "StoreLimit")
    merged["UptimeMillis"] = node.uptime_ms
    merged["Uptime"] = node.uptime_text
    merged["DataDirectory"] = node.data_directory
    merged["Queues"] = _object_names(values, "Queues")
    merged["Topics"] = _object_names(values, "Topics")
    return merged


def _wanted(request: Mapping[str, Any]) -> list[str] | None:
    attr = request.get("attribute")
    if not attr:
        return None
    if isinstance(attr, str):
        return attr.split(",")
    return [str(a) for a in attr] if isinstance(attr, list) else None


def _select(attrs: Mapping[str, Any], wanted: list[str] | None, mbean: str) -> dict[str, Any]:
    if wanted is None:
        return dict(attrs)
    missing = [a for a in wanted if a not in attrs]
    if missing:
        raise LookupError(f"{NO_ATTRIBUTE} : No such attribute: {missing[0]} (mbean "
                          f"{mbean}; docs/operations.md lists the supported attributes)")
    return {a: attrs[a] for a in wanted}


def _is_broker_name(name: str) -> bool:
    props = parse_mbean(name)
    return props is not None and set(props) - {""} == {"type", "brokerName"}


def jolokia_merge(request: Mapping[str, Any], plan: JolokiaPlan, answers: Sequence[Answer],
                  *, count: int, node: str, figures: NodeFigures, timestamp: int,
                  placement: str = HASH_NAME) -> dict[str, Any]:
    """One Jolokia answer from every shard's answer to ``request`` (asked of them without
    ``attribute`` for reads, so the node can sum before it selects)."""
    up = [a for a in answers if a.up]
    found = [a for a in up if isinstance(a.body, Mapping) and a.body.get("status") == 200]
    states = shard_states(answers)
    if not found:
        failed = next((a.body for a in sorted(up, key=lambda a: a.shard)
                       if isinstance(a.body, Mapping)), None)
        if failed is not None:
            return {**failed, "request": dict(request), "shards": states}
        return {**jolokia_error(request, 503, UNAVAILABLE,
                                f"{UNAVAILABLE} : no shard of the node is answering"),
                "shards": states}
    found.sort(key=lambda a: a.shard)
    value: Any
    try:
        if plan.merge == "broker":
            attrs = broker_mbean([a.body["value"] for a in found], figures)
            wanted = _wanted(request)
            selected = _select(attrs, wanted, str(request.get("mbean")))
            value = selected[wanted[0]] if wanted is not None and len(wanted) == 1 \
                and isinstance(request.get("attribute"), str) else selected
        elif plan.merge == "read":
            value = _pattern_value(request, found, count, node, placement, figures)
        elif plan.merge == "search":
            value = sorted({str(n) for a in found for n in a.body.get("value") or ()})
        else:  # list: the first shard's tree, completed by the others'
            value = {}
            for a in found:
                _fill(value, a.body.get("value") or {})
    except LookupError as exc:
        return {**jolokia_error(request, 404, NO_ATTRIBUTE, str(exc.args[0])),
                "shards": states}
    return {"request": dict(request), "value": value, "timestamp": timestamp,
            "status": 200, "shards": states}


def _pattern_value(request: Mapping[str, Any], found: Sequence[Answer], count: int,
                   node: str, placement: str, figures: NodeFigures) -> dict[str, Any]:
    brokers: dict[str, list[Mapping[str, Any]]] = {}
    others: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for a in found:
        for name, attrs in (a.body.get("value") or {}).items():
            if not isinstance(attrs, Mapping):
                continue
            if _is_broker_name(name):
                brokers.setdefault(name, []).append(attrs)
                continue
            props = parse_mbean(name) or {}
            keeper = _mbean_owner(props, count, node, placement)
            if name not in others or a.shard == keeper:
                others[name] = (a.shard, attrs)
    wanted = _wanted(request)
    value = {name: _select(broker_mbean(parts, figures), wanted, name)
             for name, parts in brokers.items()}
    value.update({name: _select(attrs, wanted, name)
                  for name, (_, attrs) in sorted(others.items())})
    return value


def _fill(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, item in other.items():
        mine = into.get(key)
        if key not in into:
            into[key] = dict(item) if isinstance(item, Mapping) else item
        elif isinstance(mine, dict) and isinstance(item, Mapping):
            _fill(mine, item)
