"""The trace's small tables from one aggregation pass, finished on the driver.

One scan of the events feeds one hash aggregation (numbers only in its buffer) whose
groups are few by construction: one per broker run, destination and, for
``broker_started``, ``dropped`` and ``denied`` events, reason (runs x destinations x
reasons), and one per time window, broker, event kind and, for forwards, bridge (the
trace's duration / window x brokers x six kinds x bridges). Neither grows with the
number of messages, so the rows are collected once (Arrow) and the driver builds from
them, in plain Python:

* ``boots`` (each run with its successor's start, first service and the heartbeat
  its start reported), ``failovers``, ``throughput`` and ``bridges``, as Arrow
  tables written without Spark (``small_tables.write_local``);
* ``served``: the last delivery per broker and destination (for stuck messages);
* "now" (the newest event) and the dictionaries that code brokers, runs,
  destinations and reasons as integers for the journeys' aggregation
  (``meshmq.pipeline.coded``). Codes follow the sorted names, so comparing codes
  orders as comparing the strings did.

``broker_started``'s reason (``core.trace.start_reason``) is parsed here, on the few
start rows, instead of by a regular expression per event.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark spelling

from meshmq.core import trace as tr

THROUGHPUT_KINDS = (tr.RECEIVED, tr.RECEIVED_FROM_BRIDGE, tr.DISPATCHED, tr.DELIVERED,
                    tr.ACKED, tr.FORWARDED)

# Which reason a run row carries: none, a start's, a drop's (dropped or denied).
AUX_NONE, AUX_START, AUX_DROP = 0, 1, 2

# The output schemas: those of the reference transforms in ``meshmq.pipeline.audit``.
BOOTS_DDL = ("broker string, boot string, started_ts bigint, last_ts bigint, "
             "clean_stop boolean, events bigint, first_service_ts bigint, exact boolean, "
             "heartbeat_ms int, previous_boot string, previous_heartbeat_ts bigint, "
             "holder string, took_over string, next_started_ts bigint, "
             "next_service_ts bigint, alive_until_ts bigint, next_broker string")
FAILOVERS_DDL = ("broker string, ended_boot string, down_from_ts bigint, up_again_ts bigint, "
                 "down_ms double, kind string, uncertainty_ms double, first_service_ts bigint, "
                 "up_on string")
THROUGHPUT_DDL = "window_start timestamp, broker string, event string, events bigint, bytes bigint"
BRIDGES_DDL = ("window_start timestamp, broker string, peer string, connector string, "
               "messages bigint, bytes bigint")


def catalog_rows(events: DataFrame, window: str) -> DataFrame:
    """The one aggregation over the events: a run row per (broker, boot, destination,
    reason kind, reason) and a window row per (window, broker, event, peer, connector)
    of the throughput kinds; ``k`` says which (0 run, 1 window)."""
    ev = F.col("event")
    is_msg = F.col("message_id") != ""
    aux_kind = (F.when(ev == tr.BROKER_STARTED, AUX_START)
                .when(ev.isin(tr.DROPPED, tr.DENIED), AUX_DROP).otherwise(AUX_NONE))
    text = F.lit(None).cast("string")
    fwd = ev == tr.FORWARDED

    def key(k: int, boot: Column, dest: Column, kind: Column, aux: Column, w: Column,
            event: Column, peer: Column, connector: Column) -> Column:
        return F.struct(F.lit(k).alias("k"), F.col("broker").alias("broker"),
                        boot.alias("boot"), dest.alias("destination"),
                        kind.alias("aux_kind"), aux.alias("aux"), w.alias("window_start"),
                        event.alias("event"), peer.alias("peer"), connector.alias("connector"),
                        F.col("ts").alias("ts"), is_msg.alias("is_msg"), ev.alias("_ev"),
                        F.col("size").alias("size"),
                        (F.col("dedup_id").isNotNull() & is_msg).alias("has_dedup"))

    run = key(0, F.col("boot"), F.col("destination"), aux_kind,
              F.when(aux_kind != AUX_NONE, F.col("reason")), F.lit(None).cast("timestamp"),
              text, text, text)
    win = F.when(ev.isin(*THROUGHPUT_KINDS), key(
        1, text, text, F.lit(None).cast("int"), text,
        F.window(F.timestamp_micros("ts"), window)["start"], ev, F.when(fwd, F.col("peer")),
        F.when(fwd, F.col("connector"))))
    keyed = (events.select(F.explode(F.array(run, win)).alias("r"))
             .where(F.col("r").isNotNull()).select("r.*"))
    is_msg_col = F.col("is_msg")
    service = is_msg_col & (F.col("_ev") != tr.RECOVERED)
    return (keyed.groupBy("k", "broker", "boot", "destination", "aux_kind", "aux",
                          "window_start", "event", "peer", "connector")
            .agg(F.count("*").alias("n"), F.min("ts").alias("min_ts"),
                 F.max("ts").alias("max_ts"),
                 F.sum(F.when(is_msg_col, 1).otherwise(0)).alias("msg_events"),
                 F.max(F.col("_ev") == tr.BROKER_STOPPED).alias("stopped"),
                 F.min(F.when(service, F.col("ts"))).alias("first_service_ts"),
                 F.max(F.when(F.col("_ev").isin(tr.DISPATCHED, tr.DELIVERED), F.col("ts")))
                 .alias("served_ts"),
                 F.sum("size").alias("bytes"),
                 # Deliveries that carry a dedup id: whether resends need looking up.
                 F.sum(F.when(F.col("has_dedup") & F.col("_ev").isin(
                     tr.DISPATCHED, tr.DELIVERED), 1).otherwise(0)).alias("dedup_deliveries")))


def _start_field(reason: str | None, name: str) -> str | None:
    """A ``key=value`` field of ``broker_started``'s reason (core.trace.start_reason)."""
    found = re.search(rf"(?:^| ){name}=(\S+)", reason or "")
    return found.group(1) if found else None


