"""The node's figures from its shards' answers: pure, so every rule is unit-tested.

Each shard answers ``/api/stat`` and ``/api/broker`` for itself; the node's endpoint
shows one broker. Counters are summed (a destination's figures over the shards that
have it: with routing, only its owner does), connections are counted on every shard,
the front shard's network and master/slave state stand for the node's, and a shard that
did not answer is listed as down in ``shards`` instead of failing the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ShardAnswer", "ShardRow", "node_broker", "node_stat", "shard_rows"]


@dataclass(frozen=True, slots=True)
class ShardAnswer:
    """One shard's JSON answer to a request, or why there is none."""

    shard: int
    body: Mapping[str, Any] | None = None
    error: str = ""

    @property
    def up(self) -> bool:
        return self.body is not None


@dataclass(frozen=True, slots=True)
class ShardRow:
    """What the supervisor knows of a shard process."""

    shard: int
    pid: int | None
    state: str  # starting, running, restarting, stopping, stopped
    restarts: int
    uptime_ms: int
    last_exit: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Numbers summed, tables merged the same way; anything else: the first seen."""
    for key, value in other.items():
        mine = into.get(key)
        if key not in into:
            into[key] = dict(value) if isinstance(value, Mapping) else value
        elif _number(mine) and _number(value):
            into[key] = mine + value
        elif isinstance(mine, dict) and isinstance(value, Mapping):
            _merge(mine, value)


def _percent(used: object, limit: object) -> float:
    if _number(used) and _number(limit) and limit:
        return round(100 * float(used) / float(limit), 1)  # type: ignore[arg-type]
    return 0.0


def _front(answers: Sequence[ShardAnswer]) -> ShardAnswer | None:
    """The front shard's answer (shard 0), else the first that answered."""
    up = [a for a in answers if a.up]
    return next((a for a in up if a.shard == 0), up[0] if up else None)


def _shard_list(answers: Sequence[ShardAnswer]) -> list[dict[str, Any]]:
    return [{"shard": a.shard, "state": "up" if a.up else "down",
             **({"error": a.error} if a.error and not a.up else {})}
            for a in sorted(answers, key=lambda a: a.shard)]


def _destinations(answers: Sequence[ShardAnswer]) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        assert answer.body is not None
        for dest in answer.body.get("destinations") or ():
            key = (str(dest.get("type", "")), str(dest.get("name", "")))
            if key in merged:
                _merge(merged[key], dest)
            else:
                merged[key] = dict(dest)
    return [merged[k] for k in sorted(merged)]


def node_stat(name: str, answers: Sequence[ShardAnswer]) -> dict[str, Any]:
    """``/api/stat`` for the node (what ``meshmq stat`` prints), plus ``shards``."""
    up = [a for a in answers if a.up]
    front = _front(answers)
    totals: dict[str, Any] = {}
    for answer in up:
        assert answer.body is not None
        _merge(totals, {k: v for k, v in answer.body.items()
                        if k not in ("destinations", "durable_subscriptions", "ha",
                                     "network", "build", "persistent_refused")})
    stat: dict[str, Any] = {
        **totals,
        "broker": name,
        "uptime_ms": max((int(a.body.get("uptime_ms", 0)) for a in up  # type: ignore[union-attr]
                          ), default=0),
        "connections": int(totals.get("connections", 0)),
        "destinations": _destinations(up),
        "durable_subscriptions": [
            {**sub, "shard": a.shard} for a in up
            for sub in (a.body or {}).get("durable_subscriptions") or ()],
        "persistent_refused": next(
            (a.body.get("persistent_refused") for a in up  # type: ignore[union-attr]
             if a.body.get("persistent_refused")), None),  # type: ignore[union-attr]
        "shards": _shard_list(answers),
    }
    memory = stat.setdefault("memory", {"used": 0, "limit": 0, "peak": 0})
    memory["percent"] = _percent(memory.get("used"), memory.get("limit"))
    if front is not None and front.body is not None:
        for key in ("ha", "network", "build"):
            if key in front.body:
                stat[key] = front.body[key]
    stat.setdefault("ha", {"mode": "none", "role": "standalone"})
    return stat


def node_broker(name: str, answers: Sequence[ShardAnswer], uptime_ms: int,
                started_at: str) -> dict[str, Any]:
    """``/api/broker`` for the node: the supervisor's name and uptime, usage summed,
    the limits as every shard has them (each shard applies them to itself)."""
    up = [a for a in answers if a.up]
    front = _front(answers)
    doc: dict[str, Any] = dict(front.body) if front is not None and front.body else {}
    for key in ("store", "memory"):
        total: dict[str, Any] = {}
        for answer in up:
            part = (answer.body or {}).get(key)
            if isinstance(part, Mapping):
                _merge(total, part)
        if total:
            total["percent"] = _percent(total.get("bytes"), total.get("limit_bytes"))
            doc[key] = total
    doc.update({
        "name": name,
        "uptime_ms": uptime_ms,
        "started_at": started_at,
        "connections": sum(int((a.body or {}).get("connections", 0)) for a in up),
        "destinations": sum(int((a.body or {}).get("destinations", 0)) for a in up),
        "shards": _shard_list(answers),
    })
    doc.setdefault("role", "standalone")
    return doc


def shard_rows(rows: Sequence[ShardRow], answers: Sequence[ShardAnswer]
               ) -> list[dict[str, Any]]:
    """``/api/shards``: each shard's process and, when it answered, its connections."""
    by_shard = {a.shard: a for a in answers}
    out = []
    for row in sorted(rows, key=lambda r: r.shard):
        answer = by_shard.get(row.shard)
        body = answer.body if answer is not None else None
        out.append({
            "shard": row.shard, "pid": row.pid, "state": row.state,
            "restarts": row.restarts, "uptime_ms": row.uptime_ms,
            "last_exit": row.last_exit,
            "connections": int(body.get("connections", 0)) if body else None,
            "answering": body is not None,
            "links": body.get("shard_links") if body else None,
            "handoffs": body.get("handoffs") if body else None,
            **row.extra,
        })
    return out
