"""core/shard_txn.py: the two-phase commit of a transaction across shards, on bare
cores -- the coordinator's state machine (Hypothesis), the prepared record's codec,
what each role writes in which batch, and what a restarted core recovers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.core.test_broker_core import connect, make_broker, pump, send, sub
from tests.unit.core.test_shard_relay import NODE, owned_by

from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, Consumer
from meshmq.core.message import Message
from meshmq.core.shard_txn import (
    DECIDED_PREFIX,
    PREPARED_PREFIX,
    CoordinatorTxn,
    Outcome,
    Phase,
    TxnAsk,
    TxnDecide,
    TxnPrepare,
    decode_prepared,
    encode_prepared,
)
from meshmq.core.shards import ShardIdentity
from meshmq.errors import TransactionError
from meshmq.store.base import AddMessage, Recovery, RemoveRef
from meshmq.store.memory import MemoryStore


def _shard(index: int) -> tuple[Broker, MemoryStore]:
    broker, _, store = make_broker()
    broker.use_shard(_identity(index))
    return broker, store


def _identity(index: int) -> ShardIdentity:
    return ShardIdentity(index=index, count=2, node=NODE, run_dir="/nowhere", token="t")


def _restart(broker: Broker, store: MemoryStore, index: int) -> Broker:
    again = Broker(broker.state.config, store)
    again.use_shard(_identity(index))
    again.recover(Recovery(keys=store.keys(), durable_subscriptions=store.durable_subscriptions()))
    return again


# ------------------------------------------------------------------ the state machine
_EVENTS = st.lists(st.tuples(st.sampled_from(["yes", "no", "lost", "confirmed"]),
                             st.integers(0, 3)), max_size=25)


@given(st.frozensets(st.integers(0, 3), min_size=1), _EVENTS)
def test_the_coordinator_commits_only_on_every_yes_and_is_done_only_once_all_applied(
        participants: frozenset[int], events: list[tuple[str, int]]) -> None:
    machine = CoordinatorTxn(participants)
    outcomes: list[Outcome] = []
    yes: set[int] = set()
    broken = False  # a no, or a participant lost, before every yes
    done_at = None
    for i, (event, owner) in enumerate(events):
        decided = bool(outcomes)
        if event in ("yes", "no"):
            out = machine.vote(owner, event == "yes")
        elif event == "lost":
            out = machine.lost(owner)
        else:
            if machine.confirmed(owner):
                assert done_at is None
                done_at = i
            out = None
        if not decided and owner in participants:
            if event == "yes":
                yes.add(owner)
            elif event in ("no", "lost"):
                broken = True
        if out is not None:
            outcomes.append(out)
    assert len(outcomes) <= 1  # decided once, never changed
    if outcomes == [Outcome.COMMIT]:
        assert machine.phase in (Phase.COMMITTING, Phase.DONE)
    elif outcomes == [Outcome.ABORT]:
        assert broken and machine.phase is Phase.ABORTED
    else:
        assert not broken and yes != participants and machine.phase is Phase.PREPARING
    if yes == participants and not broken:
        assert outcomes == [Outcome.COMMIT]
    if done_at is not None:
        assert outcomes == [Outcome.COMMIT] and machine.phase is Phase.DONE
        confirmed = {o for e, o in events[:done_at + 1] if e == "confirmed"}
        assert participants <= confirmed
    elif outcomes == [Outcome.COMMIT]:
        assert machine.phase is Phase.COMMITTING and machine.unconfirmed


@given(st.lists(st.binary(max_size=40), max_size=4), st.lists(st.binary(max_size=40),
                                                              max_size=4),
       st.integers(0, 255))
def test_a_prepared_record_round_trips(sends: list[bytes], acked: list[bytes],
                                       coordinator: int) -> None:
    def messages(bodies: list[bytes], name: str) -> list[Message]:
        return [Message(message_id=f"ID:{name}-{i}", destination=dst.queue(name), body=b)
                for i, b in enumerate(bodies)]

    body = encode_prepared(coordinator, messages(sends, "s"), messages(acked, "a"))
    got_coordinator, got_sends, got_acked = decode_prepared(body)
    assert got_coordinator == coordinator
    assert [(m.message_id, m.destination, m.body) for m in got_sends] == \
        [(m.message_id, m.destination, m.body) for m in messages(sends, "s")]
    assert [m.body for m in got_acked] == acked


# ------------------------------------------------------------------ the coordinator
def test_the_coordinators_part_waits_for_every_vote_and_lands_with_the_decision() -> None:
    broker, store = _shard(1)
    conn = connect(broker)
    here, there = owned_by(1, "here"), owned_by(0, "there")
    broker.begin(conn, "t")
    broker.send(conn, (dst.queue(here),), Message(
        message_id="ID:h", destination=dst.queue(here), body=b"h", persistent=True), "t")
    broker.send(conn, (dst.queue(there),), Message(
        message_id="ID:x", destination=dst.queue(there), body=b"x", persistent=True), "t")
    assert broker.commit(conn, "t") is False
    txns = broker.shard_transactions
    [prepare] = txns.take()
    assert isinstance(prepare, TxnPrepare) and prepare.owner == 0 and not prepare.acks
    assert [m.body for m in prepare.sends] == [b"x"]
    assert broker.take_shard_sends() == []  # not forwarded one by one
    assert dst.queue(here) not in broker.queues  # nor its own part applied yet
    txn_id = txns.started(conn)
    assert txn_id == prepare.txn and txns.started(conn) is None
    store.write(broker.take_ops())
    assert txns.answer(txn_id) is None  # still deciding
    assert txns.voted(txn_id, 0, True) is Outcome.COMMIT
    batch = broker.take_ops()  # one batch: its own part and the decision record
    adds = [op for op in batch if isinstance(op, AddMessage)]
    assert sorted(key for op in adds for key, _ in op.refs) == \
        sorted([f"queue://{here}", f"record://{DECIDED_PREFIX}{txn_id}"])
    store.write(batch)
    assert txns.participants(txn_id) == [0] and txns.answer(txn_id) is True
    # Restarted before the participant applied it: told again on the next link.
    again = _restart(broker, store, 1)
    assert again.shard_transactions.resume(0) == [TxnDecide(0, txn_id, True)]
    assert again.shard_transactions.answer(txn_id) is True
    txns.confirmed(txn_id, 0)
    assert [type(op) for op in broker.take_ops()] == [RemoveRef]
    assert txns.answer(txn_id) is False and txns.in_flight == 0


def test_a_no_vote_or_a_lost_participant_aborts_and_nothing_lands() -> None:
    broker, _ = _shard(1)
    conn = connect(broker)
    here, there = owned_by(1, "here"), owned_by(0, "there")
    txns = broker.shard_transactions
    for how in ("no", "lost"):
        broker.begin(conn, how)
        broker.send(conn, (dst.queue(here),), Message(
            message_id=f"ID:h{how}", destination=dst.queue(here), body=b"h"), how)
        broker.send(conn, (dst.queue(there),), Message(
            message_id=f"ID:t{how}", destination=dst.queue(there), body=b"t"), how)
        broker.commit(conn, how)
        txns.take()
        txn_id = txns.started(conn)
        assert txn_id is not None
        if how == "no":
            assert txns.voted(txn_id, 0, False) is Outcome.ABORT
        else:
            assert txns.link_lost(0) == [txn_id]
        assert txns.take() == [TxnDecide(0, txn_id, False)]
        assert broker.take_ops() == [] and txns.answer(txn_id) is False
        assert txns.voted(txn_id, 0, True) is None  # too late
    assert dst.queue(here) not in broker.queues or broker.queues[dst.queue(here)].depth == 0


def test_a_transaction_on_its_own_shard_is_applied_at_once_without_decisions() -> None:
    broker, _ = _shard(1)
    conn = connect(broker)
    here = owned_by(1, "here")
    broker.begin(conn, "t")
    send(broker, conn, here, "h", persistent=True)
    broker.send(conn, (dst.queue(here),), Message(
        message_id="ID:h", destination=dst.queue(here), body=b"h", persistent=True), "t")
    assert broker.commit(conn, "t") is True
    assert broker.shard_transactions.take() == []
    assert broker.shard_transactions.started(conn) is None
    assert broker.queues[dst.queue(here)].depth == 2


# ------------------------------------------------------------------ a participant
def _participant() -> tuple[Broker, MemoryStore, Consumer, int, str]:
    """Shard 0 holding message "a" in a queue, delivered to a consumer (as the one it
    runs for a relayed consumer) and not yet acknowledged."""
    broker, store = _shard(0)
    conn = connect(broker)
    name = owned_by(0, "in")
    send(broker, conn, name, "a", persistent=True)
    consumer = sub(broker, conn, "relay-1", name, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    [delivery] = pump(broker, store)
    return broker, store, consumer, delivery.tag, name


@pytest.mark.parametrize("commit", [True, False])
def test_a_participant_prepares_invisibly_and_survives_a_restart(commit: bool) -> None:
    broker, store, consumer, tag, name = _participant()
    out = owned_by(0, "out")
    x = Message(message_id="ID:s1-x", destination=dst.queue(out), body=b"x", persistent=True)
    broker.shard_transactions.prepare(1, "g", [x], [(consumer, tag)])
    batch = broker.take_ops()  # the ack and the record: one atomic batch
    assert RemoveRef(f"queue://{name}", 1) in batch
    assert any(key == f"record://{PREPARED_PREFIX}g" for op in batch
               if isinstance(op, AddMessage) for key, _ in op.refs)
    store.write(batch)
    assert broker.queues[dst.queue(name)].depth == 0
    assert dst.queue(out) not in broker.queues  # invisible until the decision
    again = _restart(broker, store, 0)
    assert again.shard_transactions.resume(1) == [TxnAsk(1, "g")]
    assert again.shard_transactions.resume(0) == []
    assert dst.queue(name) not in again.queues or again.queues[dst.queue(name)].depth == 0
    assert again.shard_transactions.finish("g", commit) is True
    store.write(again.take_ops())
    assert again.shard_transactions.finish("g", commit) is False  # told twice: once
    assert again.take_ops() == []
    conn = connect(again)
    reader = sub(again, conn, "r", f"{name},{out}")
    got = [(d.message.body, d.delivery_count) for d in pump(again, store)]
    assert got == ([(b"x", 1)] if commit else [(b"a", 2)])  # "a" back, redelivered
    assert again.shard_transactions.resume(1) == []
    assert reader is not None


def test_a_participant_refuses_an_ack_no_longer_in_the_window_and_changes_nothing() -> None:
    broker, store, consumer, tag, name = _participant()
    store.write(broker.take_ops())
    with pytest.raises(TransactionError, match="delivered again"):
        broker.shard_transactions.prepare(1, "g", [], [(consumer, tag + 1)])
    assert broker.take_ops() == [] and broker.queues[dst.queue(name)].depth == 1
    assert broker.state.records == {}
