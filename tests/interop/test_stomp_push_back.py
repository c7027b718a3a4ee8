"""A slow STOMP consumer pushes back on the producers of its destination, over real
sockets: a producer that writes flat out is not read while the queue's (or topic
subscription's) consumers cannot take more, so the backlog in the broker stays bounded,
and every message still arrives once, in order. What must never be held: a connection
by its own consumers, a transaction's sends, a producer of another destination, a queue
with a consumer that still takes messages. Bounds on counts, never on time: the peak
backlog is sampled on the broker's loop every millisecond."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination, queue, topic
from meshmq.transport.push_back import BACKLOG_LIMIT
from meshmq.transport.stomp_server import FRAMES_PER_TURN
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.raw_stomp import RawFrame, frame_bytes, uid

# What one read of a producer can add to a backlog before the broker looks at it: the
# frames of one read, at most FRAMES_PER_TURN handled per loop turn and the rest on the
# next turns, uvloop reading up to 256 KiB at once.
READ_BYTES = 256 * 1024
_OPEN: list[RawClient] = []  # closed after each test


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadBroker]:
    b = ThreadBroker(make_config(tmp_path)).start()
    try:
        yield b
    finally:
        while _OPEN:
            _OPEN.pop().close()
        b.stop()


def _client(broker: ThreadBroker) -> RawClient:
    client = RawClient(broker)
    _OPEN.append(client)
    return client


class Producer:
    """A raw socket whose thread writes ``count`` numbered SENDs (bodies ``tag`` and the
    number) as fast as the socket takes them, then one receipted frame: a SEND with the
    body ``end``, or the transaction's COMMIT."""

    def __init__(self, broker: ThreadBroker, dest: str, count: int, size: int, *,
                 transaction: str | None = None, tag: str = "p") -> None:
        self.client = _client(broker)
        self.client.connect()
        self.dest, self.count, self.size, self.txn = dest, count, size, transaction
        self.tag = tag
        self.written = 0
        self.receipt = uid("done-")
        self.thread = threading.Thread(target=self._write, daemon=True)

    def start(self) -> Producer:
        self.thread.start()
        return self

    def _write(self) -> None:
        txn = [("transaction", self.txn)] if self.txn else []
        if self.txn:
            self.client.send_frame("BEGIN", txn)
        for start in range(0, self.count, 64):
            end = min(self.count, start + 64)
            self.client.send_bytes(b"".join(_send(self.dest, i, self.size, txn, self.tag)
                                            for i in range(start, end)))
            self.written = end
        if self.txn:
            self.client.send_frame("COMMIT", [*txn, ("receipt", self.receipt)])
        else:
            self.client.send_frame("SEND", [("destination", self.dest),
                                            ("receipt", self.receipt)], b"end")

    def wait_done(self, timeout: float = 20.0) -> None:
        self.client.read_until_receipt(self.receipt, timeout)
        self.thread.join(timeout)


def _send(dest: str, i: int, size: int, extra: list[tuple[str, str]],
          tag: str = "p") -> bytes:
    body = f"{tag}{i:08d}".encode().ljust(size, b"x")
    return frame_bytes("SEND", [("destination", dest), *extra,
                                ("content-length", str(len(body)))], body)


class Consumer(RawClient):
    """A raw socket consumer with a small receive buffer, read only when the test says."""

    def __init__(self, broker: ThreadBroker, dest: str, *, ack: str = "auto",
                 prefetch: int | None = None) -> None:
        super().__init__(broker)
        _OPEN.append(self)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.connect()
        self.ack = ack
        headers = [("destination", dest), ("id", "s"), ("ack", ack), ("receipt", "sub")]
        if prefetch is not None:
            headers.append(("activemq.prefetchSize", str(prefetch)))
        self.send_frame("SUBSCRIBE", headers)
        self.read_until_receipt("sub")
        self.seen: list[int] = []  # the numbers of the MESSAGEs read, -1 for "end"
        self.tags: list[str] = []

    def take(self, n: int, *, ack: bool = True) -> list[RawFrame]:
        """Read ``n`` MESSAGE frames (acking each when client acks are on and ``ack``)."""
        frames = []
        for _ in range(n):
            frame = self.read_frame(20.0)
            assert frame.command == "MESSAGE", frame
            self.seen.append(_number(frame))
            self.tags.append(frame.body[:1].decode())
            if ack and self.ack != "auto":
                self.send_frame("ACK", [("id", frame["ack"])])
            frames.append(frame)
        return frames


