"""Fixtures for the STOMP interop suite.

``broker`` and ``broker_factory`` come from tests/conftest.py (journal store in
tmp_path). ``client`` and ``raw`` build stomp.py / raw-socket clients that are always
closed at teardown. Every interop test gets a 30 s timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.mqtt_helpers import MqttEnv
from tests.interop.stomp_helpers import Client, RawClient
from tests.support.brokers import ThreadBroker


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/interop" in str(item.path).replace("\\", "/") \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(30))


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[Callable[..., Client]]:
    """``client(version="1.2", ..., on=other_broker)``: a connected stomp.py client
    (on the ``broker`` fixture unless ``on`` is given)."""
    made: list[Client] = []

    def make(version: str = "1.2", *, on: ThreadBroker | None = None, connect: bool = True,
             **kw: Any) -> Client:
        target = on or request.getfixturevalue("broker")
        c = Client(target, version, connect=False, **kw)
        made.append(c)
        if connect:
            c.connect()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.disconnect()


@pytest.fixture
def raw(request: pytest.FixtureRequest) -> Iterator[Callable[..., RawClient]]:
    """``raw(on=other_broker)``: a bare TCP connection to the broker's STOMP port."""
    made: list[RawClient] = []

    def make(*, on: ThreadBroker | None = None) -> RawClient:
        r = RawClient(on or request.getfixturevalue("broker"))
        made.append(r)
        return r

    try:
        yield make
    finally:
        for r in made:
            r.close()


@pytest.fixture
def mqtt_env(tmp_path: Path) -> Iterator[MqttEnv]:
    """A broker with STOMP, MQTT and WebSocket listeners and MQTT client factories."""
    env = MqttEnv(tmp_path / "mqtt-data")
    try:
        yield env
    finally:
        env.close()
