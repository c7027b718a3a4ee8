"""Fixtures for the failover client tests: in-process brokers with STOMP and MQTT
listeners (``meshmq``), and subprocess brokers for kill -9 tests (``process_brokers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshmq.client import Event, EventKind
from meshmq.config.model import ListenerConfig
from tests.support.brokers import ProcessBroker, ThreadBroker, make_config
from tests.support.ports import free_ports


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/client" in str(item.path).replace("\\", "/") \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(60))


LISTENERS = (ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0),
             ListenerConfig(name="mqtt", protocol="mqtt", host="127.0.0.1", port=0))


def stomp_uri(b: ThreadBroker | ProcessBroker) -> str:
    port = b.runtime.addresses["stomp"][1] if isinstance(b, ThreadBroker) else b.ports["stomp"]
    return f"stomp://127.0.0.1:{port}"


def mqtt_uri(b: ThreadBroker | ProcessBroker) -> str:
    port = b.runtime.addresses["mqtt"][1] if isinstance(b, ThreadBroker) else b.ports["mqtt"]
    return f"mqtt://127.0.0.1:{port}"


async def wait_for_event(events: list[Event], kind: EventKind, count: int = 1,
                         timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while sum(e.kind is kind for e in events) < count:
            await asyncio.sleep(0.01)  # polled with a deadline


@pytest.fixture
def meshmq_factory(tmp_path: Path) -> Iterator[Callable[..., ThreadBroker]]:
    """``meshmq_factory(**config changes)``: an in-process broker with STOMP + MQTT."""
    started: list[ThreadBroker] = []

    def make(**changes: object) -> ThreadBroker:
        changes.setdefault("listeners", LISTENERS)
        b = ThreadBroker(make_config(tmp_path / f"data{len(started)}", **changes)).start()
        started.append(b)
        return b

    try:
        yield make
    finally:
        for b in started:
            if b.runtime is not None and b.runtime.started:
                b.stop()


@pytest.fixture
def meshmq(meshmq_factory: Callable[..., ThreadBroker]) -> ThreadBroker:
    return meshmq_factory()


def write_process_config(directory: Path, name: str, stomp_port: int, mqtt_port: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / "meshmq.toml"
    cfg.write_text(f"""
[broker]
name = "{name}"
data_directory = "{directory / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{stomp_port}"

[[listeners]]
name = "mqtt"
url = "mqtt://127.0.0.1:{mqtt_port}"

[store]
fsync = true

[management]
enabled = false
""")
    return cfg


@pytest.fixture
def process_brokers(tmp_path: Path) -> Iterator[Callable[[str], ProcessBroker]]:
    """``process_brokers("a")``: a started ``meshmq broker`` subprocess (data and log under
    tmp_path/<name>); the same name again restarts it on the same data and ports."""
    made: list[ProcessBroker] = []
    ports: dict[str, list[int]] = {}

    def make(name: str) -> ProcessBroker:
        if name not in ports:
            ports[name] = free_ports(2)
        cfg = write_process_config(tmp_path / name, name, *ports[name])
        b = ProcessBroker(cfg, tmp_path / name / "broker.log").start()
        made.append(b)
        return b

    try:
        yield make
    finally:
        for b in made:
            if b.proc is not None and b.proc.poll() is None:
                b.terminate()
