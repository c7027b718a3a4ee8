"""Push-back across a bridge, over real sockets and a real link between two in-process
brokers: a producer on the forwarding broker, sending flat out to a queue whose only
consumer is on the remote broker, is held once the bridge's window of unacknowledged
forwards is full and the bound waits in the queue, instead of the forwarding broker
queueing the whole run; it is read again when the remote acknowledges, and every
message arrives once, in order. Bounds on counts, never on time: the backlog is
sampled on the forwarding broker's loop every millisecond."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination, queue, topic
from meshmq.transport.push_back import BACKLOG_LIMIT
from tests.interop.stomp_helpers import uid
from tests.interop.test_stomp_push_back import (
    _OPEN,
    BacklogWatch,
    Consumer,
    Producer,
    _frames_per_read,
    held_producers,
)
from tests.network.helpers import connector, consumers_on, net_config, tcp_uri, wait_forwarding
from tests.support.brokers import ThreadBroker, poll

PREFETCH = 200  # the bridge's window: small, so that the run is much larger


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[ThreadBroker, ThreadBroker]]:
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    # A long heart-beat: the remote's loop is stopped for a moment on purpose.
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:({tcp_uri(b)})", prefetch_size=PREFETCH, heartbeat_ms=60_000))).start()
    try:
        wait_forwarding(a)
        yield a, b
    finally:
        while _OPEN:
            _OPEN.pop().close()
        a.stop()
        b.stop()


def stall(broker: ThreadBroker) -> threading.Event:
    """Stop ``broker``'s loop (a remote busy elsewhere: nothing read, nothing
    acknowledged) until the returned event is set."""
    go = threading.Event()
    stopped = threading.Event()

    def hold() -> None:
        stopped.set()
        go.wait(60)
    broker.loop.call_soon_threadsafe(hold)
    assert stopped.wait(10)
    return go


def demand_on(broker: ThreadBroker, dest: Destination) -> int:
    """Consumers of ``dest`` on ``broker`` that forward to another broker (demand)."""
    assert broker.runtime is not None
    core = broker.runtime.broker
    return broker.run(lambda: sum(c.spec.network_path is not None
                                  for q in core.waiting_queues(dest) for c in q.consumers))


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_producer_is_held_while_the_bridges_window_is_full(
        brokers: tuple[ThreadBroker, ThreadBroker], kind: str) -> None:
    """The remote consumes a queue (the bridge's demand consumer is the queue's one
    consumer on A) or subscribes to a topic (the demand is a subscription of its own
    on A, whose backlog is what holds the producer)."""
    a, b = brokers
    name = uid("bridged")
    dest = queue(name) if kind == "queue" else topic(name)
    count, size = 20_000, 1024  # 20 MB: far more than the sockets on the way hold
    consumer = Consumer(b, f"/{kind}/{name}")
    poll(lambda: demand_on(a, dest) == 1, what="the demand on A")
    watch = BacklogWatch(a, dest)
    go = stall(b)
    try:
        producer = Producer(a, f"/{kind}/{name}", count, size).start()
        poll(lambda: held_producers(a) == 1, 30, "the producer held on A")
    finally:
        go.set()
    consumer.take(count + 1)  # the remote takes everything: the producer goes on
    producer.wait_done(60)
    peak = watch.stop()
    assert consumer.seen == [*range(count), -1]  # every message once, in order
    # What waits on A: the bound, and what one read of the producer adds before the
    # session looks again (the window's messages left the queue's backlog).
    bound = BACKLOG_LIMIT + _frames_per_read(size)
    assert peak <= bound, (peak, bound)
    print(f"A's peak backlog {peak} (bound {bound}, the run {count})")
    poll(lambda: held_producers(a) == 0, 30, "the producer read again")


def test_a_stalled_remote_leaves_the_run_to_a_local_consumer_with_room(
        brokers: tuple[ThreadBroker, ThreadBroker]) -> None:
    """The bridge's window fills and the remote acknowledges nothing, but a consumer on
    A itself still has room: nothing waits for the bridge, so the producer is read to
    its end (its last receipt comes while the remote is still stopped) and the local
    consumer gets every message the bridge did not take, in order."""
    a, b = brokers
    name = uid("shared")
    count, size = 5 * BACKLOG_LIMIT, 256
    Consumer(b, f"/queue/{name}")
    local = Consumer(a, f"/queue/{name}", ack="client-individual", prefetch=count + 1)
    poll(lambda: consumers_on(a, f"queue://{name}") == 2, what="both consumers on A")
    go = stall(b)
    try:
        producer = Producer(a, f"/queue/{name}", count, size).start()
        producer.wait_done(30)  # its last SEND's receipt: A read everything
        assert held_producers(a) == 0
        # The bridge took at most its window before the remote stopped; the rest is
        # the local consumer's, in order.
        local.take(count + 1 - PREFETCH, ack=False)
        assert local.seen == sorted(local.seen, key=lambda n: n if n >= 0 else count)
    finally:
        go.set()
