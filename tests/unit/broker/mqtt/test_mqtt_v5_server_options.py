"""MQTT 5 options the broker offers beyond the mandatory: Server Keep Alive (a maximum
keep-alive the broker imposes) and topic aliases towards clients that announce a Topic
Alias Maximum (a bounded least-recently-used map per connection)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import MqttEnv, mqtt_env, uid

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import Properties, Publish


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    config = memory_config(mqtt=dataclasses.replace(MqttConfig(), max_keep_alive_s=20))
    with mqtt_env(config) as e:
        yield e


@pytest.mark.parametrize(("asked", "told"), [(60, 20), (0, 20), (10, None), (20, None)])
def test_server_keep_alive(env: MqttEnv, asked: int, told: int | None) -> None:
    raw = env.raw(5)
    ack = raw.connect(uid("ka"), keep_alive=asked)
    assert ack.properties.server_keep_alive == told
    session = next(iter(env.runtime.mqtt.sessions.values()))
    assert session.keep_alive == (told or asked)


def test_keep_alive_of_311_clients_is_their_own(env: MqttEnv) -> None:
    raw = env.raw(4)
    raw.connect(uid("ka311"), keep_alive=60)
    assert [s.keep_alive for s in env.runtime.mqtt.sessions.values()] == [60]


def _resolve(packets: list[Publish], known: dict[int, str]) -> list[tuple[str, bytes]]:
    out = []
    for p in packets:
        alias = p.properties.topic_alias
        if alias is not None:
            if p.topic:
                known[alias] = p.topic
            topic = known[alias]
        else:
            topic = p.topic
        out.append((topic, p.payload))
    return out


def test_topic_aliases_towards_the_client_within_its_maximum(env: MqttEnv) -> None:
    sub = env.raw(5)
    sub.connect(uid("alias"), properties=Properties(topic_alias_maximum=2))
    base = f"al/{uid('t')}"
    sub.subscribe((f"{base}/#", 0))
    pub = env.raw(5)
    pub.connect(uid("pub"))
    order = ["a", "b", "a", "c", "a", "b", "b"]
    for i, leaf in enumerate(order):
        pub.publish(f"{base}/{leaf}", f"{i}".encode(), qos=0)
    packets = sub.publishes(len(order))
    assert _resolve(packets, {}) == [(f"{base}/{leaf}", f"{i}".encode())
                                     for i, leaf in enumerate(order)]
    aliases = [p.properties.topic_alias for p in packets]
    assert all(a in (1, 2) for a in aliases), aliases  # never above the client's maximum
    # Repeats of a topic still mapped are sent by alias alone (empty topic name).
    assert packets[2].topic == "" and packets[6].topic == ""
    # "c" took the least recently used alias ("b"'s), so "b" is sent in full again.
    assert packets[5].topic == f"{base}/b"


def test_no_aliases_for_clients_without_a_maximum(env: MqttEnv) -> None:
    sub = env.raw(5)
    sub.connect(uid("noalias"))
    topic = f"al/{uid('n')}"
    sub.subscribe((topic, 0))
    pub = env.raw(5)
    pub.connect(uid("pub"))
    for _ in range(3):
        pub.publish(topic, b"x", qos=0)
    assert [(p.topic, p.properties.topic_alias) for p in sub.publishes(3)] == \
        [(topic, None)] * 3
