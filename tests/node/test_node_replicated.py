"""Nodes of shards in a ``replicated`` cluster, with real processes: three ``--shards 2``
nodes, each with its own data directory; the supervisors elect, shard k of the master
streams its journal to shard k of the others. The master node (supervisor and shards)
is killed with SIGKILL under failover producers and consumers on queues of both shards;
a follower node that was down catches up and takes over with every receipted message;
a master left alone stops its shards; two nodes and a witness take over and go on
writing with one node lost; nodes elect and stream over mutual TLS and refuse
plaintext; an elected node whose shards start slower than a lease keeps the role; a
master node stopped gracefully hands the role
over without its lease running out; a master node paused (SIGSTOP) past its lease is
replaced, and resumed, never confirms the write it took while deposed."""

from __future__ import annotations

import contextlib
import datetime
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.ha.support import FailoverProducer, HaProcess, accepts, connect
from tests.ha.test_replicated_tls import _intrude
from tests.node.test_node_ha import HaNode, RecordingConsumer, check, drain, queue_owned_by
from tests.support import ports as port_support
from tests.support.brokers import poll
from tests.support.nodes import pid_gone
from tests.support.pki import Pki

pytestmark = pytest.mark.slow

SHARDS = 2
LEASE_S = 2
HA = f"lease_ms = {LEASE_S * 1000}\nkeepalive_ms = 400"
_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")  # logging's asctime


def replication_ports() -> int:
    """A free port with the ``SHARDS`` ports after it free too: the node's election
    listener and its shards' stream listeners (docs/ha.md)."""
    for _ in range(200):
        first = port_support.free_port()
        block = range(first + 1, first + 1 + SHARDS)
        if any(p in port_support._handed_out for p in block):
            continue
        try:
            for p in block:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        port_support._handed_out.update(block)
        return first
    raise AssertionError("no block of free ports")


def write_node(path: Path, *, name: str, data: Path, port: int, listen: int,
               members: list[int], ha: str = HA) -> Path:
    others = ", ".join(f'"127.0.0.1:{m}"' for m in members)
    path.write_text(f"""
[broker]
name = "{name}"
data_directory = "{data}"
shards = {SHARDS}

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{port}"

[store]
fsync = false

[management]
host = "127.0.0.1"
port = 0

[ha]
mode = "replicated"
listen = "127.0.0.1:{listen}"
members = [{others}]
{ha}
""")
    return path


class Cluster:
    def __init__(self, tmp_path: Path, ha: str = HA) -> None:
        names = "abc"
        self.ports = {n: port_support.free_port() for n in names}
        repl = self.repl = {n: replication_ports() for n in names}
        self.nodes = {
            n: HaNode(write_node(tmp_path / f"{n}.toml", name=n, data=tmp_path / n,
                                 port=self.ports[n], listen=repl[n],
                                 members=[repl[o] for o in names if o != n], ha=ha),
                      tmp_path / f"{n}.log")
            for n in names}

    def client_ports(self) -> list[int]:
        return list(self.ports.values())

    def start(self, *names: str) -> None:
        for n in names:
            self.nodes[n].start()
        for n in names:
            self.nodes[n].wait_slave()

    def master(self, among: str = "abc", times: int = 1, timeout: float = 60) -> str:
        """The node that started its shards as master (the ``times``-th time)."""
        found: list[str] = []

        def elected() -> bool:
            found[:] = [n for n in among if self.nodes[n].proc is not None
                        and self.nodes[n].text().count(" started: 2 shards on ") >= times]
            return bool(found)

        poll(elected, timeout, "a node to be elected master")
        assert len(found) == 1, f"two masters: {found}"
        return found[0]

    def kill(self, name: str) -> None:
        """SIGKILL the node's supervisor and every shard of it."""
        node = self.nodes[name]
        shards = node.shard_processes()
        node.kill9()
        for proc in shards:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the shards to exit")