def _as_int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _max(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _min(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _sum(values: Iterable[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _nulls_first(*values: Any) -> tuple[Any, ...]:
    """A sort key ordering as Spark's ascending sort: nulls first."""
    return tuple(x for v in values for x in (v is not None, v if v is not None else 0))


@dataclasses.dataclass
class Catalog:
    """What the driver knows after the catalog pass (see the module docstring)."""

    boots: list[dict[str, Any]]
    failovers: list[dict[str, Any]]
    throughput: list[dict[str, Any]]
    bridges: list[dict[str, Any]]
    served: list[dict[str, Any]]
    now_ts: int
    first_ts: int | None
    last_ts: int | None
    brokers: list[str]
    runs: list[tuple[str, str | None]]
    destinations: list[str | None]
    drop_reasons: list[str]
    # Run rows: (broker, boot, destination, aux_kind, aux): the coding table's keys.
    keys: list[tuple[Any, ...]]
    # Deliveries of messages that carry a dedup id (``audit.delivered_copies``' input).
    dedup_deliveries: int = 0


def build(rows: list[dict[str, Any]]) -> Catalog:
    """The small tables and dictionaries from the collected catalog rows."""
    run_rows = [r for r in rows if r["k"] == 0]
    win_rows = [r for r in rows if r["k"] == 1]
    per_run: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for r in run_rows:
        per_run.setdefault((r["broker"], r["boot"]), []).append(r)
    runs = []
    for (broker, boot), parts in per_run.items():
        starts = [p["aux"] for p in parts if p["aux_kind"] == AUX_START]
        exact = _max(_as_int(_start_field(s, "exact")) for s in starts)
        runs.append({
            "broker": broker, "boot": boot, "started_ts": _min(p["min_ts"] for p in parts),
            "last_ts": _max(p["max_ts"] for p in parts),
            "clean_stop": any(p["stopped"] for p in parts),
            "events": sum(p["msg_events"] for p in parts),
            "first_service_ts": _min(p["first_service_ts"] for p in parts),
            "exact": exact == 1,
            "heartbeat_ms": _max(_as_int(_start_field(s, "heartbeat_ms")) for s in starts),
            "previous_boot": _max(_start_field(s, "previous_boot") for s in starts),
            "previous_heartbeat_ts": _max(_as_int(_start_field(s, "last_heartbeat"))
                                          for s in starts),
            "holder": _max(_start_field(s, "holder") for s in starts),
            "took_over": _max(_start_field(s, "took_over") for s in starts)})
    # The first run that took the lease over from each holder (audit.boots).
    successor: dict[str, dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: _nulls_first(r["started_ts"],
                                                       r["first_service_ts"], r["broker"])):
        if run["took_over"] is not None:
            successor.setdefault(run["took_over"], run)
    boots = []
    by_broker: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_broker.setdefault(run["broker"], []).append(run)
    for broker in sorted(by_broker):
        ordered = sorted(by_broker[broker],
                         key=lambda r: _nulls_first(r["started_ts"], r["boot"]))
        for run, nxt in zip(ordered, [*ordered[1:], None], strict=True):
            if run["boot"] is None:
                continue  # as a join on the boot id would leave it out
            row = dict(run, next_started_ts=None if nxt is None else nxt["started_ts"],
                       next_service_ts=None if nxt is None else nxt["first_service_ts"],
                       next_broker=None if nxt is None else broker)
            alive = run["last_ts"]
            if nxt is not None and nxt["previous_boot"] == run["boot"]:
                alive = _max([run["last_ts"], nxt["previous_heartbeat_ts"]])
            row["alive_until_ts"] = alive
            # Whichever came first ends the run: its broker's next start or a takeover.
            succ = successor.get(run["holder"]) if run["holder"] is not None else None
            if succ is not None and succ["started_ts"] is not None \
                    and run["started_ts"] is not None \
                    and succ["started_ts"] > run["started_ts"] \
                    and (nxt is None or nxt["started_ts"] is None
                         or succ["started_ts"] < nxt["started_ts"]):
                row.update(next_started_ts=succ["started_ts"],
                           next_service_ts=succ["first_service_ts"],
                           next_broker=succ["broker"])
            boots.append(row)
    failovers = sorted(
        ({"broker": b["broker"], "ended_boot": b["boot"], "down_from_ts": b["alive_until_ts"],
          "up_again_ts": b["next_started_ts"],
          "down_ms": (b["next_started_ts"] - b["alive_until_ts"]) / 1000.0,
          "kind": "restart" if b["clean_stop"] else "crash",
          "uncertainty_ms": 0.0 if b["clean_stop"] else (
              None if b["heartbeat_ms"] is None else float(b["heartbeat_ms"])),
          "first_service_ts": b["next_service_ts"], "up_on": b["next_broker"]}
         for b in boots if b["next_started_ts"] is not None),
        key=lambda r: _nulls_first(r["down_from_ts"], r["broker"]))
    through: dict[tuple[Any, ...], list[Any]] = {}
    for r in win_rows:
        acc = through.setdefault((r["window_start"], r["broker"], r["event"]), [0, None])
        acc[0] += r["n"]
        acc[1] = _sum([acc[1], r["bytes"]])
    throughput = [{"window_start": k[0], "broker": k[1], "event": k[2], "events": v[0],
                   "bytes": v[1]}
                  for k, v in sorted(through.items(), key=lambda kv: _nulls_first(*kv[0]))]
    bridges = sorted(
        ({"window_start": r["window_start"], "broker": r["broker"], "peer": r["peer"],
          "connector": r["connector"], "messages": r["n"], "bytes": r["bytes"]}
         for r in win_rows if r["event"] == tr.FORWARDED),
        key=lambda r: _nulls_first(r["window_start"], r["broker"], r["peer"], r["connector"]))
    served: dict[tuple[str, str | None], int] = {}
    for r in run_rows:
        if r["served_ts"] is not None:
            k = (r["broker"], r["destination"])
            served[k] = max(served.get(k, r["served_ts"]), r["served_ts"])
    peers = {r["peer"] for r in win_rows if r["event"] == tr.FORWARDED and r["peer"]}
    return Catalog(
        boots=boots, failovers=failovers, throughput=throughput, bridges=bridges,
        served=[{"served_broker": b, "served_destination": d, "served_ts": ts}
                for (b, d), ts in sorted(served.items(), key=lambda kv: _nulls_first(*kv[0]))],
        now_ts=_max(b["last_ts"] for b in boots) or 0,
        first_ts=_min(r["started_ts"] for r in runs),
        last_ts=_max(r["last_ts"] for r in runs),
        brokers=sorted({r["broker"] for r in runs} | peers),
        runs=sorted(per_run, key=lambda k: _nulls_first(*k)),
        destinations=sorted({r["destination"] for r in run_rows if r["destination"] != ""
                             and r["destination"] is not None}),
        drop_reasons=sorted({r["aux"] for r in run_rows
                             if r["aux_kind"] == AUX_DROP and r["aux"] is not None}),
        keys=[(r["broker"], r["boot"], r["destination"], r["aux_kind"], r["aux"])
              for r in run_rows],
        dedup_deliveries=sum(r.get("dedup_deliveries") or 0 for r in run_rows))
