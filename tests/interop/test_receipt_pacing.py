"""Receipts keep pace with a client that pipelines receipted persistent SENDs: the broker
reads no further than ``UNCONFIRMED_LIMIT`` (B) sends past the last receipt it let out,
so receipt k leaves before SEND k + B is read, and a producer that waits for its
receipts to free its memory is never starved by its own stream."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore
from meshmq.transport.stomp_server import UNCONFIRMED_LIMIT
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.raw_stomp import frame_bytes

QUEUE = "/queue/paced"


class GatedStore(MemoryStore):
    """A memory store whose sync() waits until the test opens the gate (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    async def sync(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        await super().sync()


def _send(i: int, size: int = 64) -> bytes:
    return frame_bytes("SEND", [("destination", QUEUE), ("persistent", "true"),
                                ("receipt", f"r{i}"), ("content-length", str(size))],
                       b"x" * size)


class Producer:
    """A raw socket: a thread writes the sends as fast as the socket takes them, the
    caller reads receipts. ``written`` is how many sends the kernel has accepted."""

    def __init__(self, port: int, total: int, size: int = 64) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        self.sock.sendall(frame_bytes("CONNECT", [("accept-version", "1.2"), ("host", "/")]))
        self.buf = b""
        assert self._frame().startswith(b"CONNECTED")
        self.total = total
        self.written = 0
        self.size = size
        self.writer = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        for start in range(0, self.total, 64):
            end = min(self.total, start + 64)
            self.sock.sendall(b"".join(_send(i, self.size) for i in range(start, end)))
            self.written = end

    def _frame(self) -> bytes:
        while b"\x00" not in self.buf:
            data = self.sock.recv(1 << 16)
            assert data, "the broker closed the connection"
            self.buf += data
        frame, self.buf = self.buf.split(b"\x00", 1)
        return frame.lstrip(b"\r\n")

    def receipt(self) -> str:
        frame = self._frame()
        assert frame.startswith(b"RECEIPT"), frame[:200]
        return frame.split(b"receipt-id:", 1)[1].split(b"\n", 1)[0].decode()


def _held_with(broker: ThreadBroker, waiting: int) -> bool:
    """Whether a STOMP session has stopped reading with ``waiting`` receipts queued."""
    assert broker.runtime is not None
    sessions = broker.runtime.engine.sessions.values()
    return broker.run(lambda: any(
        s.reading_held() and len(getattr(s, "confirms", ())) == waiting for s in sessions))


def test_no_send_is_read_past_the_limit_until_the_store_lets_receipts_out(
        tmp_path: Path) -> None:
    store = GatedStore()
    broker = ThreadBroker(make_config(tmp_path / "data"), store=store).start()
    total = 3 * UNCONFIRMED_LIMIT
    try:
        producer = Producer(broker.port, total)
        producer.writer.start()
        # The store syncs nothing yet: the broker takes B sends, then stops reading.
        poll(lambda: _held_with(broker, UNCONFIRMED_LIMIT), 20,
             f"the connection to be held with {UNCONFIRMED_LIMIT} receipts waiting")
        assert broker.destination_stats("paced")["enqueued"] == UNCONFIRMED_LIMIT
        store.gate.set()
        # Every receipt comes, in order, and only then are the rest read.
        assert [producer.receipt() for _ in range(total)] == [f"r{i}" for i in range(total)]
        producer.writer.join(10)
        assert broker.destination_stats("paced")["enqueued"] == total
        producer.sock.close()
    finally:
        store.gate.set()
        broker.stop()


def _kernel_buffered(frame: int) -> int:
    """How many frames the socket buffers between client and broker can hold at most:
    the client's send buffer (as set, doubled by Linux) and the broker's receive buffer
    (autotuned up to tcp_rmem's maximum)."""
    rmem_max = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    return (2 * 64 * 1024 + rmem_max) // frame + 1


def test_receipts_arrive_while_a_pipelining_client_is_still_writing(tmp_path: Path) -> None:
    """With the journal: 40 MB of receipted sends cannot all sit in socket buffers, so the
    client can finish writing only if receipts flowed while it wrote; each arrives in
    order, and the sends written but not confirmed never exceed B plus what the socket
    buffers and the broker's one read (256 KiB) can hold."""
    broker = ThreadBroker(make_config(tmp_path / "data"),
                          store=JournalStore(tmp_path / "journal")).start()
    total, size = 40_000, 1024
    try:
        producer = Producer(broker.port, total, size)
        producer.writer.start()
        first = producer.receipt()
        written_at_first = producer.written
        deadline = time.monotonic() + 120
        got = [first]
        ahead = written_at_first
        while len(got) < total:
            assert time.monotonic() < deadline, f"{len(got)} receipts of {total} in 120 s"
            got.append(producer.receipt())
            ahead = max(ahead, producer.written - len(got))
        assert got == [f"r{i}" for i in range(total)]
        assert written_at_first < total
        frame = len(_send(0, size))
        bound = UNCONFIRMED_LIMIT + _kernel_buffered(frame) + 256 * 1024 // frame + 64
        assert ahead <= bound, f"{ahead} sends ahead of their receipts (bound {bound})"
        producer.writer.join(10)
        producer.sock.close()
        assert broker.destination_stats("paced")["enqueued"] == total
    finally:
        broker.stop()
