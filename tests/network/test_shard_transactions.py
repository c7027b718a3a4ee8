"""STOMP transactions across two shards of one node, over real Unix-socket links with
real clients: a COMMIT whose sends and acknowledgements touch both shards commits in
two phases (core/shard_txn.py), all or nothing, also when a shard stops between the
phases; one that touches only the client's shard sends nothing to the other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshmq.core.shard_txn import DECIDED_PREFIX, PREPARED_PREFIX, TxnDecide
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
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
