"""Connection handoff over plain WebSocket (transport/handoff.py, transport/websocket.py):
a STOMP client on a ``ws://`` listener whose first SEND or SUBSCRIBE (MQTT: PUBLISH or
SUBSCRIBE) names a destination another shard owns is passed to that owner, socket and
WebSocket state together; the owner's WebSocket codec goes on from the client's next
byte. Real WebSocket clients (the websockets library, paho-mqtt over websockets), two
in-process shards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import ShardsConfig
from tests.interop.mqtt_helpers import Paho
from tests.network.test_shard_handoff import _clients, _link_sent, _stats
from tests.network.test_shard_handoff_ids import _client_id, _holder
from tests.network.test_shard_handoff_ids import _clients as _mqtt_clients
from tests.support.brokers import poll
from tests.support.raw_stomp import frame_bytes
from tests.support.shard_pair import ShardPair
from tests.support.ws_stomp import WsStomp, closed_after


@pytest.fixture
def handing(tmp_path: Path) -> Iterator[ShardPair]:
    """Two linked shards with a ws:// listener each, that hand connections over."""
    shards = ShardPair(tmp_path, ws=True, sharding=ShardsConfig(handoff=True)).start()
    shards.wait_linked()
    yield shards
    shards.stop()


@pytest.fixture
def clients() -> Iterator[list[WsStomp]]:
    yield from closed_after()


def ws_client(pair: ShardPair, shard: int, made: list[WsStomp], *, text: bool = True
              ) -> WsStomp:
    client = WsStomp(pair[shard].ws_port, text=text)
    made.append(client)
    assert client.connect().get("version") == "1.2"
    return client


@pytest.mark.parametrize("text", [True, False], ids=["text", "binary"])
def test_a_producer_on_the_wrong_shard_is_handed_over_with_what_it_pipelined(
        handing: ShardPair, clients: list[WsStomp], text: bool) -> None:
    queue = handing.owned_by(0, "ws-produced")
    producer = ws_client(handing, 1, clients, text=text)
    crossed = _link_sent(handing[1])
    # Thirty SENDs in one message (what follows the first travels as the inner
    # protocol's pending bytes), then ten messages of one SEND each written at once
    # (the WebSocket codec's bytes on the socket or in its buffer), the last with a
    # receipt.
    producer.send_raw(b"".join(
        frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("n", str(i))],
                    f"m{i}".encode()) for i in range(30)))
    for i in range(30, 40):
        producer.send_raw(frame_bytes(
            "SEND", [("destination", f"/queue/{queue}"), ("n", str(i))]
            + ([("receipt", "end")] if i == 39 else []), f"m{i}".encode()))
    assert producer.next("RECEIPT").get("receipt-id") == "end"

    assert _stats(handing[1])["handed"] == 1 and _stats(handing[0])["adopted"] == 1
    assert _link_sent(handing[1]) == crossed  # nothing crossed
    assert _clients(handing[1]) == 0 and _clients(handing[0]) == 1
    assert handing[0].depth(queue) == 40
    # The owner answers as the client writes: text to a text client, else binary.
    assert producer.kinds == [str if text else bytes] * 2, producer.kinds

    consumer = ws_client(handing, 0, clients)
    consumer.send("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
    got = [consumer.next("MESSAGE") for _ in range(40)]
    assert [f.get("n") for f in got] == [str(i) for i in range(40)]
    assert [f.body for f in got] == [f"m{i}".encode() for i in range(40)]


def test_a_consumer_on_the_wrong_shard_is_served_by_the_owner(
        handing: ShardPair, clients: list[WsStomp]) -> None:
    queue = handing.owned_by(0, "ws-consumed")
    consumer = ws_client(handing, 1, clients)
    crossed = _link_sent(handing[1])
    consumer.receipt("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                   ("ack", "client-individual")])
    assert _stats(handing[1])["handed"] == 1
    assert handing[0].consumers(queue) == 1 and handing[1].consumers(queue) == 0

    producer = ws_client(handing, 0, clients)
    for i in range(10):
        producer.receipt("SEND", [("destination", f"/queue/{queue}")], f"m{i}".encode())
    got = [consumer.next("MESSAGE") for _ in range(10)]
    assert [f.body for f in got] == [f"m{i}".encode() for i in range(10)]
    for frame in got:
        consumer.receipt("ACK", [("id", frame.get("ack") or "")])
    poll(lambda: handing[0].depth(queue) == 0, what="the acknowledged queue to empty")
    assert _link_sent(handing[1]) == crossed
    # The handed connection answers pings and closes as any WebSocket does.
    consumer.ws.ping().wait(10)
    consumer.receipt("DISCONNECT", [])
    poll(lambda: _clients(handing[0]) == 1, what="the consumer's session to end")


def test_a_send_inside_a_fragmented_message_crosses_instead(
        handing: ShardPair, clients: list[WsStomp]) -> None:
    """The SEND ends inside a message the client fragmented: the codec is part-way
    through a message, which cannot move, so the connection stays and crosses."""
    queue = handing.owned_by(0, "ws-fragmented")
    producer = ws_client(handing, 1, clients)
    crossed = _link_sent(handing[1])
    first = frame_bytes("SEND", [("destination", f"/queue/{queue}")], b"a")
    second = frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("receipt", "r")],
                         b"b")
    producer.ws.send([first.decode(), second.decode()])  # one message, two frames
    assert producer.next("RECEIPT").get("receipt-id") == "r"
    assert _stats(handing[1])["offered"] == 0
    assert _link_sent(handing[1]) == crossed + 2
    assert handing[0].depth(queue) == 2


