"""STOMP acknowledgement semantics per ack mode and protocol version, through the real
STOMP session of a broker driven in memory: which messages an ACK or NACK settles, what
comes back after a consumer goes away, and which acknowledgements are refused."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import uid

VERSIONS = ["1.0", "1.1", "1.2"]


def _queue(prefix: str) -> str:
    return f"/queue/{uid(prefix)}"


def _left_on_queue(client, q: str, expected: int) -> list[str]:
    """Bodies a fresh auto-ack consumer of ``q`` receives (``expected`` of them), after
    a marker proves nothing else was waiting."""
    other = client("1.2")
    other.subscribe(q, "drain")
    marker = uid("marker-")
    other.send(q, marker)
    other.wait_messages(expected + 1)
    other.barrier()
    bodies = other.bodies()
    assert bodies[-1] == marker, bodies
    return bodies[:-1]


@pytest.mark.parametrize("version", VERSIONS)
def test_auto_ack_messages_are_settled_on_delivery(broker, client, version):
    c = client(version)
    q = _queue("auto")
    c.subscribe(q, "s", ack="auto")
    for i in range(3):
        c.send(q, f"m{i}")
    msgs = c.wait_messages(3)
    # no ack id is handed out for auto-acknowledged messages
    assert all("ack" not in m.headers for m in msgs)
    c.disconnect()
    assert _left_on_queue(client, q, 0) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_client_ack_settles_every_message_up_to_the_one_acked(broker, client, version):
    c = client(version)
    q = _queue("cumul")
    c.subscribe(q, "s", ack="client")
    for i in range(4):
        c.send(q, f"m{i}")
    msgs = c.wait_messages(4)
    c.ack(msgs[2])
    c.disconnect()
    assert _left_on_queue(client, q, 1) == ["m3"]


@pytest.mark.parametrize("version", VERSIONS)
def test_client_individual_ack_settles_only_that_message(broker, client, version):
    c = client(version)
    q = _queue("indiv")
    c.subscribe(q, "s", ack="client-individual")
    for i in range(4):
        c.send(q, f"m{i}")
    msgs = c.wait_messages(4)
    c.ack(msgs[2])
    c.disconnect()
    assert _left_on_queue(client, q, 3) == ["m0", "m1", "m3"]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_in_client_individual_mode_returns_only_that_message(broker, client, version):
    c = client(version)
    q = _queue("nack1")
    c.subscribe(q, "s", ack="client-individual", headers={"activemq.prefetchSize": "3"})
    for i in range(3):
        c.send(q, f"m{i}")
    msgs = c.wait_messages(3)
    c.nack(msgs[1])
    again = c.wait_messages(4)[3]
    assert again.body == "m1"
    assert again.headers.get("redelivered") == "true"
    c.barrier()
    assert len(c.messages) == 4  # m0 and m2 were not returned


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_of_an_ack_mode_client_message_returns_the_earlier_ones_too(broker, client,
                                                                          version):
    c = client(version)
    q = _queue("nackc")
    c.subscribe(q, "s", ack="client")
    for i in range(3):
        c.send(q, f"m{i}")
    msgs = c.wait_messages(3)
    c.nack(msgs[1])
    redelivered = c.wait_messages(5)[3:]
    assert [m.body for m in redelivered] == ["m0", "m1"]
    assert all(m.headers.get("redelivered") == "true" for m in redelivered)


def test_each_subscription_keeps_its_own_ack_mode(broker, client):
    c = client("1.2")
    auto_q, client_q = _queue("mixa"), _queue("mixc")
    c.subscribe(auto_q, "a", ack="auto")
    c.subscribe(client_q, "c", ack="client-individual")
    c.send(auto_q, "auto-msg")
    c.send(client_q, "client-msg")
    c.wait_messages(2)
    c.disconnect()
    assert _left_on_queue(client, auto_q, 0) == []
    assert _left_on_queue(client, client_q, 1) == ["client-msg"]


def test_ack_ids_name_the_subscription_they_belong_to(broker, client):
    c = client("1.2")
    q1, q2 = _queue("ids1"), _queue("ids2")
    c.subscribe(q1, "first", ack="client-individual")
    c.subscribe(q2, "second", ack="client-individual")
    c.send(q1, "one")
    c.send(q2, "two")
    msgs = {m.body: m for m in c.wait_messages(2)}
    first, second = msgs["one"].headers["ack"], msgs["two"].headers["ack"]
    assert first != second
    assert first.split("-")[0] != second.split("-")[0]
    # acking one leaves the other outstanding
    c.ack(msgs["two"])
    c.disconnect()
    assert _left_on_queue(client, q1, 1) == ["one"]
    assert _left_on_queue(client, q2, 0) == []


@pytest.mark.parametrize("mode", ["client", "client-individual"])
def test_acking_a_message_twice_is_refused(broker, client, mode):
    c = client("1.2")
    q = _queue("twice")
    c.subscribe(q, "s", ack=mode)
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.ack(m)
    c.ack(m, receipt=False)
    err = c.listener.wait_error()
    assert err.headers["message"].startswith("unexpected ACK/NACK")
    c.listener.wait_disconnected()


@pytest.mark.parametrize("version", VERSIONS)
def test_ack_of_an_auto_acknowledged_message_is_refused(broker, client, version):
    c = client(version)
    q = _queue("autoack")
    c.subscribe(q, "s", ack="auto")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    # 1.2: consumer 1, delivery tag 1, as a client-ack delivery would have been named
    headers = {"id": "1-1"} if version == "1.2" else {
        "message-id": m.headers["message-id"], "subscription": "s"}
    c.send_frame("ACK", headers)
    err = c.listener.wait_error()
    assert "unexpected ACK/NACK" in err.headers["message"]
    c.listener.wait_disconnected()


@pytest.mark.parametrize("ack_id", ["garbage", "1-", "-1", "99-1", "1-999999"])
def test_ack_with_an_id_the_broker_never_gave_is_refused(broker, client, ack_id):
    c = client("1.2")
    q = _queue("badid")
    c.subscribe(q, "s", ack="client-individual")
    c.send_frame("ACK", {"id": ack_id, "receipt": "r"})
    err = c.listener.wait_error()
    assert err.headers["message"].startswith("unexpected ACK/NACK"), err.headers
    assert err.headers.get("receipt-id") == "r"
    c.listener.wait_disconnected()


def test_ack_after_unsubscribe_is_refused_and_the_message_returns(broker, client):
    c = client("1.2")
    q = _queue("unsubacked")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.unsubscribe("s")
    c.ack(m, receipt=False)
    assert "unknown ack id" in c.listener.wait_error().headers["message"]
    assert _left_on_queue(client, q, 1) == ["m"]


def test_ack_ids_are_private_to_their_connection(broker, client):
    owner = client("1.2")
    q = _queue("private")
    owner.subscribe(q, "s", ack="client-individual")
    owner.send(q, "m")
    (m,) = owner.wait_messages(1)
    thief = client("1.2")
    thief.send_frame("ACK", {"id": m.headers["ack"]})
    assert "unknown ack id" in thief.listener.wait_error().headers["message"]
    # the owner's message is still unacknowledged: it comes back when the owner leaves
    owner.close()
    assert _left_on_queue(client, q, 1) == ["m"]


def test_stomp11_ack_names_the_subscription_that_holds_the_message(broker, client):
    c = client("1.1")
    q = _queue("sub11")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.send_frame("ACK", {"message-id": m.headers["message-id"], "subscription": "s",
                         "receipt": "ok"})
    c.listener.wait_receipt("ok")
    c.disconnect()
    assert _left_on_queue(client, q, 0) == []


def test_stomp10_ack_by_message_id_alone_finds_the_subscription(broker, client):
    c = client("1.0")
    q1, q2 = _queue("a10"), _queue("b10")
    c.subscribe(q1, "s1", ack="client")
    c.subscribe(q2, "s2", ack="client")
    c.send(q2, "second-queue")
    (m,) = c.wait_messages(1)
    assert "subscription" in m.headers
    c.send_frame("ACK", {"message-id": m.headers["message-id"], "receipt": "ok"})
    c.listener.wait_receipt("ok")
    c.disconnect()
    assert _left_on_queue(client, q2, 0) == []


def test_transactional_nack_takes_effect_only_at_commit(broker, client):
    c = client("1.2")
    q = _queue("txnack")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.begin("t")
    c.nack(m, transaction="t")
    c.barrier()
    assert len(c.messages) == 1  # not redelivered before COMMIT
    c.commit("t")
    again = c.wait_messages(2)[1]
    assert again.body == "m"
    assert again.headers.get("redelivered") == "true"


def test_aborted_nack_leaves_the_message_with_its_consumer(broker, client):
    c = client("1.2")
    q = _queue("txnackabort")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.begin("t")
    c.nack(m, transaction="t")
    c.abort("t")
    c.barrier()
    assert len(c.messages) == 1
    c.ack(m)  # still the consumer's to acknowledge
    c.disconnect()
    assert _left_on_queue(client, q, 0) == []


def test_delivery_count_grows_with_each_nack(broker, client):
    c = client("1.2")
    q = _queue("count")
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    counts = []
    for n in range(1, 4):
        m = c.wait_messages(n)[-1]
        counts.append(m.headers.get("JMSXDeliveryCount"))
        c.nack(m)
    assert counts == [None, "2", "3"]
