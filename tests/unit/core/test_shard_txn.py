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
    ONE_PHASE_PREFIX,
    PREPARED_PREFIX,
    CoordinatorTxn,
    Outcome,
    Phase,
    TxnAsk,
    TxnCommitted,
    TxnDecide,
    TxnForget,
    TxnPrepare,
    decode_prepared,
    encode_prepared,
    one_phase,
)
from meshmq.core.shards import ShardIdentity, owner
from meshmq.errors import TransactionError
from meshmq.store.base import AddMessage, Recovery, RemoveRef
from meshmq.store.memory import MemoryStore


def _shard(index: int, count: int = 2) -> tuple[Broker, MemoryStore]:
    broker, _, store = make_broker()
    broker.use_shard(_identity(index, count))
    return broker, store


def _identity(index: int, count: int = 2) -> ShardIdentity:
    return ShardIdentity(index=index, count=count, node=NODE, run_dir="/nowhere", token="t")


def _restart(broker: Broker, store: MemoryStore, index: int) -> Broker:
    again = Broker(broker.state.config, store)
    again.use_shard(_identity(index))
    again.recover(Recovery(keys=store.keys(), durable_subscriptions=store.durable_subscriptions()))
    return again


# ------------------------------------------------------------------ the state machine
_EVENTS = st.lists(st.tuples(st.sampled_from(["yes", "no", "lost", "confirmed", "timeout"]),
                             st.integers(0, 3)), max_size=25)


@given(st.frozensets(st.integers(0, 3), min_size=1), _EVENTS)
def test_the_coordinator_commits_only_on_every_yes_and_is_done_only_once_all_applied(
        participants: frozenset[int], events: list[tuple[str, int]]) -> None:
    machine = CoordinatorTxn(participants)
    outcomes: list[Outcome] = []
    yes: set[int] = set()
    broken = False  # a no, or a participant lost, before every yes
    done_at = None
    for i, (event, shard) in enumerate(events):
        decided = bool(outcomes)
        if event in ("yes", "no"):
            out = machine.vote(shard, event == "yes")
        elif event == "lost":
            out = machine.lost(shard)
        elif event == "timeout":  # the wait for the votes ran out
            out = machine.timed_out()
        else:
            if machine.confirmed(shard):
                assert done_at is None
                done_at = i
            out = None
        if not decided and event == "timeout":
            broken = True
        elif not decided and shard in participants:
            if event == "yes":
                yes.add(shard)
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


# ------------------------------------------------------------------ one phase
def _owned_of(k: int, count: int, prefix: str) -> str:
    for n in range(10_000):
        name = f"{prefix}.{n}"
        if owner(dst.queue(name), count, node=NODE) == k:
            return name
    raise AssertionError("unreachable")


@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.booleans())
def test_one_phase_exactly_when_one_other_shard_holds_all_of_the_transaction(
        owners: list[int], local_ack: bool) -> None:
    broker, store = _shard(1, count=4)
    conn = connect(broker)
    consumer = None
    if local_ack:
        mine = _owned_of(1, 4, "mine")
        send(broker, conn, mine, "m")
        consumer = sub(broker, conn, "s", mine, ack_mode=AckMode.CLIENT_INDIVIDUAL)
        [delivery] = pump(broker, store)
    broker.begin(conn, "t")
    for i, k in enumerate(owners):
        name = _owned_of(k, 4, "out")
        broker.send(conn, (dst.queue(name),), Message(
            message_id=f"ID:{i}", destination=dst.queue(name), body=b"x"), "t")
    if consumer is not None:
        broker.ack(conn, consumer, delivery.tag, cumulative=False, txn="t")
    broker.commit(conn, "t")
    prepares = broker.shard_transactions.take()
    remote = set(owners) - {1}
    assert sorted(p.owner for p in prepares if isinstance(p, TxnPrepare)) == sorted(remote)
    expect = len(remote) == 1 and 1 not in owners and not local_ack
    assert all(p.one_phase is expect for p in prepares if isinstance(p, TxnPrepare))
    assert one_phase(frozenset(remote), 1 in owners, local_ack, False) is expect
    assert not one_phase(frozenset(remote), False, False, True)  # a NACK keeps two
    assert (broker.shard_transactions.started(conn) is None) is (not remote)


