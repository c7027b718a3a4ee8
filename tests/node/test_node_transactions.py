"""STOMP transactions across the shards of a real ``meshmq broker --shards 2`` node:
a transaction on shard 1 that sends to queues of both shards and acknowledges
messages of both commits all or nothing -- nothing shows before both shards prepared,
an ABORT leaves nothing, and a shard killed with SIGKILL before the decision (the other
shard, or the coordinator itself) rolls it back on both, with every acknowledged
message back once, flagged redelivered. A one-phase commit (all its work on shard 0)
gets its answer when the supervisor restarts a killed owner within
``shards.owner_wait_ms``, and an ERROR of unknown outcome when a stopped owner does not
answer within it (the owner's commit then stands)."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import NodeProcess, shard_api, stomp_on, write_node_toml

pytestmark = pytest.mark.slow

_names = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    n = NodeProcess(write_node_toml(tmp / "node.toml", data=tmp / "data"),
                    tmp / "node.log").start()
    ProcessBroker.running.discard(n)  # stopped here, after the module's tests
    try:
        yield n
    finally:
        n.terminate()


def _owned_by(shard: int, prefix: str) -> str:
    for n in _names:
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"queue://{name}"), 2, node="node") == shard:
            return name
    raise AssertionError("unreachable")


def _depth(node: NodeProcess, shard: int, queue: str) -> int:
    """The queue's depth on its owner (0 when the owner has never had it; -1 while the
    owner does not answer)."""
    try:
        stat = shard_api(node, shard, "/api/stat")
    except OSError:
        return -1
    for dest in stat["destinations"]:
        if dest["type"] == "queue" and dest["name"] == queue:
            return int(dest["depth"])
    return 0


def _send(client: RawClient, queue: str, body: str, txn: str | None = None) -> None:
    headers = [("destination", f"/queue/{queue}"), ("persistent", "true")]
    headers.append(("transaction", txn) if txn is not None else ("receipt", body))
    client.send_frame("SEND", headers, body.encode())
    if txn is None:
        client.read_until_receipt(body)


class _Scene:
    """Message "a" in a queue of shard 0 and "b" in one of shard 1, delivered to a
    client on shard 1 (the coordinator) and not yet acknowledged; an output queue on
    each shard."""

    def __init__(self, node: NodeProcess, tag: str) -> None:
        self.node = node
        self.in0, self.in1 = _owned_by(0, f"in-{tag}"), _owned_by(1, f"in-{tag}")
        self.out0, self.out1 = _owned_by(0, f"out-{tag}"), _owned_by(1, f"out-{tag}")
        producer = stomp_on(node, 0)
        _send(producer, self.in0, f"a-{tag}")
        _send(producer, self.in1, f"b-{tag}")
        producer.close()
        self.client = stomp_on(node, 1)
        for sub, queue in (("s0", self.in0), ("s1", self.in1)):
            self.client.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"),
                                                 ("id", sub), ("ack", "client-individual")])
        self.acks = {}
        for _ in range(2):
            frame, _ = self.client.read_until("MESSAGE")
            self.acks[frame.body.decode()] = frame.get("ack") or ""
        assert sorted(self.acks) == [f"a-{tag}", f"b-{tag}"]
        self.pids = [row["pid"] for row in node.shards()]

    def work(self, txn: str) -> None:
        c = self.client
        c.send_frame("BEGIN", [("transaction", txn)])
        _send(c, self.out0, f"x-{txn}", txn)
        _send(c, self.out1, f"y-{txn}", txn)
        for ack in self.acks.values():
            c.send_frame("ACK", [("id", ack), ("transaction", txn)])

    def depths(self) -> tuple[int, int, int, int]:
        n = self.node
        return (_depth(n, 0, self.in0), _depth(n, 1, self.in1), _depth(n, 0, self.out0),
                _depth(n, 1, self.out1))

    def returned_once(self) -> None:
        """Nothing of the transaction landed, and each acknowledged message comes back
        exactly once, flagged redelivered."""
        poll(lambda: self.depths() == (1, 1, 0, 0), 60, "the rollback on both shards")
        reader = stomp_on(self.node, 0)
        for sub, queue in (("r0", self.in0), ("r1", self.in1)):
            reader.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", sub),
                                            ("ack", "client-individual")])
        got = []
        for _ in range(2):
            frame, _ = reader.read_until("MESSAGE")
            got.append((frame.body.decode(), frame.get("redelivered")))
            reader.send_frame("ACK", [("id", frame.get("ack") or "")])
        assert sorted(got) == sorted((body, "true") for body in self.acks)
        reader.send_frame("DISCONNECT", [("receipt", "bye")])
        assert not [f for f in reader.expect_closed() if f.command == "MESSAGE"]
        reader.close()
        assert self.depths() == (0, 0, 0, 0)


def _wchar(pid: int) -> int:
    """Bytes the process has written so far (files and sockets)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar")


