"""A node of shards as one member of a ``shared`` master/slave pair, with real processes:
two ``--shards 2`` nodes on one data directory, the master's supervisor killed with
SIGKILL under failover producers and consumers, and a paused master node fenced."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from stomp.utils import Frame

from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.ha.support import (
    SHARED,
    FailoverConsumer,
    FailoverProducer,
    HaProcess,
    Recorder,
    accepts,
    connect,
)
from tests.support.brokers import poll
from tests.support.nodes import pid_gone
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

_NODE_MANAGEMENT = re.compile(r"management endpoint of the node on http://[\d.]+:(\d+)/")


def queue_owned_by(shard: int, prefix: str) -> str:
    n = 0
    while owner(Destination.parse_uri(f"queue://{prefix}.{n}"), 2) != shard:
        n += 1
    return f"/queue/{prefix}.{n}"


class HaNode(HaProcess):
    """A ``--shards 2`` node that may start as the slave of a shared pair."""

    def wait_master(self, timeout: float = 60, times: int = 1) -> HaNode:
        """Until the node started its shards as master (the ``times``-th time)."""
        def ready() -> bool:
            self._check_alive()
            return self.text().count(" started: 2 shards on ") >= times
        poll(ready, timeout, "the node to become master")
        return self

    def role(self) -> str | None:
        try:
            return str(self.stat()["ha"]["role"])
        except OSError:  # between two runs of its supervisor
            return None

    @property
    def management_port(self) -> int:
        found = _NODE_MANAGEMENT.findall(self.text())
        assert found, "no management endpoint"
        return int(found[-1])

    def shard_processes(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children()


def write_node(path: Path, *, name: str, data: Path, port: int, ha: str = SHARED) -> Path:
    path.write_text(f"""
[broker]
name = "{name}"
data_directory = "{data}"
shards = 2

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{port}"

[store]
fsync = false

[management]
host = "127.0.0.1"
port = 0

[ha]
{ha}
""")
    return path


def pair(tmp_path: Path, ha: str = SHARED) -> tuple[dict[str, HaNode], list[int]]:
    data = tmp_path / "data"
    ports = [free_port(), free_port()]
    nodes = {name: HaNode(write_node(tmp_path / f"{name}.toml", name=name, data=data,
                                     port=port, ha=ha), tmp_path / f"{name}.log")
             for name, port in zip("ab", ports, strict=True)}
    return nodes, ports


class RecordingConsumer(FailoverConsumer):
    """Also keeps every delivery's message id and redelivered flag."""

    def __init__(self, ports: Any, destination: str) -> None:
        super().__init__(ports, destination)
        self.deliveries: list[tuple[str, str, bool]] = []  # (message-id, body, redelivered)

    def _next(self, rec: Recorder, seen: int) -> tuple[list[Frame], bool]:  # type: ignore[override]
        frames, broken = FailoverConsumer._next(rec, seen)
        self.deliveries.extend(delivery(f) for f in frames)
        return frames, broken


def delivery(frame: Frame) -> tuple[str, str, bool]:
    return (frame.headers["message-id"], frame.body,
            frame.headers.get("redelivered") == "true")


def drain(port: int, destination: str) -> list[tuple[str, str, bool]]:
    """Every message left on ``destination`` (up to a marker sent last)."""
    conn, rec = connect(port)
    conn.send(destination, "END", headers={"persistent": "true"}, receipt="marker")
    poll(lambda: "marker" in rec.receipts, 30, "the marker's receipt")
    conn.subscribe(destination, id="d", ack="auto")

    def has_marker() -> bool:
        with rec.cond:
            return any(m.body == "END" for m in rec.messages)

    poll(has_marker, 60, "the marker message")
    with rec.cond:
        frames = [f for f in rec.messages if f.body != "END"]
    conn.disconnect()
    return [delivery(f) for f in frames]


def check(producer: FailoverProducer, consumer: RecordingConsumer,
          drained: list[tuple[str, str, bool]]) -> None:
    """Every receipted message consumed or still queued; a message (by its id) delivered
    again only flagged redelivered; other duplicates only from the producer's re-sends
    of sends left in doubt; an acknowledged message never comes back."""
    seen = consumer.deliveries + drained
    bodies = [body for _, body, _ in seen]
    sent = {f"{producer.prefix}-{n:06d}" for n in range(producer.sent + 1)}
    assert not [b for b in bodies if b not in sent], "a message that was never sent"
    missing = producer.report.confirmed - set(bodies)
    assert not missing, f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
    first: set[str] = set()
    for message_id, body, redelivered in seen:
        if message_id in first:
            assert redelivered, f"{body} ({message_id}) delivered again, not flagged"
        first.add(message_id)
    came_back = consumer.report.acked & {body for _, body, _ in drained}
    assert not came_back, f"acknowledged messages came back: {sorted(came_back)[:5]}"
    copies = len({(message_id, body) for message_id, body, _ in seen}) - len(set(bodies))
    assert copies <= producer.report.in_doubt_resends, \
        (copies, producer.report.in_doubt_resends)


def bound_ports(proc: psutil.Process) -> set[int]:
    """Every TCP port the process has a socket on (listening or only bound)."""
    return {c.laddr.port for c in proc.net_connections("tcp") if c.laddr}