def _number(frame: RawFrame) -> int:
    return -1 if frame.body == b"end" else int(frame.body[1:9])


def _of(consumer: Consumer, tag: str) -> list[int]:
    return [n for n, t in zip(consumer.seen, consumer.tags, strict=True) if t == tag]


class BacklogWatch:
    """The most messages ``dest``'s queues held at once, sampled on the broker's loop."""

    def __init__(self, broker: ThreadBroker, dest: Destination) -> None:
        assert broker.runtime is not None
        self.core = broker.runtime.broker
        self.loop = broker.loop
        self.dest = dest
        self.peak = 0
        self.running = True
        self.loop.call_soon_threadsafe(self._tick)

    def _tick(self) -> None:
        for q in self.core.waiting_queues(self.dest):
            self.peak = max(self.peak, q.depth)
        if self.running:
            self.loop.call_later(0.001, self._tick)

    def stop(self) -> int:
        self.running = False
        return self.peak


def held_producers(broker: ThreadBroker) -> int:
    assert broker.runtime is not None
    push_back = broker.runtime.push_back
    return broker.run(lambda: len(push_back.held))


def _frames_per_read(size: int) -> int:
    return READ_BYTES // (size + 60) + FRAMES_PER_TURN


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_consumer_that_does_not_read_holds_its_producer_and_the_backlog_stays_bounded(
        broker: ThreadBroker, kind: str) -> None:
    name = uid("slow.")
    dest = f"/{kind}/{name}"
    count, size = 20_000, 1024  # 20 MB: far more than the buffers in front of the consumer
    consumer = Consumer(broker, dest)
    watch = BacklogWatch(broker, queue(name) if kind == "queue" else topic(name))
    producer = Producer(broker, dest, count, size).start()
    # Nothing is read: the consumer's socket, then its transport fill, and the broker
    # stops reading the producer instead of queueing the rest.
    poll(lambda: held_producers(broker) == 1, 20, "the producer held")
    consumer.take(count + 1)
    producer.wait_done()
    peak = watch.stop()
    assert consumer.seen == [*range(count), -1]  # every message once, in order
    # Held as soon as the consumer was paused: at most one read waited in the queue.
    assert peak <= _frames_per_read(size), peak
    assert held_producers(broker) == 0


def test_a_client_ack_consumer_with_a_full_window_holds_the_producer(
        broker: ThreadBroker) -> None:
    dest = f"/queue/{uid('window.')}"
    count, size = 10_000, 256
    consumer = Consumer(broker, dest, ack="client-individual", prefetch=10)
    watch = BacklogWatch(broker, queue(dest.removeprefix("/queue/")))
    producer = Producer(broker, dest, count, size).start()
    first = consumer.take(10, ack=False)  # the window is full and stays so
    poll(lambda: held_producers(broker) == 1, 20, "the producer held")
    for frame in first:
        consumer.send_frame("ACK", [("id", frame["ack"])])
    consumer.take(count + 1 - 10)
    producer.wait_done()
    peak = watch.stop()
    assert consumer.seen == [*range(count), -1]
    assert peak <= BACKLOG_LIMIT + 10 + _frames_per_read(size), peak


def test_a_connection_is_never_held_by_its_own_consumer(broker: ThreadBroker) -> None:
    """One connection subscribes with client acks (prefetch 1), sends far more than
    the bound to the same queue, then reads and acks: if its own full window held its
    reading, the ACKs would never be read."""
    dest = f"/queue/{uid('self.')}"
    count = 4 * BACKLOG_LIMIT
    client = _client(broker)
    client.connect()
    client.send_frame("SUBSCRIBE", [("destination", dest), ("id", "s"),
                                    ("ack", "client-individual"),
                                    ("activemq.prefetchSize", "1"), ("receipt", "sub")])
    client.read_until_receipt("sub")
    client.send_bytes(b"".join(_send(dest, i, 64, []) for i in range(count)))
    seen = []
    for _ in range(count):
        frame = client.read_frame(20.0)
        assert frame.command == "MESSAGE", frame
        seen.append(_number(frame))
        client.send_frame("ACK", [("id", frame["ack"])])
    assert seen == list(range(count))
    assert held_producers(broker) == 0


