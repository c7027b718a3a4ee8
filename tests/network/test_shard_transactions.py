"""STOMP transactions across two shards of one node, over real Unix-socket links with
real clients: a COMMIT whose sends and acknowledgements touch both shards commits in
two phases (core/shard_txn.py), all or nothing, also when a shard stops between the
phases; one whose work all belongs to the other shard commits there in one phase,
committed once or rolled back when either shard is killed with SIGKILL, and failed as
of unknown outcome when its owner does not answer within ``owner_wait_ms`` (stopped, or
killed and not back in time), the owner's outcome standing once it is back; one that
touches only the client's shard sends nothing to the other."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import ShardsConfig
from meshmq.core.shard_txn import DECIDED_PREFIX, ONE_PHASE_PREFIX, PREPARED_PREFIX, TxnDecide
from meshmq.protocol.wire import decode_txn
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ProcessBroker, poll
from tests.support.shard_pair import ShardBroker, ShardPair


def _send(client: RawClient, queue: str, body: str, txn: str | None = None) -> None:
    headers = [("destination", f"/queue/{queue}"), ("persistent", "true")]
    if txn is not None:
        headers.append(("transaction", txn))
    else:
        headers.append(("receipt", f"r-{body}"))
    client.send_frame("SEND", headers, body.encode())
    if txn is None:
        client.read_until_receipt(f"r-{body}")


def _subscribe(client: RawClient, queue: str, sub: str) -> None:
    """Subscribe; the MESSAGEs that come are read with ``_message`` (which skips the
    RECEIPT: a relayed subscription's first MESSAGE may come before it)."""
    client.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", sub),
                                    ("ack", "client-individual"), ("receipt", f"s-{sub}")])


def _message(client: RawClient) -> tuple[str, str, bool]:
    """The next MESSAGE as (body, ack id, redelivered)."""
    frame, _ = client.read_until("MESSAGE")
    return frame.body.decode(), frame.get("ack") or "", frame.get("redelivered") == "true"


def _records(shard: ShardBroker, prefix: str) -> list[str]:
    assert shard.runtime is not None
    records = shard.runtime.broker.state.records
    return shard.run(lambda: [name for name in records if name.startswith(prefix)])


def _txn_sent(shard: ShardBroker) -> dict[str, int]:
    assert shard.runtime is not None and shard.runtime.shard_peers is not None
    peers = shard.runtime.shard_peers
    return shard.run(lambda: dict(peers.txn_sent))


def _in_flight(shard: ShardBroker) -> int:
    """Transactions the shard coordinates and still waits for."""
    assert shard.runtime is not None
    txns = shard.runtime.broker.shard_transactions
    return shard.run(lambda: txns.in_flight)


def _patch(shard: ShardBroker, name: str, make: Callable[[Any], Any]) -> None:
    """Replace method ``name`` of the shard's links (``make(original)``), in its loop."""
    assert shard.runtime is not None and shard.runtime.shard_peers is not None
    peers = shard.runtime.shard_peers
    shard.run(lambda: setattr(peers, name, make(getattr(peers, name))))


def _hold_commits(shard: ShardBroker) -> None:
    """The coordinator logs its decisions but does not send them (as if it died
    right after logging)."""
    def make(original: Any) -> Any:
        def queue_txn(txn: Any) -> None:
            if not (isinstance(txn, TxnDecide) and txn.commit):
                original(txn)
        return queue_txn
    _patch(shard, "_queue_txn", make)


def _prepare_both(pair: ShardPair) -> tuple[RawClient, dict[str, str]]:
    """A client on shard 1 holding one delivery from a queue of each shard, and the
    names of an output queue on each shard."""
    names = {"in0": pair.owned_by(0, "in"), "in1": pair.owned_by(1, "in"),
             "out0": pair.owned_by(0, "out"), "out1": pair.owned_by(1, "out")}
    producer = pair[0].client()
    _send(producer, names["in0"], "a")
    _send(producer, names["in1"], "b")
    producer.close()
    client = pair[1].client()
    _subscribe(client, names["in0"], "s0")  # relayed from shard 0
    _subscribe(client, names["in1"], "s1")
    return client, names


def _receive_both(client: RawClient) -> dict[str, str]:
    got = dict(_message(client)[:2] for _ in range(2))
    assert sorted(got) == ["a", "b"]
    return got


