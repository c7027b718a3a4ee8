"""Credentials against a broker with no users configured (authentication off: any login
is accepted, as ActiveMQ without an authentication plugin) and against one with users
(a given login must be valid), with the real stomp.py and paho-mqtt clients. The notice
that authentication is off is tested in memory in
tests/unit/broker/test_login_credentials.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import stomp.exception
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from meshmq.config.model import AuthConfig, User
from meshmq.protocol.mqtt import ReasonCode
from tests.interop.mqtt_helpers import MqttEnv, uid
from tests.interop.stomp_helpers import Client

_USERS = AuthConfig(users=(User("admin", "secret"),))  # anonymous access on, one user


@pytest.fixture
def env_factory(tmp_path: Path) -> Iterator[Callable[..., MqttEnv]]:
    made: list[MqttEnv] = []

    def make(**config: object) -> MqttEnv:
        e = MqttEnv(tmp_path / f"b{len(made)}", **config)
        made.append(e)
        return e

    try:
        yield make
    finally:
        for e in made:
            e.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomppy_system_manager_accepted_by_default_broker(
        env_factory: Callable[..., MqttEnv], version: str) -> None:
    env = env_factory()
    c = env.stomp(version, login="system", passcode="manager")
    q = f"/queue/{uid('creds')}"
    c.subscribe(q)
    c.send(q, "accepted")
    assert c.wait_messages(1)[0].body == "accepted"


@pytest.mark.parametrize("level", [4, 5])
def test_paho_system_manager_accepted_by_default_broker(
        env_factory: Callable[..., MqttEnv], level: int) -> None:
    env = env_factory()
    p = env.paho(level, username="system", password="manager")
    assert p.reason_code == 0


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomppy_unknown_login_refused_once_users_exist(
        env_factory: Callable[..., MqttEnv], version: str) -> None:
    env = env_factory(auth=_USERS)
    c = Client(env.broker, version, login="system", passcode="manager", connect=False)
    try:
        with pytest.raises(stomp.exception.ConnectFailedException):
            c.connect()
        assert c.listener.wait_error().headers["message"].endswith("or password is invalid.")
    finally:
        c.disconnect()
    ok = env.stomp(version, login="admin", passcode="secret")
    ok.send(f"/queue/{uid('creds')}", "valid login still works")


@pytest.mark.parametrize("level", [4, 5])
def test_paho_unknown_login_refused_once_users_exist(
        env_factory: Callable[..., MqttEnv], level: int) -> None:
    env = env_factory(auth=_USERS)
    bad = env.paho(level, username="system", password="manager", expect_success=False)
    # paho reports 3.1.1's return code 4 as the MQTT 5 code 0x86 too
    assert bad.reason_code.value == ReasonCode.NOT_AUTHORIZED
    assert isinstance(bad.reason_code, PahoReasonCode)
    good = env.paho(level, username="admin", password="secret")
    assert good.reason_code == 0
