"""Connection handoff with a client id (transport/handoff.py, network/shard_clients.py):
an MQTT connection with a session that ends with it, and a STOMP connection with a
``client-id``, are handed to the shard that owns their first topic or destination with
their claim on the client id, which the id's owner moves to the adopting shard. After
that, QoS 0, 1 and 2 go straight to the owner, a will is published once, a second
CONNECT with the id anywhere takes over (MQTT) or is refused (STOMP), and an owner that
declines leaves the connection to cross, still holding its id. Real sockets, real
Unix-socket links, two in-process shards."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import ShardsConfig
from meshmq.core.shards import client_owner
from meshmq.protocol.mqtt import (
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    ReasonCode,
    Will,
)
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair


@pytest.fixture
def handing(tmp_path: Path) -> Iterator[ShardPair]:
    """Two linked shards, with STOMP and MQTT listeners, that hand connections over."""
    shards = ShardPair(tmp_path, mqtt=True, sharding=ShardsConfig(handoff=True)).start()
    shards.wait_linked()
    yield shards
    shards.stop()


def _stats(shard: ShardBroker) -> dict[str, int]:
    runtime = shard.runtime
    assert runtime is not None and runtime.handoffs is not None
    handoffs = runtime.handoffs
    return shard.run(handoffs.stats.as_dict)


def _clients(shard: ShardBroker, protocol: str) -> int:
    """Client connections of ``protocol`` served by this shard."""
    runtime = shard.runtime
    assert runtime is not None
    broker = runtime.broker
    return shard.run(lambda: sum(1 for c in broker.connections.values()
                                 if c.protocol == protocol and not c.principal.internal))


def _client_id(pair: ShardPair, k: int, prefix: str) -> str:
    """A fresh client id that shard ``k`` owns."""
    for n in itertools.count():
        name = f"{prefix}-{n}"
        if client_owner(name, pair.count) == k:
            return name
    raise AssertionError("unreachable")


def _holder(pair: ShardPair, client_id: str) -> int | None:
    """The shard the client id's owner says holds it."""
    owner = pair[client_owner(client_id, pair.count)]
    runtime = owner.runtime
    assert runtime is not None and runtime.durability.clients is not None
    clients = runtime.durability.clients
    return owner.run(lambda: clients.table[client_id].shard
                     if client_id in clients.table else None)


def _topic(pair: ShardPair, k: int, prefix: str) -> str:
    """An MQTT topic shard ``k`` owns."""
    return pair.owned_by(k, prefix, "topic").replace(".", "/")


@pytest.mark.parametrize(("level", "id_owner"), [(4, 0), (4, 1), (5, 0), (5, 1)])
def test_an_mqtt_subscriber_and_publisher_are_handed_to_the_topics_owner(
        handing: ShardPair, level: int, id_owner: int) -> None:
    topic = _topic(handing, 0, "sensors")
    sub_id = _client_id(handing, id_owner, "sub")
    pub_id = _client_id(handing, id_owner, "pub")
    subscriber = RawMqtt(handing[1].mqtt_port, level=level)
    publisher = RawMqtt(handing[1].mqtt_port, level=level)
    try:
        subscriber.connect(sub_id)
        subscriber.subscribe((topic, 2))
        assert _stats(handing[1])["handed"] == 1
        assert handing[0].topic_subscribers(topic.replace("/", ".")) == 1
        assert _holder(handing, sub_id) == 0

        publisher.connect(pub_id, keep_alive=30)
        alias = Properties(topic_alias=1) if level == 5 else None
        publisher.publish(topic, b"q0", properties=alias)
        poll(lambda: _stats(handing[1])["handed"] == 2, what="the publisher handed over")
        # MQTT 5: the alias the first PUBLISH set is known to the shard that took it.
        later = "" if level == 5 else topic
        assert isinstance(publisher.publish(later, b"q1", qos=1, properties=alias), Puback)
        assert isinstance(publisher.publish(later, b"q2", qos=2, properties=alias), Pubcomp)
        got = subscriber.publishes(3)
        assert [(p.payload, p.qos) for p in got] == [(b"q0", 0), (b"q1", 1), (b"q2", 2)]
        for packet in got:
            subscriber.ack(packet)
        # Both are served by the topic's owner: nothing of theirs crosses.
        assert _clients(handing[1], "mqtt") == 0 and _clients(handing[0], "mqtt") == 2
        assert _holder(handing, pub_id) == 0
        assert _stats(handing[0])["adopted"] == 2
        publisher.ping()
        subscriber.ping()
    finally:
        publisher.close()
        subscriber.close()
    poll(lambda: _holder(handing, sub_id) is None and _holder(handing, pub_id) is None,
         what="both client ids released by the shard that took them")


