"""STOMP over WebSocket on a real ``meshmq broker --shards 2`` subprocess with
connection handoff on, through the node's one ``ws://`` port (the kernel picks each
connection's shard): a producer and a consumer of a queue shard 1 owns are served by
shard 1 wherever they landed, text clients keep getting text, and the messages arrive
in order, once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.node.test_node_routing import owned_by
from tests.support.brokers import poll
from tests.support.nodes import NodeProcess, plain_module_node, shard_of
from tests.support.ws_stomp import WsStomp, closed_after

pytestmark = pytest.mark.slow

LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
             '[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n')


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"), listeners=LISTENERS,
                                 handoff=True)


@pytest.fixture
def clients() -> Iterator[list[WsStomp]]:
    yield from closed_after()


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
    before = node.handoffs()
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

    after = node.handoffs()
    assert after["handed"] - before.get("handed", 0) == 2, after
    # Both now on shard 1 (the owner), answered in text as they write text.
    assert shard_of(node, consumer.ws.socket) == 1
    assert shard_of(node, producer.ws.socket) == 1
    assert set(consumer.kinds) == {str} and set(producer.kinds) == {str}
    # Nothing of theirs crossed: shard 0 forwarded no send and relayed no delivery.
    assert link_of_shard_0(node) == crossed
    poll(lambda: all(d["depth"] == 0 for d in node.api("/api/stat")["destinations"]
                     if d["name"] == queue), 20, "the acknowledged queue to empty")
