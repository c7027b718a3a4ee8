"""Fixtures for the STOMP and MQTT interop suites.

Every test that uses ``broker``, ``broker_with`` or an MQTT environment (``mqtt_env``, a module's
``env`` made with :func:`make_env`) runs twice: against one broker (``[broker]``, a
ThreadBroker with a journal store in tmp_path) and against a node of two shards
(``[node]``: one ``meshmq broker --shards 2`` subprocess per module, every client through
its one port, so producers and consumers are often on different shards). A test that
cannot run on a node (it reads one broker's internals, or needs a configuration the
module's node does not have) is marked ``@pytest.mark.one_broker("why")`` and its node
variant is skipped with that reason; one that meets a known gap of a node is marked
``node_gap("why")``. A module's node gets extra TOML from a module-level
``NODE_TOML`` string.

``broker_with(**changes)`` is ``broker_factory`` (tests/conftest.py) with a node
variant. ``client`` and ``raw`` build stomp.py /
raw-socket clients that are always closed at teardown. Every interop test gets a 30 s
timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.mqtt_helpers import MqttEnv
from tests.interop.stomp_helpers import Client, RawClient
from tests.support.brokers import ThreadBroker, make_config
from tests.support.node_target import NodeTarget, make_env, module_node, stomp_client
from tests.support.nodes import NodeProcess


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "one_broker(reason): the test's node variant does not apply (why)")
    config.addinivalue_line(
        "markers", "node_gap(reason): the node variant meets a known gap of a node of "
        "shards (a strict xfail: it fails the run once the gap is closed)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/interop" in str(item.path).replace("\\", "/") \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(30))


@pytest.fixture(scope="module")
def interop_node(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node of two shards for every node variant of a module."""
    yield from module_node(tmp_path_factory.mktemp("node"),
                           getattr(request.module, "NODE_TOML", ""))


@pytest.fixture(params=["broker", "node"])
def topology(request: pytest.FixtureRequest) -> str:
    """``broker`` or ``node``: what the test's clients connect to."""
    if request.param == "node":
        marker = request.node.get_closest_marker("one_broker")
        if marker is not None:
            pytest.skip(f"one broker only: {marker.args[0]}")
        gap = request.node.get_closest_marker("node_gap")
        if gap is not None:
            request.applymarker(pytest.mark.xfail(reason=gap.args[0], strict=True))
    return str(request.param)


@pytest.fixture
def broker(topology: str, request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[ThreadBroker | NodeTarget]:
    """One broker (STOMP on port 0), or the module's node of two shards."""
    if topology == "node":
        target = NodeTarget(request.getfixturevalue("interop_node"))
        yield target
        assert target.errors() == [], f"the node logged errors: {target.errors()}"
        target.check_alive()
        return
    b = ThreadBroker(make_config(tmp_path / "data")).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker_with(topology: str, request: pytest.FixtureRequest,
                broker_factory: Callable[..., ThreadBroker]
                ) -> Iterator[Callable[..., ThreadBroker | NodeTarget]]:
    """``broker_with(**changes)``: one broker with config ``changes`` (as
    ``broker_factory``), or the module's node, whose ``NODE_TOML`` says the same."""
    targets: list[NodeTarget] = []

    def make(**changes: Any) -> ThreadBroker | NodeTarget:
        if topology == "node":
            targets.append(NodeTarget(request.getfixturevalue("interop_node")))
            return targets[-1]
        return broker_factory(**changes)

    yield make
    for target in targets:
        assert target.errors() == [], f"the node logged errors: {target.errors()}"
        target.check_alive()


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[Callable[..., Client]]:
    """``client(version="1.2", ..., on=other_broker)``: a connected stomp.py client
    (on the ``broker`` fixture unless ``on`` is given)."""
    made: list[Client] = []

    def make(version: str = "1.2", *, on: ThreadBroker | NodeTarget | None = None,
             connect: bool = True,
             **kw: Any) -> Client:
        target = on or request.getfixturevalue("broker")
        if isinstance(target, NodeTarget):  # clients take turns over the shards
            c = stomp_client(target, version, connect=connect, **kw)
            made.append(c)
            return c
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

    def make(*, on: ThreadBroker | NodeTarget | None = None) -> RawClient:
        target = on or request.getfixturevalue("broker")
        r = target.placer.placed("stomp", lambda port: RawClient(target, source_port=port)) \
            if isinstance(target, NodeTarget) else RawClient(target)
        made.append(r)
        return r

    try:
        yield make
    finally:
        for r in made:
            r.close()


@pytest.fixture
def mqtt_env(topology: str, request: pytest.FixtureRequest,
             tmp_path: Path) -> Iterator[MqttEnv]:
    """A broker (or node) with STOMP, MQTT and WebSocket listeners and MQTT client
    factories."""
    env = make_env(request, topology, tmp_path / "mqtt-data")
    try:
        yield env
    finally:
        env.close()