def _work(client: RawClient, names: dict[str, str], acks: dict[str, str], txn: str) -> None:
    client.send_frame("BEGIN", [("transaction", txn)])
    _send(client, names["out0"], f"x-{txn}", txn)
    _send(client, names["out1"], f"y-{txn}", txn)
    for ack in acks.values():
        client.send_frame("ACK", [("id", ack), ("transaction", txn)])


def test_a_commit_across_shards_applies_both_owners_work_and_an_abort_none(
        pair: ShardPair) -> None:
    client, names = _prepare_both(pair)
    acks = _receive_both(client)
    _work(client, names, acks, "t1")
    client.send_frame("ABORT", [("transaction", "t1"), ("receipt", "abort")])
    client.read_until_receipt("abort")
    assert _txn_sent(pair[1]) == {}  # an abort costs the other shard nothing
    _work(client, names, acks, "t2")
    client.send_frame("COMMIT", [("transaction", "t2"), ("receipt", "commit")])
    client.read_until_receipt("commit")
    assert _txn_sent(pair[1]) == {"prepare": 1, "commit": 1}  # shard 0 alone takes part
    # Durable on both after the RECEIPT; visible on the participant once its commit
    # (sent right after the decision) is applied.
    assert pair[1].depth(names["out1"]) == 1 and pair[1].depth(names["in1"]) == 0
    poll(lambda: pair[0].depth(names["out0"]) == 1, what="the participant's commit")
    assert pair[0].depth(names["in0"]) == 0
    poll(lambda: not _records(pair[1], DECIDED_PREFIX) and
         not _records(pair[0], PREPARED_PREFIX), what="the records to go")
    client.close()
    reader = pair[0].client()
    for q in ("out0", "out1"):
        _subscribe(reader, names[q], q)
    assert sorted(_message(reader)[0] for _ in range(2)) == ["x-t2", "y-t2"]  # not t1's
    reader.close()


