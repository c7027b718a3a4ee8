"""Limits that protect the broker. Persistent sends without receipts cannot outrun the
store: the connection stops being read once too much unconfirmed data is queued, and
resumes when the store syncs. A listener refuses connections beyond max_connections."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from meshmq.store.memory import MemoryStore
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import ThreadBroker, make_config, poll


class GatedStore(MemoryStore):
    """A memory store whose sync() waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.syncs_waiting = 0

    async def sync(self) -> None:
        self.syncs_waiting += 1
        # The "disk" is busy until the test opens the gate; the event loop keeps running.
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        await super().sync()




def test_listener_refuses_connections_beyond_max_connections(tmp_path: Path) -> None:
    import dataclasses
    import socket

    from meshmq.config.model import ListenerConfig

    config = dataclasses.replace(make_config(tmp_path / "data"), listeners=(
        ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0,
                       max_connections=2),))
    broker = ThreadBroker(config).start()
    try:
        with RawClient(broker) as a, RawClient(broker) as b:
            a.connect("1.2")
            b.connect("1.2")
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as c:
                c.settimeout(10)
                try:
                    assert c.recv(10) == b""  # closed at once by the broker
                except ConnectionResetError:
                    pass
        # Once they have gone, new connections are admitted again.
        poll(lambda: broker.stats()["connections"] == 0, 10, "connections to close")
        with RawClient(broker) as d:
            d.connect("1.2")
    finally:
        broker.stop()




