"""Connection handoff between two shards of one node (transport/handoff.py): a plain
STOMP connection whose first SEND or SUBSCRIBE names a destination another shard owns
is passed, socket and all, to that owner, which goes on serving it; the client sees
only its frames answered. Real sockets, real Unix-socket links, two in-process shards."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import ShardsConfig
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.raw_stomp import frame_bytes
from tests.support.shard_pair import ShardBroker, ShardPair


@pytest.fixture
def handing(tmp_path: Path) -> Iterator[ShardPair]:
    """Two linked shards that hand connections over."""
    shards = ShardPair(tmp_path, sharding=ShardsConfig(handoff=True)).start()
    shards.wait_linked()
    yield shards
    shards.stop()


def _stats(shard: ShardBroker) -> dict[str, int]:
    runtime = shard.runtime
    assert runtime is not None and runtime.handoffs is not None
    handoffs = runtime.handoffs
    return shard.run(handoffs.stats.as_dict)


def _link_sent(shard: ShardBroker) -> int:
    """Sends this shard forwarded to another shard as owner."""
    runtime = shard.runtime
    assert runtime is not None
    return sum(int(str(link["sent"])) for link in shard.run(runtime.shard_links) or [])


def _clients(shard: ShardBroker) -> int:
    runtime = shard.runtime
    assert runtime is not None
    broker = runtime.broker
    return shard.run(lambda: sum(1 for c in broker.connections.values()
                                 if c.protocol == "stomp" and not c.principal.internal))


def _receive(client: RawClient, count: int) -> list[str]:
    out = []
    while len(out) < count:
        frame, _ = client.read_until("MESSAGE")
        out.append(frame.body.decode())
    return out


def test_pipelined_sends_on_the_wrong_shard_reach_the_owner_in_order(
        handing: ShardPair) -> None:
    queue = handing.owned_by(0, "handed")
    producer = handing[1].client()
    # Forty SENDs in one write, the last one cut in two: what shard 1 read and did not
    # handle travels with the socket, escaped header values included.
    frames = b"".join(
        frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("seq", str(i)),
                             ("odd", "a\\cb\\\\c"), ("persistent", "true")], f"m{i}".encode())
        for i in range(40))
    last = frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("seq", "40"),
                                ("receipt", "last")], b"m40")
    producer.send_bytes(frames + last[:10])
    poll(lambda: _stats(handing[1])["handed"] == 1, what="the producer handed over")
    producer.send_bytes(last[10:])
    producer.read_until_receipt("last")

    assert _stats(handing[0])["adopted"] == 1
    assert _link_sent(handing[1]) == 0  # nothing crossed
    assert handing[0].depth(queue) == 41
    assert _clients(handing[1]) == 0 and _clients(handing[0]) == 1

    consumer = handing[0].client()
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
    got = []
    while len(got) < 41:
        frame, _ = consumer.read_until("MESSAGE")
        got.append(frame)
    assert [f.body.decode() for f in got] == [f"m{i}" for i in range(41)]
    assert got[0].get("odd") == "a:b\\c"
    assert _stats(handing[0])["offered"] == 0  # the owner's own consumer stays
    producer.close()
    consumer.close()


def test_a_producer_that_pipelines_hundreds_of_kilobytes_is_handed_over_whole(
        handing: ShardPair) -> None:
    queue = handing.owned_by(0, "flood")
    producer = handing[1].client()
    count = 3000
    body = b"y" * 200
    producer.send_bytes(b"".join(
        frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("n", str(i))]
                    + ([("receipt", "end")] if i == count - 1 else []), body)
        for i in range(count)))
    producer.read_until_receipt("end")
    assert _stats(handing[1])["handed"] == 1 and _link_sent(handing[1]) == 0
    assert handing[0].depth(queue) == count
    consumer = handing[0].client()
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
    got = [consumer.read_until("MESSAGE")[0].get("n") for _ in range(count)]
    assert got == [str(i) for i in range(count)]
    producer.close()
    consumer.close()


def test_a_send_pipelined_behind_connect_is_handed_over_after_the_connected(
        handing: ShardPair) -> None:
    queue = handing.owned_by(0, "eager")
    client = RawClient(handing[1])
    client.send_bytes(
        frame_bytes("CONNECT", [("accept-version", "1.2"), ("host", "node")])
        + frame_bytes("SEND", [("destination", f"/queue/{queue}"), ("receipt", "r")], b"x"))
    frame, _ = client.read_until("CONNECTED")
    assert frame.get("version") == "1.2"
    client.read_until_receipt("r")  # written by the owner, after shard 1's CONNECTED
    assert _stats(handing[1])["handed"] == 1 and _link_sent(handing[1]) == 0
    assert handing[0].depth(queue) == 1
    client.close()


def test_a_consumer_on_the_wrong_shard_is_served_by_the_owner(handing: ShardPair) -> None:
    queue = handing.owned_by(0, "consumed")
    consumer = handing[1].client()
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "client-individual"), ("receipt", "sub")])
    consumer.read_until_receipt("sub")
    assert _stats(handing[1])["handed"] == 1
    assert handing[0].consumers(queue) == 1 and handing[1].consumers(queue) == 0

    producer = handing[0].client()
    for i in range(10):
        producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                     ("receipt", f"r{i}")], f"m{i}".encode())
        producer.read_until_receipt(f"r{i}")
    got = [consumer.read_until("MESSAGE")[0] for _ in range(10)]
    assert [f.body for f in got] == [f"m{i}".encode() for i in range(10)]
    for i, frame in enumerate(got):
        consumer.send_frame("ACK", [("id", frame["ack"]), ("receipt", f"a{i}")])
        consumer.read_until_receipt(f"a{i}")
    poll(lambda: handing[0].depth(queue) == 0, what="the acknowledged queue to empty")
    consumer.close()
    producer.close()


def test_a_connection_that_holds_something_crosses_instead(handing: ShardPair) -> None:
    mine = handing.owned_by(1, "local")
    theirs = handing.owned_by(0, "remote")
    client = handing[1].client()
    # Its first SUBSCRIBE names a destination shard 1 owns: nothing to hand over, and
    # once it holds a subscription it is never offered.
    client.send_frame("SUBSCRIBE", [("destination", f"/queue/{mine}"), ("id", "s"),
                                    ("receipt", "sub")])
    client.read_until_receipt("sub")
    client.send_frame("SEND", [("destination", f"/queue/{theirs}"), ("receipt", "r")], b"x")
    client.read_until_receipt("r")
    assert _stats(handing[1])["offered"] == 0
    assert _link_sent(handing[1]) == 1
    assert handing[0].depth(theirs) == 1
    client.close()


def test_an_owner_that_declines_leaves_the_connection_to_cross(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, sharding=ShardsConfig(handoff=True))
    # The owner takes one STOMP connection only: the handed one would be a second.
    listener = dataclasses.replace(pair.configs[0].listeners[0], max_connections=1)
    pair.configs[0] = dataclasses.replace(pair.configs[0], listeners=(listener,))
    pair.start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "declined")
        holder = pair[0].client()
        producer = pair[1].client()
        for i in range(5):
            producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("receipt", f"r{i}")], f"m{i}".encode())
            producer.read_until_receipt(f"r{i}")
        stats = _stats(pair[1])
        assert (stats["offered"], stats["declined"], stats["handed"]) == (1, 1, 0)
        assert _stats(pair[0])["refused"] == 1
        assert _link_sent(pair[1]) == 5 and pair[0].depth(queue) == 5
        holder.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        assert _receive(holder, 5) == [f"m{i}" for i in range(5)]
        holder.close()
        producer.close()
    finally:
        pair.stop()


def test_handoff_off_keeps_every_connection_where_it_landed(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "kept")
    producer = pair[1].client()
    producer.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "r")], b"x")
    producer.read_until_receipt("r")
    runtime = pair[1].runtime
    assert runtime is not None and runtime.handoffs is None
    assert _link_sent(pair[1]) == 1
    producer.close()
