"""Bridge forwarding throughput: STOMP queue traffic through 0, 1 and 2 network hops.

    .venv/bin/python bench/network_bench.py            # full run (~6 min on 2 cores)
    .venv/bin/python bench/network_bench.py --quick    # smoke run (~20 s)
    .venv/bin/python bench/network_bench.py --profile /tmp/prof   # + py-spy on every broker

The target: a network of brokers forwards at least 0.9x the single-broker rate (result
files written before 2026-11-27 were judged against 0.8x).
Every case starts fresh ``meshmq broker`` subprocesses (journal store, ``fsync = true``,
STOMP + ``tcp`` + management listeners on free loopback ports) and drives them with
bench/loadgen.py's workers, producer and consumer on different brokers:

- ``single``: producer and consumer on broker A;
- ``1hop``: producer on A, consumer on B, A's connector ``static:(B)``;
- ``2hop``: producer on A, consumer on C, A -> B -> C, ``network_ttl = 2`` on both.

each non-persistent (fire and forget, one receipt at the end) and persistent
(``persistent:true``, receipt window 100), 256 B bodies, 1 producer / 1 consumer.
Before the producer sends its first message the harness polls ``/api/stat`` until every
bridge is ``forwarding`` and the demand created by the consumer has reached A. After
the run it checks that nothing is left on any broker (queue depth, bridge in-flight,
forwarded = acknowledged) and reports what was left if not.

Reported per case: end-to-end msg/s (first send to last receive), latency p50/p99, the
ratio to ``single`` of the same persistence, each broker's peak RSS and CPU use. Cases
are repeated (``--repeat``, interleaved so load from other processes hits all alike);
the repetition with the median end-to-end rate is the headline, all are in the JSON. Writes
``bench/results/<date>-network.md`` and ``.json`` (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen as lg
import psutil
from brokers import HOST, RssSampler, cpu_spent, free_ports, port_accepts, tree_cpu

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
TARGET = 0.9
T = TypeVar("T")
# Where the brokers import meshmq from: an export of the measured commit (--rev), so a
# run measures committed code even while someone edits the work tree.
BROKER_ENV: dict[str, str] = {}
# Extra [[network_connectors]] settings from --connector (TOML values), for experiments.
CONNECTOR_EXTRA: dict[str, str] = {}
PROFILE_NATIVE = False  # --profile-native: py-spy also samples compiled (mypyc) frames
# --callgrind: every broker runs under valgrind's callgrind, its counters zeroed when the
# load starts and dumped when it ends, so each broker's instructions per delivered
# message are counted, not timed (they do not move with the host's load).
CALLGRIND = False
CALLGRIND_SLOWDOWN = 10  # timeouts are this much longer under valgrind
# --cpus: brokers A, B, C on the first three, the two load workers on the next two (the
# same CPUs in every topology); the harness itself keeps to the others. Empty: the
# scheduler places everything.
PIN: list[int] = []
# --perf DIR: `perf record` (software cpu-clock, call graphs) on every broker during the
# load: native frames at full speed, compiled (mypyc) functions and CPython included.
PERF: Path | None = None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def poll(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """First truthy value of ``predicate()``; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)  # back-off inside a deadline poll
        delay = min(delay * 2, 0.05)


# --------------------------------------------------------------------------- brokers

