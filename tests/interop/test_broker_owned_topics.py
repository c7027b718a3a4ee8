"""Topics only the broker writes: the $SYS statistics and the ActiveMQ advisories. A
client's PUBLISH or SEND there is refused (MQTT 5: Not authorized, 0x87; MQTT 3.1.1 has
no refusal, so the message is dropped; STOMP: an ERROR frame), nothing is routed or
retained, and the client stays connected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import Puback, Publish, Pubrec, ReasonCode
from tests.interop.mqtt_helpers import MqttEnv, uid

CONNECTED = "$SYS/broker/clients/connected"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data", mqtt=MqttConfig(sys_interval_ms=100))
    try:
        yield e
    finally:
        e.close()


def denied(env: MqttEnv) -> int:
    return int(env.broker.run(lambda: env.runtime.broker.denied_publishes))


@pytest.mark.parametrize("topic", [CONNECTED, "ActiveMQ/Advisory/Connection"])
def test_mqtt5_publish_to_a_broker_topic_is_not_authorized(env: MqttEnv, topic: str) -> None:
    monitor = env.raw_connected(5)
    monitor.subscribe(topic, qos=0)
    monitor.ping()  # the retained statistic, if any, arrives before the spoof
    spoofer = env.raw_connected(5)
    ack = spoofer.publish(topic, b"999999", qos=1, retain=True)
    assert isinstance(ack, Puback) and ack.reason_code == ReasonCode.NOT_AUTHORIZED, ack
    assert "written only by the broker" in (ack.properties.reason_string or "")
    pid = spoofer.next_pid()
    spoofer.send(Publish(topic, b"999999", qos=2, packet_id=pid))
    rec = spoofer.expect(Pubrec)
    assert (rec.packet_id, rec.reason_code) == (pid, ReasonCode.NOT_AUTHORIZED), rec
    spoofer.publish(topic, b"999999", qos=0)
    assert spoofer.ping() == []  # still connected and serving
    assert denied(env) == 3
    # The monitor never sees the spoofed value, live or retained.
    assert all(p.payload != b"999999" for p in monitor.ping()
               if isinstance(p, Publish))
    late = env.raw_connected(5)
    late.subscribe(topic, qos=0)
    assert all(p.payload != b"999999" for p in late.ping() if isinstance(p, Publish))
    env.assert_healthy()


def test_mqtt311_publish_to_sys_is_dropped_and_the_exchange_completes(env: MqttEnv) -> None:
    marker = uid("marker/")
    monitor = env.raw_connected(4)
    monitor.subscribe(CONNECTED, marker, qos=0)
    spoofer = env.raw_connected(4)
    ack = spoofer.publish(CONNECTED, b"999999", qos=1, retain=True)
    assert isinstance(ack, Puback)  # 3.1.1 has no refusal: acknowledged, dropped
    spoofer.publish(CONNECTED, b"999999", qos=2)  # PUBREC, PUBREL, PUBCOMP all complete
    spoofer.publish(marker, b"end", qos=1)
    seen = []
    while True:
        p = monitor.expect(Publish)
        if p.topic == marker:
            break
        seen.append(p.payload)
    assert b"999999" not in seen
    assert denied(env) == 2


def test_stomp_send_to_a_broker_topic_gets_an_error(env: MqttEnv) -> None:
    c = env.stomp()
    c.send("/topic/$SYS.broker.clients.connected", "999999", receipt=False)
    err = c.listener.wait_error()
    assert "written only by the broker" in err.headers.get("message", "")
