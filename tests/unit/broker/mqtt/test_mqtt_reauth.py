"""MQTT 5 AUTH after CONNECT: re-authentication with the SASL PLAIN method CONNECT used
succeeds or ends the connection with a DISCONNECT reason code that DISCONNECT may carry;
an AUTH the client had no right to send is a protocol error. Never a bare close, never
a traceback in the broker's log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import MqttEnv, mqtt_env, uid

from meshmq.config.model import AuthConfig, User
from meshmq.protocol.mqtt import Auth, Disconnect, Properties, ReasonCode

PLAIN = "PLAIN"


@pytest.fixture
def auth_env() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(auth=AuthConfig(
            anonymous_access=False,
            users=(User("system", "manager"), User("other", "pw"))))) as e:
        yield e


def _plain(env: MqttEnv):  # type: ignore[no-untyped-def]
    raw = env.raw(5)
    raw.connect(uid("re"), properties=Properties(authentication_method=PLAIN,
                                                 authentication_data=b"\0system\0manager"))
    return raw


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_reauthentication_succeeds(auth_env: MqttEnv, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    raw = _plain(auth_env)
    raw.send(Auth(ReasonCode.RE_AUTHENTICATE, Properties(
        authentication_method=PLAIN, authentication_data=b"\0system\0manager")))
    ack = raw.expect(Auth)
    assert ack.reason_code == ReasonCode.SUCCESS
    assert ack.properties.authentication_method == PLAIN
    assert raw.ping() == []
    _no_tracebacks(caplog)


@pytest.mark.parametrize(("data", "why"), [
    (b"\0system\0wrong", "wrong password"),
    (b"\0other\0pw", "another user"),
    (b"garbage", "malformed"),
])
def test_failed_reauthentication_is_a_not_authorized_disconnect(
        auth_env: MqttEnv, caplog: pytest.LogCaptureFixture, data: bytes, why: str) -> None:
    caplog.set_level(logging.INFO)
    raw = _plain(auth_env)
    raw.send(Auth(ReasonCode.RE_AUTHENTICATE, Properties(
        authentication_method=PLAIN, authentication_data=data)))
    packets = raw.until_closed()
    assert [type(p) for p in packets] == [Disconnect], why
    assert packets[0].reason_code == ReasonCode.NOT_AUTHORIZED
    _no_tracebacks(caplog)


def test_auth_without_a_method_on_connect_is_a_protocol_error(
        auth_env: MqttEnv, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    raw = auth_env.raw(5)
    raw.connect(uid("pw"), username="system", password=b"manager")
    raw.send(Auth(ReasonCode.RE_AUTHENTICATE, Properties(
        authentication_method=PLAIN, authentication_data=b"\0system\0manager")))
    packets = raw.until_closed()
    assert [type(p) for p in packets] == [Disconnect]
    assert packets[0].reason_code == ReasonCode.PROTOCOL_ERROR
    _no_tracebacks(caplog)


def test_auth_with_another_method_is_a_protocol_error(auth_env: MqttEnv) -> None:
    raw = _plain(auth_env)
    raw.send(Auth(ReasonCode.RE_AUTHENTICATE, Properties(
        authentication_method="SCRAM-SHA-256", authentication_data=b"x")))
    packets = raw.until_closed()
    assert [type(p) for p in packets] == [Disconnect]
    assert packets[0].reason_code == ReasonCode.PROTOCOL_ERROR