def send_all(port: int, queue: str, bodies: list[str]) -> None:
    """Persistent sends, each confirmed by its receipt."""
    conn, rec = connect(port)
    for body in bodies:
        conn.send(queue, body, headers={"persistent": "true"}, receipt=body)
    poll(lambda: set(bodies) <= rec.receipts, 30, f"the receipts of {len(bodies)} sends")
    conn.disconnect()


def started_with_messages(tmp_path: Path, ha: str, prefix: str
                          ) -> tuple[Cluster, str, list[str], list[list[str]]]:
    """Three nodes with ``ha``, elected, and 20 receipted sends to a queue of each shard:
    the cluster, its master, the queues and what each was sent."""
    cluster = Cluster(tmp_path, ha=ha)
    cluster.start("a", "b", "c")
    first = cluster.master()
    queues = [queue_owned_by(k, prefix) for k in range(SHARDS)]
    sent = [[f"{prefix}-{k}-{i}" for i in range(20)] for k in range(SHARDS)]
    for queue, bodies in zip(queues, sent, strict=True):
        send_all(cluster.ports[first], queue, bodies)
    return cluster, first, queues, sent


def test_the_master_node_killed_a_follower_node_takes_over_both_shards_streams(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start("a", "b", "c")
    first = cluster.master()
    followers = [n for n in "abc" if n != first]
    master = cluster.nodes[first]
    assert all(not accepts(cluster.ports[n]) for n in followers)
    stat = master.stat()["ha"]
    assert (stat["mode"], stat["role"]) == ("replicated", "master")
    # Every node runs its shards: the followers' keep copies of the master's streams.
    assert all(len(node.shard_processes()) == SHARDS for node in cluster.nodes.values())

    queues = [queue_owned_by(0, "rep"), queue_owned_by(1, "rep")]
    producers = [FailoverProducer(cluster.client_ports, q, prefix=f"p{i}")
                 for i, q in enumerate(queues)]
    consumers = [RecordingConsumer(cluster.client_ports, q) for q in queues]
    for thread in (*producers, *consumers):
        thread.start()

    def confirmed(at_least: int) -> bool:
        assert all(p.fatal is None for p in producers), [p.fatal for p in producers]
        return all(len(p.report.confirmed) >= at_least for p in producers)

    poll(lambda: confirmed(100), 60, "100 receipted sends per queue on the master node")
    cluster.kill(first)
    killed = time.monotonic()
    second = cluster.master(among="".join(followers))
    took = time.monotonic() - killed
    new = cluster.nodes[second]
    assert new.stat()["ha"]["role"] == "master"
    assert new.stat()["ha"]["term"] > stat["term"]

    before = [len(p.report.confirmed) for p in producers]
    poll(lambda: all(len(p.report.confirmed) >= n + 100
                     for p, n in zip(producers, before, strict=True))
         or any(p.fatal for p in producers), 60, "100 more receipted sends per queue")
    for thread in (*producers, *consumers):
        thread.stop.set()
    for thread in (*producers, *consumers):
        thread.join(30)
    assert all(t.fatal is None for t in (*producers, *consumers))
    for producer, consumer, queue in zip(producers, consumers, queues, strict=True):
        check(producer, consumer, drain(cluster.ports[second], queue))

    # Alone, the master loses its majority: it stops all its shards and follows again.
    last = next(n for n in followers if n != second)
    shards = new.shard_processes()
    cluster.kill(last)
    poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the lone master's shards to stop")
    poll(lambda: "restarting the node as a slave" in new.text(), 30, "the node to follow")
    assert not accepts(cluster.ports[second])
    assert new.terminate() == 0
    print(f"replicated node takeover after SIGKILL of the master node: {took:.3f}s")


class WitnessPair:
    """Nodes ``a`` and ``b`` and ``meshmq witness`` ``w`` (``shards = 2``): a stream
    witness per shard and the node's election in one process."""

    def __init__(self, tmp_path: Path) -> None:
        self.ports = {n: port_support.free_port() for n in "abw"}
        repl = {n: replication_ports() for n in "abw"}

        def config(n: str) -> Path:
            return write_node(tmp_path / f"{n}.toml", name=n, data=tmp_path / n,
                              port=self.ports[n], listen=repl[n],
                              members=[repl[o] for o in "abw" if o != n])

        self.witness = HaProcess(config("w"), tmp_path / "w.log", command="witness").start()
        self.nodes = {n: HaNode(config(n), tmp_path / f"{n}.log") for n in "ab"}
        for node in self.nodes.values():
            node.start()
        for node in self.nodes.values():
            node.wait_slave()

    def master(self, among: str = "ab", times: int = 1) -> str:
        def elected() -> list[str]:
            return [n for n in among if self.nodes[n].proc is not None
                    and self.nodes[n].text().count(" started: 2 shards on ") >= times]
        found = poll(elected, 60, "a node to be elected master")
        assert len(found) == 1, found
        return found[0]

    def crash(self, name: str) -> None:
        """SIGKILL the shards first (a supervisor's death alone lets them hand over)."""
        node = self.nodes[name]
        shards = node.shard_processes()
        for proc in shards:
            proc.kill()
        node.kill9()
        poll(lambda: all(pid_gone(p.pid) for p in shards), 30, "the shards to exit")


def test_two_nodes_and_a_witness_take_over_and_write_on_with_one_node_lost(
        tmp_path: Path) -> None:
    """The master node crashes: the other node is elected with the witness's vote and
    has every receipted message; alone with the witness it goes on confirming sends (a
    majority of each stream: its copy and the witness's record)."""
    pair = WitnessPair(tmp_path)
    first = pair.master()
    other = "b" if first == "a" else "a"
    queues = [queue_owned_by(0, "wit"), queue_owned_by(1, "wit")]
    early = [[f"early-{k}-{i}" for i in range(30)] for k in range(SHARDS)]
    for queue, bodies in zip(queues, early, strict=True):
        send_all(pair.ports[first], queue, bodies)
    pair.crash(first)
    assert pair.master(other) == other
    assert "handed over" not in pair.witness.text()
    late = [[f"late-{k}-{i}" for i in range(30)] for k in range(SHARDS)]
    for queue, bodies in zip(queues, late, strict=True):
        send_all(pair.ports[other], queue, bodies)  # its copy and the witness's record
    for queue, e, lt in zip(queues, early, late, strict=True):
        assert [body for _, body, _ in drain(pair.ports[other], queue)] == e + lt
    assert "witness: node of 2 shards voting in elections of" in pair.witness.text()
    assert pair.nodes[other].terminate() == 0
    assert pair.witness.terminate() == 0
    assert not list((tmp_path / "w").rglob("gen-*")), "a witness stores no journal"


def test_the_witness_refuses_a_node_behind_on_a_shard_it_helped_confirm(
        tmp_path: Path) -> None:
    """The follower node crashes, the master goes on with the witness, then crashes too.
    The follower comes back behind: the witness refuses it (it recorded batches that node
    lacks), so it is not elected; the old master comes back and is, with every message."""
    pair = WitnessPair(tmp_path)
    first = pair.master()
    other = "b" if first == "a" else "a"
    queue = queue_owned_by(1, "behind")
    pair.crash(other)
    send_all(pair.ports[first], queue, ["only-with-the-witness"])
    pair.crash(first)
    pair.nodes[other].start()
    poll(lambda: f"refused for {other}@" in pair.witness.text()
         and "(candidate log is behind)" in pair.witness.text(), 60,
         "the witness to refuse the node that is behind")
    assert " started: 2 shards on " not in pair.nodes[other].text()
    pair.nodes[first].start()
    assert pair.master() == first  # its log since the restart
    assert [body for _, body, _ in drain(pair.ports[first], queue)] == \
        ["only-with-the-witness"]
    for node in (*pair.nodes.values(), pair.witness):
        assert node.terminate() == 0


def test_an_elected_node_whose_shards_start_slower_than_a_lease_keeps_the_role(
        tmp_path: Path) -> None:
    """The elected node's new master shards are stopped (SIGSTOP) as they start, for 2.5
    leases: the others keep waiting for them (the node repeats its vote request while
    they start) instead of electing again, and the node serves once they run."""
    cluster = Cluster(tmp_path)
    cluster.start("a", "b", "c")

    def master_shards() -> tuple[str, list[int]] | None:
        """The elected node and the pids of the master shards it started, from its log:
        "shard k started (pid N)" is logged once the new process runs the shard's
        program. A child of the supervisor found any other way may still be its fork
        before the exec, and stopping that would stop the supervisor too (it waits for
        the exec), which is not the scenario."""
        for n, node in cluster.nodes.items():
            _, starting, after = node.text().partition("master: starting the node's")
            if starting:
                return n, [int(pid) for pid in re.findall(
                    r"shard \d+ started \(pid (\d+)\)", after)]
        return None

    winner, _ = poll(master_shards, 60, "an elected node to start its master shards")
    stopped: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 10
        while len(stopped) < SHARDS and time.monotonic() < deadline:  # both, as they appear
            found = master_shards()
            assert found is not None and found[0] == winner
            for pid in found[1]:
                if all(proc.pid != pid for proc in stopped):
                    proc = psutil.Process(pid)
                    proc.send_signal(signal.SIGSTOP)
                    stopped.append(proc)
        assert len(stopped) == SHARDS, stopped
        term = int(cluster.nodes[winner].text().split("master: node elected for term ")[1]
                   .split()[0])
        time.sleep(2.5 * LEASE_S)  # the scenario itself: shards slower than the lease
    finally:
        for proc in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)
    assert cluster.master() == winner
    for node in cluster.nodes.values():
        assert f"asking for votes in term {term + 1}" not in node.text()
    send_all(cluster.ports[winner], "/queue/slow-start", ["after"])
    assert [body for _, body, _ in drain(cluster.ports[winner], "/queue/slow-start")] == \
        ["after"]
    # The master first (it hands over): a master left alone would be deposed (status 3).
    for name in sorted(cluster.nodes, key=lambda n: n != winner):
        assert cluster.nodes[name].terminate() == 0


