"""Transactions (core/transactions.py): what BEGIN/COMMIT/ABORT do with sends, ACKs
and NACKs, which errors come at once and which at COMMIT, and the one store batch a
COMMIT writes."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.config.model import UsageConfig
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker, Connection
from meshmq.core.consumer import AckMode
from meshmq.core.destinations import DestKind
from meshmq.core.message import Message
from meshmq.errors import DestinationError, ProtocolError, ResourceLimitError, TransactionError
from meshmq.store.base import AddMessage, RemoveRef

CI = AckMode.CLIENT_INDIVIDUAL


def tsend(broker: Broker, conn: Connection, name: str, body: str, txn: str, *,
          persistent: bool = False, **props: object) -> bool:
    dest = dst.queue(name)
    msg = Message(message_id=broker.new_message_id(conn.id), destination=dest,
                  body=body.encode(), persistent=persistent,
                  properties=dict(props))  # type: ignore[arg-type]
    return broker.send(conn, (dest,), msg, txn)


@pytest.mark.parametrize(("persistent", "needs_sync"), [(True, True), (False, False)])
def test_a_commit_needs_a_store_sync_only_for_persistent_work(persistent: bool,
                                                               needs_sync: bool) -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    broker.begin(conn, "tx")
    assert tsend(broker, conn, "q", "m", "tx", persistent=persistent) is False
    assert broker.commit(conn, "tx") is needs_sync


def test_committed_sends_arrive_in_send_order_across_destinations() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "a,b")
    broker.begin(conn, "tx")
    for name, body in (("a", "1"), ("b", "2"), ("a", "3")):
        tsend(broker, conn, name, body, "tx")
    assert pump(broker, store) == [] and broker.queues[dst.queue("b")].depth == 0
    broker.commit(conn, "tx")
    out = pump(broker, store)
    assert bodies(out) == ["1", "2", "3"] and {d.consumer for d in out} == {c}


def test_a_commit_writes_the_sends_before_the_acks_in_one_batch() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "in", ack_mode=CI)
    send(broker, conn, "in", "request", persistent=True)
    (d,) = pump(broker, store)
    broker.begin(conn, "tx")
    tsend(broker, conn, "out", "reply", "tx", persistent=True)
    broker.ack(conn, c, d.tag, cumulative=False, txn="tx")
    assert broker.take_ops() == []
    assert broker.commit(conn, "tx") is True
    ops = broker.take_ops()
    assert [type(op) for op in ops] == [AddMessage, RemoveRef]
    assert ops[1] == RemoveRef("queue://in", 1)


@pytest.mark.parametrize("action", ["commit", "abort"])
def test_an_unknown_transaction_is_refused(action: str) -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    with pytest.raises(TransactionError):
        getattr(broker, action)(conn, "nope")


def test_a_transaction_belongs_to_the_connection_that_began_it() -> None:
    broker, _, store = make_broker()
    owner, other = connect(broker), connect(broker)
    broker.begin(owner, "tx")
    tsend(broker, owner, "q", "m", "tx")
    with pytest.raises(TransactionError):
        broker.commit(other, "tx")
    with pytest.raises(TransactionError):
        tsend(broker, other, "q", "m", "tx")
    broker.begin(other, "tx")  # the same name is free on another connection
    broker.abort(other, "tx")
    broker.commit(owner, "tx")
    sub(broker, owner, "c", "q")
    assert bodies(pump(broker, store)) == ["m"]


def test_a_transaction_id_may_be_reused_once_it_has_ended() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    for body in ("first", "second"):
        broker.begin(conn, "tx")
        tsend(broker, conn, "q", body, "tx")
        broker.commit(conn, "tx")
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["first", "second"]


def test_an_aborted_ack_leaves_the_message_with_the_consumer_to_ack_again() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m", persistent=True)
    (d,) = pump(broker, store)
    broker.begin(conn, "tx")
    broker.ack(conn, c, d.tag, cumulative=False, txn="tx")
    broker.abort(conn, "tx")
    assert pump(broker, store) == []  # not redelivered: the consumer still holds it
    assert broker.ack(conn, c, d.tag, cumulative=False) is True
    assert broker.queues[dst.queue("q")].depth == 0


def test_a_transactional_nack_redelivers_only_at_commit() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m")
    (d,) = pump(broker, store)
    broker.begin(conn, "tx")
    broker.nack(conn, c, d.tag, cumulative=False, txn="tx")
    assert pump(broker, store) == [] and d.tag in c.dispatched
    broker.commit(conn, "tx")
    (again,) = pump(broker, store)
    assert again.redelivered and again.message.body == b"m"


def test_an_aborted_nack_does_nothing() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    send(broker, conn, "q", "m")
    (d,) = pump(broker, store)
    broker.begin(conn, "tx")
    broker.nack(conn, c, d.tag, cumulative=False, txn="tx")
    broker.abort(conn, "tx")
    assert pump(broker, store) == [] and d.tag in c.dispatched


def test_a_transactional_ack_of_an_unknown_tag_is_refused_at_once() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=CI)
    broker.begin(conn, "tx")
    with pytest.raises(ProtocolError):
        broker.ack(conn, c, 99, cumulative=False, txn="tx")
    assert conn.transactions["tx"].acks == []


def test_a_transactional_cumulative_ack_settles_up_to_its_tag_at_commit() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    out = pump(broker, store)
    broker.begin(conn, "tx")
    broker.ack(conn, c, out[1].tag, cumulative=True, txn="tx")
    assert len(c.dispatched) == 3
    broker.commit(conn, "tx")
    assert list(c.dispatched) == [out[2].tag]


def test_sends_to_bad_destinations_are_refused_at_send_not_at_commit() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    broker.begin(conn, "tx")
    wild = dst.queue("a.*")
    with pytest.raises(DestinationError):
        broker.send(conn, (wild,), Message("m", wild, b""), "tx")
    assert conn.transactions["tx"].sends == []


def test_the_memory_limit_refuses_a_transactional_send_at_once() -> None:
    broker, _, _ = make_broker(usage=UsageConfig(memory_limit=1000, on_limit="fail"))
    conn = connect(broker)
    send(broker, conn, "q", "x" * 400)  # 1100 bytes with its overhead: memory is full
    broker.begin(conn, "tx")
    with pytest.raises(ResourceLimitError):
        tsend(broker, conn, "q", "m", "tx")


def test_a_commit_to_a_temporary_queue_that_went_away_fails_and_sends_nothing() -> None:
    broker, _, store = make_broker()
    owner, sender = connect(broker), connect(broker)
    temp = broker.create_temp(owner, DestKind.TEMP_QUEUE)
    broker.begin(sender, "tx")
    tsend(broker, sender, "kept", "a", "tx")
    broker.send(sender, (temp,), Message("r", temp, b"reply"), "tx")
    broker.close_connection(owner)
    with pytest.raises(TransactionError):
        broker.commit(sender, "tx")
    assert "tx" not in sender.transactions
    sub(broker, sender, "c", "kept")
    assert pump(broker, store) == []


def test_closing_a_connection_discards_its_open_transactions() -> None:
    broker, _, store = make_broker()
    conn, other = connect(broker), connect(broker)
    broker.begin(conn, "tx")
    tsend(broker, conn, "q", "never", "tx")
    broker.close_connection(conn)
    assert conn.transactions == {}
    sub(broker, other, "c", "q")
    assert pump(broker, store) == []


def test_a_duplicate_dedup_id_inside_a_transaction_is_dropped_at_commit() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    send(broker, conn, "q", "original", properties={"dedup-id": "k"})
    broker.begin(conn, "tx")
    tsend(broker, conn, "q", "resend", "tx", **{"dedup-id": "k"})
    tsend(broker, conn, "q", "new", "tx", **{"dedup-id": "k2"})
    broker.commit(conn, "tx")
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["original", "new"]
