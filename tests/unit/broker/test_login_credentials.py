"""Logins from ActiveMQ's JAAS properties files (activemq.xml + login.config) over STOMP
and MQTT, and the one-time notice of a broker without users, through a broker driven in
memory."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.memory_broker import MemoryBroker, memory_broker, memory_config
from tests.support.memory_mqtt import MemoryMqtt

from meshmq.config.activemq_xml import load_activemq_xml
from meshmq.config.model import AuthConfig, User
from meshmq.core.passwords import hash_password
from meshmq.protocol.mqtt import ReasonCode
from meshmq.protocol.stomp import encode_frame


@pytest.fixture
def jaas_broker(tmp_path: Path) -> Iterator[MemoryBroker]:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "login.config").write_text(
        'activemq {\n  org.apache.activemq.jaas.PropertiesLoginModule required\n'
        '    org.apache.activemq.jaas.properties.user="users.properties"\n'
        '    org.apache.activemq.jaas.properties.group="groups.properties";\n};\n')
    (conf / "users.properties").write_text(
        f"# users\nsystem=manager\nalice={hash_password('wonder land')}\n")
    (conf / "groups.properties").write_text("admins=system\nusers=system,\\\n  alice\n")
    (conf / "activemq.xml").write_text(
        '<beans><broker brokerName="jaas"><plugins>\n'
        '<jaasAuthenticationPlugin configuration="activemq"/>\n</plugins></broker></beans>\n')
    imported = load_activemq_xml(conf / "activemq.xml")
    with memory_broker(memory_config(auth=imported.auth)) as broker:
        yield broker


def principals(broker: MemoryBroker) -> set[tuple[Any, Any]]:
    return {(c.principal.user, c.principal.groups)
            for c in broker.broker.connections.values() if c.principal is not None}


def test_jaas_users_connect_over_stomp_and_mqtt(jaas_broker: MemoryBroker) -> None:
    client = jaas_broker.stomp()
    # a hashed password: checked off the event loop, the SEND behind the CONNECT waits
    client.send_raw(encode_frame("CONNECT", [("accept-version", "1.2"), ("login", "alice"),
                                             ("passcode", "wonder land")])
                    + encode_frame("SEND", [("destination", "/queue/j"), ("receipt", "r1")],
                                   b"x"))
    assert client.expect("CONNECTED")
    assert client.expect("RECEIPT").get("receipt-id") == "r1"
    assert principals(jaas_broker) == {("alice", frozenset({"users"}))}
    for level in (4, 5):
        mqtt = MemoryMqtt(jaas_broker, level)
        mqtt.connect(f"sys{level}", username="system", password=b"manager")
        assert ("system", frozenset({"admins", "users"})) in principals(jaas_broker)
        mqtt.abort()


def test_jaas_wrong_password_is_refused(jaas_broker: MemoryBroker) -> None:
    for login, passcode in (("alice", "wonderland"), ("system", "x"), ("nobody", "manager")):
        client = jaas_broker.stomp()
        err = client.connect(login=login, passcode=passcode)
        assert err.command == "ERROR"
        assert err.get("message") == f"User name [{login}] or password is invalid."
        client.wait_closed()
    bad = MemoryMqtt(jaas_broker, 4)
    ack = bad.connect("bad", username="alice", password=b"nope", expect_success=False)
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED  # CONNACK 5 on the 3.1.1 wire
    assert bad.until_closed() == []
    assert jaas_broker.broker.statistics()["failed_logins"] == 4
    assert principals(jaas_broker) == set()


def test_default_broker_says_once_that_authentication_is_off(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="meshmq"):
        with memory_broker(memory_config()):
            pass
        with memory_broker(memory_config(auth=AuthConfig(users=(User("admin", "secret"),)))):
            pass
    lines = [r.getMessage() for r in caplog.records if "authentication is off" in
             r.getMessage()]
    assert len(lines) == 1, lines