def test_nodes_elect_and_stream_over_mutual_tls_and_refuse_plaintext(
        tmp_path: Path, pki: Pki) -> None:
    """``ha.ssl_*`` on a node: its election link and every shard's stream are mutual
    TLS. A plaintext or untrusted dialer gets nothing; a takeover after SIGKILL of the
    master node delivers every receipted message of both shards."""
    cert, key = pki.broker("a")
    tls = f'ssl_certfile = "{cert}"\nssl_keyfile = "{key}"\nssl_cafile = "{pki.ca}"'
    cluster, first, queues, sent = started_with_messages(tmp_path, f"{HA}\n{tls}", "tls")

    stranger = ssl.create_default_context(cafile=str(pki.ca))
    stranger.load_cert_chain(*pki.stranger("broker"))
    election = cluster.repl[first]
    for port in (election, election + 1, election + SHARDS):  # the node, shards 0 and 1
        assert _intrude(port, None) == b""
        assert _intrude(port, stranger) == b""
    # Each listener (the supervisor's, each shard's) logs both causes.
    poll(lambda: cluster.nodes[first].text().count("refused a link from") >= 6, 10,
         "the refusals logged")

    cluster.kill(first)
    second = cluster.master(among="".join(n for n in "abc" if n != first))
    for queue, bodies in zip(queues, sent, strict=True):
        assert [body for _, body, _ in drain(cluster.ports[second], queue)] == bodies
    for n in "abc":
        if n != first:
            assert "does not trust" not in cluster.nodes[n].text()
            assert cluster.nodes[n].terminate() == 0


