"""MQTT ``$SYS/broker/...`` on a node of two shards (real ``meshmq broker --shards 2``
processes): a subscriber on either shard gets the node's figures (messages of both
shards' destinations, clients of both shards, no shard links), one value per
interval, not each shard's own in turn."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.node.test_node_routing import LISTENERS, owned_by
from tests.support.brokers import ProcessBroker
from tests.support.nodes import NodeProcess, mqtt_on, stomp_on, write_node_toml

pytestmark = pytest.mark.slow

INTERVAL_S = 0.25
RECEIVED = "$SYS/broker/messages/received"
CONNECTED = "$SYS/broker/clients/connected"
STORED = "$SYS/broker/store/messages/count"


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS,
                             extra=f"\n[mqtt]\nsys_interval_ms = {int(INTERVAL_S * 1000)}\n")
    n = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(n)  # this fixture stops it
    try:
        yield n
    finally:
        n.terminate()


def values_for(sub: RawMqtt, seconds: float) -> dict[str, list[str]]:
    """Every $SYS value ``sub`` gets for ``seconds``, by topic, in order."""
    got: dict[str, list[str]] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        (publish,) = sub.publishes(1, timeout=10)
        got.setdefault(publish.topic, []).append(publish.payload.decode())
    return got


def test_every_shard_publishes_the_nodes_figures_once_per_interval(
        node: NodeProcess) -> None:
    producer: RawClient = stomp_on(node, 0)
    # 3 messages kept by shard 0, 5 by shard 1: the node has 8, neither shard alone.
    for shard, count in ((0, 3), (1, 5)):
        queue = owned_by(shard, "sys")
        for i in range(count):
            producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("persistent", "true"),
                                         ("receipt", f"r{shard}-{i}")], b"m")
            producer.read_until_receipt(f"r{shard}-{i}")
    subscribers = [mqtt_on(node, k, f"sys-reader-{k}") for k in (0, 1)]
    try:
        subscribed = []
        for sub in subscribers:
            sub.subscribe(RECEIVED, CONNECTED, STORED, qos=0)
            subscribed.append(time.monotonic())
        for k, sub in enumerate(subscribers):
            got = values_for(sub, 3.0)  # the second reader's values wait meanwhile
            window = time.monotonic() - subscribed[k]
            # Clients: the STOMP producer and the two MQTT readers, on both shards.
            assert got[CONNECTED][-3:] == ["3"] * 3, (k, got)
            assert got[RECEIVED][-3:] == ["8"] * 3, (k, got)
            assert got[STORED][-3:] == ["8"] * 3, (k, got)
            # One publisher for the node: a value per interval (plus the retained
            # one at subscribe), not one per shard per interval. A late timer only
            # makes fewer.
            assert len(got[RECEIVED]) <= window / INTERVAL_S + 2, (k, got[RECEIVED])
            # Never a shard's own figure (3 or 5) in turn with the node's: once the
            # node's sums include the sends (a shard reports once an interval), only
            # the node's.
            values = got[RECEIVED]
            assert set(values[values.index("8"):]) == {"8"}, (k, values)
    finally:
        producer.close()
        for sub in subscribers:
            sub.close()
