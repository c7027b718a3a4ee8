"""The $SYS statistics topics (published only while an MQTT listener exists), over
sockets. Retained messages, wills, retain handling, keep-alive and broker-only topics
(MQTT and STOMP doors) are tested without sockets in
tests/unit/broker/mqtt/test_mqtt_retain_and_sys.py and test_mqtt_will_and_retained.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import Publish
from tests.interop.mqtt_helpers import LEVELS, MqttEnv, uid
from tests.support.node_target import make_env

# The node variant's $SYS interval, as the one broker's below.
NODE_TOML = "\n[mqtt]\nsys_interval_ms = 100\n"


@pytest.fixture
def env(topology: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "data", mqtt=MqttConfig(sys_interval_ms=100))
    try:
        yield e
    finally:
        e.close()


# ---------------------------------------------------------------------------- $SYS


@pytest.mark.parametrize("level", LEVELS)
def test_sys_topics_and_hash_does_not_match_them(env: MqttEnv, level: int) -> None:
    sys_sub = env.raw_connected(level)
    sys_sub.subscribe("$SYS/#", qos=0)
    retained = sys_sub.ping()
    topics = {p.topic: p.payload for p in retained}  # type: ignore[union-attr]
    assert "$SYS/broker/clients/connected" in topics, sorted(topics)
    assert "$SYS/broker/version" in topics
    assert topics["$SYS/broker/version"].startswith(b"meshmq")

    everything = env.raw_connected(level)
    everything.subscribe("#", qos=0)
    plus = env.raw_connected(level)
    plus.subscribe("+/broker/#", qos=0)
    assert [p for p in everything.ping() if p.topic.startswith("$")] == []  # type: ignore[union-attr]
    assert plus.ping() == []
    # wait for a live $SYS update (interval 100 ms) that counts us (sys_sub, everything
    # and plus at least; updates made before the last two connected may come first),
    # then a marker: "#" saw no $ topics meanwhile
    while True:
        p = sys_sub.expect(Publish)
        if not p.retain and p.topic == "$SYS/broker/clients/connected" \
                and int(p.payload) >= 3:
            break
    marker = uid("sysmarker/")
    pub = env.raw_connected(level)
    pub.publish(marker, b"m", qos=0)
    seen = []
    while True:
        p = everything.expect(Publish)
        seen.append(p.topic)
        if p.topic == marker:
            break
    assert [t for t in seen if t.startswith("$")] == [], seen
    assert plus.ping() == []
