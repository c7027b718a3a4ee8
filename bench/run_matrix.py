"""Run the benchmark matrix (docs/benchmarks.md) against meshmq and every peer broker here.

    .venv/bin/python bench/run_matrix.py            # full matrix (~40 min on 2 cores)
    .venv/bin/python bench/run_matrix.py --quick    # smoke run, small counts (~5 min)
    .venv/bin/python bench/run_matrix.py --only meshmq activemq --scenarios s1 s2

Installs nothing itself: run ``bash bench/setup-peers.sh`` first (idempotent). Every
broker is started here on free loopback ports in a temp directory and stopped at
the end (also on Ctrl-C and errors). Writes ``bench/results/<date>.md``, ``.json``
and PNG charts next to them. See docs/benchmarks.md for what each scenario
measures and how the ratios are read.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as bk
from loadgen import LoadResult, LoadSpec, open_stomp, run_load

from meshmq.protocol.stomp import encode_frame

RESULTS = Path(__file__).resolve().parent / "results"
BROKER_ORDER = ["nullsink", "activemq", "meshmq", "rabbitmq", "coilmq", "mosquitto", "amqtt"]
PEERS = ["activemq", "rabbitmq", "coilmq", "mosquitto", "amqtt"]


@dataclass
class Scenario:
    key: str
    group: str           # scenario group ("1".."7", "lat"), as numbered in docs/benchmarks.md
    title: str
    spec: dict[str, Any]
    quick: dict[str, Any] = field(default_factory=dict)  # overrides for --quick
    chart: dict[str, Any] = field(default_factory=dict)  # axis values for the charts

    @property
    def protocol(self) -> str:
        return str(self.spec.get("protocol", "stomp"))


def _np(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"producers": 1, "consumers": 1, "size": 256, "count": 200_000,
                            "duration": 8.0}
    base.update(kw)
    return base


QUICK = {"duration": 2.0}
SCENARIOS: list[Scenario] = [
    Scenario("q1x1", "1", "Queue 1/1, 256 B, non-persistent", _np(),
             {"count": 20_000, **QUICK}, {"size": 256, "connections": 2}),
    Scenario("q4x4", "1", "Queue 4/4, 256 B, non-persistent",
             _np(producers=4, consumers=4), {"count": 20_000, **QUICK}),
    Scenario("q1x1-w10", "1", "Queue 1/1, 256 B, non-persistent, window 10 (as coilmq gets)",
             _np(window=10, count=100_000), {"count": 10_000, **QUICK}),
    Scenario("q1x1-p-w1", "2", "Queue 1/1, 256 B, persistent, window 1",
             _np(persistent=True, window=1, count=20_000), {"count": 1_000, **QUICK}),
    Scenario("q1x1-p-w100", "2", "Queue 1/1, 256 B, persistent, window 100",
             _np(persistent=True, window=100, count=100_000), {"count": 5_000, **QUICK}),
    Scenario("t1x1", "3", "Topic 1/1, 256 B, non-persistent (chart baseline)",
             _np(mode="topic", count=100_000), {"count": 10_000, **QUICK}, {"consumers": 1}),
    Scenario("t1x10", "3", "Topic fan-out 1/10, 256 B, non-persistent (deliveries/s)",
             _np(mode="topic", consumers=10, count=30_000), {"count": 3_000, **QUICK},
             {"consumers": 10}),
    Scenario("q1x1-1k", "4", "Queue 1/1, 1 KB, non-persistent", _np(size=1024, count=100_000),
             {"count": 10_000, **QUICK}, {"size": 1024}),
    Scenario("q1x1-16k", "4", "Queue 1/1, 16 KB, non-persistent",
             _np(size=16 * 1024, count=20_000), {"count": 2_000, **QUICK}, {"size": 16384}),
    Scenario("q1x1-1m", "4", "Queue 1/1, 1 MB, non-persistent",
             _np(size=1024 * 1024, count=300), {"count": 30, **QUICK}, {"size": 1048576}),
    Scenario("q1x1-idle100", "5", "100 idle connections + queue 1/1 256 B",
             _np(idle=100), {"count": 20_000, **QUICK}, {"connections": 102}),
    Scenario("q1x1-idle1000", "5", "1,000 idle connections + queue 1/1 256 B",
             _np(idle=1000), {"count": 20_000, **QUICK}, {"connections": 1002}),
    Scenario("lat50", "lat", "Queue 1/1 256 B paced at 50% of ActiveMQ's q1x1 peak",
             _np(count=0, rate=-1.0), {**QUICK}),
    Scenario("mqtt-q0-1x1", "7", "MQTT QoS 0, 1/1, 256 B",
             _np(protocol="mqtt", qos=0, count=200_000), {"count": 20_000, **QUICK}),
    Scenario("mqtt-q0-1x10", "7", "MQTT QoS 0, 1/10, 256 B (deliveries/s)",
             _np(protocol="mqtt", qos=0, consumers=10, count=30_000),
             {"count": 3_000, **QUICK}),
    Scenario("mqtt-q1-1x1", "7", "MQTT QoS 1 (window 100), 1/1, 256 B",
             _np(protocol="mqtt", qos=1, window=100, count=100_000), {"count": 5_000, **QUICK}),
    Scenario("mqtt-q1-1x10", "7", "MQTT QoS 1 (window 100), 1/10, 256 B (deliveries/s)",
             _np(protocol="mqtt", qos=1, window=100, consumers=10, count=20_000),
             {"count": 2_000, **QUICK}),
]

BACKLOG_FULL = {"count": 1_000_000, "producers": 4, "window": 100, "cap_s": 150.0}
BACKLOG_QUICK = {"count": 20_000, "producers": 4, "window": 100, "cap_s": 30.0}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- one broker

def _spec_for(broker: bk.Broker, sc: Scenario, quick: bool, lat_rate: float | None,
              scale: float) -> tuple[LoadSpec, list[str]]:
    kw = dict(sc.spec)
    if quick:
        kw.update(sc.quick)
    if "count" in kw and kw["count"] and not quick:
        kw["count"] = max(1, int(kw["count"] * scale))
    notes: list[str] = []
    if kw.get("rate", 0) < 0:
        kw["rate"] = lat_rate or 0.0
    proto = kw.get("protocol", "stomp")
    spec = LoadSpec(host=bk.HOST, port=broker.ports[proto], vhost=broker.vhost, **kw)
    if broker.credentials and proto == "stomp":
        spec.login, spec.passcode = broker.credentials
    if broker.max_inflight_bytes:
        frame = spec.size + 120
        cap = max(1, broker.max_inflight_bytes // frame)
        if spec.window == 0 or spec.window > cap:
            notes.append(f"window capped to {cap} (was {spec.window or 'none'}): "
                         f"{broker.name} cannot parse frames split across its reads")
            spec.window = cap
    return spec, notes


def run_scenario(broker: bk.Broker, sc: Scenario, rss: bk.RssSampler, quick: bool,
                 lat_rate: float | None, scale: float) -> dict[str, Any]:
    spec, notes = _spec_for(broker, sc, quick, lat_rate, scale)
    if sc.group == "lat" and not spec.rate:
        return {"status": "skipped", "reason": "no reference rate (ActiveMQ q1x1 missing)"}
    rss.reset()
    t = time.time()
    cpu: dict[str, Any] = {}

    def on_start() -> None:
        cpu["t0"], cpu["before"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

    def on_end() -> None:
        cpu["t1"], cpu["after"] = time.perf_counter(), bk.tree_cpu([broker.pid()])

    res: LoadResult = run_load(spec, hard_timeout=max(120.0, spec.duration * 20),
                               on_start=on_start, on_end=on_end)
    row = res.row()
    row["notes"] = notes + row["notes"]
    if "after" in cpu:
        row.update(cpu_per_message(bk.cpu_spent(cpu["before"], cpu["after"]),
                                   cpu["t1"] - cpu["t0"], res))
    row["peak_rss_mb"] = rss.peak_mb()
    row["wall_s"] = round(time.time() - t, 1)
    row["window"] = spec.window
    row["rate_target"] = spec.rate or None
    row["status"] = "ok" if res.complete else ("error" if res.error else "incomplete")
    return row


def cpu_per_message(broker_cpu_s: float, span_s: float, res: LoadResult) -> dict[str, Any]:
    """The broker's and the generator's CPU per message over the timed part of a run.
    Per delivery divides by messages received (for fan-out, every copy), per publish by
    messages sent; they differ only with fan-out."""
    def us(cpu_s: float | None, n: int) -> float | None:
        return round(cpu_s * 1e6 / n, 2) if cpu_s is not None and n else None

    return {
        "broker_cpu_s": round(broker_cpu_s, 3),
        "broker_cpu_pct": round(100 * broker_cpu_s / span_s, 1) if span_s > 0 else None,
        "broker_cpu_us_per_delivery": us(broker_cpu_s, res.received),
        "broker_cpu_us_per_publish": us(broker_cpu_s, res.sent),
        "gen_cpu_us_per_delivery": us(res.gen_cpu_s, res.received),
    }


async def _probe_first_message(broker: bk.Broker, dest: str, timeout: float) -> float:
    """Connect, subscribe (client ack, prefetch 1, so nothing is consumed) and time the
    first MESSAGE; returns seconds from the call."""
    t0 = time.perf_counter()
    spec = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], vhost=broker.vhost)
    if broker.credentials:
        spec.login, spec.passcode = broker.credentials
    got: list[float] = []

    class Rec:
        def got(self, now: float, stamps: list[float]) -> None:
            if not got:
                got.append(time.perf_counter())

    conn = await open_stomp(spec, Rec(), timeout=timeout)  # type: ignore[arg-type]
    assert conn.transport is not None
    conn.transport.write(encode_frame("SUBSCRIBE", [
        ("destination", dest), ("id", "probe"), ("ack", "client-individual"),
        ("activemq.prefetchSize", "1"), ("prefetch-count", "1")]))
    async with asyncio.timeout(timeout):
        while not got:
            await conn.flow.wait()
    conn.transport.close()
    return got[0] - t0


def run_backlog(broker: bk.Broker, rss: bk.RssSampler, quick: bool) -> dict[str, Any]:
    """Scenario 6: persistent 1 KB backlog with no consumer, restart, drain."""
    cfg = BACKLOG_QUICK if quick else BACKLOG_FULL
    out: dict[str, Any] = {"target_count": cfg["count"], "cap_s": cfg["cap_s"], "notes": []}
    # Start from an empty store so the RSS and recovery reflect the backlog alone.
    broker.stop()
    broker.wipe_data()
    broker.start()
    name = f"backlog{int(time.time()) % 100000}"
    spec = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], vhost=broker.vhost,
                    producers=cfg["producers"], consumers=0, size=1024, persistent=True,
                    window=cfg["window"], count=cfg["count"], duration=cfg["cap_s"],
                    name=name)
    if broker.credentials:
        spec.login, spec.passcode = broker.credentials
    if broker.max_inflight_bytes:
        spec.window = max(1, broker.max_inflight_bytes // (spec.size + 120))
        out["notes"].append(f"window capped to {spec.window} ({broker.name}'s parser)")
    rss.reset()
    send = run_load(spec, hard_timeout=cfg["cap_s"] * 3)
    out["sent"] = send.sent
    out["send_rate"] = send.send_rate
    out["send_error"] = send.error
    out["rss_after_send_mb"] = round(rss.sample() / 1024, 1)
    out["peak_rss_send_mb"] = rss.peak_mb()
    if send.sent < cfg["count"]:
        out["notes"].append(f"send phase capped at {cfg['cap_s']:.0f}s: backlog is "
                            f"{send.sent:,} of {cfg['count']:,} messages")
    log(f"  backlog: sent {send.sent} at {send.send_rate:.0f} msg/s, "
        f"RSS {out['peak_rss_send_mb']} MB")
    dest = f"/queue/bench.{name}.0"
    if broker.persistent_store and send.sent:
        out["stop_s"] = round(broker.stop(), 2)
        rss.reset()
        t0 = time.perf_counter()
        try:
            port_s = broker.start()
            first = asyncio.run(_probe_first_message(broker, dest, 120.0))
            out["restart_port_s"] = round(port_s, 2)
            out["restart_first_message_s"] = round(time.perf_counter() - t0, 2)
            out["probe_s"] = round(first, 3)
        except Exception as exc:
            out["restart_error"] = f"{type(exc).__name__}: {exc}"
        out["rss_after_restart_mb"] = round(rss.sample() / 1024, 1)
    else:
        out["restart_first_message_s"] = None
        out["notes"].append("no restart-recovery: in-memory store" if not
                            broker.persistent_store else "nothing sent")
    drain = LoadSpec(host=bk.HOST, port=broker.ports["stomp"], vhost=broker.vhost,
                     producers=0, consumers=1, size=1024, count=0, drain=send.sent,
                     name=name, stall=30.0)
    if broker.credentials:
        drain.login, drain.passcode = broker.credentials
    d = run_load(drain, hard_timeout=cfg["cap_s"] * 2)
    out["drained"] = d.received
    out["drain_rate"] = d.e2e_rate
    out["drain_error"] = d.error
    out["drain_notes"] = d.notes
    out["peak_rss_drain_mb"] = rss.peak_mb()
    out["peak_rss_mb"] = max(out["peak_rss_send_mb"], out["peak_rss_drain_mb"])
    log(f"  backlog: drained {d.received} at {d.e2e_rate:.0f} msg/s; "
        f"recovery {out.get('restart_first_message_s')} s")
    return out


def warm_up(broker: bk.Broker, quick: bool) -> dict[str, Any]:
    """An unrecorded queue 1/1 run per protocol first, so a JIT (ActiveMQ's JVM) is warm
    and lazy imports are done before the first measured scenario."""
    done: dict[str, Any] = {}
    for proto in sorted(broker.protocols):
        spec = LoadSpec(protocol=proto, host=bk.HOST, port=broker.ports[proto],
                        vhost=broker.vhost, count=5_000 if quick else 100_000,
                        duration=1.0 if quick else 4.0, qos=0)
        if broker.credentials and proto == "stomp":
            spec.login, spec.passcode = broker.credentials
        if broker.max_inflight_bytes:
            spec.window = max(1, broker.max_inflight_bytes // (spec.size + 120))
        try:
            r = run_load(spec, hard_timeout=60)
            done[proto] = {"received": r.received, "e2e_rate": r.e2e_rate, "error": r.error}
        except Exception as exc:
            done[proto] = {"error": f"{type(exc).__name__}: {exc}"}
    return done


def run_broker(name: str, scenarios: list[Scenario], args: argparse.Namespace,
               lat_rate: float | None, with_backlog: bool) -> dict[str, Any]:
    cls = bk.ALL_BROKERS[name]
    broker = cls()
    entry: dict[str, Any] = {"name": name, "scenarios": {}}
    reason = broker.missing()
    if reason:
        broker.close()
        entry["missing"] = reason
        log(f"{name}: MISSING ({reason})")
        return entry
    entry["version"] = broker.version()
    try:
        log(f"{name}: starting ({entry['version']})")
        entry["startup_s"] = round(broker.start(), 2)
        rss = bk.RssSampler(broker.pid)
        entry["idle_rss_mb"] = rss.peak_mb()
        warm = warm_up(broker, args.quick)
        if warm:
            entry["warm_up"] = warm
        mqtt_reason = getattr(broker, "mqtt_missing", lambda: None)()
        for sc in scenarios:
            if sc.protocol not in broker.protocols or (sc.protocol == "mqtt" and mqtt_reason):
                why = mqtt_reason if sc.protocol == "mqtt" and mqtt_reason and \
                    sc.protocol in broker.protocols else f"{sc.protocol.upper()} not supported"
                if name == "meshmq":
                    why += " yet"
                entry["scenarios"][sc.key] = {"status": "unsupported", "reason": why}
                continue
            if broker.pid() is None:
                log(f"{name}: broker died; restarting")
                broker.start()
            try:
                row = run_scenario(broker, sc, rss, args.quick, lat_rate, args.scale)
            except Exception as exc:  # keep the matrix going
                row = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            entry["scenarios"][sc.key] = row
            log(f"{name} {sc.key}: {row.get('status')} e2e {row.get('e2e_rate')} "
                f"send {row.get('send_rate')} p99 {row.get('p99_ms')} ms "
                f"rss {row.get('peak_rss_mb')} MB {row.get('error') or ''}")
            if name == "activemq" and sc.key == "q1x1" and row.get("e2e_rate"):
                lat_rate = 0.5 * float(row["e2e_rate"])
                entry["lat_rate"] = lat_rate
        if with_backlog and "stomp" in broker.protocols and name != "nullsink":
            try:
                entry["backlog"] = run_backlog(broker, rss, args.quick)
            except Exception as exc:
                entry["backlog"] = {"error": f"{type(exc).__name__}: {exc}"}
        rss.stop()
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        log(f"{name}: FAILED {entry['error']}")
    finally:
        broker.close()
    return entry


# --------------------------------------------------------------------------- reporting

def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if digits == 0:
            return f"{v:,.0f}"
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


EMPTY = " |" * 11  # the empty cells after a scenario table's second column


def _broker_cpu(row: dict[str, Any]) -> str:
    """µs per delivery, and per publish after it where fan-out makes them differ."""
    per_d, per_p = row.get("broker_cpu_us_per_delivery"), row.get("broker_cpu_us_per_publish")
    if per_d is not None and per_p is not None and row.get("received") != row.get("sent"):
        return f"{_fmt(per_d, 1)} ({_fmt(per_p, 1)}/publish)"
    return _fmt(per_d, 1)


def _rate(entry: dict[str, Any], key: str) -> float | None:
    row = entry.get("scenarios", {}).get(key) or {}
    if row.get("status") in ("ok", "incomplete") and row.get("e2e_rate"):
        return float(row["e2e_rate"])
    return None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}x"


def evaluate_targets(res: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows."""
    mm = res.get("meshmq", {})
    rows: list[tuple[str, str, str]] = []

    def cmp(label: str, key: str, peer: str, factor: float) -> None:
        a, b = _rate(mm, key), _rate(res.get(peer, {}), key)
        if res.get(peer, {}).get("missing"):
            rows.append((label, f"{peer} missing", "n/a"))
        elif a is None or b is None:
            why = (mm.get("scenarios", {}).get(key) or {}).get("reason") or "no result"
            rows.append((label, why if a is None else f"no {peer} result", "not met"
                         if a is None and "not supported" in why else "n/a"))
        else:
            rows.append((label, f"{a:,.0f} vs {b:,.0f} msg/s = {a / b:.2f}x",
                         "met" if a >= factor * b else "not met"))

    for key, what in (("q1x1", "queue 1/1 non-persistent"), ("q4x4", "queue 4/4 non-persistent"),
                      ("q1x1-w10", "queue 1/1 non-persistent window 10"),
                      ("q1x1-p-w1", "queue persistent window 1"),
                      ("q1x1-p-w100", "queue persistent window 100")):
        cmp(f"STOMP {what} >= 1.0x ActiveMQ", key, "activemq", 1.0)
    # coilmq only works with <4 KB unconfirmed in flight (window 10 for 256 B), and keeps
    # messages in memory: the like-for-like row is q1x1-w10; the others are for reference.
    for key, what in (("q1x1-w10", "queue 1/1 non-persistent, window 10 both"),
                      ("q1x1", "queue 1/1 non-persistent (coilmq at window 10)"),
                      ("q4x4", "queue 4/4 non-persistent (coilmq at window 10)"),
                      ("q1x1-p-w1", "queue persistent window 1 (coilmq in memory)"),
                      ("q1x1-p-w100", "queue persistent window 100 (coilmq window 10, memory)")):
        cmp(f"STOMP {what} >= 5x coilmq", key, "coilmq", 5.0)
    for key in ("mqtt-q0-1x1", "mqtt-q0-1x10", "mqtt-q1-1x1", "mqtt-q1-1x10"):
        cmp(f"{key} >= 0.5x Mosquitto", key, "mosquitto", 0.5)
        cmp(f"{key} >= 5x amqtt", key, "amqtt", 5.0)
    a = (mm.get("scenarios", {}).get("lat50") or {})
    b = (res.get("activemq", {}).get("scenarios", {}).get("lat50") or {})
    if a.get("p99_ms") is not None and b.get("p99_ms") is not None:
        rows.append(("p99 at 50% of ActiveMQ's peak <= ActiveMQ's",
                     f"{a['p99_ms']:.2f} vs {b['p99_ms']:.2f} ms at "
                     f"{_fmt(a.get('rate_target'))} msg/s",
                     "met" if a["p99_ms"] <= b["p99_ms"] else "not met"))
    else:
        rows.append(("p99 at 50% of ActiveMQ's peak <= ActiveMQ's", "no result", "n/a"))
    bl = mm.get("backlog") or {}
    if bl.get("peak_rss_mb") is not None:
        rows.append((f"backlog of {bl.get('sent', 0):,} x 1 KB: RSS < 400 MB",
                     f"{bl['peak_rss_mb']:.0f} MB",
                     "met" if bl["peak_rss_mb"] < 400 else "not met"))
        rec = bl.get("restart_first_message_s")
        rows.append(("backlog restart recovery < 10 s",
                     f"{rec} s" if rec is not None else bl.get("restart_error", "no result"),
                     "met" if rec is not None and rec < 10 else "not met"))
        if bl.get("sent", 0) < 1_000_000:
            rows.append(("(backlog size)", f"{bl.get('sent', 0):,} messages, not 1M",
                         "scaled"))
    return rows


def write_markdown(path: Path, data: dict[str, Any], charts: list[str]) -> None:
    res: dict[str, dict[str, Any]] = data["brokers"]
    env = data["env"]
    names = [n for n in BROKER_ORDER if n in res]
    mm = res.get("meshmq", {})
    lines: list[str] = []
    lines.append(f"# Benchmark matrix, {env['date']}{' (quick)' if env['quick'] else ''}\n")
    lines.append(f"Command: `{env['command']}` on {env['cpus']} CPUs, Python {env['python']}, "
             f"{env['platform']}; meshmq at git {env['git']}, "
             f"{env.get('meshmq_build', 'python')} build. Generated by "
             "bench/run_matrix.py; see docs/benchmarks.md for the method.\n")
    lines.append("Ratios are meshmq / peer on end-to-end msg/s (first send to last receive), "
             f"measured in this run on this machine. The load generator and the broker share "
             f"the {env['cpus']} CPUs, so msg/s moves with how much CPU the generator takes; "
             "the broker's CPU per delivered message does much less, and is the figure to "
             "compare across machines.\n")
    lines.append("## Brokers\n")
    lines.append("| broker | version | status | startup s | idle RSS MB |")
    lines.append("|---|---|---|---|---|")
    for n in names:
        e = res[n]
        status = "MISSING: " + e["missing"] if e.get("missing") else (
            "FAILED: " + e["error"] if e.get("error") else "ran")
        lines.append(f"| {n} | {e.get('version', '—')} | {status} | {_fmt(e.get('startup_s'), 2)} "
                 f"| {_fmt(e.get('idle_rss_mb'), 1)} |")
    lines.append("")
    lines.append("## Targets\n")
    lines.append("| target | measured | verdict |")
    lines.append("|---|---|---|")
    for t, m, v in evaluate_targets(res):
        lines.append(f"| {t} | {m} | **{v}** |")
    lines.append("")
    sink = res.get("nullsink", {})
    lines.append("## Scenarios\n")
    lines.append("Each table: one row per broker. `e2e` = messages received / (last receive - "
                 "first "
             "send); for fan-out it counts deliveries. `send` = messages sent / (first send - "
             "last confirmation). Latency is receive time minus the timestamp in the body. "
             "`broker CPU µs/delivery` is the user + system CPU time of the broker's process "
             "tree (a JVM whole, Erlang's children included) from the first send to the last "
             "receive, over the messages received; with fan-out the figure per published "
             "message follows in brackets. `generator CPU µs/delivery` is the same for the "
             "load generator's worker processes: when it is near the nullsink row's, the "
             "generator is the limit. `broker CPU %` is the broker's CPU time over that span "
             "(100 = one core). "
             "The `nullsink` row is the load generator's ceiling against a peer that does no "
             "broker work. `meshmq/x` is meshmq's e2e over this broker's.\n")
    for sc in data["scenarios"]:
        key = sc["key"]
        lines.append(f"### {sc['group']}. {sc['title']} (`{key}`)\n")
        lines.append("| broker | e2e msg/s | send msg/s | broker CPU µs/delivery "
                     "| generator CPU µs/delivery | broker CPU % | p50 ms | p99 ms | max ms "
                     "| peak RSS MB | received/expected | meshmq/x |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        mrate = _rate(mm, key)
        notes: list[str] = []
        for n in names:
            e = res[n]
            if e.get("missing"):
                lines.append(f"| {n} | MISSING |{EMPTY}")
                continue
            row = e.get("scenarios", {}).get(key)
            if row is None:
                continue
            if row.get("status") in ("unsupported", "skipped"):
                lines.append(f"| {n} | {row.get('reason')} |{EMPTY}")
                continue
            if row.get("status") == "error" and not row.get("received"):
                lines.append(f"| {n} | error: {str(row.get('error'))[:120]} |{EMPTY}")
                continue
            flag = "" if row.get("status") == "ok" else f" ({row.get('status')})"
            ratio = "—" if n == "meshmq" else _ratio(mrate, _rate(e, key))
            lines.append(f"| {n} | {_fmt(row.get('e2e_rate'))}{flag} "
                         f"| {_fmt(row.get('send_rate'))} | {_broker_cpu(row)} "
                         f"| {_fmt(row.get('gen_cpu_us_per_delivery'), 1)} "
                         f"| {_fmt(row.get('broker_cpu_pct'))} "
                     f"| {_fmt(row.get('p50_ms'), 2)} | {_fmt(row.get('p99_ms'), 2)} "
                     f"| {_fmt(row.get('max_ms'), 2)} | {_fmt(row.get('peak_rss_mb'), 1)} "
                     f"| {_fmt(row.get('received'))}/{_fmt(row.get('expected'))} | {ratio} |")
            for note in row.get("notes") or []:
                notes.append(f"{n}: {note}")
            if row.get("error"):
                notes.append(f"{n}: {row['error']}")
        if key == "lat50":
            rate = (res.get("activemq", {}).get("lat_rate"))
            notes.insert(0, f"paced at {_fmt(rate)} msg/s total" if rate else "no pace")
        for note in notes:
            lines.append(f"- {note}")
        lines.append("")
    lines.append("### 6. Backlog: persistent 1 KB messages, no consumer, then restart and drain\n")
    lines.append("| broker | backlog msgs | send msg/s | drain msg/s | peak RSS MB (send / drain) "
             "| port open after restart s | first message after restart s | meshmq/x send "
             "| meshmq/x drain |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    mb = mm.get("backlog") or {}
    for n in names:
        b = res[n].get("backlog")
        if not b:
            continue
        if b.get("error"):
            lines.append(f"| {n} | error: {b['error'][:120]} | | | | | | | |")
            continue
        rec = b.get("restart_first_message_s")
        rec_s = _fmt(rec, 2) if rec is not None else (b.get("restart_error") or "n/a")
        lines.append(
            f"| {n} | {_fmt(b.get('sent'))} | {_fmt(b.get('send_rate'))} "
            f"| {_fmt(b.get('drain_rate'))} ({_fmt(b.get('drained'))}) "
            f"| {_fmt(b.get('peak_rss_send_mb'), 1)} / {_fmt(b.get('peak_rss_drain_mb'), 1)} "
            f"| {_fmt(b.get('restart_port_s'), 2)} | {rec_s} "
            f"| {'—' if n == 'meshmq' else _ratio(mb.get('send_rate'), b.get('send_rate'))} "
            f"| {'—' if n == 'meshmq' else _ratio(mb.get('drain_rate'), b.get('drain_rate'))} |")
    for n in names:
        b = res[n].get("backlog") or {}
        for note in b.get("notes", []):
            lines.append(f"- {n}: {note}")
        for k in ("send_error", "drain_error", "restart_error"):
            if b.get(k):
                lines.append(f"- {n}: {k}: {b[k]}")
    lines.append("")
    if sink and not sink.get("missing"):
        lines.append("## Generator ceiling\n")
        lines.append("The `nullsink` rows above are the same scenarios against bench/nullsink.py, "
                 "which acknowledges and discards what producers send and streams ready-made "
                 "messages to consumers: they bound what this generator can measure on this "
                 "machine. A broker result close to the nullsink row is generator-bound. With a "
                 "confirmation window the sink's consumers are not paced by its producers, so "
                 "read its `send` column as the ceiling there.\n")
    if charts:
        lines.append("## Charts\n")
        for c in charts:
            lines.append(f"![{c}]({c})\n")
    path.write_text("\n".join(lines) + "\n")


def make_charts(data: dict[str, Any], stem: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no charts (pip install matplotlib)")
        return []
    res = data["brokers"]
    scs = {s["key"]: s for s in data["scenarios"]}
    out = []
    charts = [
        ("size", "message size (bytes)", "throughput vs message size (queue 1/1, non-persistent)",
         True),
        ("consumers", "consumers (topic fan-out, 1 producer)",
         "deliveries/s vs number of consumers", False),
        ("connections", "open connections (2 active + idle)",
         "throughput vs number of connections (queue 1/1, 256 B)", True),
    ]
    for axis, xlabel, title, logx in charts:
        keys = [k for k, s in scs.items() if axis in s.get("chart", {})]
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        plotted = False
        for n in BROKER_ORDER:
            e = res.get(n)
            if not e or e.get("missing"):
                continue
            pts = sorted((scs[k]["chart"][axis], _rate(e, k)) for k in keys
                         if _rate(e, k) is not None)
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            style = "--" if n == "nullsink" else "-"
            ax.plot(xs, ys, style, marker="o", label=n, linewidth=2.5 if n == "meshmq" else 1.2)
            plotted = True
        if not plotted:
            plt.close(fig)
            continue
        if logx:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("end-to-end msg/s (log)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{stem}-{axis}.png"
        fig.savefig(RESULTS / name, dpi=100)
        plt.close(fig)
        out.append(name)
    return out


# --------------------------------------------------------------------------- main

def _git_rev() -> str:
    """The last commit that touched src/, flagged when src/ has uncommitted edits (the
    editable install runs the work tree, which may be ahead of any commit).
    ``MESHMQ_GIT_REV`` says it where the tree has no history (bench/device-run.sh)."""
    if os.environ.get("MESHMQ_GIT_REV"):
        return os.environ["MESHMQ_GIT_REV"]
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, check=False,
                                  cwd=Path(__file__).parent).stdout.strip()
        except OSError:
            return ""

    rev = git("log", "-1", "--format=%h", "--", "../src") or "?"
    if git("status", "--porcelain", "--", "../src"):
        rev += " + uncommitted src/ changes"
    return rev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    ap.add_argument("--only", nargs="+", metavar="BROKER", choices=BROKER_ORDER,
                    help="run only these brokers (default: all)")
    ap.add_argument("--scenarios", nargs="+", metavar="KEY",
                    help="scenario keys or group numbers (e.g. q1x1 2 7 backlog)")
    ap.add_argument("--no-backlog", action="store_true", help="skip scenario 6")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--out", default=None, help="results file stem (default: the date)")
    ap.add_argument("--meshmq-build", choices=("compiled", "python"), default=None,
                    help="meshmq build to run: compiled (dev/build-compiled; the default) or "
                         "python (the editable pure-Python install)")
    args = ap.parse_args()
    if args.meshmq_build:
        os.environ["MESHMQ_BENCH_BUILD"] = args.meshmq_build

    selected = SCENARIOS
    with_backlog = not args.no_backlog
    if args.scenarios:
        want = set(args.scenarios)
        selected = [s for s in SCENARIOS if s.key in want or s.group in want]
        with_backlog = with_backlog and bool(want & {"6", "backlog"})
    names = [n for n in BROKER_ORDER if not args.only or n in args.only]
    if "lat50" in [s.key for s in selected] and "activemq" not in names:
        log("note: lat50 needs ActiveMQ's q1x1 rate; it is skipped without activemq")

    # Ctrl-C / SIGTERM: the finally-blocks stop every broker.
    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    date = dt.date.today().isoformat()
    stem = args.out or (date + ("-quick" if args.quick else ""))
    data: dict[str, Any] = {
        "env": {"date": date, "quick": args.quick, "cpus": os.cpu_count(),
                "python": platform.python_version(), "platform": platform.platform(),
                "git": _git_rev(), "meshmq_build": bk.meshmq_build(),
                "started": dt.datetime.now().isoformat(timespec="seconds"),
                "command": " ".join(["python bench/run_matrix.py", *sys.argv[1:]])},
        "scenarios": [asdict(s) for s in selected],
        "brokers": {},
    }
    lat_rate: float | None = None
    RESULTS.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        for n in names:
            entry = run_broker(n, selected, args, lat_rate, with_backlog)
            lat_rate = entry.get("lat_rate", lat_rate)
            data["brokers"][n] = entry
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        data["env"]["interrupted"] = True
    data["env"]["minutes"] = round((time.time() - t0) / 60, 1)
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    charts = make_charts(data, stem)
    write_markdown(RESULTS / f"{stem}.md", data, charts)
    log(f"wrote {RESULTS / (stem + '.md')} and .json ({data['env']['minutes']} min)")


if __name__ == "__main__":
    main()
