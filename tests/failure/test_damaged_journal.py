"""A damaged journal met by a real broker process: receipted messages are recovered where
their checksums prove them, and the broker refuses (one line, naming the flag) to start
when it would otherwise drop what it cannot read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import stomp
from tests.support.brokers import ProcessBroker, poll, write_broker_toml

from meshmq.store.journal import format as fmt

pytestmark = pytest.mark.slow


def _config(tmp_path: Path) -> Path:
    return write_broker_toml(tmp_path / "meshmq.toml", name="damaged", data=tmp_path / "data")


def _send(port: int, count: int) -> None:
    """Each send waits for its receipt, so each message is a journal record of its own
    (the broker writes one record per event-loop turn)."""
    receipts: set[str] = set()

    class Listener(stomp.ConnectionListener):
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            receipts.add(frame.headers["receipt-id"])

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("", Listener())
    conn.connect(wait=True)
    for i in range(count):
        conn.send("/queue/kept", f"m{i}", headers={"persistent": "true"}, receipt=f"r{i}")
        poll(lambda i=i: f"r{i}" in receipts, 20, f"receipt r{i}")
    conn.disconnect(receipt="bye")


def _drain(port: int, count: int) -> list[str]:
    got: list[str] = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            got.append(frame.body)

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("", Listener())
    conn.connect(wait=True)
    conn.subscribe("/queue/kept", id="s", ack="auto")
    poll(lambda: len(got) >= count, 20, f"{count} messages")
    conn.disconnect()
    return got


def test_zeroed_segment_header_loses_no_receipted_message(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    broker = ProcessBroker(cfg, tmp_path / "broker.log").start()
    _send(broker.port, 100)
    broker.kill9()
    [seg] = sorted((tmp_path / "data" / "journal").glob("seg-*.log"))
    data = bytearray(seg.read_bytes())
    data[:fmt.HEADER_SIZE] = bytes(fmt.HEADER_SIZE)
    seg.write_bytes(bytes(data))
    broker = ProcessBroker(cfg, tmp_path / "broker.log").start()
    try:
        assert _drain(broker.port, 100) == [f"m{i}" for i in range(100)]
    finally:
        broker.terminate()
    assert (seg.parent / (seg.name + ".damaged")).exists()


def test_unreadable_receipted_data_needs_the_flag(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    broker = ProcessBroker(cfg, tmp_path / "broker.log").start()
    _send(broker.port, 30)
    broker.kill9()
    [seg] = sorted((tmp_path / "data" / "journal").glob("seg-*.log"))
    data = bytearray(seg.read_bytes())
    records = fmt.scan_records(bytes(data)).records
    assert len(records) >= 3
    data[records[1][0] + 12] ^= 0xFF
    seg.write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                           str(cfg)], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--accept-data-loss" in lines[0] and seg.name in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert seg.read_bytes() == bytes(data)
    broker = ProcessBroker(cfg, tmp_path / "broker.log",
                           extra_args=("--accept-data-loss",)).start()
    try:
        # The first record held the first message; the damage took the rest.
        assert _drain(broker.port, 1) == ["m0"]
    finally:
        broker.terminate()
    assert (seg.parent / (seg.name + ".damaged")).read_bytes() == bytes(data)
    # The flag was for one start: the repaired journal opens cleanly without it.
    ProcessBroker(cfg, tmp_path / "broker.log").start().terminate()
