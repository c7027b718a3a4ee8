"""HA inside the runtime, with in-process brokers: the MasterBroker advisory, a slave
that serves nothing until it is master, and a master deposed by a takeover."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from meshmq.config.model import BrokerConfig, HaConfig, ListenerConfig
from meshmq.ha.file_lease import FileLease
from meshmq.ha.roles import Role
from meshmq.transport.runtime import BrokerRuntime
from tests.ha.support import connect
from tests.interop.mqtt_helpers import Paho
from tests.support.brokers import ThreadBroker, make_config, poll

FAST = HaConfig(mode="shared", lease_ms=1000, keepalive_ms=100, acquire_interval_ms=20)


def ha_config(data: Path, name: str) -> BrokerConfig:
    config = make_config(data, broker_name=name, ha=FAST)
    return dataclasses.replace(config, listeners=(
        ListenerConfig(name="stomp", protocol="stomp", port=0),
        ListenerConfig(name="mqtt", protocol="mqtt", port=0)))


class SlaveBroker(ThreadBroker):
    """A ThreadBroker whose start returns at once: the runtime may wait as a slave."""

    def start_waiting(self) -> Future[Any]:
        self.thread.start()
        self.runtime = BrokerRuntime(self.config, self.store)
        return asyncio.run_coroutine_threadsafe(self.runtime.start(), self.loop)

    def role(self) -> Role:
        rt = self.runtime
        assert rt is not None and rt.ha is not None
        return self.run(lambda: rt.ha.role)  # type: ignore[union-attr]


def master_advisory(port: int) -> dict[str, Any]:
    client = Paho(port)
    try:
        client.subscribe("ActiveMQ/Advisory/MasterBroker")
        msgs = client.wait_messages(1)
        assert msgs[0].retain
        body: dict[str, Any] = json.loads(msgs[0].payload)
        return body
    finally:
        client.close()


def test_master_broker_advisory_follows_the_master(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    a = ThreadBroker(ha_config(data, "a")).start()
    b = SlaveBroker(ha_config(data, "b"))
    try:
        assert a.runtime is not None
        first = master_advisory(a.runtime.addresses["mqtt"][1])
        assert (first["advisoryType"], first["originBrokerName"], first["epoch"],
                first["role"]) == ("MasterBroker", "a", 1, "master")
        started = b.start_waiting()
        poll(lambda: b.role() is Role.SLAVE, 10, "b to wait as a slave")
        assert b.runtime is not None and b.runtime.addresses == {
            "management": b.runtime.addresses["management"]}
        a.stop()  # graceful: hands the lease over
        started.result(10)
        assert b.role() is Role.MASTER
        second = master_advisory(b.runtime.addresses["mqtt"][1])
        assert (second["originBrokerName"], second["epoch"]) == ("b", 2)
    finally:
        b.stop()


def test_a_deposed_master_closes_its_clients_and_stops(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    a = ThreadBroker(ha_config(data, "a")).start()
    try:
        conn, rec = connect(a.port)
        conn.send("/queue/d", "kept", headers={"persistent": "true"}, receipt="kept")
        poll(lambda: "kept" in rec.receipts, 10, "a receipt")
        # Another broker judges the lease expired (say a was paused) and takes it.
        intruder = FileLease(data / "journal", "intruder")
        assert intruder.try_acquire(intruder.look().record) == 2
        assert a.runtime is not None
        poll(lambda: a.runtime is not None and a.runtime.deposed, 10,
             "a to notice it was deposed")
        poll(lambda: rec.disconnected, 10, "a to drop its client")
        poll(lambda: a.runtime is not None and not a.runtime.started, 10, "a to stop")
        # The record shows the intruder's epoch: a handed nothing back on its way out.
        assert intruder.look().record is not None
        assert intruder.look().record.holder == "intruder"  # type: ignore[union-attr]
        intruder.close()
    finally:
        a.stop()