@pytest.mark.parametrize("level", [4, 5])
def test_mqtt_clients_over_websocket_are_handed_to_the_topics_owner(
        handing: ShardPair, level: int) -> None:
    topic = handing.owned_by(0, "ws-sensors", "topic").replace(".", "/")
    subscriber = Paho(handing[1].ws_port, level=level, client_id=f"ws-sub-{level}",
                      transport="websockets")
    publisher = Paho(handing[1].ws_port, level=level, client_id=f"ws-pub-{level}",
                     transport="websockets")
    try:
        crossed = _link_sent(handing[1])
        assert subscriber.subscribe(topic, qos=1)
        assert _stats(handing[1])["handed"] == 1
        for i in range(5):
            publisher.publish(topic, f"m{i}".encode(), qos=1)
        assert _stats(handing[1])["handed"] == 2 and _stats(handing[0])["adopted"] == 2
        assert subscriber.wait_messages(5) and subscriber.payloads() == [
            f"m{i}".encode() for i in range(5)]
        assert _mqtt_clients(handing[1], "mqtt") == 0
        assert _mqtt_clients(handing[0], "mqtt") == 2
        assert _link_sent(handing[1]) == crossed  # nothing crossed
    finally:
        publisher.close()
        subscriber.close()


@pytest.mark.parametrize("level", [4, 5])
def test_a_session_resumed_over_websocket_is_handed_over_at_its_connect(
        tmp_path: Path, level: int) -> None:
    """A persistent session subscribed to shard 0's topic, resumed over WebSocket
    through shard 1, is handed to shard 0 at its CONNECT (shard 0 answers it) and gets
    what was published while it was away, once."""
    pair = ShardPair(tmp_path, mqtt=True, ws=True, sharding=ShardsConfig(handoff=True))
    pair.start()
    try:
        pair.wait_linked()
        topic = pair.owned_by(0, "ws-meters", "topic").replace(".", "/")
        client_id = _client_id(pair, 1, f"ws-meter-{level}")
        session = {"clean": False} if level == 4 else {"clean": False, "session_expiry": 600}
        made = Paho(pair[1].ws_port, level=level, client_id=client_id,
                    transport="websockets", **session)  # type: ignore[arg-type]
        made.subscribe(topic, qos=1)  # handed at its SUBSCRIBE
        poll(lambda: _stats(pair[1])["handed"] == 1, what="handed at its SUBSCRIBE")
        made.close()
        poll(lambda: _holder(pair, client_id) is None, what="the client id released")
        publisher = Paho(pair[0].mqtt_port, level=level, client_id=f"ws-pub-{level}")
        for i in range(3):
            publisher.publish(topic, f"m{i}".encode(), qos=1)
        publisher.close()

        back = Paho(pair[1].ws_port, level=level, client_id=client_id,
                    transport="websockets", **session)  # type: ignore[arg-type]
        try:
            assert back.session_present
            assert _stats(pair[1])["handed"] == 2 and _stats(pair[0])["sessions"] == 2
            back.wait_messages(3)
            assert back.payloads() == [b"m0", b"m1", b"m2"]
            assert _mqtt_clients(pair[1], "mqtt") == 0 and _holder(pair, client_id) == 0
        finally:
            back.close()
    finally:
        pair.stop()
