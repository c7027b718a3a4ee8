"""What a shard holds for an owner, over real links between two shards with real STOMP
clients: sends to a stopped owner are held only for ``[shards] owner_wait_ms`` (then refused,
retriably, with a line that says the destination's shard is restarting), what is held
counts against the memory limit, so a producer is paused instead of growing the shard
without bound, an owner at its memory limit holds a producer on another shard back as
it holds its own, and sends whose STORED was lost are sent again and stored once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import UsageConfig
from meshmq.config.toml_loader import loads_toml
from meshmq.network import shards
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair


def _memory_used(shard: ShardBroker) -> int:
    assert shard.runtime is not None
    broker = shard.runtime.broker
    return shard.run(lambda: broker.usage.used)


def test_sends_to_an_owner_gone_longer_than_the_wait_are_refused_then_accepted_again(
        tmp_path: Path) -> None:
    # The setting as an operator writes it; each shard's runtime passes it to its links.
    sharding = loads_toml("[broker]\nshards = 2\n\n[shards]\nowner_wait_ms = 500\n"
                          "handoff = false\n").sharding
    pair = ShardPair(tmp_path, sharding=sharding).start()
    try:
        pair.wait_linked()
        assert pair[1].runtime is not None and pair[1].runtime.shard_peers is not None
        assert pair[1].runtime.shard_peers.owner_wait_s == 0.5
        queue = pair.owned_by(0, "waited")
        pair.stop_owner(0)
        held = pair[1].client()
        held.send_frame("SEND", [("destination", f"/queue/{queue}"), ("persistent", "true"),
                                 ("receipt", "h")], b"held")
        # Its receipt never comes: once the wait is over the send fails, retriably.
        error = held.expect_error_and_close()
        assert "restarting" in (error.get("message") or ""), error
        held.close()
        assert pair[1].outstanding() == 1  # kept: it still goes when the owner is back
        # A send after the wait is refused at once and not held.
        late = pair[1].client()
        late.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "l")],
                        b"late")
        error = late.expect_error_and_close()
        assert "restarting" in (error.get("message") or "") and "send it again" in \
            (error.get("message") or ""), error
        late.close()
        assert pair[1].outstanding() == 1
        # Destinations this shard owns are unaffected.
        local = pair[1].client()
        local.send_frame("SEND", [("destination", f"/queue/{pair.owned_by(1, 'here')}"),
                                  ("receipt", "x")], b"here")
        local.read_until_receipt("x")
        local.close()
        pair.start(0)
        pair.wait_linked()
        poll(lambda: pair[1].outstanding() == 0, what="the held send stored by its owner")
        again = pair[1].client()
        again.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "a")],
                         b"again")
        again.read_until_receipt("a")
        consumer = pair[0].client()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        got = [consumer.read_until("MESSAGE")[0].body for _ in range(2)]
        assert got == [b"held", b"again"]
        with pytest.raises(TimeoutError):  # the refused one was not kept
            consumer.read_until("MESSAGE", timeout=0.3)
        for client in (again, consumer):
            client.close()
    finally:
        pair.stop()


def test_sends_held_for_a_stopped_owner_count_against_the_memory_limit(
        tmp_path: Path) -> None:
    limit = 64 * 1024
    pair = ShardPair(tmp_path, usage=UsageConfig(memory_limit=limit)).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "bounded")
        pair.stop_owner(0)
        producer = pair[1].client()
        body = b"x" * 1024
        frame = (f"SEND\ndestination:/queue/{queue}\npersistent:false\n"
                 f"content-length:{len(body)}\n\n").encode() + body + b"\0"
        producer.send_bytes(frame * 1000)  # no receipts: nothing else would stop it
        poll(lambda: _memory_used(pair[1]) >= limit, what="the memory limit reached")
        # The producer is paused (its frames are not read): no answer to a barrier ...
        producer.send_frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "b")],
                            b"barrier")
        with pytest.raises(TimeoutError):
            producer.read_until_receipt("b", timeout=0.3)
        # ... so what is held stays near the limit, not 1000 messages.
        held = pair[1].outstanding()
        assert limit // (2 * len(body)) <= held <= 2 * limit // len(body), held
        pair.start(0)
        # The owner has the same limit: it takes what fits and the rest goes as a
        # consumer there makes room, as for a producer connected to it.
        consumer = pair[0].client()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                          ("ack", "auto")])
        for _ in range(1001):
            consumer.read_until("MESSAGE", timeout=30)
        producer.read_until_receipt("b", timeout=30)  # the owner stored them all
        assert pair[1].outstanding() == 0
        poll(lambda: _memory_used(pair[1]) == 0, what="the held bytes released")
        producer.close()
        consumer.close()
    finally:
        pair.stop()


def test_sends_whose_stored_answer_was_lost_are_not_stored_twice(tmp_path: Path) -> None:
    """The owner keeps running, but its STOREDs never reach the sender (the link
    drops first): the sender sends them again on the next link, and the owner knows
    them by their sequence numbers. First sends never enter its duplicate window."""
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "twice")
        sender = pair[1]
        assert sender.runtime is not None and sender.runtime.shard_peers is not None
        peers = sender.runtime.shard_peers
        owner = pair[0]
        assert owner.runtime is not None
        window = owner.runtime.broker.dedup
        sender.run(lambda: setattr(peers, "on_acks", lambda peer, acks: None))
        producer = sender.client()
        for i in range(3):
            producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                         ("persistent", "true"), ("receipt", f"t{i}")],
                               f"t{i}".encode())
        poll(lambda: owner.depth(queue) == 3, what="the owner storing the sends")
        assert owner.run(lambda: len(window)) == 0
        assert sender.outstanding() == 3  # their STOREDs were lost
        del peers.on_acks  # (an instance attribute: the method answers again)

        def drop() -> None:
            link = peers.peers[0].link
            assert link is not None
            link.abort("dropped by the test")

        sender.run(drop)
        for i in range(3):
            producer.read_until_receipt(f"t{i}")
        assert sender.outstanding() == 0
        assert owner.depth(queue) == 3
        consumer = owner.client()
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        assert [consumer.read_until("MESSAGE")[0].body for _ in range(3)] == \
            [b"t0", b"t1", b"t2"]
        with pytest.raises(TimeoutError):  # each once
            consumer.read_until("MESSAGE", timeout=0.3)
        for client in (producer, consumer):
            client.close()
    finally:
        pair.stop()


def test_a_resend_with_its_dedup_id_is_confirmed_only_once_the_owner_stored_it(
        tmp_path: Path) -> None:
    """A producer whose connection dropped before the receipt sends again with the same
    dedup-id through the same shard: that shard has seen the id, but the original is
    on the owner, which is stopped: no receipt until the owner has it, and it keeps one."""
    pair = ShardPair(tmp_path).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "idempotent")
        pair.stop_owner(0)
        headers = [("destination", f"/queue/{queue}"), ("persistent", "true"),
                   ("dedup-id", "order-7")]
        first = pair[1].client()
        first.send_frame("SEND", [*headers, ("receipt", "1")], b"order")
        poll(lambda: pair[1].outstanding() == 1, what="the send held for the owner")
        first.close()  # gone before its receipt
        again = pair[1].client()
        again.send_frame("SEND", [*headers, ("receipt", "2")], b"order")
        with pytest.raises(TimeoutError):
            again.read_until_receipt("2", timeout=0.3)
        pair.start(0)
        again.read_until_receipt("2")
        assert pair[0].depth(queue) == 1
        again.close()
    finally:
        pair.stop()


def _links(shard: ShardBroker) -> dict[str, Any]:
    runtime = shard.runtime
    assert runtime is not None and runtime.shard_peers is not None
    peers = runtime.shard_peers
    summary: list[dict[str, Any]] = shard.run(peers.summary)
    return summary[0]  # a pair: the one other shard


def _flood(shard: ShardBroker, queue: str, n: int) -> RawClient:
    """A producer on ``shard`` that wrote ``n`` numbered 1 KB non-persistent sends to
    ``queue`` at once (no receipts: only flow control holds it back)."""
    producer = shard.client()
    pad = "x" * 1024
    producer.send_bytes(b"".join(
        (f"SEND\ndestination:/queue/{queue}\npersistent:false\n\n{i:04d}{pad}\0").encode()
        for i in range(n)))
    return producer


def _drain(consumer: RawClient, queue: str, n: int) -> list[int]:
    """Subscribe ``consumer`` to ``queue`` and read ``n`` messages: their numbers."""
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "auto")])
    got = []
    while len(got) < n:
        frame, _ = consumer.read_until("MESSAGE", timeout=30)
        got.append(int(frame.body[:4]))
    return got


def test_an_owner_at_its_memory_limit_holds_producers_on_other_shards_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At its limit the owner parks sends from other shards (unanswered, so their shard
    holds them and pauses its producer) and routes them, in order, as a consumer makes
    room: nothing is refused and sent again (the pause after a refusal is an hour
    here, so a refusal would stall the test), and the owner's memory stays near it."""
    monkeypatch.setattr(shards, "RETRY_PAUSE_S", 3600.0)
    limit = 64 * 1024
    pair = ShardPair(tmp_path, usage=UsageConfig(memory_limit=limit)).start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "roomy")
        owner_peak = []

        def parked() -> bool:
            owner_peak.append(_memory_used(pair[0]))
            return int(_links(pair[0])["parked"]) > 0
        producer = _flood(pair[1], queue, 300)
        poll(parked, what="sends parked at the owner's limit")
        # The owner took what fits (a link batch may pass the limit), not all 300 KB.
        assert max(owner_peak) <= 2 * limit
        consumer = pair[0].client()
        assert _drain(consumer, queue, 300) == list(range(300))
        owner, sender = _links(pair[0]), _links(pair[1])
        assert (owner["refused"], sender["retried"], owner["parked"]) == (0, 0, 0)
        assert int(owner["parked_total"]) > 0
        producer.close()
        consumer.close()
    finally:
        pair.stop()


