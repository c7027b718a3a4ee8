"""MQTT persistent sessions handed over on a real ``meshmq broker --shards 2``
subprocess with connection handoff on, through the node's one port with paho-mqtt
clients (the kernel picks each connection's shard): a 3.1.1 persistent session whose
subscription is on shard 1's topic, resumed through whichever shard, is served by
shard 1 and gets what was published while it was away, every message once."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.interop.mqtt_helpers import Paho
from tests.node.test_node_routing import LISTENERS, owned_by
from tests.support.brokers import poll
from tests.support.nodes import NodeProcess, plain_module_node, shard_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"), listeners=LISTENERS,
                                 handoff=True)


def _settled(node: NodeProcess) -> dict[str, int]:
    """The counters once every offer has its answer."""
    def answered() -> dict[str, int] | None:
        c = node.handoffs()
        return c if c.get("offered", 0) == c.get("handed", 0) + c.get("declined", 0) + \
            c.get("lost", 0) else None
    counters = poll(answered, what="every handoff answered")
    assert counters is not None
    return counters


def test_a_resumed_persistent_session_is_served_by_its_topics_owner(
        node: NodeProcess) -> None:
    topic = owned_by(1, "node.meters", "topic").replace(".", "/")
    port = node.ports["mqtt"]
    opened: list[Paho] = []
    try:
        made = Paho(port, level=4, client_id="node-meter", clean=False)
        opened.append(made)
        made.subscribe(topic, qos=1)
        made.disconnect()
        publisher = Paho(port, level=4, client_id="node-meter-pub")
        opened.append(publisher)
        publisher.publish(topic, b"first", qos=1)
        waiting = [b"first"]
        for n in range(64):
            before = _settled(node)["handed"]
            back = Paho(port, level=4, client_id="node-meter", clean=False)
            opened.append(back)
            assert back.session_present
            back.wait_for(waiting[-1])
            assert back.payloads() == waiting  # each once, in order
            sock = back.client.socket()
            assert isinstance(sock, socket.socket)
            assert shard_of(node, sock) == 1  # wherever it landed
            back.disconnect()
            if _settled(node)["handed"] > before:
                break  # it landed on shard 0, which handed it over at its CONNECT
            waiting = [f"waiting {n}".encode()]
            publisher.publish(topic, waiting[0], qos=1)
        else:
            raise AssertionError("64 connections and none reached shard 0")
    finally:
        for client in opened:
            client.close()
