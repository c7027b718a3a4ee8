"""Retained messages (retain flag, clearing, v5 retain handling and retain-as-published),
will messages (abrupt close, normal DISCONNECT, v5 will delay), keep-alive enforcement
and the $SYS statistics topics, which only the broker writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import (
    Disconnect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    ReasonCode,
    RetainHandling,
    SubscriptionOptions,
    Will,
)
from tests.interop.mqtt_helpers import LEVELS, MqttEnv, uid


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data", mqtt=MqttConfig(sys_interval_ms=100))
    try:
        yield e
    finally:
        e.close()


# ---------------------------------------------------------------------------- retained


@pytest.mark.parametrize("level", LEVELS)
def test_new_subscriber_gets_retained_message_with_retain_flag(env: MqttEnv,
                                                                level: int) -> None:
    topic = uid("ret/")
    live = env.paho(level)
    live.subscribe(topic, 1)
    pub = env.paho(level)
    pub.publish(topic, b"retained!", qos=1, retain=True)
    # an existing subscriber gets it as a normal message: retain flag 0
    got = live.wait_messages(1)[0]
    assert (got.payload, got.retain) == (b"retained!", False)
    late = env.paho(level)
    late.subscribe(topic, 1)
    msg = late.wait_messages(1)[0]
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == (topic, b"retained!", True, 1)


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


# ---------------------------------------------------------------------------- wills


@pytest.mark.parametrize("level", LEVELS)
def test_will_published_on_abrupt_close(env: MqttEnv, level: int) -> None:
    topic = uid("will/")
    watcher = env.paho(level)
    watcher.subscribe(topic, 1)
    dying = env.raw(level)
    dying.connect(uid("dying"), keep_alive=60,
                  will=Will(topic, b"gone", qos=1, retain=True))
    assert dying.ping() == []
    dying.abort()  # socket closed without DISCONNECT
    msg = watcher.wait_messages(1)[0]
    assert (msg.topic, msg.payload, msg.qos) == (topic, b"gone", 1)
    late = env.paho(level)  # the will was retained
    late.subscribe(topic, 1)
    retained = late.wait_messages(1)[0]
    assert (retained.payload, retained.retain) == (b"gone", True)


@pytest.mark.parametrize("level", LEVELS)
def test_no_will_after_normal_disconnect(env: MqttEnv, level: int) -> None:
    topic = uid("nowill/")
    watcher = env.paho(level)
    watcher.subscribe(topic, 1)
    polite = env.raw(level)
    polite.connect(uid("polite"), will=Will(topic, b"should not appear", qos=1))
    polite.disconnect()
    assert polite.until_closed() == []  # the broker has processed the close by now
    pub = env.paho(level)
    pub.publish(topic, b"marker", qos=1)
    assert watcher.wait_for(b"marker")[0].payload == b"marker"  # the marker came first


def test_v5_disconnect_with_will_message_publishes_the_will(env: MqttEnv) -> None:
    topic = uid("willrc/")
    watcher = env.paho(5)
    watcher.subscribe(topic, 1)
    raw = env.raw(5)
    raw.connect(uid("rc4"), will=Will(topic, b"asked for", qos=1))
    raw.disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE)
    raw.until_closed()
    assert watcher.wait_messages(1)[0].payload == b"asked for"


def test_v5_will_delay_and_reconnect_within_it_cancels(env: MqttEnv) -> None:
    cancelled_topic = uid("willc/")
    delayed_topic = uid("willd/")
    watcher = env.paho(5)
    watcher.subscribe(cancelled_topic, 1)
    watcher.subscribe(delayed_topic, 1)
    session = Properties(session_expiry_interval=60)
    will_props = Properties(will_delay_interval=1)
    cid = uid("comesback")
    back = env.raw(5)
    back.connect(cid, clean=False, properties=session,
                 will=Will(cancelled_topic, b"cancelled will", qos=1, properties=will_props))
    control = env.raw(5)
    control.connect(uid("staysaway"), clean=False, properties=session,
                    will=Will(delayed_topic, b"delayed will", qos=1, properties=will_props))
    back.abort()
    t0 = time.monotonic()
    control.abort()  # its will timer is scheduled after the other one, same delay
    again = env.raw(5)
    assert again.connect(cid, clean=False, properties=session).session_present is True
    msgs = watcher.wait_for(b"delayed will")
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.9, f"will delay of 1 s not honoured: published after {elapsed:.2f}s"
    assert [m.payload for m in msgs] == [b"delayed will"]
    watcher.client.publish(cancelled_topic, b"marker", 1).wait_for_publish(10)
    assert [m.payload for m in watcher.wait_for(b"marker")] == [b"delayed will", b"marker"]


# ---------------------------------------------------------------------------- keep-alive


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_enforced_at_one_and_a_half_times(env: MqttEnv, level: int) -> None:
    watcher = env.paho(level)
    raw = env.raw(level)
    t0 = time.monotonic()
    raw.connect(uid("silent"), keep_alive=1)
    got = raw.until_closed(timeout=5)
    elapsed = time.monotonic() - t0
    # 1.5 s of silence, checked by a 0.5 s timer
    assert 1.4 <= elapsed <= 2.8, elapsed
    if level == 5:
        assert len(got) == 1 and isinstance(got[0], Disconnect), got
        assert got[0].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    else:
        assert got == []
    env.assert_healthy(watcher)


@pytest.mark.parametrize("level", LEVELS)
def test_keep_alive_satisfied_by_traffic(env: MqttEnv, level: int) -> None:
    raw = env.raw(level)
    raw.connect(uid("chatty"), keep_alive=1)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # PINGREQ every ~0.3 s (socket-read paced)
        assert raw.ping() == []
        raw.sock.settimeout(0.3)
        try:
            data = raw.sock.recv(1)
        except TimeoutError:
            continue
        raise AssertionError(f"unexpected data or close: {data!r}")
    assert raw.ping() == []


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
    # wait for a live $SYS update (interval 100 ms) that counts us, then a marker:
    # "#" saw no $ topics meanwhile
    while True:
        p = sys_sub.expect(Publish)
        if not p.retain and p.topic == "$SYS/broker/clients/connected":
            assert int(p.payload) >= 3  # sys_sub, everything and plus at least
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
    errors = env.errors.messages()
    env.errors.records.clear()  # reported here, not again at teardown
    assert errors == []


# ------------------------------------------------ $SYS and advisories: only the broker writes
# A client's PUBLISH or SEND there is refused (MQTT 5: Not authorized, 0x87; MQTT 3.1.1 has
# no refusal, so the message is dropped; STOMP: an ERROR frame), nothing is routed or
# retained, and the client stays connected.

CONNECTED = "$SYS/broker/clients/connected"


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