def test_a_transactions_sends_hold_nothing_until_commit(broker: ThreadBroker) -> None:
    """A queue whose only consumer's window is full, with more than the bound waiting:
    a plain producer is held, but a transaction's SENDs are read on to their COMMIT
    (they are not delivered before it), whose RECEIPT arrives."""
    dest = f"/queue/{uid('txn.')}"
    consumer = Consumer(broker, dest, ack="client-individual", prefetch=1)
    plain = Producer(broker, dest, 3 * BACKLOG_LIMIT, 64).start()
    held = consumer.take(1, ack=False)
    poll(lambda: held_producers(broker) == 1, 20, "the plain producer held")
    txn = Producer(broker, dest, 2 * BACKLOG_LIMIT, 64, transaction=uid("tx-"),
                   tag="t").start()
    txn.wait_done()  # the COMMIT's RECEIPT: read although the queue is slow
    assert held_producers(broker) == 1
    consumer.send_frame("ACK", [("id", held[0]["ack"])])
    consumer.take(3 * BACKLOG_LIMIT + 1 + 2 * BACKLOG_LIMIT - 1)
    plain.wait_done()
    assert _of(consumer, "p") == list(range(3 * BACKLOG_LIMIT))
    assert consumer.seen.count(-1) == 1  # "end"
    assert _of(consumer, "t") == list(range(2 * BACKLOG_LIMIT))


def test_a_producer_of_another_queue_is_read_on(broker: ThreadBroker) -> None:
    slow_dest, fast_dest = f"/queue/{uid('slow.')}", f"/queue/{uid('fast.')}"
    slow_consumer = Consumer(broker, slow_dest)
    held = Producer(broker, slow_dest, 20_000, 1024).start()
    poll(lambda: held_producers(broker) == 1, 20, "the slow queue's producer held")
    fast_consumer = Consumer(broker, fast_dest)
    fast = Producer(broker, fast_dest, 5_000, 1024).start()
    fast_consumer.take(5_001)
    fast.wait_done()
    assert fast_consumer.seen == [*range(5_000), -1]
    assert held_producers(broker) == 1  # still held: its consumer has read nothing
    slow_consumer.take(20_001)
    held.wait_done()
    assert slow_consumer.seen == [*range(20_000), -1]


def test_a_queue_with_a_consumer_still_taking_holds_nobody(broker: ThreadBroker) -> None:
    """Two consumers, one of which never reads: the other takes what the stalled one
    cannot, so the producer is read to its end while the stalled one is still full."""
    dest = f"/queue/{uid('pair.')}"
    count = 20_000
    stalled = Consumer(broker, dest)
    reader = Consumer(broker, dest)
    got: list[RawFrame] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                got.append(reader.read_frame(0.05))
            except TimeoutError:
                continue

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    producer = Producer(broker, dest, count, 1024).start()
    producer.wait_done()  # every SEND was read while ``stalled`` read nothing
    assert held_producers(broker) == 0
    stalled_frames: list[RawFrame] = []
    poll(lambda: _drain(stalled, stalled_frames) + len(got) >= count + 1, 20,
         "every message delivered")
    stop.set()
    thread.join(5)
    assert stalled_frames, "the stalled consumer got nothing: the test proves nothing"
    numbers = sorted(_number(f) for f in got + stalled_frames)
    assert numbers == [-1, *range(count)]


def _drain(consumer: Consumer, into: list[RawFrame]) -> int:
    """Read what ``consumer`` has waiting (a short wait each time); how many so far."""
    try:
        while True:
            into.append(consumer.read_frame(0.05))
    except TimeoutError:
        return len(into)