def test_a_master_node_stopped_gracefully_hands_over_before_its_lease_runs_out(
        tmp_path: Path) -> None:
    """SIGTERM of the master node: each master shard lets its followers catch up and
    tells them it resigns, so the others elect a successor at once, long before a lease
    of 8 s would have run out, with every receipted message of both shards."""
    lease_s = 8
    cluster, first, queues, sent = started_with_messages(
        tmp_path, f"lease_ms = {lease_s * 1000}\nkeepalive_ms = 400", "hand")
    old = cluster.nodes[first]
    stopping = time.monotonic()
    assert old.terminate() == 0
    second = cluster.master(among="".join(n for n in "abc" if n != first))
    took = time.monotonic() - stopping
    handed = _logged_at(old.text(), "handed the replicated master role over")
    assert len(handed) == SHARDS
    # From the old master's last shard handing over to the successor's election, both
    # as logged: a slow stop of the old node (a loaded machine) does not count, and a
    # successor that waited for the lease would show about 8 s here.
    elected = _logged_at(cluster.nodes[second].text(), "master: node elected for term")
    handover = elected[-1] - max(handed)
    assert handover < lease_s / 2, (
        f"elected {handover:.1f}s after the handover ({took:.1f}s after SIGTERM): the "
        "successor waited for the lease", _election_lines(old), _election_lines(
            cluster.nodes[second]))
    for queue, bodies in zip(queues, sent, strict=True):
        assert [body for _, body, _ in drain(cluster.ports[second], queue)] == bodies
    for n in "abc":
        if n != first:
            assert cluster.nodes[n].terminate() == 0
    for node in cluster.nodes.values():  # stopped with links open: no error logged
        assert "Traceback" not in node.text(), node.text()[-3000:]
    print(f"replicated node handover after SIGTERM of the master node: {took:.3f}s "
          f"({handover:.3f}s from the handover to the election)")