def test_a_commit_whose_other_shard_is_down_rolls_back_on_every_shard(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        client, names = _prepare_both(pair)
        acks = _receive_both(client)
        # Only the local delivery is acknowledged: shard 0 takes part with a send.
        client.send_frame("BEGIN", [("transaction", "t")])
        _send(client, names["out0"], "x", "t")
        _send(client, names["out1"], "y", "t")
        client.send_frame("ACK", [("id", acks["b"]), ("transaction", "t")])
        pair.stop_owner(0)
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        error = client.expect_error_and_close()
        client.close()
        assert error.get("message") == \
            "transaction 't' was rolled back: shard node#0 is unreachable"
        assert pair[1].depth(names["out1"]) == 0
        pair.start(0)
        pair.wait_linked()
        again = pair[1].client()
        _subscribe(again, names["in1"], "s1")
        assert _message(again)[::2] == ("b", True)  # back, flagged
        again.close()
        assert pair[0].depth(names["out0"]) == 0 and pair[0].depth(names["in0"]) == 1
    finally:
        pair.stop()


def test_a_coordinator_restarted_after_its_decision_drives_the_commit(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        client, names = _prepare_both(pair)
        acks = _receive_both(client)
        _hold_commits(pair[1])
        _work(client, names, acks, "t")
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        client.read_until_receipt("commit")  # the decision is durable
        # Prepared on shard 0, not visible there: its acked message left the queue.
        assert len(_records(pair[0], PREPARED_PREFIX)) == 1
        assert pair[0].depth(names["out0"]) == 0 and pair[0].depth(names["in0"]) == 0
        assert pair[1].depth(names["out1"]) == 1
        client.close()
        pair.stop(1)
        pair.start(1)
        pair.wait_linked()
        poll(lambda: pair[0].depth(names["out0"]) == 1, what="the re-driven commit")
        poll(lambda: not _records(pair[1], DECIDED_PREFIX), what="the decision to go")
        assert pair[0].depth(names["in0"]) == 0 and pair[1].depth(names["out1"]) == 1
        assert not _records(pair[0], PREPARED_PREFIX)
    finally:
        pair.stop()


def test_a_participant_restarted_while_prepared_asks_and_commits(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        client, names = _prepare_both(pair)
        acks = _receive_both(client)
        _hold_commits(pair[1])
        _work(client, names, acks, "t")
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        client.read_until_receipt("commit")
        pair.stop_owner(0)
        pair.start(0)
        pair.wait_linked()
        poll(lambda: pair[0].depth(names["out0"]) == 1, what="the commit after asking")
        assert pair[0].depth(names["in0"]) == 0
        # Asked once more (the link is new), the commit is not applied twice.
        poll(lambda: not _records(pair[0], PREPARED_PREFIX), what="the prepared record")
        client.close()
        reader = pair[0].client()
        _subscribe(reader, names["out0"], "o")
        assert _message(reader)[0] == "x-t"
        _subscribe(reader, names["in0"], "i")
        reader.send_frame("DISCONNECT", [("receipt", "bye")])
        frames = reader.expect_closed()
        assert not [f for f in frames if f.command == "MESSAGE"]  # "a" was consumed
        reader.close()
    finally:
        pair.stop()


def test_a_participant_prepared_when_its_coordinator_stops_undecided_aborts(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        client, names = _prepare_both(pair)
        acks = _receive_both(client)
        # The coordinator never hears the vote: it stops before deciding.
        _patch(pair[1], "_voted", lambda original: lambda *args: None)
        _work(client, names, acks, "t")
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        poll(lambda: len(_records(pair[0], PREPARED_PREFIX)) == 1, what="the prepare")
        assert pair[0].depth(names["in0"]) == 0  # acknowledged, prepared
        client.close()
        pair.stop(1)
        pair.start(1)
        pair.wait_linked()
        poll(lambda: not _records(pair[0], PREPARED_PREFIX), what="the presumed abort")
        assert pair[0].depth(names["out0"]) == 0 and pair[1].depth(names["out1"]) == 0
        reader = pair[0].client()
        _subscribe(reader, names["in0"], "i")
        assert _message(reader)[::2] == ("a", True)  # back in its queue, flagged
        _subscribe(reader, names["in1"], "j")
        assert _message(reader)[::2] == ("b", True)
        reader.close()
    finally:
        pair.stop()


def test_a_transaction_on_one_shard_sends_nothing_to_the_other(pair: ShardPair) -> None:
    mine, out = pair.owned_by(1, "mine"), pair.owned_by(1, "out")
    client = pair[1].client()
    _send(client, mine, "m")
    _subscribe(client, mine, "s")
    _, ack, _ = _message(client)
    client.send_frame("BEGIN", [("transaction", "t")])
    _send(client, out, "o", "t")
    client.send_frame("ACK", [("id", ack), ("transaction", "t")])
    client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
    client.read_until_receipt("commit")
    assert pair[1].depth(out) == 1 and pair[1].depth(mine) == 0
    assert _txn_sent(pair[1]) == {} and pair[1].outstanding() == 0
    client.close()


# ------------------------------------------------------------------ one phase
def _one_phase_work(client: RawClient, out0: str, ack: str, txn: str) -> None:
    """A transaction whose every part belongs to shard 0: a send to its queue and the
    acknowledgement of a delivery relayed from it."""
    client.send_frame("BEGIN", [("transaction", txn)])
    _send(client, out0, f"x-{txn}", txn)
    client.send_frame("ACK", [("id", ack), ("transaction", txn)])


def _consume_from_shard0(pair: ShardPair, via: Any) -> tuple[RawClient, str, str, str]:
    """"a" in a queue of shard 0, delivered (unacknowledged) to a client of shard 1
    (``via``: the in-process shard or its subprocess); an output queue of shard 0."""
    in0, out0 = pair.owned_by(0, "in"), pair.owned_by(0, "out")
    client = RawClient(via)
    client.connect()
    _send(client, in0, "a")
    _subscribe(client, in0, "s0")
    body, ack, _ = _message(client)
    assert body == "a"
    return client, in0, out0, ack


def _bodies(client: RawClient, queue: str, sub: str) -> list[tuple[str, bool]]:
    """What ``queue`` holds, read (and acknowledged) to the end."""
    _subscribe(client, queue, sub)
    got = []
    while True:
        try:
            frame, _ = client.read_until("MESSAGE", timeout=1.0)
        except TimeoutError:
            return got
        got.append((frame.body.decode(), frame.get("redelivered") == "true"))
        client.send_frame("ACK", [("id", frame.get("ack") or "")])


def test_a_transaction_for_one_other_shard_commits_there_in_one_phase(
        pair: ShardPair) -> None:
    client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
    _one_phase_work(client, out0, ack, "t")
    client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
    client.read_until_receipt("commit")
    # Applied on its owner before the RECEIPT: visible at once, no prepare, no decision.
    assert pair[0].depth(out0) == 1 and pair[0].depth(in0) == 0
    assert not _records(pair[1], DECIDED_PREFIX) and not _records(pair[0], PREPARED_PREFIX)
    poll(lambda: _txn_sent(pair[1]) == {"commit-one": 1, "forget": 1},
         what="the owner told to forget")
    poll(lambda: not _records(pair[0], ONE_PHASE_PREFIX), what="the one-phase record")
    client.close()
    reader = pair[0].client()
    assert _bodies(reader, out0, "o") == [("x-t", False)]
    assert _bodies(reader, in0, "i") == []
    reader.close()


def _drop_first(shard: ShardBroker, method: str, op: str) -> threading.Event:
    """The shard's links drop the first TXN ``op`` that ``method`` (``on_txn`` for one
    read, ``_txn_out`` for one written) carries, as if the shard died right before it;
    the event says it happened."""
    dropped = threading.Event()

    def make(original: Any) -> Any:
        def patched(*args: Any) -> None:
            head = decode_txn(args[2])[0] if method == "on_txn" else args[1]
            if head.get("op") == op and not dropped.is_set():
                dropped.set()
                return
            original(*args)
        return patched
    _patch(shard, method, make)
    return dropped


def test_one_phase_owner_killed_before_its_sync_rolls_back(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path)
    owner: ProcessBroker = pair.process(0).start()
    pair.start(1)
    try:
        poll(lambda: pair[1].links_up() == 1, what="the link to the owner")
        client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
        _one_phase_work(client, out0, ack, "t")
        assert owner.proc is not None
        owner.proc.send_signal(signal.SIGSTOP)  # it never reads the commit
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        poll(lambda: _txn_sent(pair[1]) == {"commit-one": 1}, what="the one-phase commit")
        owner.kill9()
        poll(lambda: pair[1].links_up() == 0, what="the link to drop")
        with pytest.raises(TimeoutError):  # in doubt: the owner decides once it is back
            client.read_frame(timeout=0.3)
        owner = pair.process(0).start()
        error = client.expect_error_and_close(timeout=30)
        assert error.get("message") == ("transaction 't' was rolled back: "
                                        "shard node#0 was lost before it committed")
        client.close()
        reader = RawClient(owner)
        reader.connect()
        assert [body for body, _ in _bodies(reader, in0, "i")] == ["a"]  # back, once
        assert _bodies(reader, out0, "o") == []
        reader.close()
    finally:
        pair.stop()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.terminate()


def test_one_phase_owner_killed_after_its_sync_commits_once(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path)
    owner: ProcessBroker = pair.process(0).start()
    pair.start(1)
    try:
        poll(lambda: pair[1].links_up() == 1, what="the link to the owner")
        client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
        # Its answer, sent once the commit was synced, is lost with it.
        answered = _drop_first(pair[1], "on_txn", "committed-one")
        _one_phase_work(client, out0, ack, "t")
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        poll(answered.is_set, what="the owner's answer")
        owner.kill9()
        poll(lambda: pair[1].links_up() == 0, what="the link to drop")
        owner = pair.process(0).start()
        client.read_until_receipt("commit", timeout=30)  # it did commit
        poll(lambda: _txn_sent(pair[1]).get("forget", 0) >= 1, what="the forget")
        client.close()
        reader = RawClient(owner)
        reader.connect()
        assert _bodies(reader, out0, "o") == [("x-t", False)]  # once
        assert _bodies(reader, in0, "i") == []
        reader.close()
    finally:
        pair.stop()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.terminate()


def test_one_phase_coordinator_killed_after_the_owners_sync_commits_once(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path)
    pair.start(0)
    coordinator: ProcessBroker = pair.process(1).start()
    try:
        poll(lambda: pair[0].links_up() == 1, what="the link to the coordinator")
        answered = _drop_first(pair[0], "_txn_out", "committed-one")
        client, in0, out0, ack = _consume_from_shard0(pair, coordinator)
        _one_phase_work(client, out0, ack, "t")
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        poll(answered.is_set, what="the owner's commit")
        assert pair[0].depth(out0) == 1 and pair[0].depth(in0) == 0
        assert len(_records(pair[0], ONE_PHASE_PREFIX)) == 1
        coordinator.kill9()
        client.expect_closed()  # no RECEIPT: the client cannot know, as with one broker
        client.close()
        coordinator = pair.process(1).start()
        # The owner tells the restarted coordinator, which tells it to forget.
        poll(lambda: not _records(pair[0], ONE_PHASE_PREFIX), what="the one-phase record")
        reader = pair[0].client()
        assert _bodies(reader, out0, "o") == [("x-t", False)]
        assert _bodies(reader, in0, "i") == []
        reader.close()
    finally:
        pair.stop()
        if coordinator.proc is not None and coordinator.proc.poll() is None:
            coordinator.terminate()


# ------------------------------------------------------------------ one phase, in doubt
WAIT_MS = 3000  # long enough for a kill to drop the link first on a loaded machine


def _in_doubt(why: str) -> str:
    return (f"transaction 't' may have committed: its outcome is unknown because shard "
            f"node#0, which commits all of it, {why}did not answer within 3 s "
            "(shards.owner_wait_ms); check before doing it again")


def _waiting_pair(tmp_path: Path) -> tuple[ShardPair, ProcessBroker]:
    """Shard 0 (the owner) as a subprocess, shard 1 (the coordinator) in this process
    with a short ``owner_wait_ms``."""
    pair = ShardPair(tmp_path, sharding=ShardsConfig(handoff=False, owner_wait_ms=WAIT_MS))
    owner = pair.process(0).start()
    pair.start(1)
    poll(lambda: pair[1].links_up() == 1, what="the link to the owner")
    return pair, owner


def test_one_phase_owner_stopped_past_the_wait_fails_the_commit_in_doubt(
        tmp_path: Path) -> None:
    pair, owner = _waiting_pair(tmp_path)
    try:
        client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
        _one_phase_work(client, out0, ack, "t")
        assert owner.proc is not None
        owner.proc.send_signal(signal.SIGSTOP)  # alive, linked, silent
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        error = client.expect_error_and_close(timeout=30)
        client.close()
        assert error.get("message") == _in_doubt("")
        assert pair[1].links_up() == 1 and _in_flight(pair[1]) == 0  # given up
        owner.proc.send_signal(signal.SIGCONT)  # it reads the commit: it did commit
        poll(lambda: _txn_sent(pair[1]).get("forget", 0) == 1, what="the late answer")
        reader = RawClient(owner)
        reader.connect()
        assert _bodies(reader, out0, "o") == [("x-t", False)]  # once
        assert _bodies(reader, in0, "i") == []
        reader.close()
    finally:
        if owner.proc is not None and owner.proc.poll() is None:
            owner.proc.send_signal(signal.SIGCONT)
        pair.stop()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.terminate()


@pytest.mark.parametrize("synced", [False, True])
def test_one_phase_owner_killed_and_back_after_the_wait_keeps_its_outcome(
        tmp_path: Path, synced: bool) -> None:
    pair, owner = _waiting_pair(tmp_path)
    try:
        client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
        answered = _drop_first(pair[1], "on_txn", "committed-one")
        _one_phase_work(client, out0, ack, "t")
        assert owner.proc is not None
        if not synced:
            owner.proc.send_signal(signal.SIGSTOP)  # it never reads the commit
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        if synced:
            poll(answered.is_set, what="the owner's answer, lost with it")
        else:
            poll(lambda: _txn_sent(pair[1]) == {"commit-one": 1}, what="the commit")
        owner.kill9()
        error = client.expect_error_and_close(timeout=30)
        client.close()
        assert error.get("message") == _in_doubt("is unreachable and ")
        owner = pair.process(0).start()  # after the wait: the owner's outcome stands
        poll(lambda: pair[1].links_up() == 1, what="the link back")
        if synced:  # it tells the coordinator again, which tells it to forget
            poll(lambda: _txn_sent(pair[1]).get("forget", 0) == 1, what="the forget")
        reader = RawClient(owner)
        reader.connect()
        assert _bodies(reader, out0, "o") == ([("x-t", False)] if synced else [])
        assert [body for body, _ in _bodies(reader, in0, "i")] == ([] if synced else ["a"])
        reader.close()
    finally:
        pair.stop()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.terminate()
