"""MQTT interoperability with paho-mqtt: its 3.1.1 unsubscribe/resubscribe, the v5
CONNACK properties it exposes, and username/password auth as paho reports it. The
broker's MQTT 5 behaviour itself is tested in memory (tests/unit/broker/mqtt/
test_mqtt_v5.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import AuthConfig, User
from meshmq.protocol.mqtt import ReasonCode
from tests.interop.mqtt_helpers import LEVELS, MqttEnv, Paho, uid
from tests.support.node_target import make_env

# The node variant (one node for the module) has a user and anonymous access, so that
# clients without a login work as on ``env`` and logins are checked as on ``auth_env``.
NODE_TOML = ('\n[[auth.users]]\nname = "system"\npassword = "manager"\n')


@pytest.fixture
def env(topology: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "data")
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def auth_env(topology: str, request: pytest.FixtureRequest,
             tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "auth", auth=AuthConfig(anonymous_access=False,
                                                   users=(User("system", "manager"),)))
    try:
        yield e
    finally:
        e.close()


def test_paho_v311_unsubscribe_and_resubscribe(env: MqttEnv) -> None:
    topic = uid("unsub/")
    c = env.paho(4)
    assert c.subscribe(topic, 2)[0] == 2
    c.unsubscribe(topic)
    c.publish(topic, b"after unsubscribe", 1)
    c.subscribe(topic, 1)
    c.publish(topic, b"marker", 1)
    assert [m.payload for m in c.wait_for(b"marker")] == [b"marker"]


@pytest.mark.parametrize("level", LEVELS)
def test_username_password_auth(auth_env: MqttEnv, level: int) -> None:
    good = auth_env.paho(level, username="system", password="manager")
    assert good.reason_code == 0
    bad = auth_env.paho(level, username="system", password="wrong", expect_success=False)
    # As ActiveMQ: not authorized (paho reports the 3.1.1 return code 5 as the v5 code
    # 0x87 too; the in-memory tests check the byte the broker writes)
    assert bad.reason_code.value == ReasonCode.NOT_AUTHORIZED
    good.publish(uid("auth/"), b"still fine", 1)


def test_paho_v5_connack_properties_visible(env: MqttEnv) -> None:
    c: Paho = env.paho(5, client_id="")
    props = c.connack_properties
    assert getattr(props, "AssignedClientIdentifier", None)
    assert getattr(props, "TopicAliasMaximum", 0) >= 1
