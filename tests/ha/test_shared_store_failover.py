"""Shared-store master/slave with real broker processes: SIGKILL under load, SIGSTOP past
the lease, graceful handover, and a slave that opens no client connectors."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import psutil
import pytest

from meshmq.core import trace as tr
from meshmq.ha.file_lease import FileLease
from meshmq.transport.runtime import EXIT_DEPOSED
from tests.ha.support import (
    SHARED,
    FailoverConsumer,
    FailoverProducer,
    HaProcess,
    accepts,
    connect,
    drain,
    write_config,
)
from tests.support.brokers import poll
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


def pair(tmp_path: Path, ha: str = SHARED) -> tuple[Callable[[str], HaProcess], list[int]]:
    """A factory of brokers on one shared data directory, each on its own fixed port."""
    data = tmp_path / "data"
    ports = {"a": free_port(), "b": free_port()}

    def make(name: str) -> HaProcess:
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=data, ha=ha,
                           stomp_port=ports[name])
        return HaProcess(cfg, tmp_path / f"{name}.log")

    return make, [ports["a"], ports["b"]]


def check_delivery(bodies: list[str], producer: FailoverProducer) -> None:
    """Zero confirmed messages lost, nothing invented, duplicates only from re-sends of
    sends left in doubt, order per producer kept."""
    report = producer.report
    sent = {f"{producer.prefix}-{n:06d}" for n in range(producer.sent + 1)}
    invented = [b for b in bodies if b not in sent]
    assert not invented, f"never sent: {invented[:5]}"
    missing = report.confirmed - set(bodies)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
    duplicates = len(bodies) - len(set(bodies))
    assert duplicates <= report.in_doubt_resends, \
        f"{duplicates} duplicates but only {report.in_doubt_resends} in-doubt re-sends"
    first_seen = list(dict.fromkeys(bodies))
    assert first_seen == sorted(first_seen), "order per producer was not kept"


def check_consumed(producer: FailoverProducer, consumer: FailoverConsumer,
                   drained: list[str]) -> None:
    """With a consumer acking through the failover too: every confirmed message was
    consumed or is still queued, an ack the broker confirmed is never undone, and
    duplicates come only from in-doubt sends and deliveries whose ack was not confirmed."""
    received = consumer.report.received
    seen = received + drained
    sent = {f"{producer.prefix}-{n:06d}" for n in range(producer.sent + 1)}
    assert not [b for b in seen if b not in sent], "a message that was never sent"
    missing = producer.report.confirmed - set(seen)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
    came_back = consumer.report.acked & set(drained)
    assert not came_back, f"acknowledged messages came back: {sorted(came_back)[:5]}"
    unconfirmed_acks = len(received) - len(consumer.report.acked)
    duplicates = len(seen) - len(set(seen))
    assert duplicates <= producer.report.in_doubt_resends + unconfirmed_acks, \
        (duplicates, producer.report.in_doubt_resends, unconfirmed_acks)


def test_sigkill_master_under_load_then_old_master_returns_as_slave(tmp_path: Path) -> None:
    make, ports = pair(tmp_path)
    a = make("a").start().wait_master()
    b = make("b").start().wait_slave()
    producer = FailoverProducer(lambda: ports, "/queue/ha")
    producer.start()
    consumer = FailoverConsumer(lambda: ports, "/queue/ha")
    consumer.start()
    poll(lambda: len(producer.report.confirmed) >= 200 or producer.fatal, 60,
         "200 confirmed sends on the master")
    a.kill9()
    killed = time.monotonic()
    poll(lambda: accepts(ports[1]), 30, "the slave to accept connections")
    took = time.monotonic() - killed
    before = len(producer.report.confirmed)
    poll(lambda: len(producer.report.confirmed) >= before + 200 or producer.fatal, 60,
         "200 more confirmed sends on the new master")
    acked = len(consumer.report.acked)
    poll(lambda: len(consumer.report.acked) >= acked + 50 or consumer.fatal, 60,
         "the consumer to carry on with the new master")
    assert producer.fatal is None and consumer.fatal is None
    assert any(port == ports[1] for _, port in producer.report.failovers)
    assert consumer.connections >= 2

    # The old master comes back as a slave of the new one, with no connectors open.
    a = make("a").start().wait_slave()
    assert not accepts(ports[0])
    assert a.stat()["ha"]["role"] == "slave"
    assert b.stat()["ha"] | {"renewals": 0} == b.stat()["ha"] | {
        "role": "master", "epoch": 2, "lease_epoch": 2, "renewals": 0}
    assert str(b.stat()["ha"]["took_over_from"]).startswith("a@")  # a was killed
    producer.stop.set()
    producer.join(30)
    consumer.stop.set()
    consumer.join(30)
    assert producer.fatal is None and consumer.fatal is None

    # Graceful stop of the new master: the returned one takes over at once (the lease
    # was handed back, not left to expire) and serves everything from the shared store.
    assert b.terminate() == 0
    a.wait_master()
    assert "took the shared lease at epoch 3 (it was free)" in a.text()
    bodies = drain(ports[0], "/queue/ha")
    check_consumed(producer, consumer, bodies)
    assert a.terminate() == 0
    print(f"takeover after SIGKILL: {took:.3f}s; {len(producer.report.confirmed)} confirmed, "
          f"{producer.report.in_doubt_resends} re-sent, {len(consumer.report.acked)} acked, "
          f"{len(bodies)} left")


def test_paused_master_cannot_write_after_its_lease_was_taken(tmp_path: Path) -> None:
    make, ports = pair(tmp_path)
    a = make("a").start().wait_master()
    b = make("b").start().wait_slave()
    old, old_rec = connect(ports[0])
    old.send("/queue/p", "before", headers={"persistent": "true"}, receipt="before")
    poll(lambda: "before" in old_rec.receipts, 30, "the receipt before the pause")

    a.signal(signal.SIGSTOP)
    try:
        b.wait_master()  # after the lease ran out: a's process still holds its alive lock
        assert "let it expire" in b.text()
        # A client of the paused master sends; the frame waits in a's socket buffer.
        old.send("/queue/p", "from-the-deposed", headers={"persistent": "true"},
                 receipt="deposed")
        new, new_rec = connect(ports[1])
        new.send("/queue/p", "on-new-master", headers={"persistent": "true"},
                 receipt="new")
        poll(lambda: "new" in new_rec.receipts, 30, "the new master's receipt")
    finally:
        a.signal(signal.SIGCONT)
    # a wakes up, finds the lease gone, refuses the write, closes and becomes a slave.
    poll(lambda: old_rec.disconnected or bool(old_rec.errors), 30,
         "the deposed master to drop its client")
    assert "deposed" not in old_rec.receipts
    poll(lambda: "restarting as a slave" in a.text(), 30, "the deposed master to restart")
    a.wait_slave()
    assert not accepts(ports[0])
    assert "deposed:" in a.text() or "store refused a write" in a.text()
    new.disconnect()
    assert drain(ports[1], "/queue/p") == ["before", "on-new-master"]
    assert b.terminate() == 0
    a.wait_master()
    assert a.terminate() == 0


def test_slave_opens_no_connectors_and_reports_its_role(tmp_path: Path) -> None:
    make, _ = pair(tmp_path)
    a = make("a").start().wait_master()
    b = make("b").start().wait_slave()
    assert b.alive()
    assert b.proc is not None
    listening = {c.laddr.port for c in psutil.Process(b.proc.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {b.management_port}, "a slave listens only for management"
    assert "listening for" not in b.text()
    stat = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
         f"127.0.0.1:{b.management_port}"], capture_output=True, text=True, timeout=30,
        check=True).stdout
    assert "role slave  ha shared  epoch 0  lease held by a@" in stat
    assert a.stat()["ha"]["role"] == "master"
    # A slave stops at once on SIGTERM; the master keeps its lease.
    assert b.terminate() == 0
    assert a.stat()["ha"]["epoch"] == 1
    assert a.terminate() == 0


def test_deposed_master_exits_when_it_may_not_restart(tmp_path: Path) -> None:
    make, ports = pair(tmp_path, ha=SHARED + "\nrestart_when_deposed = false")
    a = make("a").start().wait_master()
    # A slave elsewhere judged the lease expired and took it.
    intruder = FileLease(tmp_path / "data" / "journal", "intruder")
    assert intruder.try_acquire(intruder.look().record) == 2
    poll(lambda: not a.alive(), 30, "the deposed master to exit")
    assert a.terminate() == EXIT_DEPOSED  # already exited: only collects the status
    assert "deposed: another broker took the lease over" in a.text()
    assert not accepts(ports[0])
    intruder.close()


def test_paused_master_under_write_load_is_replaced_and_the_new_master_keeps_its_lease(
        tmp_path: Path) -> None:
    """SIGSTOP a master while four producers keep its journal writer busy: a slave takes
    over once the lease ran out, whatever the paused writer was doing (takeover needs no
    lock the paused process holds). The new master then drains a backlog with one ack per
    message and never misses a renewal (renewals do not queue behind store work)."""
    ha = 'mode = "shared"\nlease_ms = 1000\nkeepalive_ms = 300\nacquire_interval_ms = 50'
    data = tmp_path / "data"
    ports = [free_port(), free_port()]

    def make(name: str, port: int) -> HaProcess:
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=data, ha=ha,
                           stomp_port=port, fsync=True)
        return HaProcess(cfg, tmp_path / f"{name}.log")

    a = make("a", ports[0]).start().wait_master()
    b = make("b", ports[1]).start().wait_slave()
    backlog = 20000
    loader, loader_rec = connect(ports[0])
    for n in range(backlog):
        loader.send("/queue/backlog", f"b-{n:06d}" + "x" * 190,
                    headers={"persistent": "true"})
    loader.send("/queue/backlog", "loaded", headers={"persistent": "true"},
                receipt="loaded")
    poll(lambda: "loaded" in loader_rec.receipts, 60, "the backlog to be stored")
    loader.disconnect()

    targets = list(ports)
    producers = [FailoverProducer(lambda: list(targets), f"/queue/w{i}", prefix=f"p{i}")
                 for i in range(4)]
    for producer in producers:
        producer.start()
    poll(lambda: all(len(p.report.confirmed) >= 30 for p in producers)
         or any(p.fatal for p in producers), 60, "30 confirmed sends from each producer")
    # And one connection pipelining 4 KB sends: the writer is never idle.
    flood, _ = connect(ports[0])
    flooding = threading.Event()

    def flood_sends() -> None:
        with contextlib.suppress(Exception):
            while True:
                flood.send("/queue/flood", "f" * 4096, headers={"persistent": "true"})
                flooding.set()

    threading.Thread(target=flood_sends, daemon=True).start()
    poll(flooding.is_set, 30, "the pipelined sends to start")

    a.signal(signal.SIGSTOP)
    paused = time.monotonic()
    targets.remove(ports[0])  # the producers' failover list: the paused one never answers
    try:
        b.wait_master(timeout=10)
        took = time.monotonic() - paused
    finally:
        a.signal(signal.SIGCONT)
    assert "let it expire" in b.text()
    poll(lambda: "restarting as a slave" in a.text(), 30, "the deposed master to restart")
    a.wait_slave()

    # The new master drains the backlog, one client-individual ack per message.
    conn, rec = connect(ports[1])
    conn.subscribe("/queue/backlog", id="s", ack="client-individual",
                   headers={"activemq.prefetchSize": "500"})
    acked = 0
    deadline = time.monotonic() + 120
    while acked <= backlog and time.monotonic() < deadline:
        with rec.cond:
            rec.cond.wait_for(lambda n=acked: len(rec.messages) > n, 1)
            frames = rec.messages[acked:]
        for frame in frames:
            conn.ack(frame.headers["ack"])
        acked += len(frames)
    conn.disconnect()
    assert acked == backlog + 1, f"{acked} of {backlog + 1} backlog messages drained"
    assert "deposed" not in b.text() and "renewal failed" not in b.text(), b.text()
    assert b.stat()["ha"]["role"] == "master"

    for producer in producers:
        producer.stop.set()
    for producer in producers:
        producer.join(30)
        assert producer.fatal is None
        check_delivery(drain(ports[1], producer.destination), producer)
    assert b.terminate() == 0
    assert a.terminate() == 0
    print(f"takeover of a paused master under write load: {took:.3f}s (lease 1.000s)")


def test_the_slaves_trace_names_the_master_it_took_over_from(tmp_path: Path) -> None:
    """Brokers of a pair may have different names: the slave's ``broker_started`` names
    the lease holder it succeeded after the master's SIGKILL, so the audit ends the
    master's run at the takeover."""
    make, _ports = pair(tmp_path, ha=SHARED)
    trace_dir = tmp_path / "trace"
    brokers = {}
    for name in ("a", "b"):
        proc = make(name)
        with proc.config_path.open("a") as f:
            f.write(f'\n[trace]\nenabled = true\ndirectory = "{trace_dir}"\n'
                    "flush_interval_ms = 1\n")
        brokers[name] = proc
    a, b = brokers["a"].start().wait_master(), brokers["b"].start().wait_slave()

    def starts() -> dict[str, dict[str, str]]:
        found = {}
        for path in sorted(trace_dir.glob("*.jsonl*")):
            for row in map(tr.decode_jsonl_line, path.read_text().splitlines()):
                if row["event"] == tr.BROKER_STARTED:
                    found[str(row["broker"])] = dict(
                        field.split("=", 1) for field in str(row["reason"]).split())
        return found

    try:
        poll(lambda: "a" in starts(), 10, "a's start in the trace")
        assert "b" not in starts()  # a slave traces nothing
        a.kill9()
        b.wait_master()
        poll(lambda: "b" in starts(), 10, "b's start in the trace")
    finally:
        b.terminate()
    fields = starts()
    assert "took_over" not in fields["a"]  # the lease was free
    holder = unquote(fields["a"]["holder"])
    assert holder.startswith("a@") and unquote(fields["b"]["holder"]).startswith("b@")
    assert unquote(fields["b"]["took_over"]) == holder
    assert f"({holder} is gone)" in b.text()
