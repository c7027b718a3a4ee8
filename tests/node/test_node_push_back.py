"""Push-back across the shards of a real node (``meshmq broker --shards 2``): a producer
that the node's port handed to shard 1, sending flat out to a queue shard 0 owns whose
consumer reads nothing, is held by the owner's note; the owner's backlog stops growing
long before the producer's run is sent; once the consumer reads, the producer goes on,
and every message arrives once, in order."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.nodes import NodeProcess, shard_api, stomp_on, write_node_toml
from tests.support.raw_stomp import frame_bytes

pytestmark = pytest.mark.slow

COUNT, SIZE = 30_000, 1024  # 30 MB: far more than the sockets on the way hold
# The owner's backlog once the producer is held (tests/network/test_shard_push_back.py
# samples it on the shards' loops): what waited when the owner noted the hold plus what
# the producer's shard had forwarded meanwhile, the sends on the link (about 6,400 here
# on an idle two-core machine); bounded, far below COUNT.
HELD_BACKLOG = COUNT // 2


def _owned_by_0(prefix: str) -> str:
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"queue://{name}"), 2, node="node") == 0:
            return name
    raise AssertionError("unreachable")


def _holds_in(node: NodeProcess) -> int:
    """How often shard 0, the owner, asked shard 1 to hold its producers."""
    links = shard_api(node, 1, "/api/broker")["shard_links"]
    return sum(int(link["holds_in"]) for link in links if link["shard"] == 0)


def _depth(node: NodeProcess, name: str) -> int:
    return int(node.api(f"/api/destinations/queue/{name}")["depth"])


def test_a_producer_on_another_shard_is_held_by_the_owners_slow_consumer(
        tmp_path: Path) -> None:
    node = NodeProcess(write_node_toml(tmp_path / "node.toml", data=tmp_path / "data"),
                       tmp_path / "node.log").start()
    name = _owned_by_0("pushed")
    consumer = stomp_on(node, 0)
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{name}"), ("id", "s"),
                                      ("ack", "auto"), ("receipt", "sub")])
    consumer.read_until_receipt("sub")
    producer: RawClient = stomp_on(node, 1)
    written = [0]

    def write() -> None:
        for start in range(0, COUNT, 64):
            producer.send_bytes(b"".join(
                frame_bytes("SEND", [("destination", f"/queue/{name}"),
                                     ("content-length", str(SIZE))],
                            f"p{i:08d}".encode().ljust(SIZE, b"x"))
                for i in range(start, min(COUNT, start + 64))))
            written[0] = min(COUNT, start + 64)
        producer.send_frame("SEND", [("destination", f"/queue/{name}"),
                                     ("receipt", "end")], b"end")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        poll(lambda: _holds_in(node) >= 1, 60, "the owner's note to hold the producer")
        # Held: what was on its way lands, then the owner's backlog stops growing.
        last = [-1]

        def settled() -> bool:
            depth = _depth(node, name)
            same, last[0] = depth == last[0], depth
            return same

        poll(settled, 60, "the owner's backlog to stop growing")
        assert last[0] <= HELD_BACKLOG, last[0]
        assert written[0] < COUNT  # the producer's writes stalled, far from the end
        print(f"the owner's backlog once the producer was held: {last[0]} "
              f"(the producer had written {written[0]} of {COUNT})")
        seen = []
        for _ in range(COUNT + 1):
            frame, _ = consumer.read_until("MESSAGE", timeout=30)
            seen.append(-1 if frame.body == b"end" else int(frame.body[1:9]))
        assert seen == [*range(COUNT), -1]  # every message once, in order
        producer.read_until_receipt("end", timeout=30)
        thread.join(30)
    finally:
        producer.close()
        consumer.close()
        node.terminate()
