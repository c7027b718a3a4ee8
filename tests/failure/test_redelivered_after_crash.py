"""After a crash, every message that may have been delivered says so (``redelivered``).

A delivery leaves the broker only once the store durably knows the message may have
been dispatched (the dispatch mark, store.base.MarkDispatched), so neither a lost
delivery-count record nor a lost acknowledgement can bring a delivered message back
unflagged. Messages beyond the mark (a window ahead of the highest dispatched one) were
certainly never dispatched and come back unflagged.

Two ways to crash:

* a *crash image*: the journal's writer thread is stopped at its fence (the hook every
  write group passes), so a copy of the data directory is exactly what a SIGKILL at
  that moment would leave on disk, while the test sees what the consumer got;
* a real ``kill -9`` of a subprocess broker while a consumer streams and acks.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import stomp
from tests.failure.test_kill9_journal import Recorder, connect
from tests.support.brokers import ProcessBroker, ThreadBroker, make_config, poll, write_broker_toml

from meshmq.core.queue import DISPATCH_MARK_MIN_WINDOW, DISPATCH_MARK_WINDOW
from meshmq.store.journal import JournalStore

pytestmark = pytest.mark.slow

QUEUE = "/queue/flagged"
TOTAL = 1000


class GateFence:
    """A write fence that can hold the journal's writer thread before its next write."""

    epoch = 1

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.blocked = threading.Event()  # the writer waits at the gate

    def close(self) -> None:
        self.blocked.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def begin_write(self) -> None:
        if not self._open.is_set():
            self.blocked.set()
            self._open.wait(30)

    def end_write(self) -> None:
        return


def _ping(conn: stomp.Connection12, rec: Recorder, name: str) -> None:
    """A round trip on the consumer's connection that needs no store write: everything
    the broker sent on it before answering has arrived once the receipt is here."""
    conn.subscribe("/queue/unused", id=name, receipt=name)
    poll(lambda: name in rec.receipts, 30, f"receipt {name}")


def _crash_image(data: Path, into: Path) -> Path:
    shutil.copytree(data / "journal", into, ignore=shutil.ignore_patterns("lock"))
    return into


def _recover(image: Path, tmp_path: Path, name: str) -> list[stomp.utils.Frame]:
    """Start a broker on a crash image and receive everything it has on QUEUE."""
    broker = ThreadBroker(make_config(tmp_path / f"{name}-data"),
                          store=JournalStore(image)).start()
    try:
        conn, rec = connect(broker.port)
        conn.subscribe(QUEUE, id="drain", ack="client-individual",
                       headers={"activemq.prefetchSize": str(TOTAL)})
        poll(lambda: len(rec.messages) == TOTAL, 30, f"{TOTAL} messages from {name}")
        conn.disconnect()
    finally:
        broker.stop()
    return list(rec.messages)


def _flagged(frames: list[stomp.utils.Frame]) -> set[str]:
    return {f.body for f in frames if f.headers.get("redelivered") == "true"}


def test_crash_image_flags_every_delivered_message_and_only_near_ones(
        tmp_path: Path) -> None:
    fence = GateFence()
    data = tmp_path / "data"
    broker = ThreadBroker(make_config(data),
                          store=JournalStore(data / "journal", fence=fence)).start()
    try:
        producer, prec = connect(broker.port)
        for n in range(TOTAL):
            producer.send(QUEUE, f"m-{n:04d}", headers={"persistent": "true"},
                          receipt=f"p{n}")
        poll(lambda: len(prec.receipts) == TOTAL, 30, "the producer's receipts")

        # Crash 1: the store writes nothing more from the moment the consumer comes.
        fence.close()
        consumer, crec = connect(broker.port)
        consumer.subscribe(QUEUE, id="c", ack="client-individual",
                           headers={"activemq.prefetchSize": "10"})
        poll(fence.blocked.is_set, 30, "the writer to reach the closed gate")
        _ping(consumer, crec, "ping1")
        seen_at_crash1 = {f.body for f in crec.messages}
        image1 = _crash_image(data, tmp_path / "image1")

        # Crash 2: the same, once the consumer holds its window of ten.
        fence.open()
        poll(lambda: len(crec.messages) == 10, 30, "the consumer's ten messages")
        fence.close()
        producer.send("/queue/other", "x", headers={"persistent": "true"}, receipt="x")
        poll(fence.blocked.is_set, 30, "the writer to reach the closed gate again")
        _ping(consumer, crec, "ping2")
        seen_at_crash2 = {f.body for f in crec.messages}
        image2 = _crash_image(data, tmp_path / "image2")
        fence.open()
    finally:
        fence.open()
        broker.stop()

    assert len(seen_at_crash2) == 10
    for name, image, seen in (("image1", image1, seen_at_crash1),
                              ("image2", image2, seen_at_crash2)):
        frames = _recover(image, tmp_path, name)
        assert sorted(f.body for f in frames) == [f"m-{n:04d}" for n in range(TOTAL)]
        flagged = _flagged(frames)
        unflagged_delivered = seen - flagged
        assert not unflagged_delivered, (
            f"{name}: {len(unflagged_delivered)} messages delivered before the crash came "
            f"back without redelivered:true, e.g. {sorted(unflagged_delivered)[:5]}")
        # Never dispatched and beyond the mark's window (twice the prefetch of 10, at
        # least DISPATCH_MARK_MIN_WINDOW): not flagged.
        if not seen:
            assert not flagged, f"{name}: nothing was delivered, yet {len(flagged)} flagged"
        assert all(int(b[2:]) < len(seen) + DISPATCH_MARK_MIN_WINDOW for b in flagged), name


