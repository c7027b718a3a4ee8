"""core/acks.py and core/transactions.py: settling windows, now or at COMMIT."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.core import destinations as dst
from meshmq.core.acks import select, select_lenient
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message
from meshmq.errors import ProtocolError, TransactionError


def test_select_names_one_tag_or_everything_up_to_it() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT)
    for i in range(3):
        send(broker, conn, "q", f"m{i}")
    tags = [d.tag for d in pump(broker, store)]
    assert select(c, tags[1], cumulative=False) == [tags[1]]
    assert select(c, tags[1], cumulative=True) == tags[:2]
    with pytest.raises(ProtocolError):
        select(c, 999, cumulative=False)
    assert select_lenient(c, 999, cumulative=True) == []


def test_commit_applies_sends_then_acks_and_abort_drops_them() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "m0")
    first = pump(broker, store)
    broker.begin(conn, "tx")
    broker.ack(conn, c, first[0].tag, cumulative=False, txn="tx")
    broker.send(conn, (dst.queue("q"),), Message(message_id="x", destination=dst.queue("q"),
                                                 body=b"m1"), "tx")
    assert pump(broker, store) == [] and first[0].tag in c.dispatched  # nothing yet
    broker.commit(conn, "tx")
    assert bodies(pump(broker, store)) == ["m1"] and first[0].tag not in c.dispatched
    broker.begin(conn, "tx2")
    broker.send(conn, (dst.queue("q"),), Message(message_id="y", destination=dst.queue("q"),
                                                 body=b"m2"), "tx2")
    broker.abort(conn, "tx2")
    assert pump(broker, store) == []
    with pytest.raises(TransactionError):
        broker.commit(conn, "tx2")


def test_a_closed_consumers_transactional_acks_are_skipped_at_commit() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    c = sub(broker, conn, "c", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "m0")
    tag = pump(broker, store)[0].tag
    broker.begin(conn, "tx")
    broker.ack(conn, c, tag, cumulative=False, txn="tx")
    broker.unsubscribe(conn, c)  # m0 goes back to the queue
    broker.commit(conn, "tx")
    again = sub(broker, conn, "again", "q")
    out = pump(broker, store)
    assert bodies(out) == ["m0"] and out[0].consumer is again
    broker.begin(conn, "tx3")
    with pytest.raises(TransactionError):
        broker.begin(conn, "tx3")  # already started
