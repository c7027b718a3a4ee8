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

__all__ = ["TOTALLED", "CpuMeter", "ShardAnswer", "ShardRow", "node_broker", "node_ha",
           "node_stat", "shard_rows", "shard_totals"]


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


def _key(dest: Mapping[str, Any]) -> tuple[str, str]:
    return str(dest.get("type", "")), str(dest.get("name", ""))


def _destinations(answers: Sequence[ShardAnswer]) -> list[dict[str, Any]]:
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        assert answer.body is not None
        for dest in answer.body.get("destinations") or ():
            key = _key(dest)
            if key in merged:
                _merge(merged[key], dest)
            else:
                merged[key] = dict(dest)
    # A client's sends to a destination another shard owns reach the owner over a
    # shard link, which is no producer: its own shard counts it, and it is added here.
    for answer in answers:
        assert answer.body is not None
        for elsewhere in answer.body.get("producers_elsewhere") or ():
            row = merged.get(_key(elsewhere))
            if row is not None:
                row["producers"] = int(row.get("producers", 0)) + int(
                    elsewhere.get("producers", 0))
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
                                     "network", "build", "persistent_refused",
                                     "producers_elsewhere")})
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


def node_ha(ha: Mapping[str, Any], answers: Sequence[ShardAnswer]) -> dict[str, Any]:
    """The supervisor's high-availability status with each shard's replication as the
    shard reports it now. A replicated node's supervisor learns its shards' log
    positions only when it holds an election; each shard streams its own log and knows
    where it stands, so ``shards`` is taken from their answers (the supervisor's last
    view for a shard that did not answer, marked ``"up": false``)."""
    known = ha.get("shards")
    if not isinstance(known, list):
        return dict(ha)
    shards: list[dict[str, Any]] = []
    for answer in answers:
        own = answer.body.get("ha") if answer.body is not None else None
        if isinstance(own, Mapping) and own.get("mode") == "replicated":
            shards.append({"up": True, "role": own.get("role"), "term": own.get("term"),
                           "leader": own.get("leader"), "last": own.get("last"),
                           "durable": own.get("durable"), "commit": own.get("commit")})
        else:
            earlier = known[answer.shard] if answer.shard < len(known) else {}
            shards.append({**earlier, "up": False})
    return {**ha, "shards": shards}


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


class CpuMeter:
    """Each shard process's CPU seconds (user and system), sampled by the node every
    second or so: the latest reading and the share of one core it used between the
    last two readings. A new pid (a restarted shard) starts afresh."""

    def __init__(self) -> None:
        # shard -> (pid, (time, seconds) before, (time, seconds) latest)
        self._seen: dict[int, tuple[int, tuple[float, float] | None,
                                    tuple[float, float]]] = {}

    def sample(self, shard: int, pid: int, now: float, seconds: float) -> None:
        seen = self._seen.get(shard)
        before = seen[2] if seen is not None and seen[0] == pid else None
        self._seen[shard] = (pid, before, (now, seconds))

    def forget(self, shard: int) -> None:
        self._seen.pop(shard, None)

    def figures(self, shard: int, pid: int | None) -> tuple[float | None, float | None]:
        """(CPU seconds, percent of one core over the last interval); None where not
        known yet."""
        seen = self._seen.get(shard)
        if seen is None or pid is None or seen[0] != pid:
            return None, None
        _, before, (now, seconds) = seen
        if before is None or now <= before[0]:
            return round(seconds, 2), None
        percent = 100 * max(0.0, seconds - before[1]) / (now - before[0])
        return round(seconds, 2), round(percent, 1)


def _owned(answer: ShardAnswer | None) -> dict[str, Any]:
    """A shard's own destinations (``/api/destinations``: only their owner lists them):
    how many, messages in and out, and their rates summed (each the destination's
    own, over the broker's rate window)."""
    body = answer.body if answer is not None else None
    if body is None:
        return dict.fromkeys(("destinations", "messages_in", "messages_out", "in_rate",
                              "out_rate"))
    dests = body.get("destinations") or ()
    return {"destinations": len(dests),
            "messages_in": sum(int(d.get("enqueued", 0)) for d in dests),
            "messages_out": sum(int(d.get("dequeued", 0)) for d in dests),
            "in_rate": round(sum(float(d.get("enqueue_rate", 0)) for d in dests), 2),
            "out_rate": round(sum(float(d.get("dequeue_rate", 0)) for d in dests), 2)}


def shard_rows(rows: Sequence[ShardRow], answers: Sequence[ShardAnswer],
               destinations: Sequence[ShardAnswer] = (), cpu: CpuMeter | None = None
               ) -> list[dict[str, Any]]:
    """``/api/shards``: each shard's process and, when it answered, its connections,
    links, journal size (``answers``: ``/api/broker``) and owned destinations
    (``destinations``: ``/api/destinations``); its CPU from ``cpu``."""
    by_shard = {a.shard: a for a in answers}
    dests_of = {a.shard: a for a in destinations}
    out = []
    for row in sorted(rows, key=lambda r: r.shard):
        answer = by_shard.get(row.shard)
        body = answer.body if answer is not None else None
        store = body.get("store") if body else None
        seconds, percent = cpu.figures(row.shard, row.pid) if cpu else (None, None)
        out.append({
            "shard": row.shard, "pid": row.pid, "state": row.state,
            "restarts": row.restarts, "uptime_ms": row.uptime_ms,
            "last_exit": row.last_exit,
            "connections": int(body.get("connections", 0)) if body else None,
            "answering": body is not None,
            **_owned(dests_of.get(row.shard)),
            "cpu_seconds": seconds, "cpu_percent": percent,
            "journal_bytes": int(store.get("bytes", 0))
            if isinstance(store, Mapping) else None,
            "links": body.get("shard_links") if body else None,
            "handoffs": body.get("handoffs") if body else None,
            **row.extra,
        })
    return out


TOTALLED = ("connections", "destinations", "messages_in", "messages_out", "in_rate",
            "out_rate", "cpu_seconds", "cpu_percent", "journal_bytes")


def shard_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The node's sums of the per-shard columns (over the shards that answered)."""
    totals: dict[str, Any] = {}
    for key in TOTALLED:
        values = [row[key] for row in rows if _number(row.get(key))]
        total = sum(values)
        totals[key] = round(total, 2) if isinstance(total, float) else total
    return totals
