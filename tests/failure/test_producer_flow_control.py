"""A producer held by producer flow control, against a real subprocess broker.

While the broker has stopped reading a blocked producer, the producer's partial frame and
its heart-beats are unread because of the broker: the connection must not be timed out for
them. When ``usage.block_timeout_ms`` is set and the block lasts longer, the producer gets
an ERROR that says why, never a bare reset.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.interop.stomp_helpers import Address, ClosedError, RawClient, frame_bytes, uid
from tests.support.brokers import ProcessBroker, write_broker_toml

pytestmark = pytest.mark.slow

_BODY = "x" * 1500
FRAME_TIMEOUT_MS = 300


def _config(tmp_path: Path, block_timeout_ms: int) -> Path:
    return write_broker_toml(tmp_path / "meshmq.toml", name="flow", data=tmp_path / "data",
                             extra=f"[stomp]\nframe_timeout_ms = {FRAME_TIMEOUT_MS}\n\n"
                                   '[usage]\nmemory_limit = 5000\non_limit = "block"\n'
                                   f"block_timeout_ms = {block_timeout_ms}\n")



def _frames(q: str, first: int, count: int) -> bytes:
    return b"".join(frame_bytes("SEND", [("destination", q), ("receipt", f"r{i}")],
                                f"{i}:{_BODY}".encode()) for i in range(first, first + count))


def _only_receipts_within(client: RawClient, seconds: float) -> list[str]:
    """Read for ``seconds``: RECEIPTs are fine, an ERROR or a close fails the test."""
    receipts: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frame = client.read_frame(timeout=left)
        except TimeoutError:
            break
        except ClosedError:
            pytest.fail("the broker closed the blocked producer's connection")
        assert frame.command == "RECEIPT", f"unexpected frame while blocked: {frame}"
        receipts.append(frame["receipt-id"])
    return receipts


def test_blocked_producer_is_not_timed_out_and_completes(tmp_path: Path) -> None:
    broker = ProcessBroker(_config(tmp_path, 0), tmp_path / "broker.log").start()
    producer = RawClient(Address(broker.port))
    consumer = RawClient(Address(broker.port))
    try:
        producer.connect("1.2")
        q = f"/queue/{uid('held')}"
        # Three times the memory limit and half of one more frame, in one write: the
        # broker blocks part-way with the rest (a partial frame included) unread.
        count = 10
        tail = _frames(q, count, 1)
        producer.send_bytes(_frames(q, 0, count) + tail[: len(tail) // 2])
        # Many frame timeouts pass while the broker is not reading this producer.
        receipts = _only_receipts_within(producer, 8 * FRAME_TIMEOUT_MS / 1000)
        assert len(receipts) < count, "memory never filled"
        consumer.connect("1.2")
        consumer.send_frame("SUBSCRIBE", [("destination", q), ("id", "c"), ("ack", "auto")])
        producer.send_bytes(tail[len(tail) // 2:])
        producer.read_until_receipt(f"r{count}", timeout=10)
        bodies: list[int] = []
        deadline = time.monotonic() + 10
        while len(bodies) < count + 1 and time.monotonic() < deadline:
            frame = consumer.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            if frame.command == "MESSAGE":
                bodies.append(int(frame.body.split(b":")[0]))
        assert bodies == list(range(count + 1))
        assert "incomplete frame" not in (tmp_path / "broker.log").read_text()
    finally:
        producer.close()
        consumer.close()
        broker.terminate()


def test_block_timeout_answers_with_an_error(tmp_path: Path) -> None:
    broker = ProcessBroker(_config(tmp_path, 600), tmp_path / "broker.log").start()
    producer = RawClient(Address(broker.port))
    try:
        producer.connect("1.2")
        q = f"/queue/{uid('timeout')}"
        # Three times the memory limit, receipted: the broker blocks part-way through.
        producer.send_bytes(_frames(q, 0, 10))
        started = time.monotonic()
        frames = producer.expect_closed(timeout=15)
        errors = [f for f in frames if f.command == "ERROR"]
        assert len(errors) == 1, frames
        assert frames[-1] is errors[0]
        assert "usage.block_timeout_ms" in errors[0]["message"]
        assert "memory limit" in errors[0]["message"]
        receipts = [f["receipt-id"] for f in frames if f.command == "RECEIPT"]
        assert 0 < len(receipts) < 10
        assert time.monotonic() - started < 10
    finally:
        producer.close()
        broker.terminate()