def test_a_handed_connections_will_is_published_once_when_it_drops(
        handing: ShardPair) -> None:
    topic = _topic(handing, 0, "wills")
    watcher = RawMqtt(handing[0].mqtt_port, level=5)
    dying = RawMqtt(handing[1].mqtt_port, level=5)
    marker = RawMqtt(handing[0].mqtt_port, level=5)
    try:
        watcher.connect(_client_id(handing, 1, "watch"))
        watcher.subscribe((topic, 1))
        dying.connect(_client_id(handing, 1, "dying"), keep_alive=60,
                      will=Will(topic, b"gone", qos=1))
        dying.publish(topic, b"hello", qos=1)
        assert _stats(handing[1])["handed"] == 1
        dying.abort()  # no DISCONNECT: the will goes out
        first, will = watcher.publishes(2)
        assert (first.payload, will.payload) == (b"hello", b"gone")
        marker.connect(_client_id(handing, 0, "marker"))
        marker.publish(topic, b"after", qos=1)
        # Then the marker, not a second will from the shard it was handed from.
        [after] = watcher.publishes(1)
        assert after.payload == b"after"
    finally:
        watcher.close()
        dying.close()
        marker.close()


@pytest.mark.parametrize("second_on", [0, 1])
def test_a_second_mqtt_connect_after_a_handoff_takes_the_handed_one_over(
        handing: ShardPair, second_on: int) -> None:
    topic = _topic(handing, 0, "took")
    client_id = _client_id(handing, 1, "twice")
    first = RawMqtt(handing[1].mqtt_port, level=5)
    second = RawMqtt(handing[second_on].mqtt_port, level=5)
    try:
        first.connect(client_id)
        first.subscribe((topic, 1))
        assert _stats(handing[1])["handed"] == 1 and _holder(handing, client_id) == 0
        assert second.connect(client_id).reason_code == ReasonCode.SUCCESS
        closing = first.until_closed()
        assert [p.reason_code for p in closing if isinstance(p, Disconnect)] == [
            ReasonCode.SESSION_TAKEN_OVER]
        second.ping()
        assert _holder(handing, client_id) == second_on
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("id_owner", [0, 1])
def test_a_stomp_client_id_is_handed_over_refused_elsewhere_and_reconnects(
        handing: ShardPair, id_owner: int) -> None:
    queue = handing.owned_by(0, "ids")
    client_id = _client_id(handing, id_owner, "stomp")
    consumer = RawClient(handing[1])
    consumer.connect(extra=[("client-id", client_id)])
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("receipt", "sub")])
    consumer.read_until_receipt("sub")
    assert _stats(handing[1])["handed"] == 1
    assert handing[0].consumers(queue) == 1 and _holder(handing, client_id) == 0
    for shard in (0, 1):  # the id is in use, whichever shard a second CONNECT lands on
        second = RawClient(handing[shard])
        second.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                      ("client-id", client_id)])
        try:
            error = second.expect_error_and_close()
        finally:
            second.close()
        assert f"Client: {client_id} already connected" in (error.get("message") or "")
    producer = handing[0].client()
    producer.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "r")],
                        b"m")
    producer.read_until_receipt("r")
    assert consumer.read_until("MESSAGE")[0].body == b"m"
    consumer.send_frame("DISCONNECT", [("receipt", "bye")])
    consumer.read_until_receipt("bye")
    consumer.close()

    def reconnects() -> bool:
        again = RawClient(handing[1])
        try:
            again.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                         ("client-id", client_id)])
            ok = again.read_frame().command == "CONNECTED"
            if ok:
                again.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                          ("receipt", "r2")], b"n")
                again.read_until_receipt("r2")
        finally:
            again.close()
        return ok
    poll(reconnects, what="the client id released by the shard that took it")
    assert _stats(handing[1])["handed"] == 2  # handed again, with the id
    producer.close()