def test_master_node_killed_the_slave_node_takes_over_its_shards_stores(
        tmp_path: Path) -> None:
    nodes, ports = pair(tmp_path)
    a = nodes["a"].start().wait_master()
    b = nodes["b"].start().wait_slave()
    assert "took the shared lease at epoch 1" in a.text()

    # The slave node: its management endpoint only, no shard, no client port.
    assert b.proc is not None
    slave = psutil.Process(b.proc.pid)
    assert b.shard_processes() == []
    assert bound_ports(slave) == {b.management_port}
    assert not accepts(ports[1])
    stat = b.stat()
    assert (stat["ha"]["role"], stat["ha"]["mode"]) == ("slave", "shared")
    assert str(stat["ha"]["lease_holder"]).startswith("a@")
    assert a.stat()["ha"]["role"] == "master"

    queues = [queue_owned_by(0, "ha"), queue_owned_by(1, "ha")]
    producers = [FailoverProducer(lambda: ports, q, prefix=f"p{i}")
                 for i, q in enumerate(queues)]
    consumers = [RecordingConsumer(lambda: ports, q) for q in queues]
    for thread in (*producers, *consumers):
        thread.start()

    def confirmed(at_least: int) -> bool:
        assert all(p.fatal is None for p in producers), [p.fatal for p in producers]
        return all(len(p.report.confirmed) >= at_least for p in producers)

    poll(lambda: confirmed(200), 60, "200 receipted sends per queue on the master node")
    shards = a.shard_processes()
    assert len(shards) == 2
    a.kill9()
    killed = time.monotonic()
    # Its shards stop on their own once the supervisor's pipe is closed.
    poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the old shards to exit")
    poll(lambda: accepts(ports[1]), 60, "the slave node to accept clients")
    took = time.monotonic() - killed
    b.wait_master()
    assert "took the shared lease at epoch 2" in b.text()
    assert len(b.shard_processes()) == 2

    before = [len(p.report.confirmed) for p in producers]
    poll(lambda: all(len(p.report.confirmed) >= n + 200
                     for p, n in zip(producers, before, strict=True))
         or any(p.fatal for p in producers), 60, "200 more receipted sends per queue")
    acked = [len(c.report.acked) for c in consumers]
    poll(lambda: all(len(c.report.acked) >= n + 20
                     for c, n in zip(consumers, acked, strict=True))
         or any(c.fatal for c in consumers), 60, "the consumers to carry on")
    for thread in (*producers, *consumers):
        thread.stop.set()
    for thread in (*producers, *consumers):
        thread.join(30)
    assert all(t.fatal is None for t in (*producers, *consumers))
    assert all(any(port == ports[1] for _, port in p.report.failovers) for p in producers)
    assert all(c.connections >= 2 for c in consumers)

    stat = b.stat()
    assert (stat["ha"]["role"], stat["ha"]["epoch"]) == ("master", 2)
    # The killed node comes back as the slave of the new master, and stops at once.
    again = HaNode(a.config_path, a.log_path).start().wait_slave()
    assert not accepts(ports[0]) and again.shard_processes() == []
    printed = subprocess.run(
        [sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
         f"127.0.0.1:{again.management_port}"], capture_output=True, text=True, timeout=30,
        check=True).stdout
    assert "role slave  ha shared  epoch 0  lease held by b@" in printed
    assert again.terminate() == 0
    for producer, consumer, queue in zip(producers, consumers, queues, strict=True):
        check(producer, consumer, drain(ports[1], queue))
    assert b.terminate() == 0
    print(f"node takeover after SIGKILL of the supervisor: {took:.3f}s")


def test_paused_master_node_is_fenced_and_comes_back_as_slave(tmp_path: Path) -> None:
    nodes, ports = pair(tmp_path)
    a = nodes["a"].start().wait_master()
    b = nodes["b"].start().wait_slave()
    queue = queue_owned_by(1, "fence")
    old, old_rec = connect(ports[0])
    old.send(queue, "before", headers={"persistent": "true"}, receipt="before")
    poll(lambda: "before" in old_rec.receipts, 30, "the receipt before the pause")

    paused = [a.proc.pid if a.proc else 0] + [p.pid for p in a.shard_processes()]
    for pid in paused:
        psutil.Process(pid).send_signal(signal.SIGSTOP)
    try:
        b.wait_master()  # after the lease ran out: the paused holder still looks alive
        assert "let it expire" in b.text()
        # The paused node's client sends; the frame waits in its socket buffer.
        old.send(queue, "from-the-deposed", headers={"persistent": "true"},
                 receipt="deposed")
        new, new_rec = connect(ports[1])
        new.send(queue, "on-new-master", headers={"persistent": "true"}, receipt="new")
        poll(lambda: "new" in new_rec.receipts, 30, "the new master's receipt")
    finally:
        for pid in paused:
            psutil.Process(pid).send_signal(signal.SIGCONT)
    # The old node wakes up: its shards refuse the write, its supervisor is deposed,
    # kills its shards and waits as a slave again.
    poll(lambda: old_rec.disconnected or bool(old_rec.errors), 30,
         "the deposed node to drop its client")
    assert "deposed" not in old_rec.receipts
    poll(lambda: "restarting the node as a slave" in a.text(), 30, "the deposed node")
    poll(lambda: a.role() == "slave", 30, "the old master to be a slave")
    assert not accepts(ports[0])
    new.disconnect()
    assert [body for _, body, _ in drain(ports[1], queue)] == ["before", "on-new-master"]
    assert b.terminate() == 0
    a.wait_master(times=2)
    assert a.terminate() == 0
