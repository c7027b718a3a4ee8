"""Takeover time after ``kill -9`` of the master, meshmq and ActiveMQ side by side.

For each pair: start the master, then the slave on the same store, wait until the slave
is really waiting, SIGKILL the master's process group, and measure on the wall clock:

* ``accept``: until the slave's STOMP port accepts a TCP connection;
* ``receipt``: until a persistent SEND on it is confirmed by a RECEIPT (the broker
  recovered the store and serves).

Pairs:

* ``meshmq-shared``: two meshmq brokers on one journal directory (``[ha] mode = "shared"``,
  every HA setting at its default);
* ``meshmq-database``: two meshmq brokers on a PostgreSQL store with the database lease
  (defaults: lease 5 s), if PostgreSQL is installed (private cluster, as the tests do);
* ``meshmq-replicated``: two meshmq brokers, each with its own journal, plus a witness
  (``[ha] mode = "replicated"``, ``lease_ms = 1000``, ``keepalive_ms = 200`` as
  docs/ha.md recommends for it; synchronous replication);
* ``activemq-shared``: two ActiveMQ brokers on one KahaDB directory (ActiveMQ's shared
  file locker, its defaults: ``lockAcquireSleepInterval`` 10 s), if ActiveMQ is installed.

Run by hand (a few minutes): ``.venv/bin/python bench/takeover.py --rounds 5``. Results go
to ``bench/results/<date>-takeover.{json,md}``. Each round pre-loads 1000 persistent
messages so the new master has something to recover.

``--load``: one connection pipelines persistent 1 KB sends to the master while it is
stopped, so the journal writer and the replication streams are busy at that moment.
``--graceful``: stop the master with SIGTERM instead of SIGKILL (a handover: the shared
lease is released, a replicated master resigns) and measure from the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import ACTIVEMQ_HOME, ACTIVEMQ_XML, HOST, ActiveMQ, free_ports, port_accepts

RESULTS = Path(__file__).resolve().parent / "results"
PRELOAD = 1000


def stomp_frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\0"


def read_frame(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\0" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        buf.extend(data)
    end = buf.index(b"\0")
    frame = bytes(buf[:end]).lstrip(b"\r\n")
    del buf[:end + 1]
    return frame


def send_with_receipts(port: int, count: int, timeout: float = 10.0) -> None:
    """``count`` persistent SENDs, each waiting for its RECEIPT (raw STOMP 1.2)."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        buf = bytearray()
        sock.sendall(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        reply = read_frame(sock, buf)
        if not reply.startswith(b"CONNECTED"):
            raise ConnectionError(reply[:200].decode(errors="replace"))
        for i in range(count):
            sock.sendall(stomp_frame("SEND", {"destination": "/queue/takeover",
                                              "persistent": "true", "receipt": f"r{i}"},
                                     b"x" * 100))
            reply = read_frame(sock, buf)
            if not reply.startswith(b"RECEIPT"):
                raise ConnectionError(reply[:200].decode(errors="replace"))


def first_receipt(port: int, deadline: float) -> float:
    while True:
        try:
            send_with_receipts(port, 1, timeout=2.0)
            return time.perf_counter()
        except OSError:
            if time.perf_counter() > deadline:
                raise
            time.sleep(0.005)


class Node:
    """One broker process of a pair."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.cmd, self.env, self.log, self.cwd = cmd, env, log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                     cwd=self.cwd, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def wait_for(pred: object, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not pred():  # type: ignore[operator]
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------- meshmq pairs

def meshmq_pair(work: Path, store: str, ha: str) -> tuple[Node, Node, list[int]]:
    ports = free_ports(2)
    nodes = []
    for name, port in zip(("a", "b"), ports, strict=True):
        cfg = work / f"{name}.toml"
        cfg.write_text(f"""[broker]
name = "{name}"
data_directory = "{work / name}"

[[listeners]]
name = "stomp"
url = "stomp://{HOST}:{port}"

[store]
directory = "{work / 'shared-journal'}"
fsync = true
{store}

[management]
enabled = false

[ha]
{ha}
""")
        nodes.append(Node([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                           str(cfg)], {"PYTHONUNBUFFERED": "1"}, work / f"{name}.log", work))
    return nodes[0], nodes[1], ports


def meshmq_round(work: Path, store: str, ha: str) -> dict[str, float]:
    a, b, ports = meshmq_pair(work, store, ha)
    try:
        a.start()
        wait_for(lambda: port_accepts(ports[0]), 60, "the master")
        send_with_receipts(ports[0], PRELOAD)
        b.start()
        wait_for(lambda: "slave: the" in b.text(), 60, "the slave to wait")
        return measure(a, ports[1], ports[0])
    finally:
        a.kill()
        b.kill()


LOAD = False
GRACEFUL = False


def flood(port: int, stop: threading.Event) -> None:
    """Pipelined persistent sends, no receipts, until the broker goes or ``stop``."""
    with contextlib.suppress(OSError), socket.create_connection((HOST, port)) as sock:
        buf = bytearray()
        sock.sendall(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
        read_frame(sock, buf)
        frame = stomp_frame("SEND", {"destination": "/queue/flood", "persistent": "true"},
                            b"f" * 1024)
        while not stop.is_set():
            sock.sendall(frame * 16)


def measure(master: Node, slave_port: int, master_port: int) -> dict[str, float]:
    stop = threading.Event()
    if LOAD:
        threading.Thread(target=flood, args=(master_port, stop), daemon=True).start()
        time.sleep(1.0)  # the load is running when the master stops
    t0 = time.perf_counter()
    if GRACEFUL:
        assert master.proc is not None
        master.proc.send_signal(signal.SIGTERM)
    else:
        master.kill()
    killed = time.perf_counter()
    stop.set()
    while not port_accepts(slave_port, timeout=0.05):
        if time.perf_counter() - t0 > 120:
            raise RuntimeError("the slave never took over")
        time.sleep(0.002)
    accept = time.perf_counter()
    receipt = first_receipt(slave_port, killed + 120)
    return {"accept_s": accept - killed, "receipt_s": receipt - killed}


def replicated_round(work: Path) -> dict[str, float]:
    stomp = free_ports(2)
    repl = free_ports(3)
    names = ("a", "b", "w")
    addr = {n: f"{HOST}:{p}" for n, p in zip(names, repl, strict=True)}
    nodes: dict[str, Node] = {}
    for i, name in enumerate(names):
        members = ", ".join(f'"{addr[o]}"' for o in names if o != name)
        listener = (f'[[listeners]]\nname = "stomp"\nurl = "stomp://{HOST}:{stomp[i]}"\n'
                    if name != "w" else "")
        cfg = work / f"{name}.toml"
        cfg.write_text(f"""[broker]
name = "{name}"
data_directory = "{work / name}"

{listener}
[store]
fsync = true

[management]
enabled = false

[ha]
mode = "replicated"
listen = "{addr[name]}"
members = [{members}]
lease_ms = 1000
keepalive_ms = 200
{'role = "witness"' if name == "w" else ""}
""")
        nodes[name] = Node([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                            str(cfg)], {"PYTHONUNBUFFERED": "1"}, work / f"{name}.log", work)
    a, b, w = nodes["a"], nodes["b"], nodes["w"]
    try:
        a.start()
        w.start()
        wait_for(lambda: port_accepts(stomp[0]), 60, "the master")
        send_with_receipts(stomp[0], PRELOAD)
        b.start()
        # Caught up: it has applied the master's batches up to the preload.
        wait_for(lambda: "slave: following" in b.text(), 60, "the slave to follow")
        send_with_receipts(stomp[0], 1)  # confirmed => on b's disk (majority of a, b, w)
        return measure(a, stomp[1], stomp[0])
    finally:
        for n in (a, b, w):
            n.kill()


# ------------------------------------------------------------------- ActiveMQ pair

def activemq_round(work: Path) -> dict[str, float]:
    shared = work / "shared"
    nodes = []
    ports = []
    for name in ("a", "b"):
        amq = ActiveMQ(work / name)
        amq.workdir.mkdir(parents=True, exist_ok=True)
        amq.configure()
        xml = ACTIVEMQ_XML.format(data=amq.workdir / "data", host=HOST, **amq.ports)
        # Both brokers on one KahaDB directory: ActiveMQ's shared file locker decides.
        xml = xml.replace(f'directory="{amq.workdir / "data"}/kahadb"',
                          f'directory="{shared}/kahadb"')
        (amq.workdir / "conf" / "activemq.xml").write_text(xml)
        # The locker says "... slave mode waiting a lock ..." at INFO.
        with (amq.workdir / "conf" / "log4j.properties").open("a") as fh:
            fh.write("log4j.logger.org.apache.activemq.store=INFO\n")
        with (amq.workdir / "conf" / "log4j2.properties").open("a") as fh:
            fh.write("logger.locker.name = org.apache.activemq.store\n"
                     "logger.locker.level = INFO\n")
        (amq.workdir / "tmp").mkdir(exist_ok=True)
        cmd, env = amq.command()
        nodes.append(Node(cmd, env, amq.workdir / "broker.log", amq.workdir))
        ports.append(amq.ports["stomp"])
    a, b = nodes
    try:
        a.start()
        wait_for(lambda: port_accepts(ports[0]), 120, "the ActiveMQ master")
        send_with_receipts(ports[0], PRELOAD)
        b.start()
        # The slave logs this once it found the lock taken.
        wait_for(lambda: "slave" in b.text().lower() or "locked" in b.text().lower(), 120,
                 "the ActiveMQ slave to wait for the lock")
        return measure(a, ports[1], ports[0])
    finally:
        a.kill()
        b.kill()


# ------------------------------------------------------------------- main

def summarize(samples: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("accept_s", "receipt_s"):
        values = [s[key] for s in samples]
        out[f"{key}_median"] = statistics.median(values)
        out[f"{key}_min"] = min(values)
        out[f"{key}_max"] = max(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["meshmq-shared", "meshmq-database",
                                           "meshmq-replicated", "activemq-shared"],
                        action="append")
    parser.add_argument("--load", action="store_true",
                        help="pipelined persistent sends to the master while it stops")
    parser.add_argument("--graceful", action="store_true",
                        help="SIGTERM (a handover) instead of SIGKILL")
    args = parser.parse_args()
    global LOAD, GRACEFUL
    LOAD, GRACEFUL = args.load, args.graceful
    wanted = args.only or ["meshmq-shared", "meshmq-database", "meshmq-replicated",
                           "activemq-shared"]
    results: dict[str, object] = {"date": datetime.datetime.now(datetime.UTC).isoformat(),
                                  "rounds": args.rounds, "preload": PRELOAD, "pairs": {}}
    pairs: dict[str, object] = results["pairs"]  # type: ignore[assignment]
    cluster = None
    for pair in wanted:
        samples: list[dict[str, float]] = []
        skipped = None
        if pair == "activemq-shared" and not (ACTIVEMQ_HOME / "bin" / "activemq.jar").exists():
            skipped = "ActiveMQ not installed"
        if pair == "meshmq-database":
            try:
                from tests.support.postgres import PostgresCluster, _bindir

                bindir = _bindir()
                if bindir is None:
                    skipped = "PostgreSQL not installed"
                elif cluster is None:
                    cluster = PostgresCluster(bindir).start()
            except ImportError as exc:
                skipped = f"needs psycopg: {exc}"
        for i in range(args.rounds if skipped is None else 0):
            with tempfile.TemporaryDirectory(prefix=f"takeover-{pair}-") as tmp:
                work = Path(tmp)
                if pair == "meshmq-shared":
                    sample = meshmq_round(work, "", 'mode = "shared"')
                elif pair == "meshmq-database":
                    assert cluster is not None
                    dsn = cluster.create_database()
                    sample = meshmq_round(work, f'kind = "postgres"\ndsn = "{dsn}"',
                                          'mode = "database"')
                elif pair == "meshmq-replicated":
                    sample = replicated_round(work)
                else:
                    sample = activemq_round(work)
            print(f"{pair} round {i + 1}: accept {sample['accept_s']:.3f}s, "
                  f"receipt {sample['receipt_s']:.3f}s", flush=True)
            samples.append(sample)
        pairs[pair] = {"skipped": skipped} if skipped else {
            "samples": samples, **summarize(samples)}
    if cluster is not None:
        cluster.stop()
    RESULTS.mkdir(exist_ok=True)
    suffix = "-" + "-".join(args.only) if args.only else ""
    suffix += ("-load" if LOAD else "") + ("-graceful" if GRACEFUL else "")
    stem = RESULTS / f"{datetime.date.today().isoformat()}-takeover{suffix}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    how = "SIGTERM (graceful handover)" if GRACEFUL else "kill -9"
    lines = [f"# Takeover after {how} of the master{' under write load' if LOAD else ''} "
             f"({results['date'][:19]}Z)", "",
             f"{args.rounds} rounds per pair, {PRELOAD} persistent messages in the store; "
             "command: `.venv/bin/python bench/takeover.py --rounds "
             f"{args.rounds}{''.join(f' --only {p}' for p in args.only or [])}"
             f"{' --load' if LOAD else ''}{' --graceful' if GRACEFUL else ''}`.", "",
             "| pair | accepting (median, min-max) | first receipt (median, min-max) |",
             "|---|---|---|"]
    for pair, data in pairs.items():
        assert isinstance(data, dict)
        if "skipped" in data:
            lines.append(f"| {pair} | skipped: {data['skipped']} | |")
            continue
        lines.append(
            f"| {pair} | {data['accept_s_median']:.3f} s ({data['accept_s_min']:.3f}-"
            f"{data['accept_s_max']:.3f}) | {data['receipt_s_median']:.3f} s "
            f"({data['receipt_s_min']:.3f}-{data['receipt_s_max']:.3f}) |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
