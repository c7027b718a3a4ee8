"""A node of shards as the interop suite's broker: the same client fixtures and the same
MQTT environment, every client through the node's one port (the kernel spreads the
connections over the shards, so a producer and its consumer are often on different
shards). A test reads the node only through its ports and its log, never one broker's
internals; those that must are marked ``one_broker`` in tests/interop.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.interop.mqtt_helpers import MqttEnv, RawMqtt
from tests.support.brokers import ProcessBroker
from tests.support.mqtt_client_ops import ErrorLog
from tests.support.nodes import NodeProcess, write_node_toml

SHARDS = 2
# What the interop suite's MQTT environment has on one broker: STOMP, MQTT, WebSocket.
NODE_LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                  '[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:0"\n\n'
                  '[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n')
# A line the node logged at ERROR or worse, or an exception's traceback.
_ERROR_LINE = re.compile(r"^.*(?: ERROR | CRITICAL |Traceback \(most recent).*$", re.MULTILINE)


def start_node(tmp: Path, extra_toml: str = "") -> NodeProcess:
    """A ``meshmq broker --shards 2`` subprocess with the interop listeners, kept across
    tests (the caller stops it: it is not in ``ProcessBroker.running``)."""
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", shards=SHARDS,
                             listeners=NODE_LISTENERS, extra=extra_toml)
    node = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(node)  # outlives each test; the module's fixture stops it
    return node


def module_node(tmp: Path, extra_toml: str = "") -> Iterator[NodeProcess]:
    """Body of a module-scoped fixture: one node for every test of a module."""
    node = start_node(tmp, extra_toml)
    try:
        yield node
    finally:
        node.terminate()


class NodeTarget:
    """Where the STOMP client fixtures connect (``host``, ``port``) when the broker is a
    node; ``errors()`` are the node's logged errors since this test began."""

    host = "127.0.0.1"

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self._offset = node.log_path.stat().st_size

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def ports(self) -> dict[str, int]:
        return self.node.ports

    def errors(self) -> list[str]:
        with open(self.node.log_path, "rb") as f:
            f.seek(self._offset)
            text = f.read().decode(errors="replace")
        return _ERROR_LINE.findall(text)

    def check_alive(self) -> None:
        """The supervisor runs and every shard is up (no shard died meanwhile)."""
        assert self.node.proc is not None and self.node.proc.poll() is None, "the node exited"
        rows = self.node.shards()
        assert [r["state"] for r in rows] == ["running"] * SHARDS, rows
        assert all(r["restarts"] == 0 for r in rows), rows


class NodeMqttEnv(MqttEnv):
    """:class:`MqttEnv` on a running node: the same client factories on the node's
    ports; ``close`` fails the test if the node logged an error meanwhile."""

    def __init__(self, node: NodeProcess) -> None:
        self.target = NodeTarget(node)
        self.broker = self.target  # type: ignore[assignment] - what Client() connects to
        self.errors = ErrorLog()
        self._closers = []

    @property
    def runtime(self) -> NoReturn:
        raise AssertionError("a node has no in-process runtime: mark the test one_broker")

    @property
    def mqtt_port(self) -> int:
        return self.target.ports["mqtt"]

    @property
    def ws_port(self) -> int:
        return self.target.ports["ws"]

    def raw(self, level: int = 4) -> RawMqtt:
        r = super().raw(level)
        r.suback_first = False  # see MqttClientOps.suback_first
        return r

    def durables(self, client_id: str) -> Any:
        raise AssertionError("a node's durables are per shard: mark the test one_broker")

    def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:
                pass
        errors = self.target.errors()
        assert errors == [], f"the node logged errors: {errors}"
        self.target.check_alive()


def make_env(request: pytest.FixtureRequest, topology: str, data_dir: Path,
             **config: Any) -> MqttEnv:
    """The MQTT environment of the test's ``topology`` (tests/interop/conftest.py): one
    broker made with ``config``, or the module's node (``interop_node``, configured by
    the module's ``NODE_TOML``)."""
    if topology == "node":
        return NodeMqttEnv(request.getfixturevalue("interop_node"))
    return MqttEnv(data_dir, **config)
