"""Rights per destination on the MQTT doors, in memory (docs/security.md#authorization):
a subscription the map refuses is answered 0x80 (3.1.1) or NOT_AUTHORIZED with a reason
(5); a refused publish is acknowledged and dropped (3.1.1) or acknowledged with
NOT_AUTHORIZED (5); a retained message reaches only a subscriber who may read it.

The map, the same for every test:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.authorization_map import MAP, USERS
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import MqttEnv, mqtt_env

from meshmq.config.model import (
    AuthConfig,
)
from meshmq.protocol.mqtt import Puback, Publish, ReasonCode


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(auth=AuthConfig(anonymous_access=False, users=USERS,
                                                authorization=MAP))) as e:
        yield e


def stats(env: MqttEnv) -> dict[str, Any]:
    return dict(env.runtime.broker.statistics())


def test_mqtt311_refused_subscription_is_0x80_and_a_refused_publish_is_dropped(
        env: MqttEnv) -> None:
    bob = env.raw_connected(4, username="bob", password=b"b-pw")
    ack = bob.subscribe("prices/#", "secret/x", qos=1)
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1, 0x80]
    carol = env.raw_connected(4, username="carol", password=b"c-pw")
    carol.subscribe("secret/#", qos=1)
    alice = env.raw_connected(4, username="alice", password=b"a-pw")
    ack = alice.publish("secret/x", b"spoof", qos=1)
    assert isinstance(ack, Puback)  # 3.1.1 has no refusal: acknowledged and dropped
    alice.publish("secret/y", b"spoof", qos=2)  # the QoS 2 exchange completes too
    alice.publish("prices/eur", b"1.08", qos=1)
    assert [p.payload for p in bob.publishes(1)] == [b"1.08"]
    assert carol.ping() == []  # nothing reached the admin's subscription
    assert stats(env)["denied"]["by_user"] == {"alice": 2, "bob": 1}


def test_mqtt5_refusals_say_not_authorized_with_a_reason(env: MqttEnv) -> None:
    bob = env.raw_connected(5, username="bob", password=b"b-pw")
    ack = bob.subscribe("prices/+", "orders/x", qos=1)
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED]
    assert ack.properties.reason_string == \
        "User bob is not authorized to read from: topic://orders.x"
    alice = env.raw_connected(5, username="alice", password=b"a-pw")
    ack = alice.publish("news/x", b"spoof", qos=1)
    assert isinstance(ack, Puback) and ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert ack.properties.reason_string == \
        "User alice is not authorized to write to: topic://news.x"
    alice.publish("prices/usd", b"1.0", qos=1)
    got = bob.publishes(1)
    assert isinstance(got[0], Publish) and got[0].payload == b"1.0"
    assert bob.ping() == []  # the refused publish reached nobody


def test_retained_messages_reach_only_readers(env: MqttEnv) -> None:
    carol = env.raw_connected(5, username="carol", password=b"c-pw")
    carol.publish("secret/state", b"classified", qos=1, retain=True)
    alice = env.raw_connected(5, username="alice", password=b"a-pw")
    alice.publish("prices/eur", b"1.08", qos=1, retain=True)
    bob = env.raw_connected(5, username="bob", password=b"b-pw")
    ack = bob.subscribe("#", qos=1)  # allowed: bob may read prices/...
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1]
    assert [p.payload for p in bob.publishes(1)] == [b"1.08"]
    assert bob.ping() == []  # and not the secret one