_ONE_EVENTS = st.lists(st.sampled_from(["yes", "no", "lost"]), max_size=8)


@given(_ONE_EVENTS)
def test_a_one_phase_coordinator_takes_the_owners_answer_even_after_a_lost_link(
        events: list[str]) -> None:
    machine = CoordinatorTxn(frozenset({0}), one_phase=True)
    outcomes = []
    for event in events:
        out = machine.lost(0) if event == "lost" else machine.vote(0, event == "yes")
        if out is not None:
            outcomes.append(out)
        assert machine.lost(0) is None  # never an abort by itself
    answers = [e for e in events if e != "lost"]
    if not answers:
        assert not outcomes
        assert machine.phase is (Phase.IN_DOUBT if events else Phase.PREPARING)
    else:  # the first answer decides, once
        first = Outcome.COMMITTED if answers[0] == "yes" else Outcome.ABORT
        assert outcomes == [first]
        assert machine.phase is (Phase.DONE if first is Outcome.COMMITTED else Phase.ABORTED)
    with pytest.raises(ValueError):
        CoordinatorTxn(frozenset({0, 2}), one_phase=True)


def test_a_one_phase_coordinator_stores_nothing_and_asks_after_a_lost_link() -> None:
    broker, _ = _shard(1)
    conn = connect(broker)
    there = owned_by(0, "there")
    txns = broker.shard_transactions
    for answer in (True, False):
        broker.begin(conn, "t")
        broker.send(conn, (dst.queue(there),), Message(
            message_id=f"ID:{answer}", destination=dst.queue(there), body=b"x",
            persistent=True), "t")
        assert broker.commit(conn, "t") is False
        [prepare] = txns.take()
        assert isinstance(prepare, TxnPrepare) and prepare.one_phase
        txn_id = txns.started(conn)
        assert txn_id == prepare.txn
        assert txns.link_lost(0) == []  # in doubt, not rolled back
        assert txns.resume(0) == [TxnAsk(0, txn_id)]
        if answer:
            assert txns.committed_one(txn_id, 0) is Outcome.COMMITTED
            assert txns.take() == [TxnForget(0, txn_id)]
        else:
            assert txns.voted(txn_id, 0, False) is Outcome.ABORT
            assert txns.take() == []  # the owner holds nothing to abort
        assert broker.take_ops() == [] and txns.in_flight == 0
        assert txns.resume(0) == []
    # An answer about a transaction this shard no longer waits for: forget it anyway.
    assert txns.committed_one("1.0.99", 0) is None
    assert txns.take() == [TxnForget(0, "1.0.99")]


def test_a_one_phase_coordinator_gives_up_waiting_without_deciding_anything() -> None:
    broker, _ = _shard(1)
    conn = connect(broker)
    there, mine = owned_by(0, "there"), owned_by(1, "mine")
    txns = broker.shard_transactions
    for lost in (False, True):  # the owner silent on its link, or the link gone
        broker.begin(conn, "t")
        broker.send(conn, (dst.queue(there),), Message(
            message_id=f"ID:{lost}", destination=dst.queue(there), body=b"x",
            persistent=True), "t")
        broker.commit(conn, "t")
        [prepare] = txns.take()
        txn_id = txns.started(conn)
        assert isinstance(prepare, TxnPrepare) and prepare.one_phase and txn_id
        if lost:
            txns.link_lost(0)
        assert txns.give_up(txn_id) and not txns.give_up(txn_id)
        assert txns.in_flight == 0 and txns.resume(0) == []  # not asked: not waited for
        assert txns.take() == [] and broker.take_ops() == []  # nothing undone either
        # Its answer, late (or sent again by a restarted owner): only forgotten.
        assert txns.committed_one(txn_id, 0) is None
        assert txns.take() == [TxnForget(0, txn_id)]
        assert txns.voted(txn_id, 0, False) is None
    # Two phases are not given up (their outcome is the coordinator's to decide).
    broker.begin(conn, "t")
    for name in (there, mine):
        broker.send(conn, (dst.queue(name),), Message(
            message_id=f"ID:{name}", destination=dst.queue(name), body=b"x"), "t")
    broker.commit(conn, "t")
    [prepare] = txns.take()
    assert not prepare.one_phase and not txns.give_up(prepare.txn)
    assert txns.in_flight == 1


