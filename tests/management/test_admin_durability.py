"""Purges and moves through the admin API survive kill -9: a real ``meshmq broker``
subprocess with the journal store is SIGKILLed right after the answer (or in the middle
of a large move) and restarted on the same data directory."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from tests.management.http import all_ids, call, ok
from tests.support.brokers import ProcessBroker, poll, write_broker_toml

pytestmark = pytest.mark.slow


def start(tmp_path: Path) -> tuple[ProcessBroker, int]:
    config = write_broker_toml(tmp_path / "meshmq.toml", name="admin", data=tmp_path / "data",
                               management=True)
    log = tmp_path / "broker.log"
    broker = ProcessBroker(config, log).start()
    text = log.read_text()
    found = re.findall(r"management endpoint on http://[\d.]+:(\d+)", text)
    assert found, "no management endpoint in the broker's log"
    return broker, int(found[-1])


def fill(port: int, queue: str, count: int) -> None:
    """``count`` persistent messages; the last send's receipt confirms them all."""
    with SimpleStompClient("127.0.0.1", port) as c:
        for i in range(count):
            c.send(f"/queue/{queue}", f"message {i}".encode(),
                   {"persistent": "true", "n": str(i)}, confirm=i == count - 1)


def depth(port: int, queue: str) -> int:
    return int(ok(port, "GET", f"/api/destinations/queue/{queue}")["depth"])


def test_an_answered_move_survives_kill9(tmp_path: Path) -> None:
    broker, mgmt = start(tmp_path)
    fill(broker.port, "source", 500)
    ids = all_ids(mgmt, "source")
    assert len(ids) == 500
    assert ok(mgmt, "POST", "/api/queues/source/move", {"to": "queue://target"}) == \
        {"moved": 500}
    broker.kill9()
    broker, mgmt = start(tmp_path)
    try:
        assert all_ids(mgmt, "target") == ids
        assert depth(mgmt, "source") == 0
        with SimpleStompClient("127.0.0.1", broker.port) as c:  # and they are delivered
            c.subscribe("/queue/target")
            got = [c.receive(10) for _ in range(500)]
        assert [f.get("message-id") for f in got if f is not None] == ids
    finally:
        broker.terminate()


def test_an_answered_purge_survives_kill9(tmp_path: Path) -> None:
    broker, mgmt = start(tmp_path)
    fill(broker.port, "doomed", 3000)  # more than a page: most are only in the store
    fill(broker.port, "kept", 10)
    assert ok(mgmt, "POST", "/api/destinations/queue/doomed/purge") == {"purged": 3000}
    broker.kill9()
    broker, mgmt = start(tmp_path)
    try:
        assert depth(mgmt, "doomed") == 0
        assert depth(mgmt, "kept") == 10
    finally:
        broker.terminate()


def test_a_kill_in_the_middle_of_a_large_move_loses_nothing(tmp_path: Path) -> None:
    count = 20_000
    broker, mgmt = start(tmp_path)
    fill(broker.port, "big", count)
    ids = set(all_ids(mgmt, "big"))
    assert len(ids) == count
    body = json.dumps({"to": "queue://moved"}).encode()
    before = _stored_bytes(tmp_path / "data")
    with socket.create_connection(("127.0.0.1", mgmt)) as s:
        s.sendall(b"POST /api/queues/big/move HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        # Killed once the journal has taken the first batches of the move (a batch of
        # 1000 moved messages writes far more than 64 KiB).
        poll(lambda: _stored_bytes(tmp_path / "data") > before + 64 * 1024, timeout=30,
             what="the move's first batches in the journal")
        broker.kill9()
    broker, mgmt = start(tmp_path)
    try:
        source = all_ids(mgmt, "big")
        target = all_ids(mgmt, "moved") if _exists(mgmt, "moved") else []
        assert len(source) + len(target) >= count
        assert set(source) | set(target) == ids
        assert len(set(source)) == len(source) and len(set(target)) == len(target)
    finally:
        broker.terminate()


def _stored_bytes(data: Path) -> int:
    return sum(f.stat().st_size for f in data.rglob("*") if f.is_file())


def _exists(port: int, queue: str) -> bool:
    return call(port, "GET", f"/api/destinations/queue/{queue}")[0] == 200
