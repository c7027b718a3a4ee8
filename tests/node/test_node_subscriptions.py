"""Wildcard and durable subscriptions on a node of two shards, end to end: real
``meshmq broker --shards 2`` subprocesses, every client through the node's one port
(each test picks which shard a connection reached), destinations named so that each
shard owns some. A wildcard subscription gets what every shard owns, also after a
shard is killed and restarted; a durable subscription keeps, on its topic's owner, what
is published while its client is away, whichever shard the client comes back through."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import Address, RawClient
from tests.node.test_node_routing import LISTENERS, SHARDS, owned_by
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import (
    NodeProcess,
    mqtt_on,
    pid_gone,
    shard_api,
    shard_of,
    stomp_on,
    write_node_toml,
)

pytestmark = pytest.mark.slow


# ``_mqtt_session_on`` resumes a persistent session and closes it again until the
# kernel picks the wanted shard; each resume delivers what the session holds without an
# acknowledgement, and counts as a delivery attempt. The topics' redelivery limit is
# raised above the helper's tries so that those messages do not go to the DLQ.
_LENIENT_REDELIVERY = '[[policies]]\nmatch = "topic://>"\nmax_redeliveries = 1000\n'


def _start(tmp: Path) -> NodeProcess:
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS,
                             extra=_LENIENT_REDELIVERY)
    return NodeProcess(config, tmp / "node.log").start()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = _start(tmp_path_factory.mktemp("node"))
    ProcessBroker.running.discard(n)  # stopped by this fixture, after the module
    try:
        yield n
    finally:
        n.terminate()


def _stomp_as(node: NodeProcess, shard: int, client_id: str) -> RawClient:
    """A STOMP client with ``client_id`` that the node's port handed to ``shard``. The
    client id is the node's, free again as soon as a connection with it is closed,
    whichever shard the next one lands on."""
    for _ in range(64):
        client = RawClient(Address(node.port))
        client.connect(extra=[("client-id", client_id)])
        if shard_of(node, client.sock) == shard:
            return client
        client.close()
    raise AssertionError(f"no connection reached shard {shard}")


def _mqtt_session_on(node: NodeProcess, shard: int, client_id: str) -> tuple[RawMqtt, bool]:
    """An MQTT client resuming (or starting) persistent session ``client_id`` on
    ``shard``, and whether the CONNACK said the session was present."""
    for _ in range(64):
        client = RawMqtt(node.ports["mqtt"])
        present = client.connect(client_id, clean=False).session_present
        if shard_of(node, client.sock) == shard:
            return client, present
        client.close()
    raise AssertionError(f"no connection reached shard {shard}")


def _send(client: RawClient, dest: str, body: str) -> None:
    client.send_frame("SEND", [("destination", dest), ("persistent", "true"),
                               ("receipt", f"r-{body}")], body.encode())
    client.read_until_receipt(f"r-{body}")


def _subscribe(client: RawClient, dest: str, sid: str, *extra: tuple[str, str],
               ack: str = "auto") -> list[tuple[str, str]]:
    """SUBSCRIBE with a receipt; (destination, body) of messages before the receipt."""
    client.send_frame("SUBSCRIBE", [("destination", dest), ("id", sid), ("ack", ack),
                                    ("receipt", f"sub-{sid}"), *extra])
    return [(f.get("destination") or "", f.body.decode())
            for f in client.read_until_receipt(f"sub-{sid}") if f.command == "MESSAGE"]


def _messages(client: RawClient, count: int, early: list[tuple[str, str]] | None = None,
              *, ack: bool = False) -> list[tuple[str, str]]:
    got = list(early or [])
    while len(got) < count:
        frame, _ = client.read_until("MESSAGE")
        got.append((frame.get("destination") or "", frame.body.decode()))
        if ack:
            client.send_frame("ACK", [("id", frame.get("ack") or "")])
    return got


def _offline(node: NodeProcess, shard: int, client_id: str) -> dict[str, int]:
    """The durable subscriptions ``shard`` keeps for ``client_id`` with no consumer:
    name -> messages waiting."""
    subs = shard_api(node, shard, "/api/subscriptions")["subscriptions"]
    return {s["name"]: s["pending"] for s in subs
            if s["client_id"] == client_id and not s["active"]}


def test_a_queue_wildcard_consumes_what_both_shards_own(node: NodeProcess) -> None:
    for k in SHARDS:  # the consumer on each shard in turn
        queues = [owned_by(owner, f"wq{k}.jobs") for owner in SHARDS]
        consumer = stomp_on(node, k)
        producer = stomp_on(node, 1 - k)
        _send(producer, f"/queue/{queues[0]}", f"{k}-early")  # before: kept by its owner
        early = _subscribe(consumer, f"/queue/wq{k}.jobs.>", f"w{k}",
                           ack="client-individual")
        for i in range(10):
            _send(producer, f"/queue/{queues[i % 2]}", f"{k}-{i}")
        got = _messages(consumer, 11, early, ack=True)
        per_queue = {q: [b for d, b in got if d == f"/queue/{q}"] for q in queues}
        assert per_queue == {
            queues[0]: [f"{k}-early"] + [f"{k}-{i}" for i in range(0, 10, 2)],
            queues[1]: [f"{k}-{i}" for i in range(1, 10, 2)]}
        consumer.receipt_roundtrip()
        for c in (consumer, producer):
            c.close()


def test_mqtt_wildcards_at_qos_0_and_1_get_every_shards_topics(node: NodeProcess) -> None:
    topics = [owned_by(k, "wm.room", "topic").replace(".", "/") for k in SHARDS]
    qos1 = mqtt_on(node, 0, "wild1")
    qos1.subscribe("wm/room/+", qos=1)
    qos0 = mqtt_on(node, 1, "wild0")
    qos0.subscribe("wm/#", qos=0)
    publisher = mqtt_on(node, 1, "wpub")
    for i in range(10):
        publisher.publish(topics[i % 2], f"{i}".encode(), qos=1)
    for client, qos in ((qos1, 1), (qos0, 0)):
        got: dict[str, list[str]] = {}
        for publish in client.publishes(10):
            assert publish.qos == qos
            got.setdefault(publish.topic, []).append(publish.payload.decode())
            client.ack(publish)
        assert got == {topics[0]: [str(i) for i in range(0, 10, 2)],
                       topics[1]: [str(i) for i in range(1, 10, 2)]}
    for client in (qos1, qos0, publisher):
        client.close()


def test_a_stomp_durable_subscriber_gets_what_it_missed_through_either_shard(
        node: NodeProcess) -> None:
    topic = owned_by(1, "dur.news", "topic")
    name = ("activemq.subscriptionName", "daily")
    first = _stomp_as(node, 0, "reader")
    _subscribe(first, f"/topic/{topic}", "d", name)
    first.close()
    poll(lambda: _offline(node, 1, "reader") == {"daily": 0}, 20,
         "the owner to keep the subscription")
    producer = stomp_on(node, 0)
    for i in range(3):
        _send(producer, f"/topic/{topic}", f"m{i}")
    assert _offline(node, 1, "reader") == {"daily": 3}
    assert _offline(node, 0, "reader") == {}
    for shard, expected in ((1, ["m0", "m1", "m2"]), (0, ["m3"])):
        back = _stomp_as(node, shard, "reader")
        early = _subscribe(back, f"/topic/{topic}", "d", name, ack="client-individual")
        assert [b for _, b in _messages(back, len(expected), early, ack=True)] == expected
        back.receipt_roundtrip()
        back.close()
        poll(lambda: "daily" in _offline(node, 1, "reader"), 20, "the client gone")
        _send(producer, f"/topic/{topic}", "m3")
    # Removed by name through the shard that does not own it: gone on the owner.
    remover = _stomp_as(node, 0, "reader")
    remover.send_frame("UNSUBSCRIBE", [("id", "d"), name, ("receipt", "gone")])
    remover.read_until_receipt("gone")
    poll(lambda: _offline(node, 1, "reader") == {}, 20, "the owner to drop it")
    for client in (producer, remover):
        client.close()


def test_an_mqtt_persistent_session_keeps_qos1_messages_on_the_topics_owner(
        node: NodeProcess) -> None:
    topic = owned_by(1, "dur.alerts", "topic").replace(".", "/")
    session, _ = _mqtt_session_on(node, 0, "device")
    session.subscribe(topic, qos=1)
    session.close()
    poll(lambda: _offline(node, 1, "device") == {f"mqtt1:{topic}": 0}, 20,
         "the owner to keep the session's subscription")
    publisher = mqtt_on(node, 0, "apub")
    for i in range(3):
        publisher.publish(topic, f"a{i}".encode(), qos=1)
    back, present = _mqtt_session_on(node, 0, "device")
    assert present
    got = []
    for publish in back.publishes(3):
        got.append(publish.payload.decode())
        back.ack(publish)
    assert got == ["a0", "a1", "a2"]
    back.close()
    poll(lambda: f"mqtt1:{topic}" in _offline(node, 1, "device"), 20, "the session away")
    # A clean start ends the session: its subscription on the owner goes with it.
    clean = mqtt_on(node, 0, "device")
    poll(lambda: _offline(node, 1, "device") == {}, 20, "the owner to drop it")
    for client in (publisher, clean):
        client.close()


def test_a_wildcard_comes_back_on_a_killed_shard_when_the_node_restarts_it(
        tmp_path: Path) -> None:
    node = _start(tmp_path)
    try:
        topics = [owned_by(k, "wk.px", "topic") for k in SHARDS]
        subscriber = stomp_on(node, 1)
        _subscribe(subscriber, "/topic/wk.>", "w")
        victim = node.shards()[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        poll(lambda: pid_gone(victim), 10, "shard 0 to die")
        poll(lambda: node.shards()[0]["state"] == "running"
             and node.shards()[0]["pid"] != victim, 30, "shard 0 restarted")

        producer = stomp_on(node, 0)
        # A topic keeps nothing for a subscription that is not there yet: send until
        # one arrives (the links are back), then every later one must, in order.
        got: list[str] = []
        deadline = time.monotonic() + 60
        for i in itertools.count():
            assert time.monotonic() < deadline, "the wildcard never came back on shard 0"
            _send(producer, f"/topic/{topics[0]}", f"x{i}")
            try:
                frame, _ = subscriber.read_until("MESSAGE", timeout=0.05)
            except TimeoutError:
                continue
            got.append(frame.body.decode())
            break
        first = int(got[0][1:])
        for i in range(first + 1, first + 6):
            _send(producer, f"/topic/{topics[0]}", f"x{i}")
        _send(producer, f"/topic/{topics[1]}", "own")
        rest = [b for _, b in _messages(subscriber, 6)]
        assert [b for b in rest if b != "own"] == [f"x{i}" for i in range(first + 1, first + 6)]
        assert "own" in rest
        for client in (producer, subscriber):
            client.close()
    finally:
        node.terminate()



def test_mqtt_retained_messages_of_every_owner_reach_a_wildcard_on_either_shard(
        node: NodeProcess) -> None:
    topics = [owned_by(k, "ret.dev", "topic").replace(".", "/") for k in SHARDS]
    publisher = mqtt_on(node, 0, "rpub")
    for k, topic in enumerate(topics):
        publisher.publish(topic, f"v{k}".encode(), qos=1, retain=True)
    for k in SHARDS:
        # (The owner's copy to the other shard follows its PUBACK by one link hop:
        # a subscription that comes too early is made again.)
        def both_retained(k: int = k) -> bool:
            client = mqtt_on(node, k, f"rsub{k}")
            client.subscribe("ret/#", qos=1)
            got = {}
            try:
                for publish in client.publishes(2, timeout=1.0):
                    assert publish.retain
                    got[publish.topic] = publish.payload.decode()
            except AssertionError:
                return False
            finally:
                client.close()
            return got == {topics[0]: "v0", topics[1]: "v1"}

        poll(both_retained, 20, f"both retained messages on shard {k}")
    publisher.close()