def _write_config(tmp_path: Path) -> Path:
    return write_broker_toml(tmp_path / "meshmq.toml", name="flagged", data=tmp_path / "data",
                             extra="[store]\nfsync = true\n")


def test_sigkill_while_consuming_flags_every_message_delivered_before(
        tmp_path: Path) -> None:
    """A consumer acks as it goes (acks are written, not synced) while a producer keeps
    the journal busy; the broker is killed mid-stream. Whatever the consumer had
    received and comes back must be flagged; messages far beyond it must not be."""
    cfg = _write_config(tmp_path)
    broker = ProcessBroker(cfg, tmp_path / "broker.log").start()
    producer, prec = connect(broker.port)
    backlog = 3000
    for n in range(backlog):
        producer.send(QUEUE, f"m-{n:05d}", headers={"persistent": "true"},
                      receipt=f"p{n}" if n % 100 == 99 else None)
    poll(lambda: f"p{backlog - 1}" in prec.receipts, 30, "the backlog's last receipt")

    consumer, crec = connect(broker.port)
    acked = 0

    class Acker(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: stomp.utils.Frame) -> None:
            nonlocal acked
            consumer.ack(frame.headers["ack"])
            acked += 1

    consumer.set_listener("acker", Acker())
    consumer.subscribe(QUEUE, id="c", ack="client-individual",
                       headers={"activemq.prefetchSize": "200"})
    # Keep the writer busy with synced writes while messages are delivered and acked.
    n = 0
    while len(crec.messages) < 1500:
        producer.send("/queue/load", f"l-{n}", headers={"persistent": "true"},
                      receipt=f"l{n}")
        n += 1
        if n % 20 == 0:
            poll(lambda n=n: f"l{n - 1}" in prec.receipts, 30, "load receipts")
    broker.kill9()
    with crec.lock:
        received = {f.body for f in crec.messages}
    poll(crec.disconnected.is_set, 30, "the consumer to notice the broker died")

    broker = ProcessBroker(cfg, tmp_path / "broker.log").start()
    try:
        conn, rec = connect(broker.port)
        conn.send(QUEUE, "END", headers={"persistent": "true"}, receipt="end")
        poll(lambda: "end" in rec.receipts, 30, "the END receipt")
        conn.subscribe(QUEUE, id="d", ack="client-individual",
                       headers={"activemq.prefetchSize": str(backlog + 1)})
        poll(lambda: any(f.body == "END" for f in rec.messages), 30, "the END message")
        conn.disconnect()
    finally:
        assert broker.terminate() == 0
    frames = [f for f in rec.messages if f.body != "END"]
    bodies = [f.body for f in frames]
    assert len(bodies) == len(set(bodies))
    # Nothing lost: what was not received before the crash is all still there.
    assert set(bodies) >= {f"m-{n:05d}" for n in range(backlog)} - received
    came_back = set(bodies) & received
    unflagged = came_back - _flagged(frames)
    assert not unflagged, (f"{len(unflagged)} of {len(came_back)} messages delivered "
                           f"before the kill came back unflagged, e.g. {sorted(unflagged)[:5]}")
    highest = max(int(b[2:]) for b in received)
    # In flight at most a prefetch window (200) beyond what the consumer got.
    beyond = [b for b in _flagged(frames) if int(b[2:]) > highest + 200 + DISPATCH_MARK_WINDOW]
    assert not beyond, f"never-dispatched messages flagged: {sorted(beyond)[:5]}"