@dataclass
class Node:
    """One ``meshmq broker`` subprocess of the bench network."""

    name: str
    root: Path
    connect_to: list[Node] = field(default_factory=list)
    network_ttl: int = 1
    proc: subprocess.Popen[bytes] | None = None
    cpu: int | None = None  # pinned to this CPU (--cpus), with every thread it starts
    stomp: int = 0
    tcp: int = 0
    mgmt: int = 0

    def __post_init__(self) -> None:
        self.stomp, self.tcp, self.mgmt = free_ports(3)

    def config(self) -> str:
        lines = ["[broker]", f'name = "{self.name}"',
                 f'data_directory = "{self.root / "data"}"', "",
                 "[store]", "fsync = true", "",
                 "[management]", "enabled = true", f'host = "{HOST}"', f"port = {self.mgmt}", ""]
        for name, port in (("stomp", self.stomp), ("tcp", self.tcp)):
            lines += ["[[listeners]]", f'name = "{name}"', f'protocol = "{name}"',
                      f'host = "{HOST}"', f"port = {port}"]
            if name == "tcp":
                # Loopback brokers of one benchmark: links without credentials (a broker
                # refuses anonymous links unless its listener allows them).
                lines.append("allow_anonymous_links = true")
            lines.append("")
        for peer in self.connect_to:
            lines += ["[[network_connectors]]", f'uri = "static:(tcp://{HOST}:{peer.tcp})"',
                      f"network_ttl = {self.network_ttl}",
                      # Only the first connect can race the peer's start: retry quickly.
                      "initial_reconnect_delay_ms = 100"]
            lines += [f"{k} = {v}" for k, v in CONNECTOR_EXTRA.items()] + [""]
        return "\n".join(lines)

    def start(self) -> Node:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "broker.toml"
        path.write_text(self.config())
        with open(self.root / "broker.log", "ab") as out:
            wrap = ["valgrind", "--tool=callgrind",
                    f"--callgrind-out-file={self.root / 'callgrind.%p'}"] if CALLGRIND else []
            if self.cpu is not None:
                wrap = ["taskset", "-c", str(self.cpu), *wrap]
            self.proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", "meshmq.cli.main", "--log-level", "WARNING",
                 "broker", "--config", str(path)], stdout=out, stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **BROKER_ENV),
                start_new_session=True)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker {self.name} exited with {self.proc.returncode}: "
                                   + self.log()[-2000:])
            if not port_accepts(self.stomp) or not port_accepts(self.tcp):
                return False
            try:
                self.stat()
            except (OSError, urllib.error.URLError):
                return False
            return True

        poll(up, 60 * (CALLGRIND_SLOWDOWN if CALLGRIND else 1), f"broker {self.name} to start")
        return self

    def callgrind(self, command: str) -> None:
        """``callgrind_control --zero`` or ``--dump`` for this broker (under --callgrind)."""
        subprocess.run(["callgrind_control", command, str(self.pid)], check=True,
                       capture_output=True, timeout=120)

    def instructions_dumped(self) -> int:
        """Instructions counted between the zero and the dump (callgrind's first dump)."""
        (dump,) = self.root.glob("callgrind.*.1")
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                log(f"broker {self.name} ignored SIGTERM for 20 s: SIGKILL")
                proc.kill()
                proc.wait(10)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def stat(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{HOST}:{self.mgmt}/api/stat", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def queue(self, name: str, stat: dict[str, Any] | None = None) -> dict[str, Any]:
        for d in (stat or self.stat())["destinations"]:
            if d["name"] == name and d["type"] == "queue":
                return d  # type: ignore[no-any-return]
        return {"name": name, "depth": 0, "consumers": 0, "enqueued": 0, "dequeued": 0,
                "inflight": 0}

    def bridges(self, stat: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        bridges = (stat or self.stat()).get("network", {}).get("bridges", [])
        return [b for b in bridges if b.get("direction") == "outbound"]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the broker's process tree so far."""
        return cpu_spent({}, tree_cpu([self.pid]))

    def sys_s(self) -> float:
        """System (kernel) CPU seconds of the broker's process so far: the socket
        calls' kernel side, which an instruction count of user space does not see."""
        try:
            return float(psutil.Process(self.pid).cpu_times().system)
        except psutil.Error:
            return 0.0

    def log(self) -> str:
        try:
            return (self.root / "broker.log").read_text(errors="replace")
        except OSError:
            return ""


TOPOLOGIES = {
    "single": "producer and consumer on A",
    "1hop": "producer on A, consumer on B; A -> B",
    "2hop": "producer on A, consumer on C; A -> B -> C, network_ttl 2",
}


def build(topology: str, root: Path) -> list[Node]:
    """Start the brokers of ``topology``, receivers first so the first connect succeeds;
    returns them in forwarding order (producer's broker first)."""
    def cpu(i: int) -> int | None:
        return PIN[i] if PIN else None

    if topology == "single":
        return [Node("A", root / "a", cpu=cpu(0)).start()]
    if topology == "1hop":
        b = Node("B", root / "b", cpu=cpu(1)).start()
        return [Node("A", root / "a", [b], cpu=cpu(0)).start(), b]
    c = Node("C", root / "c", cpu=cpu(2)).start()
    b = Node("B", root / "b", [c], network_ttl=2, cpu=cpu(1)).start()
    return [Node("A", root / "a", [b], network_ttl=2, cpu=cpu(0)).start(), b, c]


# --------------------------------------------------------------------------- load

def _wait_demand(nodes: list[Node], queue: str, timeout: float) -> None:
    """Until the consumer is subscribed on the last broker, every bridge forwards and
    every broker before it has the demand (a network consumer) on ``queue``."""
    def ready() -> bool:
        for i, node in enumerate(nodes):
            st = node.stat()
            if any(b["state"] != "forwarding" for b in node.bridges(st)):
                return False
            if len(node.bridges(st)) != (1 if i < len(nodes) - 1 else 0):
                return False
            if node.queue(queue, st)["consumers"] < 1:
                return False
            if i < len(nodes) - 1 and not any(b["demand"] >= 1 for b in node.bridges(st)):
                return False
        return True

    poll(ready, timeout, f"bridges forwarding and demand for {queue} on every broker")


def run_split_load(prod: lg.LoadSpec, cons: lg.LoadSpec, gate: Callable[[], None],
                   hard_timeout: float, on_end: Callable[[], None] | None = None,
                   cpus: list[int] | None = None) -> lg.LoadResult:
    """bench/loadgen.py's ``run_load`` with producers and consumers on different brokers
    (``prod.port`` / ``cons.port``), ``gate()`` run after every worker connected and
    subscribed but before anything is sent, and ``on_end()`` when the last message
    arrived (or the run gave up), before the workers stop; worker i is pinned to
    ``cpus[i]`` when given (before it connects, so its threads inherit it). Uses
    loadgen's own worker processes and its accounting, so the numbers read exactly as
    the matrix's."""
    assert prod.name and prod.name == cons.name
    roles = lg._assign(prod)
    ctx = mp.get_context("spawn")
    sh = lg._Shared(barrier=ctx.Barrier(len(roles) + 1), received=ctx.Value("q", 0),
                    sent=ctx.Array("q", max(1, prod.producers)),
                    producers_done=ctx.Value("i", 0), stop=ctx.Event(), results=ctx.Queue())
    procs = [ctx.Process(target=lg._worker, args=(prod if r[0][0] == "p" else cons, r, sh, w),
                         daemon=True) for w, r in enumerate(roles)]
    for i, p in enumerate(procs):
        p.start()
        if cpus:
            psutil.Process(p.pid).cpu_affinity([cpus[i % len(cpus)]])
    result = lg.LoadResult()
    outs: list[dict[str, Any]] = []
    try:
        try:
            # The workers wait at the barrier once connected and subscribed; the barrier
            # opens when this process joins it, after the gate.
            poll(lambda: sh.barrier.n_waiting == len(roles)
                 or not all(p.is_alive() for p in procs), 120, "load workers to connect")
            if not all(p.is_alive() for p in procs):
                raise RuntimeError("a load worker died during setup")
            gate()
            sh.barrier.wait(timeout=60)
        except Exception as exc:
            sh.barrier.abort()
            sh.stop.set()
            outs = lg._collect(sh, procs, 30)
            errs = sorted({str(o.get("error")) for o in outs if o.get("error")},
                          key=lambda e: "BrokenBarrier" in e)
            result.error = f"setup failed: {type(exc).__name__}: {exc}" + \
                ("; workers: " + "; ".join(errs[:3]) if errs else "")
            return result
        t0 = time.time()
        gen0 = lg.workers_cpu(procs)
        expected: int | None = None
        last_count, last_change = -1, time.time()
        while True:
            time.sleep(0.01)  # the coordinator's sampling period, as in run_load
            now = time.time()
            if expected is None and sh.producers_done.value >= prod.producers:
                if sh.producers_done.value >= 1000:
                    break  # a producer failed
                expected = lg._expected(prod, list(sh.sent[:prod.producers]))
                last_change = now
            got = sh.received.value
            if got != last_count:
                last_count, last_change = got, now
            if expected is not None and got >= expected:
                break
            if expected is not None and now - last_change > prod.stall:
                result.notes.append(f"stalled: nothing received for {prod.stall:.0f}s")
                break
            if now - t0 > hard_timeout:
                result.notes.append(f"hard timeout after {hard_timeout:.0f}s")
                break
            if not any(p.is_alive() for p in procs):
                break
        result.gen_cpu_s = round(lg.workers_cpu(procs) - gen0, 3)
        if on_end:
            on_end()
        sh.stop.set()
        outs = lg._collect(sh, procs, 120)
        result.expected = expected if expected is not None else 0
    finally:
        sh.stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    lg.fill_result(result, outs)
    result.complete = result.error is None and result.received == result.expected \
        and result.sent > 0
    return result


# --------------------------------------------------------------------------- cases

@dataclass
class Case:
    topology: str
    persistent: bool
    count: int

    @property
    def key(self) -> str:
        return f"{self.topology}-{'p-w100' if self.persistent else 'np'}"


def _system_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    parts = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def _leftovers(nodes: list[Node], queue: str, persistent: bool
               ) -> tuple[dict[str, Any], list[str]]:
    """Per-broker queue and bridge counters after a run, and what looks wrong."""
    # Without always_sync_send a non-persistent message is settled when sent, so the
    # remote broker never acknowledges it.
    acked = persistent or CONNECTOR_EXTRA.get("always_sync_send", "true") != "false"
    snap: dict[str, Any] = {}
    problems: list[str] = []
    for node in nodes:
        st = node.stat()
        q = node.queue(queue, st)
        bridges = [{k: b.get(k) for k in ("name", "state", "forwarded", "acknowledged",
                                           "duplicates", "dropped", "received",
                                           "received_duplicates", "inflight", "demand",
                                           "last_error")} for b in node.bridges(st)]
        snap[node.name] = {"queue": {k: q.get(k) for k in ("depth", "enqueued", "dequeued",
                                                           "inflight", "consumers",
                                                           "redelivered")},
                           "bridges": bridges, "duplicates_dropped": st.get("duplicates_dropped")}
        if q.get("depth"):
            problems.append(f"{node.name}: {q['depth']} message(s) left on the queue")
        for b in bridges:
            if b["inflight"] or (acked and b["forwarded"] != b["acknowledged"]):
                problems.append(f"{node.name}: bridge {b['name']} forwarded {b['forwarded']}, "
                                f"acknowledged {b['acknowledged']}, in flight {b['inflight']}")
            if b["duplicates"] or b["received_duplicates"]:
                problems.append(f"{node.name}: bridge {b['name']} saw duplicates "
                                f"({b['duplicates']}/{b['received_duplicates']})")
    return snap, problems


def run_case(case: Case, root: Path, duration: float, profile: Path | None,
             rep: int) -> dict[str, Any]:
    name = f"net{os.getpid() % 10000}{case.key.replace('-', '')}r{rep}"
    work = Path(tempfile.mkdtemp(prefix=f"{case.key}-", dir=root))
    nodes: list[Node] = []
    samplers: list[RssSampler] = []
    spies: list[subprocess.Popen[bytes]] = []
    row: dict[str, Any] = {"case": case.key, "topology": case.topology,
                           "persistent": case.persistent, "rep": rep}
    try:
        nodes = build(case.topology, work)
        samplers = [RssSampler(lambda n=n: n.pid) for n in nodes]
        spec = lg.LoadSpec(host=HOST, port=nodes[0].stomp, producers=1, consumers=1,
                           size=256, persistent=case.persistent,
                           window=100 if case.persistent else 0, count=case.count,
                           duration=duration, name=name, stall=20.0, procs_per_role=1)
        queue = f"bench.{name}.0"
        cons = replace(spec, port=nodes[-1].stomp)
        cpu0: list[float] = []
        cpu1: list[float] = []
        ksys0: list[float] = []
        ksys1: list[float] = []
        sys0 = (0.0, 0.0)
        t_gate = 0.0

        def gate() -> None:
            nonlocal cpu0, sys0, t_gate
            t = time.monotonic()
            _wait_demand(nodes, queue, 30)
            t_gate = time.monotonic() - t
            for s in samplers:
                s.reset()
            if PERF is not None:
                PERF.mkdir(parents=True, exist_ok=True)
                for n in nodes:
                    spies.append(subprocess.Popen(
                        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-g",
                         "-p", str(n.pid), "-o", str(PERF / f"{case.key}-r{rep}-{n.name}.data")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if profile is not None:
                profile.mkdir(parents=True, exist_ok=True)
                for n in nodes:
                    out = profile / f"{case.key}-r{rep}-{n.name}.txt"
                    spies.append(subprocess.Popen(
                        [str(Path(sys.executable).parent / "py-spy"), "record", "--format",
                         "raw", "--rate", "200",
                         # mypyc's functions are native: seen only by pausing the broker.
                         *(["--native"] if PROFILE_NATIVE else ["--nonblocking"]),
                         "-p", str(n.pid), "-o", str(out)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            cpu0 = [n.cpu_s() for n in nodes]
            ksys0[:] = [n.sys_s() for n in nodes]
            sys0 = _system_busy()
            if CALLGRIND:
                for n in nodes:
                    n.callgrind("--zero")

        def on_end() -> None:
            if CALLGRIND and not cpu1:
                for n in nodes:
                    n.callgrind("--dump")
            cpu1.extend(n.cpu_s() for n in nodes)
            ksys1[:] = [n.sys_s() for n in nodes]

        t0 = time.monotonic()
        res = run_split_load(spec, cons, gate, hard_timeout=max(120.0, duration * 8) * (
                                 CALLGRIND_SLOWDOWN if CALLGRIND else 1),
                             on_end=on_end, cpus=PIN[3:5])
        wall = time.monotonic() - t0
        if not cpu1:
            on_end()
        cpu = [round(b - a, 3) for a, b in zip(cpu0, cpu1, strict=False)]
        ksys = [b - a for a, b in zip(ksys0, ksys1, strict=False)]
        busy, total = _system_busy()
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy and perf write their output on SIGINT
        for spy in spies:
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        # The consumer can have everything before the forwarding brokers have settled
        # the last acknowledgements: give them a moment, and say how long it took.
        t_settle = time.monotonic()
        try:
            poll(lambda: not _leftovers(nodes, queue, case.persistent)[1], 10,
                 "every broker to settle")
        except TimeoutError:
            pass
        settle_s = round(time.monotonic() - t_settle, 3)
        snap, problems = _leftovers(nodes, queue, case.persistent)
        if problems:
            problems.append(f"still so {settle_s:.0f} s after the consumer got its last "
                            "message")
        if res.received != res.expected:
            problems.insert(0, f"received {res.received} of {res.expected} expected")
        row.update(res.row())
        row.update({
            "demand_wait_s": round(t_gate, 3), "wall_s": round(wall, 1), "settle_s": settle_s,
            "brokers": [{"name": n.name, "peak_rss_mb": s.peak_mb(), "cpu_s": c,
                         "cpu_pct": round(100 * c / res.e2e_s, 1) if res.e2e_s else None,
                         "cpu_us_per_delivery": round(c * 1e6 / res.received, 2)
                         if res.received else None,
                         "sys_us_per_delivery": round(k * 1e6 / res.received, 2)
                         if res.received else None,
                         **({"instructions_per_delivery": round(
                             n.instructions_dumped() / res.received)}
                            if CALLGRIND and res.received else {})}
                        for n, s, c, k in zip(nodes, samplers, cpu, ksys, strict=False)],
            "gen_cpu_us_per_delivery": round(res.gen_cpu_s * 1e6 / res.received, 2)
            if res.received and res.gen_cpu_s is not None else None,
            "machine_busy_pct": round(100 * (busy - sys0[0]) / (total - sys0[1]), 1)
            if total > sys0[1] else None,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "after": snap, "problems": problems,
        })
        row["status"] = "ok" if res.complete and not problems else (
            "error" if res.error else "suspect")
        if row["status"] != "ok":
            for n in nodes:
                tail = n.log()[-1500:]
                if tail:
                    row.setdefault("logs", {})[n.name] = tail
        return row
    except Exception as exc:
        row.update({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
        try:
            row["after"] = {n.name: {"bridges": n.bridges(),
                                     "log_tail": n.log()[-1500:]} for n in nodes}
        except Exception as exc2:  # a broker is gone: say so, keep the first error
            row["after"] = f"cannot read stat: {exc2}"
        return row
    finally:
        for s in samplers:
            s.stop()
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
        for n in reversed(nodes):
            n.stop()
        shutil.rmtree(work, ignore_errors=True)


def cases(quick: bool) -> list[Case]:
    # Counts that take a single broker well under 20 s on 2 shared cores; a send phase
    # longer than --duration is cut (the run then reports the messages actually sent).
    np_count, p_count = (20_000, 5_000) if quick else (200_000, 100_000)
    return [Case(t, p, p_count if p else np_count)
            for p in (False, True) for t in ("single", "1hop", "2hop")]


# --------------------------------------------------------------------------- report

def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def use_revision(rev: str, root: Path) -> str:
    """Make the brokers run ``src/`` of commit ``rev`` (exported under ``root``), or the
    work tree for ``rev == "worktree"``; returns what is measured, for the results."""
    if rev == "worktree" and os.environ.get("MESHMQ_GIT_REV"):  # a tree with no history
        return os.environ["MESHMQ_GIT_REV"]
    if rev == "worktree":
        dirty = _git("status", "--porcelain", "src")
        return _git("rev-parse", "--short", "HEAD") + (" + uncommitted src changes"
                                                       if dirty else "")
    commit = _git("rev-parse", "--short", rev)
    export = root / "src-export"
    export.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive, check=True)
    BROKER_ENV["PYTHONPATH"] = str(export / "src")  # ahead of the editable install
    return commit


def median_run(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The repetition of ``key`` with the median e2e rate (the lower middle one of an
    even number), among the clean ones if there are any."""
    mine = [r for r in rows if r["case"] == key]
    pool = sorted([r for r in mine if r["status"] == "ok"] or mine,
                  key=lambda r: r.get("e2e_rate") or 0.0)
    return pool[(len(pool) - 1) // 2] if pool else None


def cpu_costs(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    """Per broker (forwarding order), the median over the repetitions of its CPU
    microseconds per message received by the consumer."""
    per: dict[int, list[float]] = {}
    for r in rows:
        if r["case"] == key and r.get("received"):
            for i, b in enumerate(r.get("brokers", [])):
                # cpu_us_per_msg: the name in result files written before the rename
                cost = b.get("cpu_us_per_delivery", b.get("cpu_us_per_msg"))
                if cost is not None:
                    per.setdefault(i, []).append(cost)
    out: list[float | None] = []
    for i in range(max(per, default=-1) + 1):
        vals = sorted(per.get(i, []))
        out.append(vals[(len(vals) - 1) // 2] if vals else None)
    return out


def ratio_interval(rows: list[dict[str, Any]], key: str, base_key: str,
                   level: float = 0.9, resamples: int = 2000) -> list[float] | None:
    """A bootstrap interval (``level``, percentile method) for the ratio of the median
    e2e rates of ``key`` and ``base_key``: how far the headline ratio could move with
    other repetitions of the same runs. None with fewer than 4 clean repetitions of
    either. Seeded: the same rows give the same interval."""
    def rates(k: str) -> list[float]:
        return [r["e2e_rate"] for r in rows
                if r["case"] == k and r["status"] == "ok" and r.get("e2e_rate")]
    mine, base = rates(key), rates(base_key)
    if len(mine) < 4 or len(base) < 4:
        return None
    def median(xs: list[float]) -> float:  # the lower middle one, as median_run's
        return sorted(xs)[(len(xs) - 1) // 2]

    rng = random.Random(0)
    ratios = sorted(median(rng.choices(mine, k=len(mine)))
                    / median(rng.choices(base, k=len(base)))
                    for _ in range(resamples))
    tail = (1 - level) / 2
    return [round(ratios[int(tail * resamples)], 2),
            round(ratios[int((1 - tail) * resamples) - 1], 2)]


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for persistent in (False, True):
        base_key = f"single-{'p-w100' if persistent else 'np'}"
        base = median_run(rows, base_key)
        base_cost = [c for c in cpu_costs(rows, base_key) if c is not None]
        for topology in TOPOLOGIES:
            key = f"{topology}-{'p-w100' if persistent else 'np'}"
            r = median_run(rows, key)
            if r is None:
                continue
            ratio = None
            if base and base.get("e2e_rate") and r.get("e2e_rate") and topology != "single":
                ratio = round(r["e2e_rate"] / base["e2e_rate"], 2)
            costs = cpu_costs(rows, key)
            known = [c for c in costs if c is not None]
            # With a core per broker the busiest broker sets the pace: the single
            # broker's cost over the network's busiest broker's is the ratio a machine
            # with spare cores would show (the load generator aside).
            projected = round(base_cost[0] / max(known), 2) \
                if base_cost and known and topology != "single" else None
            out.append({"case": key, "topology": topology, "persistent": persistent,
                        "status": r["status"], "e2e_rate": r.get("e2e_rate"),
                        "send_rate": r.get("send_rate"), "p50_ms": r.get("p50_ms"),
                        "p99_ms": r.get("p99_ms"), "received": r.get("received"),
                        "expected": r.get("expected"), "ratio": ratio,
                        "target_met": None if ratio is None else ratio >= TARGET,
                        "ratio_interval": None if topology == "single"
                        else ratio_interval(rows, key, base_key),
                        "all_e2e": [x.get("e2e_rate") for x in rows if x["case"] == key],
                        "cpu_us_per_delivery": costs,
                        "cpu_us_per_delivery_total": round(sum(known), 1) if known else None,
                        "gen_cpu_us_per_delivery": r.get("gen_cpu_us_per_delivery"),
                        "projected_ratio": projected,
                        "brokers": r.get("brokers", []),
                        "machine_busy_pct": r.get("machine_busy_pct"),
                        "problems": r.get("problems", []), "error": r.get("error")})
    return out


def _fmt(v: Any, nd: int = 0) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _extra(meta: dict[str, Any]) -> str:
    extra = meta.get("connector_extra") or {}
    return "".join(f", but `{k} = {v}`" for k, v in extra.items())


def _pinned(meta: dict[str, Any]) -> str:
    pin = meta.get("pinned_cpus") or []
    if not pin:
        return ""
    return (f" Brokers A, B, C pinned to CPUs {', '.join(map(str, pin[:3]))}, the load "
            f"workers to {', '.join(map(str, pin[3:]))}, the harness to the others.")


def write_markdown(path: Path, meta: dict[str, Any], summary: list[dict[str, Any]],
                   rows: list[dict[str, Any]]) -> None:
    target = meta.get("target", 0.8)
    lines = [f"# Bridge forwarding throughput ({meta['date']})", "",
             f"Command: `{meta['command']}` (see docs/benchmarks.md, *Networks of brokers*).",
             "",
             f"meshmq {meta['git']}, Python {meta['python']}, {meta['cpus']} CPUs shared with "
             "other work; brokers as subprocesses with `fsync = true`; STOMP queue, 1 producer "
             "/ 1 consumer, 256 B; non-persistent = fire and forget with one receipt at the "
             "end, persistent = `persistent:true` with a receipt window of 100. Bridges use "
             "the connector defaults (`prefetch_size` 1000, `always_sync_send` true, conduit "
             f"subscriptions){_extra(meta)}.{_pinned(meta)} Median of {meta['repeat']} interleaved "
             "repetitions by e2e rate (all of them in the last column; with 4 or more, *vs "
             "single* gives a 90 % bootstrap interval of the ratio). Target: network >= "
             f"{target}x the single broker's e2e rate.", "",
             "| case | topology | e2e msg/s | send msg/s | p50 ms | p99 ms | received/expected "
             f"| vs single | target {target}x | peak RSS MB (A/B/C) | broker CPU % (A/B/C) "
             "| broker CPU µs/delivery (A/B/C; kernel of the median run) "
             "| generator CPU µs/delivery "
             "| CPU-bound projection | machine busy % | e2e of every rep |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        rss = " / ".join(_fmt(b["peak_rss_mb"], 1) for b in s["brokers"])
        cpu = " / ".join(_fmt(b["cpu_pct"]) for b in s["brokers"])
        cost = " / ".join(_fmt(c, 1) for c in s.get("cpu_us_per_delivery",
                                                     s.get("cpu_us_per_msg", [])))
        kernel = [b.get("sys_us_per_delivery") for b in s["brokers"]]
        if any(k is not None for k in kernel):  # the median run's kernel share
            cost += " (kernel " + " / ".join(_fmt(k, 1) for k in kernel) + ")"
        gen = _fmt(s.get("gen_cpu_us_per_delivery"), 1)
        proj = "—" if s["projected_ratio"] is None else f"{s['projected_ratio']:.2f}x"
        target = "—" if s["target_met"] is None else ("met" if s["target_met"] else "**missed**")
        status = "" if s["status"] == "ok" else f" ({s['status']})"
        ratio = "—" if s["ratio"] is None else f"{s['ratio']:.2f}x"
        if s.get("ratio_interval"):
            lo, hi = s["ratio_interval"]
            ratio += f" ({lo:.2f}-{hi:.2f})"
        lines.append(
            f"| `{s['case']}`{status} | {TOPOLOGIES[s['topology']]} | {_fmt(s['e2e_rate'])} "
            f"| {_fmt(s['send_rate'])} | {_fmt(s['p50_ms'], 2)} | {_fmt(s['p99_ms'], 2)} "
            f"| {_fmt(s['received'])}/{_fmt(s['expected'])} "
            f"| {ratio} "
            f"| {target} | {rss} | {cpu} | {cost} | {gen} | {proj} | {_fmt(s['machine_busy_pct'])} "
            f"| {', '.join(_fmt(x) for x in s['all_e2e'])} |")
    problems = [(r["case"], r["rep"], p) for r in rows for p in r.get("problems", [])]
    errors = [(r["case"], r["rep"], r["error"]) for r in rows if r.get("error")]
    lines += ["", "## Checks", ""]
    if not problems and not errors:
        lines.append("Every repetition: all messages received, no queue depth left on any "
                     "broker, every bridge's forwarded = acknowledged with nothing in flight, "
                     "no duplicates.")
    for case, rep, p in problems + errors:
        lines.append(f"- `{case}` rep {rep}: {p}")
    lines += ["", "Broker CPU % is the broker's CPU time over the run's e2e time (100 = one "
              "core); machine busy % is the whole machine's (all CPUs) over the same span, "
              "with other users' processes included. Broker CPU µs/delivery is each broker's "
              "CPU time from the first send to the last receive per message delivered "
              "(median over the repetitions); it moves much less than the rates with the "
              "load others put on the machine, but still some (smaller batches when "
              "preempted). Generator CPU µs/delivery is the same for the load generator's "
              "processes. The CPU-bound "
              "projection is the single broker's µs/delivery over the busiest network broker's: "
              "the ratio to expect when every broker has a core of its own and the load "
              "generator another. Peak RSS is sampled every 0.1 s.", ""]
    path.write_text("\n".join(lines) + "\n")


def pin_cpus(spec: str, ap: argparse.ArgumentParser) -> list[int]:
    """The five CPUs of ``--cpus``: listed, or probed (``auto``)."""
    have = sorted(os.sched_getaffinity(0))
    if spec == "auto":
        import cpu_siblings
        chosen, probes = cpu_siblings.independent(have, 5, 0.3, 1.25)
        for p in probes:
            log(f"cpu probe: {p}")
        if len(chosen) < 5:
            ap.error(f"--cpus auto: only {len(chosen)} CPU(s) keep their speed together "
                     f"({chosen}); list five with --cpus")
        return chosen
    try:
        cpus = [int(c) for c in spec.split(",")]
    except ValueError:
        ap.error(f"--cpus {spec!r}: expected auto or five CPU numbers such as 0,2,4,6,8")
    if len(cpus) != 5 or not set(cpus) <= set(have):  # a CPU may be named twice: shared
        ap.error(f"--cpus {spec!r}: name five of the CPUs {have[0]}-{have[-1]}")
    return cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, one repetition")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (default 3, quick 1)")
    ap.add_argument("--duration", type=float, default=None,
                    help="cap on each send phase in seconds (default 15, quick 3)")
    ap.add_argument("--only", nargs="*", default=None, help="case keys, e.g. 1hop-np")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run py-spy (raw collapsed stacks) on every broker into this dir; "
                         "distorts the numbers, so results are not written")
    ap.add_argument("--profile-native", action="store_true",
                    help="with --profile: sample native frames too (a compiled build's "
                         "functions; pauses the brokers at each sample)")
    ap.add_argument("--callgrind", action="store_true",
                    help="run every broker under valgrind's callgrind and report each "
                         "broker's instructions per delivery (~50x slower: use --quick)")
    ap.add_argument("--out", default=None, help="results file stem (default <date>-network)")
    ap.add_argument("--connector", action="append", default=[], metavar="KEY=TOML",
                    help="extra connector setting, e.g. always_sync_send=false (repeatable)")
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="only rewrite the .md next to a results .json (no brokers run)")
    ap.add_argument("--rev", default="HEAD",
                    help="commit whose src/ the brokers run (default HEAD); 'worktree' = as is")
    ap.add_argument("--cpus", default=None, metavar="auto|LIST",
                    help="pin brokers A, B, C and the two load workers to these five CPUs "
                         "(e.g. 0,2,4,6,8); auto = five found by bench/cpu_siblings.py not "
                         "to slow each other (host hyperthreads on a virtual machine)")
    ap.add_argument("--perf", type=Path, default=None, metavar="DIR",
                    help="perf record (cpu-clock, call graphs) on every broker into DIR "
                         "(read with perf report -i); results not written")
    ap.add_argument("--count", type=int, default=None,
                    help="messages per non-persistent case (default 200000, quick 20000)")
    a = ap.parse_args()
    if a.cpus is not None:
        PIN[:] = pin_cpus(a.cpus, ap)
        rest = set(os.sched_getaffinity(0)) - set(PIN)
        if rest:
            os.sched_setaffinity(0, rest)
        log(f"pinned: brokers A, B, C on {PIN[:3]}, load workers on {PIN[3:]}, "
            f"harness on {sorted(rest) or 'the same'}")
    if a.render is not None:
        data = json.loads(a.render.read_text())
        write_markdown(a.render.with_suffix(".md"), data["meta"], data["summary"], data["runs"])
        return
    repeat = a.repeat or (1 if a.quick else 3)
    duration = a.duration or (3.0 if a.quick else 15.0)
    known = [c.key for c in cases(a.quick)]
    if a.out is not None and ("/" in a.out or a.out.endswith((".md", ".json"))):
        ap.error(f"--out {a.out}: give a file stem, written under {RESULTS} as .md and "
                 f".json (e.g. --out {Path(a.out).stem})")
    unknown = sorted(set(a.only or ()) - set(known))
    if unknown:
        ap.error(f"--only: unknown case(s) {', '.join(unknown)}; cases: {', '.join(known)}")
    todo = [c for c in cases(a.quick) if not a.only or c.key in a.only]
    if a.count is not None:
        todo = [replace(c, count=a.count) if not c.persistent else c for c in todo]
    global PROFILE_NATIVE, CALLGRIND, PERF
    PERF = a.perf
    PROFILE_NATIVE = a.profile_native
    CALLGRIND = a.callgrind
    if CALLGRIND and shutil.which("callgrind_control") is None:
        ap.error("--callgrind needs valgrind (apt-get install valgrind)")
    if PERF is not None and shutil.which("perf") is None:
        ap.error("--perf needs perf (apt-get install linux-perf)")
    for item in a.connector:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            ap.error(f"--connector {item!r}: expected KEY=VALUE")
        CONNECTOR_EXTRA[key.strip()] = value.strip()
    root = Path(tempfile.mkdtemp(prefix="meshmq-netbench-"))
    rows: list[dict[str, Any]] = []
    measured = use_revision(a.rev, root)
    log(f"brokers run meshmq {measured}")

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for rep in range(1, repeat + 1):
            for case in todo:
                log(f"{case.key} rep {rep}/{repeat}: {case.count} messages")
                row = run_case(case, root, duration, a.profile, rep)
                rows.append(row)
                brokers = row.get("brokers", [])
                log(f"  {row['status']}: e2e {row.get('e2e_rate')} msg/s, "
                    f"p50 {row.get('p50_ms')} p99 {row.get('p99_ms')} ms, "
                    f"{row.get('received')}/{row.get('expected')}, "
                    f"demand wait {row.get('demand_wait_s')} s, settle {row.get('settle_s')} s, "
                    f"cpu {[b['cpu_pct'] for b in brokers]} % "
                    f"µs/delivery {[b.get('cpu_us_per_delivery') for b in brokers]} "
                    f"of it kernel {[b.get('sys_us_per_delivery') for b in brokers]} "
                    + (f"instructions/delivery "
                       f"{[b.get('instructions_per_delivery') for b in row['brokers']]} "
                       if CALLGRIND and row.get("brokers") else "")
                    + f"{row.get('problems') or ''} {row.get('error') or ''}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarise(rows)
    for s in summary:
        log(f"{s['case']:>12}: {s['e2e_rate']} msg/s, ratio {s['ratio']}, "
            f"target met {s['target_met']}")
    if a.profile is not None or a.perf is not None:
        log(f"profiles in {a.profile or a.perf}; results not written (profilers distort them)")
        return
    today = dt.date.today().isoformat()
    stem = a.out or f"{today}-network{'-quick' if a.quick else ''}"
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "git": measured,
            "python": platform.python_version(), "cpus": os.cpu_count(), "repeat": repeat,
            "duration_cap_s": duration, "quick": a.quick, "target": TARGET,
            "connector_extra": CONNECTOR_EXTRA, "pinned_cpus": PIN,
            "command": "python bench/network_bench.py" + (" --quick" if a.quick else "")
            + "".join(f" --connector {k}={v}" for k, v in CONNECTOR_EXTRA.items())
            + (f" --cpus {a.cpus}" if a.cpus else "")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "runs": rows}, indent=1) + "\n")
    write_markdown(RESULTS / f"{stem}.md", meta, summary, rows)
    log(f"wrote {RESULTS / stem}.md and .json")


if __name__ == "__main__":
    main()
