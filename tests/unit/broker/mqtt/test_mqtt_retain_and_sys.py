"""Retained messages (retain flag, clearing, v5 retain handling and retain-as-published),
keep-alive enforcement and the $SYS statistics topics, which only the broker writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import LEVELS, MqttEnv, mqtt_env, uid

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import (
    Disconnect,
    Puback,
    Publish,
    Pubrec,
    ReasonCode,
    RetainHandling,
    SubscriptionOptions,
)


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(mqtt=MqttConfig(sys_interval_ms=100))) as e:
        yield e


CONNECTED = "$SYS/broker/clients/connected"


def denied(env: MqttEnv) -> int:
    return int(env.runtime.broker.denied_publishes)


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_enforced_at_one_and_a_half_times(env: MqttEnv, level: int) -> None:
    """Driven through the session's clock: silent 14 s of a 10 s keep-alive is kept,
    silent 16 s is closed (v5 with Keep Alive timeout). Ten seconds, so that the
    broker's own timer cannot close it first on a busy machine."""
    raw = env.raw(level)
    t0 = time.monotonic()
    raw.connect(uid("silent"), keep_alive=10)
    raw.session.check_timeouts(t0 + 14)
    assert not raw.eof
    raw.session.check_timeouts(time.monotonic() + 16)
    got = raw.until_closed()
    if level == 5:
        assert len(got) == 1 and isinstance(got[0], Disconnect), got
        assert got[0].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    else:
        assert got == []
    env.assert_healthy()


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_satisfied_by_traffic(env: MqttEnv, level: int) -> None:
    raw = env.raw(level)
    raw.connect(uid("chatty"), keep_alive=10)
    for _ in range(5):
        assert raw.ping() == []
        raw.session.check_timeouts(time.monotonic() + 14)  # 14 s after the PINGREQ
        assert not raw.eof
    assert raw.ping() == []


@pytest.mark.parametrize("level", LEVELS)
def test_retained_message_replaced_and_cleared_by_empty_payload(env: MqttEnv,
                                                                level: int) -> None:
    topic = uid("clear/")
    pub = env.raw_connected(level)
    pub.publish(topic, b"v1", qos=1, retain=True)
    pub.publish(topic, b"v2", qos=1, retain=True)
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=1)
    got = sub.ping()  # retained messages follow the SUBACK
    assert [(p.payload, p.retain) for p in got] == [(b"v2", True)]  # type: ignore[union-attr]
    sub.ack(got[0])  # type: ignore[arg-type]
    pub.publish(topic, b"", qos=1, retain=True)
    sub.ack(sub.expect(Publish))  # the clearing publish itself reaches current subscribers
    fresh = env.raw_connected(level)
    fresh.subscribe(topic, qos=1)
    assert fresh.ping() == []  # nothing retained any more


def test_v5_retain_handling_0_1_2(env: MqttEnv) -> None:
    topic = uid("rh/")
    pub = env.raw_connected(5)
    pub.publish(topic, b"kept", qos=1, retain=True)

    def sub_with(raw: object, rh: RetainHandling) -> list[object]:
        assert hasattr(raw, "subscribe")
        raw.subscribe((topic, SubscriptionOptions(qos=1, retain_handling=rh)))
        return raw.ping()  # type: ignore[no-any-return]

    r0 = env.raw_connected(5)
    first = sub_with(r0, RetainHandling.SEND_ON_SUBSCRIBE)
    assert [p.payload for p in first] == [b"kept"]  # type: ignore[attr-defined]
    r0.ack(first[0])  # type: ignore[arg-type]
    again = sub_with(r0, RetainHandling.SEND_ON_SUBSCRIBE)
    assert [p.payload for p in again] == [b"kept"]  # 0: on every subscribe
    r0.ack(again[0])  # type: ignore[arg-type]

    r1 = env.raw_connected(5)
    new = sub_with(r1, RetainHandling.SEND_IF_NEW_SUBSCRIPTION)
    assert [p.payload for p in new] == [b"kept"]
    r1.ack(new[0])  # type: ignore[arg-type]
    assert sub_with(r1, RetainHandling.SEND_IF_NEW_SUBSCRIPTION) == []  # 1: not on re-subscribe

    r2 = env.raw_connected(5)
    assert sub_with(r2, RetainHandling.DO_NOT_SEND) == []  # 2: never


def test_v5_retain_as_published(env: MqttEnv) -> None:
    topic = uid("rap/")
    rap = env.raw_connected(5)
    rap.subscribe((topic, SubscriptionOptions(qos=1, retain_as_published=True)))
    plain = env.raw_connected(5)
    plain.subscribe((topic, SubscriptionOptions(qos=1)))
    pub = env.raw_connected(5)
    pub.publish(topic, b"r", qos=1, retain=True)
    pub.publish(topic, b"n", qos=1, retain=False)
    got_rap = rap.publishes(2)
    got_plain = plain.publishes(2)
    assert [(p.payload, p.retain) for p in got_rap] == [(b"r", True), (b"n", False)]
    assert [(p.payload, p.retain) for p in got_plain] == [(b"r", False), (b"n", False)]


@pytest.mark.parametrize("level", LEVELS)
def test_hash_subscriber_survives_wildcard_subscription_advisories(
        env: MqttEnv, level: int) -> None:
    """Another client's wildcard subscription makes an advisory on a destination whose
    name holds a wildcard (ActiveMQ.Advisory.Consumer.Topic.a.*); a "#" subscriber must
    neither crash the broker's pump nor lose messages."""
    everything = env.raw_connected(level)
    everything.subscribe("#", qos=0)
    other = env.raw_connected(level)
    other.subscribe(uid("wild/") + "/+", qos=0)
    other.subscribe(uid("wild/") + "/#", qos=0)
    marker = uid("advmarker/")
    pub = env.raw_connected(level)
    pub.publish(marker, b"m", qos=1)
    while everything.expect(Publish).topic != marker:
        pass
    assert env.errors.messages() == []


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


@pytest.mark.parametrize("destination", ["/topic/$SYS.broker.clients.connected",
                                         "/topic/ActiveMQ.Advisory.Connection"])
def test_stomp_send_to_a_broker_topic_is_refused_and_the_connection_stays(
        env: MqttEnv, destination: str) -> None:
    monitor = env.raw_connected(4)
    monitor.subscribe(CONNECTED, "ActiveMQ/Advisory/Connection", qos=0)
    monitor.ping()  # the retained statistic, if any, arrives before the spoof
    c = env.stomp()
    c.send("SEND", {"destination": destination, "receipt": "spoof"}, b"999999")
    err = c.expect("ERROR")
    assert "written only by the broker" in (err.get("message") or "")
    assert err.get("receipt-id") == "spoof"
    c.send("BEGIN", {"transaction": "t", "receipt": "alive"})
    assert c.expect("RECEIPT").get("receipt-id") == "alive"  # refused, not closed
    assert all(p.payload != b"999999" for p in monitor.ping() if isinstance(p, Publish))
    assert denied(env) == 1
