"""A network bridge's durable demand on a node of shards: a real ``--shards 2`` node and
a single remote broker bridged to it, and a STOMP durable topic subscriber (client id
and ``activemq.subscriptionName``) on shard 1, which does not hold the node's bridges.

While the subscriber is offline, what is published on the remote broker is kept for it
(on the remote, in the bridge's network durable subscription, or on the topic's owner
once it crossed) and delivered when it subscribes again through either shard; a
SIGKILL of shard 0, which the node restarts, loses neither that demand nor the messages
published while shard 0 was down. Both ways of bridging: the remote dials the node, or
the node (shard 0) dials the remote."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.interop.stomp_helpers import Address, RawClient
from tests.network.helpers import bridges
from tests.node.test_node_network import Clients, owned_by, remote_to_node
from tests.support.brokers import ThreadBroker, poll
from tests.support.nodes import NodeProcess, pid_gone, shard_of

pytestmark = pytest.mark.slow

# A duplex bridge either way: the remote dials shard 0's tcp:// listener, or shard 0's
# network connector dials the remote (tests/node/test_node_network.py).
__all__ = ["remote_to_node"]

CLIENT = "durable-app"
NAME = "sub"


@pytest.fixture
def opened() -> Iterator[list[RawClient]]:
    """The test's connections, closed however it ends (a failure included)."""
    clients: list[RawClient] = []
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def durable_on(node: NodeProcess, shard: int, opened: list[RawClient]) -> RawClient:
    """A STOMP connection with the client id, handed by the node's port to ``shard``
    (kept in ``opened``). The id is the node's: one closed on a shard is free on its
    owner a hop later, so a CONNECT refused as "already connected" is made again."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        client = RawClient(Address(node.port))
        try:
            client.connect(extra=[("client-id", CLIENT)])
        except AssertionError as exc:
            client.close()
            if "already connected" not in str(exc):
                raise
            continue
        if shard_of(node, client.sock) == shard:
            opened.append(client)
            return client
        client.close()
    raise AssertionError(f"no connection with client id {CLIENT} reached shard {shard}")


def subscribe(client: RawClient, topic: str) -> list[str]:
    """The durable SUBSCRIBE; the bodies of messages that came before its RECEIPT."""
    client.send_frame("SUBSCRIBE", [("destination", f"/topic/{topic}"), ("id", "d"),
                                    ("ack", "client-individual"), ("receipt", "sub"),
                                    ("activemq.subscriptionName", NAME)])
    return [f.body.decode() for f in client.read_until_receipt("sub")
            if f.command == "MESSAGE"]


def receive(client: RawClient, count: int, early: list[str],
            seen: list[str] | None = None) -> list[str]:
    """``count`` bodies, each acknowledged; ``seen`` gets each one's body, message id
    and redelivered flag (what a failure reports)."""
    got = list(early)
    deadline = time.monotonic() + 60
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {got} of {count} messages"
        frame, _ = client.read_until("MESSAGE", timeout=left)
        got.append(frame.body.decode())
        if seen is not None:
            seen.append(f"{got[-1]} {frame.get('message-id')} "
                        f"redelivered={frame.get('redelivered')}")
        client.send_frame("ACK", [("id", frame.get("ack") or "")])
    client.receipt_roundtrip()
    return got


def go_offline(client: RawClient) -> None:
    """Disconnect, leaving the durable subscription (not UNSUBSCRIBE)."""
    client.send_frame("DISCONNECT", [("receipt", "bye")])
    client.read_until_receipt("bye")
    client.close()


def publish(remote: ThreadBroker, topic: str, bodies: list[str]) -> None:
    producer = RawClient(remote)
    producer.connect()
    for body in bodies:
        producer.send_frame("SEND", [("destination", f"/topic/{topic}"),
                                     ("persistent", "true"), ("receipt", body)],
                            body.encode())
        producer.read_until_receipt(body)
    producer.close()


def network_durables(remote: ThreadBroker, topic: str) -> int:
    """The remote's network durable subscriptions on ``topic`` (kept for the node)."""
    assert remote.runtime is not None
    broker = remote.runtime.broker

    def count() -> int:
        return sum(1 for sub in broker.durables.values()
                   if sub.durable is not None
                   and sub.durable.destination == f"topic://{topic}")
    return remote.run(count)


@pytest.mark.parametrize("owner", [0, 1])
def test_an_offline_durable_subscriber_on_shard_1_keeps_the_remote_messages(
        remote_to_node: Clients, owner: int, opened: list[RawClient]) -> None:
    node, remote = remote_to_node.node, remote_to_node.remote
    topic = owned_by(owner, f"dur{owner}", "topic")
    client = durable_on(node, 1, opened)
    subscribe(client, topic)
    poll(lambda: network_durables(remote, topic) == 1, 30,
         "the node's durable demand to reach the remote broker")
    go_offline(client)

    # Offline: kept, and delivered through the other shard.
    publish(remote, topic, [f"a{i}" for i in range(5)])
    client = durable_on(node, 0, opened)
    assert receive(client, 5, subscribe(client, topic)) == [f"a{i}" for i in range(5)]
    go_offline(client)

    # Offline again, and shard 0 (the node's bridges) killed and restarted.
    publish(remote, topic, ["b0", "b1"])
    before_kill = bridges(remote)  # (for a failure's report: what the remote had settled)
    victim = node.shards()[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    poll(lambda: pid_gone(victim), 10, "shard 0 to die")
    publish(remote, topic, ["b2", "b3"])  # while the bridge is down
    poll(lambda: node.shards()[0]["state"] == "running"
         and node.shards()[0]["pid"] != victim, 30, "shard 0 restarted")
    poll(lambda: any(b["state"] == "forwarding" for b in bridges(remote)), 30,
         "the bridge to the restarted shard 0")
    publish(remote, topic, ["b4", "b5"])  # once the bridge is back
    assert network_durables(remote, topic) == 1  # the demand was not dropped
    client = durable_on(node, 1, opened)
    seen: list[str] = []
    got = receive(client, 6, subscribe(client, topic), seen)
    # What each side counted, to tell a repeat sent again by the remote from one the
    # node delivered again (a shard restarted, a shard link made again).
    assert got == [f"b{i}" for i in range(6)], (
        f"received {seen}; remote bridges before the kill {before_kill}, at the end "
        f"{bridges(remote)}; "
        f"node network {node.api('/api/network')}; shards (restarts, links) "
        f"{node.shards()}")

