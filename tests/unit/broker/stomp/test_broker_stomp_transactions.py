"""STOMP transactions (BEGIN, COMMIT, ABORT) through the real STOMP session of a broker
driven in memory: what a transaction holds back, when it becomes visible, which
transaction names are refused, and what happens to an open transaction when its
connection goes away."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import uid


def _queue(prefix: str) -> str:
    return f"/queue/{uid(prefix)}"


def _consumer(client, q: str, version: str = "1.2"):
    c = client(version)
    c.subscribe(q, "s")
    return c


@pytest.mark.parametrize("command", ["BEGIN", "COMMIT", "ABORT"])
def test_transaction_frames_need_a_known_or_new_name(broker, client, command):
    c = client("1.2")
    if command == "BEGIN":
        c.begin("t")  # a second BEGIN of the same name is the error
    c.send_frame(command, {"transaction": "t" if command == "BEGIN" else "never-begun",
                           "receipt": "r"})
    err = c.listener.wait_error()
    assert err.headers.get("receipt-id") == "r"
    expected = "'t' is already started" if command == "BEGIN" else "'never-begun'"
    assert expected in err.headers["message"], err.headers
    c.listener.wait_disconnected()


def test_send_in_an_unknown_transaction_is_refused_and_not_delivered(broker, client):
    q = _queue("unknowntx")
    consumer = _consumer(client, q)
    c = client("1.2")
    c.send_frame("SEND", {"destination": q, "transaction": "ghost", "receipt": "r"}, b"x")
    err = c.listener.wait_error()
    assert "ghost" in err.headers["message"]
    consumer.barrier()
    assert consumer.messages == []


def test_commit_delivers_sends_to_several_destinations_together(broker, client):
    q1, q2 = _queue("multi1"), _queue("multi2")
    c1, c2 = _consumer(client, q1), _consumer(client, q2)
    p = client("1.2")
    p.begin("t")
    p.conn.send(q1, "to-one", headers={"transaction": "t"})
    p.conn.send(q2, "to-two", headers={"transaction": "t"})
    p.barrier()
    c1.barrier()
    c2.barrier()
    assert c1.messages == [] and c2.messages == []
    p.commit("t")
    assert [m.body for m in c1.wait_messages(1)] == ["to-one"]
    assert [m.body for m in c2.wait_messages(1)] == ["to-two"]


def test_a_committed_transaction_name_can_be_begun_again(broker, client):
    q = _queue("reuse")
    consumer = _consumer(client, q)
    p = client("1.2")
    for round_ in range(2):
        p.begin("same")
        p.conn.send(q, f"round-{round_}", headers={"transaction": "same"})
        p.commit("same")
    assert consumer.wait_messages(2) and consumer.bodies() == ["round-0", "round-1"]


def test_an_aborted_transaction_name_can_be_begun_again(broker, client):
    q = _queue("reuseab")
    consumer = _consumer(client, q)
    p = client("1.2")
    p.begin("same")
    p.conn.send(q, "dropped", headers={"transaction": "same"})
    p.abort("same")
    p.begin("same")
    p.conn.send(q, "kept", headers={"transaction": "same"})
    p.commit("same")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies() == ["kept"]


def test_transactions_of_one_connection_are_independent(broker, client):
    q = _queue("indep")
    consumer = _consumer(client, q)
    p = client("1.2")
    p.begin("a")
    p.begin("b")
    p.conn.send(q, "in-a", headers={"transaction": "a"})
    p.conn.send(q, "in-b", headers={"transaction": "b"})
    p.abort("a")
    p.commit("b")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies() == ["in-b"]


def test_transaction_names_are_private_to_their_connection(broker, client):
    q = _queue("privtx")
    consumer = _consumer(client, q)
    owner = client("1.2")
    owner.begin("shared-name")
    owner.conn.send(q, "owned", headers={"transaction": "shared-name"})
    owner.barrier()
    other = client("1.2")
    other.send_frame("COMMIT", {"transaction": "shared-name"})
    assert "shared-name" in other.listener.wait_error().headers["message"]
    consumer.barrier()
    assert consumer.messages == []  # the other connection could not commit it
    owner.commit("shared-name")
    assert consumer.wait_messages(1)[0].body == "owned"


@pytest.mark.parametrize("how", ["disconnect", "drop"])
def test_an_open_transaction_is_rolled_back_when_its_connection_ends(broker, client, how):
    q = _queue("openend")
    consumer = _consumer(client, q)
    p = client("1.2")
    p.begin("t")
    p.conn.send(q, "never", headers={"transaction": "t"})
    p.barrier()
    if how == "disconnect":
        p.disconnect()
    else:
        p.close()
    consumer.send(q, "marker")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies() == ["marker"]


def test_open_transactional_acks_are_undone_when_the_connection_ends(broker, client):
    q = _queue("openack")
    c = client("1.2")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.begin("t")
    c.ack(m, transaction="t")
    c.close()
    again = _consumer(client, q)
    redelivered = again.wait_messages(1)[0]
    assert redelivered.body == "m"
    assert redelivered.headers.get("redelivered") == "true"


def test_commit_keeps_the_order_of_the_sends(broker, client):
    q = _queue("txorder")
    consumer = _consumer(client, q)
    p = client("1.2")
    p.send(q, "before")
    p.begin("t")
    bodies = [f"tx-{i}" for i in range(20)]
    for body in bodies:
        p.conn.send(q, body, headers={"transaction": "t"})
    p.commit("t")
    p.send(q, "after")
    consumer.wait_messages(22)
    assert consumer.bodies() == ["before", *bodies, "after"]


def test_persistent_send_committed_is_persistent_on_delivery(broker, client):
    q = _queue("txpersist")
    consumer = _consumer(client, q)
    p = client("1.2")
    p.begin("t")
    p.conn.send(q, "durable", headers={"transaction": "t", "persistent": "true"})
    p.conn.send(q, "transient", headers={"transaction": "t"})
    p.commit("t")
    msgs = {m.body: m for m in consumer.wait_messages(2)}
    assert msgs["durable"].headers.get("persistent") == "true"
    assert "persistent" not in msgs["transient"].headers


def test_topic_subscriber_sees_nothing_of_an_aborted_transaction(broker, client):
    t = f"/topic/{uid('txtopic')}"
    sub = client("1.2")
    sub.subscribe(t, "s")
    p = client("1.2")
    p.begin("t")
    p.conn.send(t, "aborted", headers={"transaction": "t"})
    p.abort("t")
    p.send(t, "plain")
    sub.wait_messages(1)
    sub.barrier()
    assert sub.bodies() == ["plain"]


def test_transaction_mixes_an_ack_and_a_send(broker, client):
    """A consume-transform-produce step: the ack and the send take effect together."""
    src, dst = _queue("txsrc"), _queue("txdst")
    out = _consumer(client, dst)
    worker = client("1.2")
    worker.subscribe(src, "in", ack="client-individual")
    worker.send(src, "job")
    (job,) = worker.wait_messages(1)
    worker.begin("t")
    worker.ack(job, transaction="t")
    worker.conn.send(dst, "result", headers={"transaction": "t"})
    worker.barrier()
    out.barrier()
    assert out.messages == []
    worker.commit("t")
    assert out.wait_messages(1)[0].body == "result"
    worker.close()
    leftover = _consumer(client, src)
    leftover.send(src, "marker")
    leftover.wait_messages(1)
    leftover.barrier()
    assert leftover.bodies() == ["marker"]  # the job was consumed by the commit
