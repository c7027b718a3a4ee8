"""Rights per destination over WebSocket (paho and STOMP), with real sockets and real
clients (docs/security.md#authorization). The STOMP rights are tested in memory in
tests/unit/broker/stomp/test_broker_stomp_authorization.py, the MQTT ones in
tests/unit/broker/test_mqtt_authorization.py.

The map, the same for every test:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import (
    AuthConfig,
)
from meshmq.protocol.mqtt.properties import ReasonCode
from tests.interop.mqtt_helpers import MqttEnv
from tests.support.authorization_map import MAP, USERS, auth_toml
from tests.support.node_target import NodeMqttEnv, make_env

# The node variant's users and map; anonymous access stays on for the connections that
# find which shard a client's source port reaches (anonymous has no rights in the map).
NODE_TOML = auth_toml(anonymous_access=True)


@pytest.fixture
def env(topology: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "data",
                 auth=AuthConfig(anonymous_access=False, users=USERS, authorization=MAP))
    try:
        yield e
    finally:
        e.close()


def stats(env: MqttEnv) -> dict[str, Any]:
    if isinstance(env, NodeMqttEnv):  # every shard's, each destination by its owner
        return dict(env.target.node.api("/api/stat"))
    return dict(env.broker.run(env.runtime.broker.statistics))


def depth(env: MqttEnv, queue: str) -> int | None:
    for d in stats(env)["destinations"]:
        if d["name"] == queue and d["type"] == "queue":
            return int(d["depth"])
    return None


def test_websocket_doors_apply_the_same_rights(env: MqttEnv) -> None:
    paho = env.paho(5, transport="websockets", username="bob", password="b-pw")
    codes = paho.subscribe("secret/x", 1)
    assert [getattr(c, "value", c) for c in codes] == [ReasonCode.NOT_AUTHORIZED]
    ws = env.ws_stomp("alice", "a-pw")
    ws.send("SEND", [("destination", "/queue/secret"), ("receipt", "r1")], b"x")
    err = ws.next("ERROR")
    assert err.get("message") == "User alice is not authorized to write to: queue://secret"
    assert err.get("receipt-id") == "r1"
    ws.receipt("SEND", [("destination", "/queue/orders.ws")], b"fine")  # still connected
    assert depth(env, "orders.ws") == 1