def test_a_commit_shows_nothing_before_both_shards_prepared_and_an_abort_nothing(
        node: NodeProcess) -> None:
    scene = _Scene(node, "commit")
    scene.work("t1")
    scene.client.send_frame("ABORT", [("transaction", "t1"), ("receipt", "abort")])
    scene.client.read_until_receipt("abort")
    scene.work("t2")
    os.kill(scene.pids[0], signal.SIGSTOP)  # the participant cannot prepare
    try:
        scene.client.send_frame("COMMIT", [("transaction", "t2"), ("receipt", "commit")])
        with pytest.raises(TimeoutError):  # a bounded negative check
            scene.client.read_until_receipt("commit", timeout=0.5)
        # The coordinator's own part waits too: its send is not in its queue.
        assert _depth(node, 1, scene.out1) == 0 and _depth(node, 1, scene.in1) == 1
    finally:
        os.kill(scene.pids[0], signal.SIGCONT)
    scene.client.read_until_receipt("commit")
    poll(lambda: scene.depths() == (0, 0, 1, 1), 30, "the commit on both shards")
    scene.client.close()
    reader = stomp_on(node, 0)
    for sub, queue in (("o0", scene.out0), ("o1", scene.out1)):
        reader.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", sub)])
    got = sorted(reader.read_until("MESSAGE")[0].body.decode() for _ in range(2))
    assert got == ["x-t2", "y-t2"]  # t1 left nothing
    reader.close()


def test_a_participant_killed_before_the_decision_rolls_back_on_both(
        node: NodeProcess) -> None:
    scene = _Scene(node, "participant")
    scene.work("t")
    victim = scene.pids[0]
    os.kill(victim, signal.SIGSTOP)
    scene.client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
    with pytest.raises(TimeoutError):  # a bounded negative check
        scene.client.read_until_receipt("commit", timeout=0.3)
    os.kill(victim, signal.SIGKILL)
    frames = scene.client.expect_closed(30)
    scene.client.close()
    assert [f.command for f in frames] == ["ERROR"], frames
    assert "rolled back" in (frames[0].get("message") or "")
    poll(lambda: node.shards()[0]["pid"] not in (None, victim) and
         node.shards()[0]["state"] == "running", 60, "shard 0 to be restarted")
    scene.returned_once()


def test_a_coordinator_killed_before_the_decision_rolls_back_after_its_restart(
        node: NodeProcess) -> None:
    scene = _Scene(node, "coordinator")
    scene.work("t")
    participant, coordinator = scene.pids
    os.kill(participant, signal.SIGSTOP)
    try:
        written = _wchar(coordinator)
        scene.client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        # The coordinator acted on the COMMIT (its prepare went to the stopped shard,
        # which reads it once it runs again), then dies before any decision.
        poll(lambda: _wchar(coordinator) > written, 30, "the coordinator to prepare")
        os.kill(coordinator, signal.SIGKILL)
        scene.client.expect_closed(30)
        scene.client.close()
    finally:
        os.kill(participant, signal.SIGCONT)
    poll(lambda: node.shards()[1]["pid"] not in (None, coordinator) and
         node.shards()[1]["state"] == "running", 60, "shard 1 to be restarted")
    scene.returned_once()


