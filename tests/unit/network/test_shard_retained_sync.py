"""The retained messages a shard sends a peer whose link comes up (network/shards.py):
in parts no larger than a batch, the first replacing what the peer held from it, so a
shard with many retained messages never sends one frame too large for the link."""

from __future__ import annotations

from typing import Any

from tests.unit.core.test_shard_relay import shard

from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.network.shards import BATCH_MESSAGES, _retained_sync, _unb64
from meshmq.protocol.wire import WireDecoder, decode_json


def _parts(messages: list[Message]) -> list[dict[str, Any]]:
    frames = WireDecoder(expect_magic=False).feed(b"".join(_retained_sync(messages)))
    return [decode_json(f) for f in frames]


def test_many_retained_messages_go_in_parts_and_replace_what_the_peer_held() -> None:
    messages = [Message(message_id=f"m{i}", destination=dst.topic(f"t.{i}"), body=b"x")
                for i in range(2 * BATCH_MESSAGES + 1)]
    parts = _parts(messages)
    assert [p["first"] for p in parts] == [True, False, False]
    assert [len(p["msgs"]) for p in parts] == [BATCH_MESSAGES, BATCH_MESSAGES, 1]
    broker, _ = shard(0)
    stale = Message(message_id="old", destination=dst.topic("gone"), body=b"y")
    broker.retained_copied(1, stale.destination, stale)
    for part in parts:
        broker.retained_synced(1, [_unb64(m) for m in part["msgs"]],
                               first=part["first"] is True)
    assert len(broker.state.retained_copies) == len(messages)
    assert stale.destination not in broker.state.retained_copies


def test_no_retained_messages_is_one_part_that_clears_the_peers_copies() -> None:
    assert _parts([]) == [{"op": "retained-sync", "first": True, "msgs": []}]
