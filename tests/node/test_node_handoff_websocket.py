"""STOMP over WebSocket on a real ``meshmq broker --shards 2`` subprocess with
connection handoff on, through the node's one ``ws://`` port (the kernel picks each
connection's shard): a producer and a consumer of a queue shard 1 owns are served by
shard 1 wherever they landed, text clients keep getting text, and the messages arrive
in order, once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.node.test_node_routing import owned_by
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import NodeProcess, shard_of, write_node_toml
from tests.support.ws_stomp import WsStomp

pytestmark = pytest.mark.slow

LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
             '[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n')


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS,
                             handoff=True)
    n = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(n)  # stopped by this fixture, after the module
    try:
        yield n
    finally:
        n.terminate()


@pytest.fixture
def clients() -> Iterator[list[WsStomp]]:
    made: list[WsStomp] = []
    yield made
    for client in made:
        client.close()


def handoffs(node: NodeProcess) -> dict[str, int]:
    total: dict[str, int] = {}
    for row in node.shards():
        counters: dict[str, Any] = row.get("handoffs") or {}
        for key, value in counters.items():
            total[key] = total.get(key, 0) + int(value)
    return total


def link_of_shard_0(node: NodeProcess) -> tuple[int, int]:
    """Sends shard 0 forwarded to shard 1, deliveries it relayed from there."""
    (link,) = next(row for row in node.shards() if row["shard"] == 0)["links"]
    return int(link["sent"]), int(link["delivered_out"])


def on_shard(node: NodeProcess, shard: int, made: list[WsStomp]) -> WsStomp:
    """A connected WebSocket STOMP client that the node's port gave to ``shard``."""
    for _ in range(64):
        client = WsStomp(node.ports["ws"])
        made.append(client)
        client.connect()
        if shard_of(node, client.ws.socket) == shard:
            return client
        client.close()
    raise AssertionError(f"64 WebSocket connections and none reached shard {shard}")


def test_websocket_clients_on_the_other_shard_are_served_by_the_owner(
        node: NodeProcess, clients: list[WsStomp]) -> None:
    queue = owned_by(1, "ws-node")
    before = handoffs(node)
    crossed = link_of_shard_0(node)
    consumer = on_shard(node, 0, clients)
    consumer.receipt("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                   ("ack", "client-individual")])
    producer = on_shard(node, 0, clients)
    for i in range(20):
        producer.send("SEND", [("destination", f"/queue/{queue}"), ("n", str(i))],
                      f"m{i}".encode())
    producer.receipt("SEND", [("destination", f"/queue/{queue}"), ("n", "20")], b"m20")
    got = [consumer.next("MESSAGE") for _ in range(21)]
    assert [f.get("n") for f in got] == [str(i) for i in range(21)]
    for frame in got:
        consumer.send("ACK", [("id", frame.get("ack") or "")])
    consumer.receipt("UNSUBSCRIBE", [("id", "s")])

    after = handoffs(node)
    assert after["handed"] - before.get("handed", 0) == 2, after
    # Both now on shard 1 (the owner), answered in text as they write text.
    assert shard_of(node, consumer.ws.socket) == 1
    assert shard_of(node, producer.ws.socket) == 1
    assert set(consumer.kinds) == {str} and set(producer.kinds) == {str}
    # Nothing of theirs crossed: shard 0 forwarded no send and relayed no delivery.
    assert link_of_shard_0(node) == crossed
    poll(lambda: all(d["depth"] == 0 for d in node.api("/api/stat")["destinations"]
                     if d["name"] == queue), 20, "the acknowledged queue to empty")