def test_a_two_phase_coordinator_whose_votes_do_not_come_in_time_rolls_back() -> None:
    broker, _ = _shard(1)
    conn = connect(broker)
    there, mine = owned_by(0, "there"), owned_by(1, "mine")
    txns = broker.shard_transactions

    def start(tag: str) -> str:
        broker.begin(conn, "t")
        for name in (there, mine):
            broker.send(conn, (dst.queue(name),), Message(
                message_id=f"ID:{tag}-{name}", destination=dst.queue(name), body=b"x",
                persistent=True), "t")
        assert broker.commit(conn, "t") is False
        [prepare] = txns.take()
        txn_id = txns.started(conn)
        assert isinstance(prepare, TxnPrepare) and not prepare.one_phase
        assert txn_id == prepare.txn
        return txn_id

    txn_id = start("late")
    assert not txns.give_up(txn_id)  # not a one-phase wait
    assert txns.time_out(txn_id) == [0]  # undecided: rolled back, shard 0 unvoted
    assert txns.take() == [TxnDecide(0, txn_id, False)]
    assert txns.in_flight == 0 and txns.time_out(txn_id) is None
    assert broker.take_ops() == []  # the coordinator's own part never applied
    # The participant's late yes changes nothing; asked, the coordinator says abort.
    assert txns.voted(txn_id, 0, True) is None and txns.take() == []
    assert txns.answer(txn_id) is False
    # Decided before the wait ran out: the wait ends with nothing to undo.
    txn_id = start("voted")
    assert txns.voted(txn_id, 0, True) is Outcome.COMMIT
    assert txns.time_out(txn_id) is None and txns.answer(txn_id) is True


def test_a_one_phase_owner_commits_in_one_batch_and_keeps_its_record_until_forgotten(
        ) -> None:
    broker, store, consumer, tag, name = _participant()
    out = owned_by(0, "out")
    x = Message(message_id="ID:s1-x", destination=dst.queue(out), body=b"x", persistent=True)
    txns = broker.shard_transactions
    txns.commit_one(1, "g", [x], [(consumer, tag)])
    batch = broker.take_ops()  # the ack, the send and the record: one atomic batch
    assert RemoveRef(f"queue://{name}", 1) in batch
    keys = sorted(key for op in batch if isinstance(op, AddMessage) for key, _ in op.refs)
    assert keys == sorted([f"queue://{out}", f"record://{ONE_PHASE_PREFIX}g"])
    store.write(batch)
    assert broker.queues[dst.queue(out)].depth == 1  # visible at once
    txns.commit_one(1, "g", [x], [(consumer, tag)])  # the same again: nothing
    assert broker.take_ops() == []
    again = _restart(broker, store, 0)
    atxns = again.shard_transactions
    assert atxns.committed_here("g")
    assert atxns.resume(1) == [TxnCommitted(1, "g")] and atxns.resume(0) == []
    atxns.forget("g")
    assert [type(op) for op in again.take_ops()] == [RemoveRef]
    assert not atxns.committed_here("g") and atxns.resume(1) == []
    atxns.forget("g")  # twice: nothing
    assert again.take_ops() == []
    assert again.queues[dst.queue(out)].depth == 1 and again.queues[dst.queue(name)].depth == 0


def test_a_one_phase_owner_refuses_what_it_cannot_take_and_changes_nothing() -> None:
    broker, store, consumer, tag, name = _participant()
    store.write(broker.take_ops())
    with pytest.raises(TransactionError, match="delivered again"):
        broker.shard_transactions.commit_one(1, "g", [], [(consumer, tag + 1)])
    assert broker.take_ops() == [] and broker.queues[dst.queue(name)].depth == 1
    assert broker.state.records == {}
