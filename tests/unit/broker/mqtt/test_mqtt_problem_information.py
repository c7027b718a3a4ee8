"""MQTT 5 Request Problem Information (3.1.2.11.7), through a broker driven in memory: a
client that asks for none gets the refusal codes of its PUBACK, PUBREC and SUBACK without
a reason string; a client that says nothing (or asks for it) gets the reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.authorization_map import MAP, USERS
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import MemoryMqtt, MqttEnv, mqtt_env, uid

from meshmq.config.model import AuthConfig
from meshmq.protocol.mqtt import Properties, Puback, Publish, Pubrec, ReasonCode

# None: the property left out (its default is 1); 1: asked for; 0: asked to go without.
ASKED = [None, 1, 0]


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    config = memory_config(auth=AuthConfig(anonymous_access=False, users=USERS,
                                           authorization=MAP),
                           max_subscriptions_per_connection=2)
    with mqtt_env(config) as e:
        yield e


def alice(env: MqttEnv, asked: int | None) -> MemoryMqtt:
    """A producer: may write prices.>, nothing else."""
    return env.raw_connected(5, uid("alice"), username="alice", password=b"a-pw",
                             properties=Properties(request_problem_information=asked))


def bob(env: MqttEnv, asked: int | None) -> MemoryMqtt:
    """A consumer: may read prices.> and orders.>."""
    return env.raw_connected(5, uid("bob"), username="bob", password=b"b-pw",
                             properties=Properties(request_problem_information=asked))


@pytest.mark.parametrize("asked", ASKED)
@pytest.mark.parametrize(("qos", "ack_type"), [(1, Puback), (2, Pubrec)])
def test_refused_publish_has_a_reason_only_when_wanted(env: MqttEnv, asked: int | None,
                                                       qos: int, ack_type: type) -> None:
    producer = alice(env, asked)
    producer.send(Publish("secret/x", b"spoof", qos=qos, packet_id=11))
    ack = producer.expect(ack_type)
    assert (ack.packet_id, ack.reason_code) == (11, ReasonCode.NOT_AUTHORIZED)
    if asked == 0:
        assert ack.properties.reason_string is None
    else:
        assert ack.properties.reason_string


@pytest.mark.parametrize("asked", ASKED)
def test_refused_subscription_has_a_reason_only_when_wanted(env: MqttEnv,
                                                            asked: int | None) -> None:
    consumer = bob(env, asked)
    ack = consumer.subscribe("prices/+", "secret/x", qos=1)
    assert ack.reason_codes == [ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED]
    assert (ack.properties.reason_string is None) is (asked == 0)


@pytest.mark.parametrize("asked", ASKED)
def test_subscription_limit_has_a_reason_only_when_wanted(env: MqttEnv,
                                                          asked: int | None) -> None:
    consumer = bob(env, asked)
    ack = consumer.subscribe("prices/a", "prices/b", "prices/c", qos=1)
    assert ack.reason_codes == [ReasonCode.GRANTED_QOS_1, ReasonCode.GRANTED_QOS_1,
                                ReasonCode.QUOTA_EXCEEDED]
    reason = ack.properties.reason_string
    if asked == 0:
        assert reason is None
    else:
        assert reason is not None and "max_subscriptions_per_connection" in reason


def test_without_problem_information_a_refused_publish_is_still_refused(env: MqttEnv) -> None:
    """Leaving out the reason changes nothing else: the message is not routed."""
    reader = env.raw_connected(5, uid("carol"), username="carol", password=b"c-pw")
    reader.subscribe("secret/#", qos=1)
    producer = alice(env, 0)
    assert producer.publish("secret/x", b"spoof", qos=1).reason_code \
        == ReasonCode.NOT_AUTHORIZED  # type: ignore[union-attr]
    assert reader.ping() == []
