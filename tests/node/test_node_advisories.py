"""ActiveMQ advisories of a real ``meshmq broker --shards 2`` node, through its one
STOMP port: a subscriber of a queue's consumer advisory topic on either shard gets each
consumer's advisory once, whichever shard the consumer is on, with the node's count and
the client's own ids, as from one broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.stomp_helpers import RawClient
from tests.node.test_node_network import owned_by
from tests.support.nodes import NodeProcess, plain_module_node, stomp_on

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(Path(tmp_path_factory.mktemp("node-advisories")))


def test_a_queues_consumers_on_both_shards_are_advised_once_on_either_shard(
        node: NodeProcess) -> None:
    queue = owned_by(1, "advised")
    watchers = []
    for k in (0, 1):
        watcher = stomp_on(node, k)
        watcher.send_frame("SUBSCRIBE", [
            ("destination", f"/topic/ActiveMQ.Advisory.Consumer.Queue.{queue}"),
            ("id", "adv"), ("receipt", "adv")])
        watcher.read_until_receipt("adv")
        watchers.append(watcher)
    consumers: list[RawClient] = []
    for k, sid in ((0, "first"), (1, "second"), (0, "last")):
        client = stomp_on(node, k)
        client.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", sid),
                                        ("receipt", sid)])
        client.read_until_receipt(sid)
        consumers.append(client)
    for k, watcher in enumerate(watchers):
        got = []
        while not got or not str(got[-1].get("consumerId")).endswith(":last"):
            frame, _ = watcher.read_until("MESSAGE")
            got.append(frame)
        assert [(f.get("advisoryType"), str(f.get("consumerId")).split(":")[-1],
                 f.get("consumerCount")) for f in got] == [
            ("ConsumerAdded", "first", "1"), ("ConsumerAdded", "second", "2"),
            ("ConsumerAdded", "last", "3")], k
        # The node's ids: the shard the client is on, then its connection there.
        assert [str(f.get("connectionId")).split("-")[0] for f in got] == ["s0", "s1", "s0"]
    for client in consumers + watchers:
        client.close()
