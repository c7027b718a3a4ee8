"""Push-back across the shards of a node, over real sockets and real links between two
shards: a producer connected to one shard, sending flat out to a queue the other shard
owns, is held while that queue's consumer cannot take more, and read again once it
does. The owner's backlog stays bounded, and every message arrives once, in order.
Bounds on counts, never on time: the owner's backlog is sampled on its loop every
millisecond."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import queue
from meshmq.transport.push_back import BACKLOG_LIMIT
from tests.interop.test_stomp_push_back import (
    _OPEN,
    BacklogWatch,
    Consumer,
    Producer,
    _frames_per_read,
    _number,
    _send,
    held_producers,
)
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair

# What the producer's shard may read and forward while the owner's note to hold it is
# on its way: the sends already on the link (which the owner routes as they come) and
# the reads of the producer until the note arrives, each at most ``_frames_per_read``.
# Measured on an idle two-core machine: up to about 6 reads' worth; bounded, unlike the
# whole run (``count``) that waited there before.
NOTE_READS = 16


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ShardPair]:
    shards = ShardPair(tmp_path).start()
    shards.wait_linked()
    try:
        yield shards
    finally:
        while _OPEN:
            _OPEN.pop().close()
        shards.stop()


def holding(owner: ShardBroker) -> int:
    """(Shard, destination) pairs whose producers the owner asks another shard to hold."""
    assert owner.runtime is not None and owner.runtime.shard_holds is not None
    holds = owner.runtime.shard_holds
    return owner.run(lambda: holds.holding)


def held_for_owners(shard: ShardBroker) -> int:
    """Destinations whose owner asks this shard to hold its producers of them."""
    assert shard.runtime is not None
    push_back = shard.runtime.push_back
    return shard.run(lambda: len(push_back.held_by_owner))


@pytest.mark.parametrize("consumer_on", [0, 1])
def test_a_producer_on_another_shard_is_held_while_the_owners_backlog_is_slow(
        pair: ShardPair, consumer_on: int) -> None:
    """The queue is owned by shard 0, the producer is on shard 1; the consumer, which
    reads nothing until the producer is held, is on the owner (a local consumer whose
    transport is paused) or on the producer's shard (relayed: its stand-in on the
    owner stops at its window, and the owner's backlog passes the bound)."""
    name = pair.owned_by(0, "pushed")
    count, size = 20_000, 1024  # 20 MB: far more than the sockets on the way hold
    consumer = Consumer(pair[consumer_on], f"/queue/{name}")
    watch = BacklogWatch(pair[0], queue(name))
    producer = Producer(pair[1], f"/queue/{name}", count, size).start()
    poll(lambda: held_producers(pair[1]) == 1, 30, "the producer held on its shard")
    if consumer_on == 0:  # held by the owner's note (shard 1 has no consumer to look at)
        assert held_for_owners(pair[1]) == 1 and holding(pair[0]) == 1
    # (A consumer on shard 1 may also hold it there, when its paused transport is seen
    # first: the relayed consumer counts on its own shard as on the owner.)
    consumer.take(count + 1)  # the consumer catches up: the producer goes on to the end
    producer.wait_done(60)
    peak = watch.stop()
    assert consumer.seen == [*range(count), -1]  # every message once, in order
    # Bounded: what waited when the owner noted the hold, and what the producer's shard
    # forwarded before the note came (a local consumer holds at once; a stand-in's
    # backlog first passes the bound).
    bound = (0 if consumer_on == 0 else BACKLOG_LIMIT) + NOTE_READS * _frames_per_read(size)
    assert peak <= bound, (peak, bound)
    print(f"consumer on shard {consumer_on}: the owner's peak backlog {peak} (bound {bound})")
    poll(lambda: held_for_owners(pair[1]) == 0 and holding(pair[0]) == 0, 30,
         "the owner's release")
    assert held_producers(pair[1]) == 0


def test_the_owners_own_producer_is_held_by_another_shards_consumer(
        pair: ShardPair) -> None:
    """Producer on the owner, consumer relayed from the other shard: the stand-in whose
    window is full counts as a consumer without room."""
    name = pair.owned_by(0, "standin")
    count, size = 10_000, 1024
    consumer = Consumer(pair[1], f"/queue/{name}")
    watch = BacklogWatch(pair[0], queue(name))
    producer = Producer(pair[0], f"/queue/{name}", count, size).start()
    poll(lambda: held_producers(pair[0]) == 1, 30, "the owner's producer held")
    consumer.take(count + 1)
    producer.wait_done(60)
    peak = watch.stop()
    assert consumer.seen == [*range(count), -1]
    assert peak <= BACKLOG_LIMIT + _frames_per_read(size), peak
    print(f"the owner's producer, a relayed consumer: peak backlog {peak}")
    poll(lambda: held_producers(pair[0]) == 0, 30, "the producer read again")


def test_a_connection_is_never_held_for_its_own_relayed_consumer(pair: ShardPair) -> None:
    """One connection on shard 1 consumes (client acks, prefetch 1) the queue shard 0
    owns and sends far more than the bound to it, then reads and acks: if the owner's
    note held its reading, its ACKs would never be read."""
    name = pair.owned_by(0, "self")
    count = 4 * BACKLOG_LIMIT
    client = pair[1].client(timeout=30)
    _OPEN.append(client)
    client.send_frame("SUBSCRIBE", [("destination", f"/queue/{name}"), ("id", "s"),
                                    ("ack", "client-individual"),
                                    ("activemq.prefetchSize", "1"), ("receipt", "sub")])
    client.read_until_receipt("sub")
    poll(lambda: pair[0].consumers(name) == 1, what="the relayed consumer on the owner")
    client.send_bytes(b"".join(_send(f"/queue/{name}", i, 64, []) for i in range(count)))
    seen = []
    for _ in range(count):
        frame = client.read_frame(30.0)
        assert frame.command == "MESSAGE", frame
        seen.append(_number(frame))
        client.send_frame("ACK", [("id", frame["ack"])])
    assert seen == list(range(count))
    assert held_producers(pair[1]) == 0
