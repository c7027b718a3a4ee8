"""A full disk under a real broker process.

The journal lives on a small tmpfs that the test mounts (root is needed to mount; without
it the test is skipped and says so). Filling it must refuse persistent messages with a
clear ERROR while everything else goes on: non-persistent traffic, consumers and their
acknowledgements; once the queue is drained the broker accepts persistent messages
again by itself; SIGTERM stops it promptly; and nothing is logged as a traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.interop.stomp_helpers import Address, ClosedError, RawClient
from tests.support.brokers import ProcessBroker, poll, write_broker_toml

pytestmark = pytest.mark.slow

BODY = b"d" * 16 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (the full-disk test uses a real "
                    "filesystem, not an injected fault)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)],
                          check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)



def _config(tmp_path: Path, data: Path) -> Path:
    return write_broker_toml(tmp_path / "meshmq.toml", name="full", data=data, extra=(
        '[store]\nsegment_size = "1 mb"\nmin_free_disk = 0\ndisk_reserve = "1 mb"\n'),
        management=True)


def _management_url(log_path: Path) -> str:
    found = re.search(r"management endpoint on (http://[\d.]+:\d+)", log_path.read_text())
    assert found, "no management endpoint in the broker's log"
    return found.group(1)


def _persistent_send(port: int, receipt: str) -> str | None:
    """One receipted persistent send on a new connection: None if confirmed, else the
    ERROR message."""
    with RawClient(Address(port)) as c:
        c.connect("1.2")
        c.send_frame("SEND", [("destination", "/queue/full"), ("persistent", "true"),
                              ("receipt", receipt)], BODY)
        frame = c.read_frame(timeout=30)
        if frame.command == "RECEIPT":
            return None
        assert frame.command == "ERROR", frame
        return frame["message"]


def test_full_disk_refuses_persistent_sends_and_recovers_by_itself(
        tmp_path: Path, small_fs: Path) -> None:
    log_path = tmp_path / "broker.log"
    broker = ProcessBroker(_config(tmp_path, small_fs / "data"), log_path).start()
    try:
        port = broker.port
        producer = RawClient(Address(port))
        producer.connect("1.2")
        sent = 0
        refusal = None
        while refusal is None:
            assert sent < 2000, "the disk never filled"
            producer.send_frame("SEND", [("destination", "/queue/full"), ("persistent", "true"),
                                         ("receipt", f"r{sent}")], BODY)
            frame = producer.read_frame(timeout=30)
            if frame.command == "ERROR":
                refusal = frame["message"]
            else:
                assert frame.command == "RECEIPT", frame
                sent += 1
        producer.close()
        assert "persistent message refused" in refusal and "disk is full" in refusal
        assert sent > 100
        # The state shows in `meshmq stat`.
        stat = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                               _management_url(log_path)],
                              check=False, capture_output=True, text=True, timeout=30)
        assert "refusing persistent messages: the journal's disk is full" in stat.stdout, \
            stat.stdout + stat.stderr

        # Non-persistent traffic still flows.
        with RawClient(Address(port)) as other:
            other.connect("1.2")
            other.send_frame("SUBSCRIBE", [("destination", "/queue/np"), ("id", "n")])
            other.send_frame("SEND", [("destination", "/queue/np")], b"light")
            frame, _ = other.read_until("MESSAGE")
            assert frame.body == b"light"

        # The consumer drains every confirmed message, acknowledging each: no ERROR.
        with RawClient(Address(port)) as consumer:
            consumer.connect("1.2")
            consumer.send_frame("SUBSCRIBE", [("destination", "/queue/full"), ("id", "c"),
                                              ("ack", "client-individual"),
                                              ("activemq.prefetchSize", "50")])
            for i in range(sent):
                try:
                    frame = consumer.read_frame(timeout=30)
                except TimeoutError:
                    raise AssertionError(f"message {i} of {sent} never came:\n"
                                         + log_path.read_text()[-2000:]) from None
                assert frame.command == "MESSAGE", frame
                last = i == sent - 1
                consumer.send_frame("ACK", [("id", frame["ack"])]
                                    + ([("receipt", "acked")] if last else []))
            # The last ACK's receipt: every acknowledgement was taken (and is durable).
            assert consumer.read_until_receipt("acked", timeout=30) == []

        # Space comes back through compaction: persistent sends are accepted again.
        attempt = 0

        def accepted() -> bool:
            nonlocal attempt
            attempt += 1
            return _persistent_send(port, f"again{attempt}") is None

        poll(accepted, 60, "persistent sends to be accepted again")
        started = time.monotonic()
        assert broker.terminate(timeout=30) == 0
        assert time.monotonic() - started < 20
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()
    log = log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("journal: disk full") == 1
    assert "disk space available again" in log


def test_sigterm_stops_a_broker_whose_journal_directory_was_deleted(
        tmp_path: Path) -> None:
    log_path = tmp_path / "broker.log"
    data = tmp_path / "data"
    broker = ProcessBroker(_config(tmp_path, data), log_path).start()
    try:
        assert _persistent_send(broker.port, "before") is None
        shutil.rmtree(data)
        # Sending until the journal needs a new segment file in the deleted directory.
        for i in range(200):
            try:
                if _persistent_send(broker.port, f"s{i}") is not None:
                    break
            except (ClosedError, TimeoutError, OSError):
                break
        started = time.monotonic()
        broker.terminate(timeout=30)
        assert time.monotonic() - started < 20
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()
    assert "Traceback" not in log_path.read_text()
