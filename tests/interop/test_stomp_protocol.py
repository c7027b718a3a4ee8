"""STOMP 1.0/1.1/1.2 protocol behaviour with stomp.py and raw sockets."""

from __future__ import annotations

import pytest

from meshmq.config.model import StompConfig
from tests.interop.stomp_helpers import uid
from tests.support.brokers import poll

# The node variant's server heart-beats, as test_stomppy_receives_server_heartbeats asks
# of one broker (the other tests' clients ask for none from the broker).
NODE_TOML = "\n[stomp]\nserver_heartbeat_ms = 100\n"

# ------------------------------------------------------------------ connect / negotiation


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomppy_connects_and_round_trips_each_version(broker, client, version):
    c = client(version)
    connected = c.listener.connected[0]
    assert connected.headers["version"] == version
    assert connected.headers.get("session")
    q = f"/queue/{uid('ver')}"
    c.subscribe(q, "s1")
    c.send(q, f"hello {version}")
    (msg,) = c.wait_messages(1)
    assert msg.body == f"hello {version}"
    assert msg.headers["destination"] == q
    assert msg.headers["subscription"] == "s1"


# ------------------------------------------------------------------ heart-beats


def test_stomppy_receives_server_heartbeats(broker_with, client):
    b = broker_with(stomp=StompConfig(server_heartbeat_ms=100))
    c = client("1.2", on=b, heartbeats=(0, 100))
    assert c.listener.connected[0].headers["heart-beat"].startswith("100,")
    c.listener.wait(lambda: c.listener.heartbeats >= 3, what="3 heart-beats from the broker")
    assert not c.listener.errors


def test_client_that_sends_heartbeats_is_kept(broker, client):
    c = client("1.2", heartbeats=(100, 0))
    assert c.listener.connected[0].headers["heart-beat"].split(",")[1] == "100"
    # ten client beats span ~1 s, far beyond 100 ms * grace: a kept connection
    c.listener.wait(lambda: c.listener.sent_heartbeats >= 10, what="10 client heart-beats")
    q = f"/queue/{uid('hb')}"
    c.subscribe(q)
    c.send(q, "still here")
    assert c.wait_messages(1)[0].body == "still here"
    assert not c.listener.errors
    assert not c.listener.disconnected


# ------------------------------------------------------------------ receipts on every frame


def test_receipts_with_stomppy_10_ack(broker, client):
    c = client("1.0")
    q = f"/queue/{uid('r10')}"
    c.subscribe(q, "s", ack="client")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.ack(m)  # waits for its receipt
    c.barrier()
    assert len(c.messages) == 1


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_disconnect_receipt_then_close_stomppy(broker, client, version):
    c = client(version)
    rid = uid("bye-")
    c.conn.disconnect(receipt=rid)
    # stomp.py may return from disconnect() before its listener thread has run.
    poll(lambda: rid in c.listener.receipts, 10, "the DISCONNECT receipt")
    c.listener.wait_disconnected()


# ------------------------------------------------------------------ transactions


# ------------------------------------------------------------------ header encoding


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_header_escaping_round_trip_stomppy(broker, client, version):
    c = client(version)
    q = f"/queue/{uid('esc')}"
    c.subscribe(q, "s")
    value = "a:b\nc\\d:"
    c.send(q, "x", {"weird": value, "plain": "p"})
    (m,) = c.wait_messages(1)
    assert m.headers["weird"] == value
    assert m.headers["plain"] == "p"


def test_content_length_body_with_nuls_stomppy(broker, client):
    body = b"head\x00middle\x00\x00tail"
    producer = client("1.2")
    consumer = client("1.2", auto_decode=False)
    q = f"/queue/{uid('nulpy')}"
    consumer.subscribe(q, "s")
    producer.send(q, body)
    (m,) = consumer.wait_messages(1)
    assert m.body == body
