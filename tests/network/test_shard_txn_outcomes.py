"""A COMMIT across two shards whose other shard is stopped (SIGSTOP) with its link up,
over real Unix-socket links: the wait is ``owner_wait_ms``, not the link's keep-alive.
In two phases the outcome is certain before the decision: rolled back on every shard,
the participant that wakes up later dropping what it prepared, nothing of the
transaction visible anywhere. In one phase it is not (the owner may have committed).
The ERROR says which in its ``meshmq-outcome`` header, and the real client raises
``TransactionRolledBackError`` or ``TransactionInDoubtError`` from it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from meshmq.client import BlockingClient, TransactionInDoubtError, TransactionRolledBackError
from meshmq.core.shard_txn import DECIDED_PREFIX
from meshmq.protocol.wire import decode_txn
from tests.interop.stomp_helpers import RawClient
from tests.network.test_shard_transactions import (
    _bodies,
    _consume_from_shard0,
    _in_flight,
    _patch,
    _records,
    _send,
    _txn_sent,
    _waiting_pair,
)
from tests.support.brokers import ProcessBroker, poll
from tests.support.shard_pair import ShardBroker, ShardPair

WHY = "shard node#0 did not prepare its part within 3 s (shards.owner_wait_ms)"
ROLLED_BACK = f"transaction 't' was rolled back: {WHY}"


def _votes(shard: ShardBroker) -> list[str]:
    """The TXN ops the shard reads from now on, in order (a live list)."""
    seen: list[str] = []

    def make(original: Any) -> Any:
        def on_txn(*args: Any) -> None:
            seen.append(str(decode_txn(args[2])[0].get("op")))
            original(*args)
        return on_txn
    _patch(shard, "on_txn", make)
    return seen


def _stopped(owner: ProcessBroker) -> Any:
    assert owner.proc is not None
    return owner.proc


def _finish(pair: ShardPair, owner: ProcessBroker) -> None:
    proc = owner.proc
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
    pair.stop()
    if proc is not None and proc.poll() is None:
        owner.terminate()


def test_a_participant_stopped_before_its_vote_rolls_back_within_the_wait(
        tmp_path: Path) -> None:
    pair, owner = _waiting_pair(tmp_path)
    try:
        read = _votes(pair[1])
        client, in0, out0, ack = _consume_from_shard0(pair, pair[1])
        out1 = pair.owned_by(1, "out")
        # Two phases: a send to each shard and the acknowledgement of shard 0's "a".
        client.send_frame("BEGIN", [("transaction", "t")])
        _send(client, out0, "x-t", "t")
        _send(client, out1, "y-t", "t")
        client.send_frame("ACK", [("id", ack), ("transaction", "t")])
        _stopped(owner).send_signal(signal.SIGSTOP)  # alive, linked, silent
        client.send_frame("COMMIT", [("transaction", "t"), ("receipt", "commit")])
        error = client.expect_error_and_close(timeout=30)
        client.close()
        assert error.get("message") == ROLLED_BACK
        assert error.get("meshmq-outcome") == "rolled-back"
        assert error.get("receipt-id") == "commit"
        # Decided here without the link's keep-alive: the link is still up.
        assert pair[1].links_up() == 1 and _in_flight(pair[1]) == 0
        assert _txn_sent(pair[1]) == {"prepare": 1, "abort": 1}
        assert not _records(pair[1], DECIDED_PREFIX) and pair[1].depth(out1) == 0
        _stopped(owner).send_signal(signal.SIGCONT)  # it reads the prepare, then the abort
        poll(lambda: "prepared" in read, what="the participant's late vote")
        assert _txn_sent(pair[1]) == {"prepare": 1, "abort": 1}  # nothing more to say
        reader = RawClient(owner)
        reader.connect()
        reader.send_frame("SUBSCRIBE", [("destination", f"/queue/{in0}"), ("id", "i"),
                                        ("ack", "client-individual")])
        frame, _ = reader.read_until("MESSAGE", timeout=10)  # put back by the abort
        assert (frame.body, frame.get("redelivered")) == (b"a", "true")
        assert _bodies(reader, out0, "o") == []
        reader.close()
        assert pair[1].depth(out1) == 0
    finally:
        _finish(pair, owner)


@pytest.mark.parametrize("phases", [1, 2])
def test_the_client_raises_what_the_commit_error_says_of_the_outcome(
        tmp_path: Path, phases: int) -> None:
    """One phase (all of it shard 0's): its outcome is unknown, TransactionInDoubtError.
    Two phases (a send to shard 1 too): rolled back, TransactionRolledBackError."""
    pair, owner = _waiting_pair(tmp_path)
    try:
        in0, out0, out1 = (pair.owned_by(0, "in"), pair.owned_by(0, "out"),
                           pair.owned_by(1, "out"))
        with BlockingClient(f"stomp://{pair[1].host}:{pair[1].port}") as client:
            client.send(f"/queue/{in0}", "a")
            sub = client.subscribe(f"/queue/{in0}", ack="client-individual")
            msg = sub.get(10)
            tx = client.begin()
            client.send(f"/queue/{out0}", "x-t", transaction=tx)
            if phases == 2:
                client.send(f"/queue/{out1}", "y-t", transaction=tx)
            client.ack(msg, transaction=tx)
            _stopped(owner).send_signal(signal.SIGSTOP)
            expected = TransactionInDoubtError if phases == 1 else TransactionRolledBackError
            with pytest.raises(expected) as raised:
                client.commit(tx)
            _stopped(owner).send_signal(signal.SIGCONT)
        text = str(raised.value)
        if phases == 1:  # the broker's words, not a lost connection's
            assert "may have committed: its outcome is unknown because shard node#0" \
                in text, text
        else:
            assert f"{tx.id}' was rolled back: {WHY}" in text, text
        reader = RawClient(owner)
        reader.connect()
        if phases == 1:  # the owner committed it once it read it
            reader.send_frame("SUBSCRIBE", [("destination", f"/queue/{out0}"),
                                            ("id", "o"), ("ack", "auto")])
            frame, _ = reader.read_until("MESSAGE", timeout=10)
            assert frame.body == b"x-t"
        else:  # nothing of it, anywhere
            reader.send_frame("SUBSCRIBE", [("destination", f"/queue/{in0}"), ("id", "i"),
                                            ("ack", "client-individual")])
            frame, _ = reader.read_until("MESSAGE", timeout=10)
            assert (frame.body, frame.get("redelivered")) == (b"a", "true")
            assert _bodies(reader, out0, "o") == [] and pair[1].depth(out1) == 0
        reader.close()
    finally:
        _finish(pair, owner)