# ------------------------------------------------------------------ one phase, bounded
# Long enough that a SIGKILLed owner's lost link is seen before it on a loaded machine;
# the in-doubt test waits it out once.
WAIT_MS = 8000


@pytest.fixture(scope="module")
def waiting_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node whose shards wait WAIT_MS for an owner (``shards.owner_wait_ms``)."""
    tmp = tmp_path_factory.mktemp("waiting")
    n = NodeProcess(write_node_toml(tmp / "node.toml", data=tmp / "data",
                                    extra=f"[shards]\nowner_wait_ms = {WAIT_MS}\n"),
                    tmp / "node.log").start()
    ProcessBroker.running.discard(n)
    try:
        yield n
    finally:
        n.terminate()


def _one_phase(node: NodeProcess, tag: str) -> tuple[RawClient, str, str, int]:
    """A transaction on shard 1 whose whole work is shard 0's (consume "a" from a queue
    of shard 0, send to another of its queues), up to its COMMIT; shard 0's pid."""
    in0, out0 = _owned_by(0, f"in1p-{tag}"), _owned_by(0, f"out1p-{tag}")
    producer = stomp_on(node, 0)
    _send(producer, in0, f"a-{tag}")
    producer.close()
    client = stomp_on(node, 1)
    client.send_frame("SUBSCRIBE", [("destination", f"/queue/{in0}"), ("id", "s"),
                                    ("ack", "client-individual")])
    frame, _ = client.read_until("MESSAGE")
    client.send_frame("BEGIN", [("transaction", "t")])
    _send(client, out0, f"x-{tag}", "t")
    client.send_frame("ACK", [("id", frame.get("ack") or ""), ("transaction", "t")])
    return client, in0, out0, node.shards()[0]["pid"]


def test_one_phase_owner_killed_and_restarted_within_the_wait_answers_the_commit(
        waiting_node: NodeProcess) -> None:
    node = waiting_node
    client, in0, out0, victim = _one_phase(node, "restarted")
    os.kill(victim, signal.SIGSTOP)  # it never reads the commit
    client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
    with pytest.raises(TimeoutError):  # a bounded negative check
        client.read_until_receipt("commit", timeout=0.3)
    os.kill(victim, signal.SIGKILL)  # the supervisor restarts it at once
    error = client.expect_error_and_close(30)
    client.close()
    assert error.get("message") == \
        "transaction 't' was rolled back: shard node#0 was lost before it committed"
    poll(lambda: (_depth(node, 0, in0), _depth(node, 0, out0)) == (1, 0), 60,
         "the owner back, with nothing of the transaction")


def test_one_phase_owner_stopped_past_the_wait_fails_the_commit_in_doubt(
        waiting_node: NodeProcess) -> None:
    node = waiting_node
    client, in0, out0, victim = _one_phase(node, "stopped")
    os.kill(victim, signal.SIGSTOP)  # alive: the supervisor does not restart it
    try:
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        error = client.expect_error_and_close(30)
        client.close()
    finally:
        os.kill(victim, signal.SIGCONT)
    assert error.get("message") == (
        "transaction 't' may have committed: its outcome is unknown because shard node#0, "
        f"which commits all of it, did not answer within {WAIT_MS // 1000} s "
        "(shards.owner_wait_ms); "
        "check before doing it again")
    # Resumed, it reads the commit: it did commit, once.
    poll(lambda: (_depth(node, 0, in0), _depth(node, 0, out0)) == (0, 1), 60,
         "the owner's commit")
    assert node.shards()[0]["pid"] == victim