def _election_lines(node: HaNode) -> list[str]:
    return [line for line in node.text().splitlines()
            if any(w in line for w in ("vote", "candidate", "elected", "handed", "resign"))]


def _logged_at(text: str, needle: str) -> list[float]:
    """The times (seconds since the epoch) of the log lines holding ``needle``."""
    found = []
    for line in text.splitlines():
        if needle in line:
            stamp = _STAMP.search(line)
            assert stamp is not None, f"no time stamp in {line!r}"
            found.append(datetime.datetime.strptime(
                stamp.group(0), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return found


def test_a_paused_master_node_is_replaced_and_never_confirms_its_late_write(
        tmp_path: Path) -> None:
    """The master node's supervisor and shards stop (SIGSTOP) past the lease: the others
    elect a new master. A send to the paused node waits in its socket; resumed, its shard
    cannot confirm it (the followers follow a higher term), the node restarts as a
    follower, and the new master holds exactly the confirmed messages."""
    cluster = Cluster(tmp_path)
    cluster.start("a", "b", "c")
    first = cluster.master()
    followers = "".join(n for n in "abc" if n != first)
    old_node = cluster.nodes[first]
    queue = queue_owned_by(1, "pause")
    old, old_rec = connect(cluster.ports[first])
    old.send(queue, "before", headers={"persistent": "true"}, receipt="before")
    poll(lambda: "before" in old_rec.receipts, 30, "the receipt before the pause")

    assert old_node.proc is not None
    paused = [old_node.proc.pid] + [p.pid for p in old_node.shard_processes()]
    for pid in paused:
        psutil.Process(pid).send_signal(signal.SIGSTOP)
    try:
        second = cluster.master(among=followers)
        old.send(queue, "from-the-deposed", headers={"persistent": "true"},
                 receipt="deposed")
        new, new_rec = connect(cluster.ports[second])
        new.send(queue, "on-new-master", headers={"persistent": "true"}, receipt="new")
        poll(lambda: "new" in new_rec.receipts, 30, "the new master's receipt")
    finally:
        for pid in paused:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).send_signal(signal.SIGCONT)
    poll(lambda: old_rec.disconnected or bool(old_rec.errors), 30,
         "the deposed node to drop its client")
    poll(lambda: "restarting the node as a slave" in old_node.text(), 30,
         "the deposed node to follow")
    assert "deposed" not in old_rec.receipts
    new.disconnect()
    assert [body for _, body, _ in drain(cluster.ports[second], queue)] == \
        ["before", "on-new-master"]
    for node in cluster.nodes.values():
        assert node.terminate() == 0


def test_a_follower_node_that_was_down_catches_up_and_takes_over(tmp_path: Path) -> None:
    """c is down while the first messages are confirmed; back, it catches up, and is the
    only follower confirming the next ones (the other follower is killed); with the
    master killed and that follower back (behind), the election must pick c, which
    delivers them all."""
    cluster = Cluster(tmp_path)
    cluster.start("a", "b")
    first = cluster.master()
    other = "b" if first == "a" else "a"
    queues = [queue_owned_by(0, "catch"), queue_owned_by(1, "catch")]
    port = cluster.ports[first]
    early = [[f"early-{k}-{i}" for i in range(50)] for k in range(SHARDS)]
    for queue, bodies in zip(queues, early, strict=True):
        send_all(port, queue, bodies)

    cluster.start("c")
    c = cluster.nodes["c"]
    # Both of c's shards follow the master's streams (and report it to c's supervisor).
    poll(lambda: str(c.stat()["ha"].get("leader")).startswith(f"{first}@"), 30,
         "c's shards to follow the master")
    # c catches up on both streams: confirmations now need it (the other is gone).
    cluster.kill(other)
    late = [[f"late-{k}-{i}" for i in range(50)] for k in range(SHARDS)]
    for queue, bodies in zip(queues, late, strict=True):
        send_all(port, queue, bodies)
    # `meshmq stat` shows each shard's log position (they replicate one by one).
    stat = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                           f"127.0.0.1:{cluster.nodes[first].management_port}"],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    positions = [s["last"] for s in cluster.nodes[first].stat()["ha"]["shards"]]
    assert all(term >= 1 and index > 0 for term, index in positions), positions
    assert f"ha replicated  term {cluster.nodes[first].stat()['ha']['term']}  master " \
        in stat, stat
    assert f"  shards {SHARDS}  logs s0 [" in stat and ", s1 [" in stat, stat
    assert stat.count(" commit ") == SHARDS, stat

    cluster.kill(first)
    cluster.start(other)  # behind on the late messages: it must not win
    assert cluster.master(among=f"c{other}", times=1) == "c"
    for queue, e, lt in zip(queues, early, late, strict=True):
        got = [body for _, body, _ in drain(cluster.ports["c"], queue)]
        assert got == e + lt
    for n in ("c", other):
        assert cluster.nodes[n].terminate() == 0


def test_a_follower_node_whose_supervisor_is_killed_leaves_no_shard_running(
        tmp_path: Path) -> None:
    """A follower's shards are still starting (following) when their supervisor dies:
    they stop as a started shard does, instead of following on with nobody to stop
    them, holding the node's replication ports."""
    cluster = Cluster(tmp_path)
    cluster.start("a", "b")
    first = cluster.master()
    other = cluster.nodes["b" if first == "a" else "a"]
    poll(lambda: len(other.shard_processes()) == SHARDS, 30, "the follower's shards")
    shards = other.shard_processes()
    other.kill9()  # the supervisor only
    poll(lambda: all(pid_gone(p.pid) for p in shards), 30,
         "the follower's shards to stop without their supervisor")
    assert cluster.nodes[first].terminate() == 0
