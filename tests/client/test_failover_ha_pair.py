"""The failover client on a real shared-store master/slave pair: the master is killed
with SIGKILL mid-stream; every confirmed persistent message reaches the application
exactly once (re-sends carry the same dedup-id, redeliveries are filtered)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from meshmq.client import FailoverClient, Message
from tests.client.test_client_features import run
from tests.ha.support import HaProcess
from tests.support.network import Node

pytestmark = [pytest.mark.timeout(120)]

HA = {"mode": "shared", "lease_ms": 1500, "keepalive_ms": 300, "acquire_interval_ms": 50}
TOTAL = 300
KILL_AFTER = 100


def test_producer_and_consumer_ride_through_a_master_kill(tmp_path: Path) -> None:
    shared = tmp_path / "pair-data"
    m = Node("M", tmp_path / "m", data_dir=shared, ha=HA)
    s = Node("S", tmp_path / "s", data_dir=shared, ha=HA)
    master = HaProcess(m.write_config(), m.root / "broker.log").start().wait_master()
    slave = HaProcess(s.write_config(), s.root / "broker.log").start().wait_slave()
    uri = (f"failover:(stomp://127.0.0.1:{m.stomp},stomp://127.0.0.1:{s.stomp})"
           "?randomize=false&timeout=60000&initialReconnectDelay=20&maxReconnectDelay=200")

    async def main() -> None:
        received: list[str] = []
        consumer = FailoverClient(uri)
        await consumer.connect()

        def on_message(msg: Message) -> None:
            received.append(msg.text)
            asyncio.get_running_loop().create_task(consumer.ack(msg))

        await consumer.subscribe("/queue/ha.orders", ack="client-individual",
                                 callback=on_message)
        producer = FailoverClient(uri)
        await producer.connect()
        confirmed: list[str] = []
        killed_at = 0.0
        for i in range(TOTAL):
            await producer.send("/queue/ha.orders", f"order {i}", persistent=True)
            confirmed.append(f"order {i}")
            if i + 1 == KILL_AFTER:
                await asyncio.to_thread(master.kill9)
                killed_at = time.monotonic()
        async with asyncio.timeout(60):
            while not set(confirmed) <= set(received):
                await asyncio.sleep(0.02)  # polled with a deadline
        assert killed_at > 0
        assert len(received) == len(set(received)), "a duplicate reached the application"
        assert producer.endpoint is not None and producer.endpoint.port == s.stomp
        await producer.close()
        await consumer.close()

    try:
        run(main())
    finally:
        for proc in (master, slave):
            if proc.alive():
                proc.terminate()
