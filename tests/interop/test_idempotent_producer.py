"""The broker's idempotent-producer window: a re-sent ``dedup-id`` is confirmed again
but stored and delivered once (STOMP header, MQTT 5 user property)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.interop.mqtt_helpers import MqttEnv, paho_props
from tests.interop.stomp_helpers import uid
from tests.support.brokers import ThreadBroker


def _stat(broker: ThreadBroker) -> dict[str, object]:
    assert broker.runtime is not None
    return broker.runtime.broker.statistics()


def _depth(broker: ThreadBroker, name: str) -> int:
    for d in _stat(broker)["destinations"]:  # type: ignore[attr-defined]
        if d["name"] == name:
            return int(d["depth"])
    return 0












@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data")
    try:
        yield e
    finally:
        e.close()


def test_mqtt5_user_property_dedup_id(env: MqttEnv) -> None:
    topic = uid("idem/")
    sub = env.paho(5)
    sub.subscribe(topic, 1)
    pub = env.paho(5)
    for _ in range(2):
        pub.publish(topic, b"once", 1, properties=paho_props(
            PacketTypes.PUBLISH, UserProperty=[("dedup-id", "m-1")]))
    pub.publish(topic, b"next", 1, properties=paho_props(
        PacketTypes.PUBLISH, UserProperty=[("dedup-id", "m-2")]))
    got = sub.wait_messages(2)
    assert [m.payload for m in got] == [b"once", b"next"]
    assert ("dedup-id", "m-1") in got[0].properties.UserProperty  # type: ignore[union-attr]