def test_sends_refused_in_fail_mode_go_again_when_the_owner_has_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``on_limit = "fail"`` the owner refuses sends from other shards at its limit
    (RETRY: the sending shard holds them; its client is not told, the send was taken)
    and says ``space`` once a consumer made room: the refused sends, and those held
    behind them, go again then and in order (the pause that would otherwise ask again
    is made an hour here)."""
    monkeypatch.setattr(shards, "RETRY_PAUSE_S", 3600.0)
    limit = 64 * 1024
    pair = ShardPair(tmp_path, usage=UsageConfig(memory_limit=limit, on_limit="fail"))
    # The sending shard has room for what it holds ("fail" would refuse its producer).
    pair.configs[1] = dataclasses.replace(pair.configs[1], usage=UsageConfig(
        memory_limit=16 * limit, on_limit="fail"))
    pair.start()
    try:
        pair.wait_linked()
        queue = pair.owned_by(0, "roomy")
        producer = _flood(pair[1], queue, 100)
        poll(lambda: int(_links(pair[1])["retried"]) > 0, what="a send refused at the limit")
        consumer = pair[0].client()
        assert _drain(consumer, queue, 100) == list(range(100))
        sender = _links(pair[1])
        assert int(sender["spaces"]) >= 1 and not sender["owner_full"]
        producer.close()
        consumer.close()
    finally:
        pair.stop()
