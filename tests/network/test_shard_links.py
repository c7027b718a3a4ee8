"""Two shards of one node over real Unix-socket links, with real STOMP and MQTT
clients on each shard's own port: sends reach the owning shard, consumers on the other
shard are relayed, receipts wait for the owner's STORED."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from meshmq.protocol.wire import (
    FEATURE_SHARD,
    MAGIC,
    WIRE_VERSION,
    FrameType,
    WireDecoder,
    decode_json,
    encode_json,
)
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardPair


def _send(client: RawClient, queue: str, body: str, *, persistent: bool = True) -> None:
    rid = f"r-{body}"
    client.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", rid),
                               ("persistent", "true" if persistent else "false")],
                      body.encode())
    client.read_until_receipt(rid)


def _receive(client: RawClient, count: int) -> list[tuple[str, str]]:
    """``count`` MESSAGE frames as (body, ack id)."""
    out = []
    while len(out) < count:
        frame, _ = client.read_until("MESSAGE")
        out.append((frame.body.decode(), frame.get("ack") or ""))
    return out


def test_producers_on_both_shards_reach_a_consumer_on_the_owner(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "orders")
    producers = [pair[0].client(), pair[1].client()]
    for i in range(40):
        _send(producers[i % 2], queue, f"p{i % 2}-{i}")
    # Every receipted message is on the owner before anyone consumes it.
    assert pair[0].depth(queue) == 40
    assert pair[1].depth(queue) == 0 and pair[1].outstanding() == 0
    consumer = pair[0].client()
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "auto")])
    bodies = [body for body, _ in _receive(consumer, 40)]
    assert sorted(bodies) == sorted(f"p{i % 2}-{i}" for i in range(40))  # each once
    for p in ("p0-", "p1-"):  # in order per producer
        mine = [b for b in bodies if b.startswith(p)]
        assert mine == sorted(mine, key=lambda b: int(b.split("-")[1]))
    for client in (*producers, consumer):
        client.close()


def test_a_consumer_on_the_other_shard_is_relayed_and_its_acks_settle_on_the_owner(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "relayed")
        producer = pair[0].client()
        for i in range(30):
            _send(producer, queue, f"m{i}")
        consumer = pair[1].client()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                          ("ack", "client-individual"),
                                          ("activemq.prefetchSize", "5")])
        got = []
        for _ in range(20):  # a window of 5: each ack lets the owner send one more
            [(body, ack)] = _receive(consumer, 1)
            got.append(body)
            consumer.send_frame("ACK", [("id", ack)])
        assert got == [f"m{i}" for i in range(20)]  # the owner's order
        poll(lambda: pair[0].depth(queue) == 10, what="the acks to reach the owner")
        consumer.close()
        producer.close()
        poll(lambda: pair[0].depth(queue) == 10 and pair[0].consumers(queue) == 0,
             what="the relayed consumer to close on the owner")
        pair.stop()
        pair.start()
        pair.wait_linked()
        assert pair[0].depth(queue) == 10  # nothing acked comes back
        again = pair[1].client()
        again.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                       ("ack", "auto")])
        assert [b for b, _ in _receive(again, 10)] == [f"m{i}" for i in range(20, 30)]
        again.close()
    finally:
        pair.stop()


def test_mqtt_qos1_publish_and_subscribe_across_shards(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    try:
        pair.wait_linked()
        topic = pair.owned_by(0, "sensors", kind="topic").replace(".", "/")
        subscriber = RawMqtt(pair[1].mqtt_port)
        subscriber.connect("sub")
        subscriber.subscribe(topic, qos=1)
        # The subscription is live on the owner one link hop after the SUBACK.
        poll(lambda: pair[0].topic_subscribers(topic.replace("/", ".")) == 1,
             what="the relayed subscription on the owner")
        publishers = [RawMqtt(pair[0].mqtt_port), RawMqtt(pair[1].mqtt_port)]
        for k, publisher in enumerate(publishers):
            publisher.connect(f"pub{k}")
        for i in range(20):
            puback = publishers[i % 2].publish(topic, f"{i % 2}-{i}".encode(), qos=1)
            assert puback is not None and puback.reason_code == 0
        got = []
        for publish in subscriber.publishes(20):
            assert publish.qos == 1
            got.append(publish.payload.decode())
            subscriber.ack(publish)
        assert sorted(got) == sorted(f"{i % 2}-{i}" for i in range(20))
        for k in ("0-", "1-"):
            mine = [g for g in got if g.startswith(k)]
            assert mine == sorted(mine, key=lambda g: int(g.split("-")[1]))
        for client in (subscriber, *publishers):
            client.close()
    finally:
        pair.stop()


def test_selectors_and_consumers_on_both_shards_share_one_queue(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "shared")
    red = pair[1].client()  # relayed: its selector is applied on the owner
    red.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "r"),
                                 ("selector", "color = 'red'"), ("ack", "auto")])
    blue = pair[0].client()
    blue.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "b"),
                                  ("selector", "color = 'blue'"), ("ack", "auto")])
    poll(lambda: pair[0].consumers(queue) == 2, what="both consumers on the owner")
    producer = pair[1].client()
    for i in range(20):
        color = "red" if i % 2 else "blue"
        producer.send_frame("SEND", [("destination", f"/queue/{queue}"), ("color", color),
                                     ("receipt", f"c{i}")], f"{color}-{i}".encode())
        producer.read_until_receipt(f"c{i}")
    assert [b for b, _ in _receive(red, 10)] == [f"red-{i}" for i in range(1, 20, 2)]
    assert [b for b, _ in _receive(blue, 10)] == [f"blue-{i}" for i in range(0, 20, 2)]
    for client in (red, blue):
        client.send_frame("UNSUBSCRIBE", [("id", "r" if client is red else "b")])
    # Two plain consumers, one per shard, share a queue: each holds one message at a
    # time (prefetch 1), so a round of two messages gives each one.
    other = pair.owned_by(0, "balanced")
    consumers = [pair[0].client(), pair[1].client()]
    for c in consumers:
        c.send_frame("SUBSCRIBE", [("destination", f"/queue/{other}"), ("id", "s"),
                                   ("ack", "client-individual"),
                                   ("activemq.prefetchSize", "1")])
    poll(lambda: pair[0].consumers(other) == 2, what="both consumers on the owner")
    for i in range(10):
        _send(producer, other, f"job{i}")
    received: list[list[str]] = [[], []]
    for _ in range(5):
        round_ = [_receive(c, 1)[0] for c in consumers]
        for k, (body, ack) in enumerate(round_):
            received[k].append(body)
            consumers[k].send_frame("ACK", [("id", ack)])
    assert sorted(received[0] + received[1]) == sorted(f"job{i}" for i in range(10))
    assert all(len(r) == 5 for r in received)
    poll(lambda: pair[0].depth(other) == 0, what="every job acknowledged on the owner")
    for client in (red, blue, producer, *consumers):
        client.close()


def test_sends_to_a_stopped_owner_wait_and_are_sent_again_when_it_is_back(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "waiting")
        pair.stop_owner(0)
        producer = pair[1].client()
        for i in range(5):
            producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("persistent", "true"), ("receipt", f"w{i}")],
                                f"w{i}".encode())
        poll(lambda: pair[1].outstanding() == 5, what="the sends held for the owner")
        # Another connection's send to a queue this shard owns is confirmed as usual
        # meanwhile (a connection's own receipts stay in order).
        other = pair[1].client()
        _send(other, pair.owned_by(1, "local"), "here")
        other.close()
        # No receipt without the owner's STORED (a bounded negative check).
        with pytest.raises(TimeoutError):
            producer.read_until_receipt("w0", timeout=0.3)
        pair.start(0)
        for i in range(5):
            producer.read_until_receipt(f"w{i}")
        assert pair[1].outstanding() == 0
        assert pair[0].depth(queue) == 5
        consumer = pair[0].client()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        assert [b for b, _ in _receive(consumer, 5)] == [f"w{i}" for i in range(5)]
        with pytest.raises(TimeoutError):  # each once
            consumer.read_until("MESSAGE", timeout=0.3)
        for client in (producer, consumer):
            client.close()
    finally:
        pair.stop()


def test_a_relayed_consumer_resumes_when_its_owner_restarts(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "resumed")
    consumer = pair[1].client()
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "client-individual")])
    poll(lambda: pair[0].consumers(queue) == 1, what="the relayed consumer on the owner")
    producer = pair[0].client()
    _send(producer, queue, "before")
    [(body, _)] = _receive(consumer, 1)  # left unacknowledged
    assert body == "before"
    producer.close()
    pair.stop(0)
    pair.start(0)
    pair.wait_linked()
    # The owner took back what it had delivered; the relay is opened again on the new
    # link, and the message comes again, flagged, followed by new ones.
    producer = pair[0].client()
    _send(producer, queue, "after")
    frame, _ = consumer.read_until("MESSAGE")
    assert frame.body == b"before" and frame.get("redelivered") == "true"
    consumer.send_frame("ACK", [("id", frame["ack"])])
    frame, _ = consumer.read_until("MESSAGE")
    assert frame.body == b"after"
    consumer.send_frame("ACK", [("id", frame["ack"])])
    poll(lambda: pair[0].depth(queue) == 0, what="both acknowledged on the owner")
    for client in (producer, consumer):
        client.close()


@pytest.mark.parametrize("change", [{"token": "wrong"}, {"broker": "other-node"},
                                    {"features": []}])
def test_a_link_without_the_nodes_token_is_refused(pair: ShardPair, change) -> None:
    path = pair.identities[0].link_socket(0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    hello = {"protocol": "meshmq", "versions": [WIRE_VERSION], "broker": "node", "shard": 1,
             "token": pair.token, "features": [FEATURE_SHARD], **change}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(MAGIC + encode_json(FrameType.HELLO, hello))
        decoder = WireDecoder(expect_magic=False)
        frames = []
        while not frames:
            data = sock.recv(65536)
            assert data, "closed without a REFUSE"
            frames = decoder.feed(data)
        assert frames[0].type is FrameType.REFUSE
        assert decode_json(frames[0])["code"] == "authentication-failed"
        assert sock.recv(65536) == b""  # and closed
    assert pair[0].links_up() == 1  # the real link is untouched