def test_an_owner_that_declines_leaves_the_connections_to_cross_holding_their_ids(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True, sharding=ShardsConfig(handoff=True))
    # The owner takes one connection per listener: a handed one would be a second.
    pair.configs[0] = dataclasses.replace(pair.configs[0], listeners=tuple(
        dataclasses.replace(lst, max_connections=1) for lst in pair.configs[0].listeners))
    pair.start()
    try:
        pair.wait_linked()
        topic = _topic(pair, 0, "declined")
        client_id = _client_id(pair, 0, "kept")
        watcher = RawMqtt(pair[0].mqtt_port, level=5)
        watcher.connect(_client_id(pair, 1, "w"))
        watcher.subscribe((topic, 1))
        client = RawMqtt(pair[1].mqtt_port, level=5)
        client.connect(client_id)
        for i in range(3):
            client.publish(topic, f"m{i}".encode(), qos=1)
        stats = _stats(pair[1])
        assert (stats["offered"], stats["declined"], stats["handed"]) == (1, 1, 0)
        assert _clients(pair[1], "mqtt") == 1  # it stayed, and crossed
        assert [p.payload for p in watcher.publishes(3)] == [b"m0", b"m1", b"m2"]
        assert _holder(pair, client_id) == 1  # still held where it stayed
        stomp_id = _client_id(pair, 0, "stomp-kept")
        blocker = pair[0].client()  # the owner's one STOMP connection
        holder = RawClient(pair[1])
        holder.connect(extra=[("client-id", stomp_id)])
        holder.send_frame("SEND", [("destination", f"/queue/{pair.owned_by(0, 'q')}"),
                                   ("receipt", "r")], b"x")
        holder.read_until_receipt("r")
        assert _stats(pair[1])["declined"] == 2 and _holder(pair, stomp_id) == 1
        client.ping()
        client.close()
        holder.close()
        blocker.close()
        watcher.close()
    finally:
        pair.stop()


def test_a_connection_whose_client_ids_owner_is_down_is_not_handed_and_keeps_its_id(
        tmp_path: Path) -> None:
    trio = ShardPair(tmp_path, mqtt=True, count=3, sharding=ShardsConfig(handoff=True))
    trio.start()
    try:
        trio.wait_linked()
        topic = _topic(trio, 0, "ownerless")
        client_id = _client_id(trio, 2, "orphan")
        client = RawMqtt(trio[1].mqtt_port, level=5)
        client.connect(client_id)
        trio.stop(2)
        for k in (0, 1):
            poll(lambda k=k: trio[k].links_up() == 1, what=f"shard {k}'s link to 2 down")
        # The claim cannot move without its owner: shard 0 declines, the client crosses.
        assert isinstance(client.publish(topic, b"m", qos=1), Puback)
        assert _stats(trio[1])["declined"] == 1 and _stats(trio[0])["refused"] == 1
        assert _clients(trio[1], "mqtt") == 1
        trio.start(2)
        trio.wait_linked()
        # The owner, back, learns that shard 1 still holds the id.
        poll(lambda: _holder(trio, client_id) == 1, what="the claim announced again")
        client.ping()
        client.close()
    finally:
        trio.stop()
