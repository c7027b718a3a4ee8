"""Push-back across a bridge, over real sockets and real links between in-process
brokers: a producer on the forwarding broker, sending flat out to a queue whose only
consumer is on the remote broker, is held once the bridge's window of unacknowledged
forwards is full and the bound waits in the queue, instead of the forwarding broker
queueing the whole run; it is read again when the remote acknowledges, and every
message arrives once, in order. A slow consumer on the remote holds it too: the remote
notes the link to hold that destination (``holds``), hop by hop over two bridges, and
a forwarder of an older version, which does not list the feature, is sent no notes.
Bounds on counts, never on time: backlogs are sampled on the brokers' loops every
millisecond."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination, queue, topic
from meshmq.network import bridge as bridge_module
from meshmq.protocol.wire import FEATURE_HOLDS, FEATURES
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
from tests.network.helpers import (
    bridges,
    connector,
    consumers_on,
    net_config,
    tcp_uri,
    wait_forwarding,
)
from tests.support.brokers import ThreadBroker, poll

PREFETCH = 200  # the bridge's window: small, so that the run is much larger


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[ThreadBroker, ThreadBroker]]:
    with chain(tmp_path, "A", "B") as (a, b):
        yield a, b


@contextlib.contextmanager
def chain(tmp_path: Path, *names: str) -> Iterator[list[ThreadBroker]]:
    """Brokers named ``names``, each bridged to the next (the last one first started);
    messages may travel the whole chain (``network_ttl``)."""
    started: list[ThreadBroker] = []
    try:
        for name in reversed(names):
            links = () if not started else (connector(
                f"static:({tcp_uri(started[0])})", prefetch_size=PREFETCH,
                # A long heart-beat: a remote's loop is stopped for a moment on purpose.
                heartbeat_ms=60_000, network_ttl=len(names)),)
            started.insert(0, ThreadBroker(net_config(tmp_path / name, name, *links)).start())
        for broker in started[:-1]:
            wait_forwarding(broker)
        yield started
    finally:
        while _OPEN:
            _OPEN.pop().close()
        for broker in started:
            broker.stop()


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


def inbound(broker: ThreadBroker) -> dict[str, object]:
    """``broker``'s one inbound link's status."""
    (link,) = [b for b in bridges(broker) if b["direction"] == "inbound"]
    return link


def depth_on(broker: ThreadBroker, dest: Destination) -> int:
    assert broker.runtime is not None
    core = broker.runtime.broker
    return broker.run(lambda: sum(q.depth for q in core.waiting_queues(dest)))


@pytest.mark.parametrize(("kind", "holds"), [("queue", True), ("topic", True),
                                             ("queue", False)],
                         ids=["queue", "topic", "queue-older-forwarder"])
def test_a_slow_consumer_on_the_remote_holds_the_forwarding_brokers_producer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, holds: bool) -> None:
    """B's only consumer takes 10 messages and acks none. B stores what A forwards
    until the bound waits, then asks A to hold the destination: A's demand consumer (of
    the queue, or A's subscription for B) takes nothing more, the bound waits on A, and
    A stops reading the producer. The run (20 MB) stays on the producer's side instead
    of in B's memory. A forwarder that does not list ``holds`` (an older version) gets
    no note: B stores the whole run."""
    if not holds:
        monkeypatch.setattr(bridge_module, "FEATURES",
                            tuple(f for f in FEATURES if f != FEATURE_HOLDS))
    name = uid("slow")
    dest = queue(name) if kind == "queue" else topic(name)
    count, size = 20_000, 1024
    with chain(tmp_path, "A", "B") as (a, b):
        consumer = Consumer(b, f"/{kind}/{name}", ack="client-individual", prefetch=10)
        poll(lambda: demand_on(a, dest) == 1, what="the demand on A")
        on_a, on_b = BacklogWatch(a, dest), BacklogWatch(b, dest)
        producer = Producer(a, f"/{kind}/{name}", count, size).start()
        first = consumer.take(10, ack=False)  # its window is full, and stays so
        if holds:
            # (The producer may be held for a moment before, while A's link is full.)
            poll(lambda: bridges(a)[0]["held"] == [str(dest)], 30, "B's hold on A")
            assert inbound(b)["holds_sent"] == 1
            poll(lambda: held_producers(a) == 1, 30, "the producer held on A")
        else:
            poll(lambda: depth_on(b, dest) == count + 1, 60, "the whole run on B")
            assert inbound(b)["holds_sent"] == 0 and bridges(a)[0]["held"] == []
        for frame in first:
            consumer.send_frame("ACK", [("id", frame["ack"])])
        consumer.take(count + 1 - 10)
        producer.wait_done(60)
        peak_a, peak_b = on_a.stop(), on_b.stop()
        assert consumer.seen == [*range(count), -1]  # every message once, in order
        print(f"peak backlog: A {peak_a}, B {peak_b} (the run {count})")
        if holds:
            # On B: the bound, and what was on its way while the note travelled (one
            # bridge window, and what the sockets between the brokers held).
            assert peak_b < count // 4, peak_b
            assert peak_a <= BACKLOG_LIMIT + PREFETCH + _frames_per_read(size), peak_a
            poll(lambda: bridges(a)[0]["held"] == [], what="the release on A")
            assert held_producers(a) == 0
        else:
            assert peak_b > count // 2, peak_b


def test_a_hold_travels_back_over_two_bridges(tmp_path: Path) -> None:
    """X -> A -> B, the consumer on B too slow: B holds A's forwards, A's backlog then
    holds X's forwards, and X stops reading its producer. Released hop by hop."""
    name = uid("far")
    dest = queue(name)
    count, size = 20_000, 1024
    with chain(tmp_path, "X", "A", "B") as (x, a, b):
        consumer = Consumer(b, f"/queue/{name}", ack="client-individual", prefetch=10)
        poll(lambda: demand_on(a, dest) == 1 and demand_on(x, dest) == 1,
             what="the demand on A and X")
        on = [BacklogWatch(broker, dest) for broker in (x, a, b)]
        producer = Producer(x, f"/queue/{name}", count, size).start()
        first = consumer.take(10, ack=False)
        poll(lambda: bridges(a)[0]["held"] == [str(dest)], 30, "B's hold on A")
        poll(lambda: bridges(x)[0]["held"] == [str(dest)], 30, "A's hold on X")
        poll(lambda: held_producers(x) == 1, 30, "the producer held on X")
        for frame in first:
            consumer.send_frame("ACK", [("id", frame["ack"])])
        consumer.take(count + 1 - 10)
        producer.wait_done(60)
        peaks = [watch.stop() for watch in on]
        assert consumer.seen == [*range(count), -1]
        print(f"peak backlog: X {peaks[0]}, A {peaks[1]}, B {peaks[2]} (the run {count})")
        assert max(peaks[1:]) < count // 4, peaks
        poll(lambda: bridges(x)[0]["held"] == [] and bridges(a)[0]["held"] == [],
             what="the releases")
