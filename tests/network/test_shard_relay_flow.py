"""Flow control of an auto-ack relayed consumer, over real links between two shards
with real STOMP clients: the owner settles its deliveries as they leave, so what stops
it is its window (at most ``prefetch`` in flight until the consumer's shard gives credit
for what it wrote to its client; a client that does not read gives none) and the link
(a full write buffer pauses every relay of that link); the messages wait in the
owner's queue meanwhile, not in the consumer's shard."""

from __future__ import annotations

import pytest

from meshmq.core import destinations as dst
from meshmq.transport.adapter import WRITE_HIGH_WATER
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair


def _owner_paused(owner: ShardBroker, name: str) -> bool:
    """Whether the owner's consumers of queue ``name`` (the relayed one) are paused."""
    assert owner.runtime is not None
    broker = owner.runtime.broker
    return owner.run(lambda: any(c.paused for c in broker.queues[dst.queue(name)].consumers))


def _in_flight(owner: ShardBroker) -> list[int]:
    """The owner's count of each auto-ack relay's deliveries not yet credited back."""
    assert owner.runtime is not None and owner.runtime.shard_peers is not None
    relay_out = owner.runtime.shard_peers.peers[1].relay_out
    assert relay_out is not None
    return owner.run(lambda: [w.inflight for w in relay_out.windows.values()])


def _held(shard: ShardBroker) -> list[int]:
    """Auto-ack deliveries waiting on the consumer's shard for its client's socket."""
    assert shard.runtime is not None
    broker = shard.runtime.broker
    return shard.run(lambda: [r.held for r in broker.state.relays.values()])


def _client_buffers(shard: ShardBroker) -> list[int]:
    """Bytes each client session's transport on ``shard`` holds, unwritten."""
    assert shard.runtime is not None
    sessions = shard.runtime.engine.sessions
    return shard.run(lambda: [s.transport.get_write_buffer_size()
                              for s in sessions.values() if hasattr(s, "transport")])


def _subscribe_relayed(pair: ShardPair, queue: str, prefetch: int = 1000) -> RawClient:
    consumer = pair[1].client(timeout=30)
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "auto"),
                                      ("activemq.prefetchSize", str(prefetch))])
    consumer.receipt_roundtrip()
    poll(lambda: pair[0].consumers(queue) == 1, what="the relayed consumer on the owner")
    return consumer


def _send(producer: RawClient, queue: str, body: bytes, count: int) -> None:
    frame = (f"SEND\ndestination:/queue/{queue}\npersistent:false\n"
             f"content-length:{len(body)}\n\n").encode() + body + b"\0"
    for start in range(0, count, 50):
        producer.send_bytes(frame * min(50, count - start))
    producer.receipt_roundtrip()


def test_a_client_that_does_not_read_pauses_the_owners_consumer(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "slow")
    prefetch = 20
    consumer = _subscribe_relayed(pair, queue, prefetch)
    producer = pair[0].client(timeout=30)
    count, body = 400, b"x" * 65536  # 26 MB: far more than the sockets on the way hold
    _send(producer, queue, body, count)
    # Settled: the client's socket and its shard's transport are full, a window waits on
    # the consumer's shard, and with no credit coming the owner's consumer stays paused.
    poll(lambda: _held(pair[1]) == [prefetch], what="a window waiting on the consumer's shard")
    assert _in_flight(pair[0]) == [prefetch] and _owner_paused(pair[0], queue)
    held = pair[0].depth(queue)
    assert held > 0, "everything left the owner while its client read nothing"
    # What its shard wrote to the client past the transport's high-water mark is at
    # most the window that was in flight when it paused, not what the link carried.
    [buffered] = _client_buffers(pair[1])
    assert buffered <= WRITE_HIGH_WATER + prefetch * len(body), buffered
    got = 0
    while got < count:  # the client reads: the owner resumes and sends the rest
        frame, _ = consumer.read_until("MESSAGE")
        assert frame.body == body
        got += 1
    poll(lambda: pair[0].depth(queue) == 0, what="the owner's queue drained")
    poll(lambda: _in_flight(pair[0]) == [0], what="every delivery credited back")
    assert _held(pair[1]) == [0]
    with pytest.raises(TimeoutError):  # each once
        consumer.read_until("MESSAGE", timeout=0.3)
    for client in (producer, consumer):
        client.close()


def test_a_full_link_pauses_its_relays_until_it_drains(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "linked")
    consumer = _subscribe_relayed(pair, queue)
    owner = pair[0]
    assert owner.runtime is not None and owner.runtime.shard_peers is not None
    relay_out = owner.runtime.shard_peers.peers[1].relay_out
    assert relay_out is not None
    owner.run(lambda: relay_out.link_writable(False))  # as when its buffer fills
    assert _owner_paused(owner, queue)
    producer = owner.client(timeout=30)
    _send(producer, queue, b"m", 3)
    with pytest.raises(TimeoutError):
        consumer.read_until("MESSAGE", timeout=0.3)
    assert owner.depth(queue) == 3  # waiting on the owner, not lost
    owner.run(lambda: relay_out.link_writable(True))  # drained
    assert [consumer.read_until("MESSAGE")[0].body for _ in range(3)] == [b"m"] * 3
    poll(lambda: owner.depth(queue) == 0, what="the owner's queue drained")
    for client in (producer, consumer):
        client.close()


def test_a_relayed_clients_acks_and_nacks_settle_on_the_owner(pair: ShardPair) -> None:
    queue = pair.owned_by(0, "settled")
    producer = pair[0].client(timeout=30)
    for i in range(10):
        producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                     ("persistent", "true")], f"m{i}".encode())
    producer.receipt_roundtrip()
    consumer = pair[1].client(timeout=30)
    consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                      ("ack", "client-individual"),
                                      ("activemq.prefetchSize", "10")])
    frames = [consumer.read_until("MESSAGE")[0] for _ in range(10)]
    assert [f.body for f in frames] == [f"m{i}".encode() for i in range(10)]
    for frame in frames[:4]:  # written together: one run of acks on the owner
        consumer.send_frame("ACK", [("id", frame["ack"])])
    consumer.send_frame("NACK", [("id", frames[4]["ack"])])
    again, _ = consumer.read_until("MESSAGE")  # the owner redelivers it, counted
    assert again.body == b"m4" and again.get("redelivered") == "true"
    poll(lambda: pair[0].depth(queue) == 6, what="the acks settled on the owner")
    consumer.send_frame("ACK", [("id", again["ack"])])
    poll(lambda: pair[0].depth(queue) == 5, what="the redelivery acked on the owner")
    consumer.close()  # m5..m9 unacknowledged: back on the owner, flagged
    poll(lambda: pair[0].consumers(queue) == 0, what="the relayed consumer closed")
    local = pair[0].client(timeout=30)
    local.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "l")])
    rest = [local.read_until("MESSAGE")[0] for _ in range(5)]
    assert [f.body for f in rest] == [f"m{i}".encode() for i in range(5, 10)]
    assert all(f.get("redelivered") == "true" for f in rest)
    for client in (producer, local):
        client.close()
