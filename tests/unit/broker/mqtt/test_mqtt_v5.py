"""MQTT 5 features through a broker driven in memory: properties, request/response,
message expiry, topic aliases, subscription identifiers, no-local, shared subscriptions,
assigned client identifiers, reason codes, server DISCONNECT with a reason, maximum
packet size, the broker's receive maximum, and authentication (username/password and
PLAIN enhanced auth) at both levels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import LEVELS, MqttEnv, mqtt_env, uid

from meshmq.config.model import AuthConfig, MqttConfig, User
from meshmq.protocol.mqtt import (
    Connack,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    ReasonCode,
    SubscriptionOptions,
    encode,
    reason_code_from_v311_connack,
)


@pytest.fixture
def auth_env() -> Iterator[MqttEnv]:
    config = memory_config(auth=AuthConfig(anonymous_access=False,
                                           users=(User("system", "manager"),)))
    with mqtt_env(config) as e:
        yield e


# ---------------------------------------------------------------------------- properties


def test_user_properties_content_type_and_payload_format(env: MqttEnv) -> None:
    topic = uid("props/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(5)
    pub.publish(topic, "héllo".encode(), qos=1, properties=Properties(
        user_properties=[("color", "red"), ("size", "10")], content_type="text/plain",
        payload_format_indicator=1))
    msg = sub.expect(Publish)
    props = msg.properties
    assert ("color", "red") in props.user_properties
    assert ("size", "10") in props.user_properties
    assert not any(k.startswith(("ActiveMQ.", "mqtt.")) for k, _ in props.user_properties), \
        props.user_properties  # broker-internal properties are not leaked to MQTT clients
    assert props.content_type == "text/plain"
    assert props.payload_format_indicator == 1
    assert msg.payload == "héllo".encode()


def test_request_response_with_response_topic_and_correlation_data(env: MqttEnv) -> None:
    request_topic = uid("svc/req/")
    reply_topic = uid("svc/reply/")
    responder = env.raw_connected(5)
    responder.subscribe(request_topic, qos=1)
    requester = env.raw_connected(5)
    requester.subscribe(reply_topic, qos=1)
    corr = b"\x00\xff\x80corr-1"
    requester.publish(request_topic, b"ping", qos=1, properties=Properties(
        response_topic=reply_topic, correlation_data=corr))
    req = responder.expect(Publish)
    assert req.properties.response_topic == reply_topic
    responder.ack(req)
    responder.publish(req.properties.response_topic, b"re: " + req.payload, qos=1,
                      properties=Properties(correlation_data=req.properties.correlation_data))
    reply = requester.expect(Publish)
    assert reply.topic == reply_topic
    assert reply.payload == b"re: ping"
    assert reply.properties.correlation_data == corr


def test_message_expiry_drops_expired_and_decrements_remaining(env: MqttEnv) -> None:
    cid = uid("exp")
    topic = uid("exp/")
    session = Properties(session_expiry_interval=300)
    sub = env.raw(5)
    sub.connect(cid, clean=False, properties=session)
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    sub.until_closed()
    pub = env.raw_connected(5)
    pub.publish(topic, b"short", qos=1, properties=Properties(message_expiry_interval=1))
    pub.publish(topic, b"long", qos=1, properties=Properties(message_expiry_interval=60))
    t0 = time.monotonic()
    # a deadline poll on the clock: the short message's 1 s lifetime must pass
    while time.monotonic() - t0 < 1.2:
        assert pub.ping() == []
    back = env.raw(5)
    assert back.connect(cid, clean=False, properties=session).session_present
    got = back.expect(Publish)
    assert got.payload == b"long"  # "short" expired while the session was offline
    remaining = got.properties.message_expiry_interval
    assert remaining is not None and 0 < remaining < 60, remaining
    back.ack(got)
    assert back.ping() == []
    # a live subscriber also gets the remaining interval
    pub.publish(topic, b"live", qos=1, properties=Properties(message_expiry_interval=30))
    live = back.expect(Publish)
    assert live.payload == b"live"
    assert live.properties.message_expiry_interval in (29, 30)


def test_message_without_expiry_has_no_expiry_property(env: MqttEnv) -> None:
    topic = uid("noexp/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(5)
    pub.publish(topic, b"x", qos=1)
    assert sub.expect(Publish).properties.message_expiry_interval is None


# ---------------------------------------------------------------------------- topic aliases


def test_topic_alias_from_client(env: MqttEnv) -> None:
    topic = uid("alias/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=0)
    pub = env.raw(5)
    ack = pub.connect(uid("aliaser"))
    assert ack.properties.topic_alias_maximum and ack.properties.topic_alias_maximum >= 1
    pub.publish(topic, b"set", qos=1, properties=Properties(topic_alias=1))
    pub.publish("", b"used", qos=1, properties=Properties(topic_alias=1))
    got = sub.publishes(2)
    assert [(p.topic, p.payload) for p in got] == [(topic, b"set"), (topic, b"used")]


@pytest.mark.parametrize(("alias", "topic", "code"), [
    (0, "t", ReasonCode.TOPIC_ALIAS_INVALID),
    (65535, "t", ReasonCode.TOPIC_ALIAS_INVALID),
    (7, "", ReasonCode.PROTOCOL_ERROR),  # an alias never set
])
def test_bad_topic_alias_gets_disconnect(env: MqttEnv, alias: int, topic: str,
                                         code: ReasonCode) -> None:
    bystander = env.raw_connected(5)
    raw = env.raw(5)
    ack = raw.connect(uid("badalias"))
    assert ack.properties.topic_alias_maximum is not None
    assert alias in (0, 7) or alias > ack.properties.topic_alias_maximum
    raw.send_bytes(_publish_with_alias(topic, alias))
    got = raw.until_closed()
    assert len(got) == 1 and isinstance(got[0], Disconnect), got
    assert got[0].reason_code == code
    env.assert_healthy(bystander)


def _publish_with_alias(topic: str, alias: int) -> bytes:
    """PUBLISH QoS 0 with a Topic Alias property, built by hand (0 is not encodable)."""
    t = topic.encode()
    props = bytes([0x23]) + alias.to_bytes(2, "big")
    body = len(t).to_bytes(2, "big") + t + bytes([len(props)]) + props + b"x"
    return bytes([0x30, len(body)]) + body


# ---------------------------------------------------------------------------- subscriptions


def test_subscription_identifiers_in_delivered_publish(env: MqttEnv) -> None:
    base = uid("sid/")
    sub = env.raw_connected(5)
    sub.subscribe(base + "/+", qos=0, properties=Properties(subscription_identifiers=[42]))
    sub.subscribe(base + "/#", qos=0, properties=Properties(subscription_identifiers=[7]))
    sub.subscribe(base + "/none", qos=0)
    pub = env.raw_connected(5)
    pub.publish(base + "/x", b"both", qos=1)
    got = sub.publishes(2)
    ids = sorted(i for p in got for i in p.properties.subscription_identifiers)
    assert ids == [7, 42]  # one PUBLISH per matching subscription, each with its id
    pub.publish(base + "/a/b", b"deep", qos=1)
    deep = sub.expect(Publish)
    assert deep.properties.subscription_identifiers == [7]
    pub.publish(base + "/none", b"plain", qos=1)
    plain = sub.publishes(3)  # /+, /# and /none all match
    assert sorted(tuple(p.properties.subscription_identifiers) for p in plain) == \
        [(), (7,), (42,)]


def test_no_local(env: MqttEnv) -> None:
    topic = uid("nolocal/")
    me = env.raw_connected(5)
    me.subscribe((topic, SubscriptionOptions(qos=1, no_local=True)))
    other = env.raw_connected(5)
    me.publish(topic, b"mine", qos=1)
    other.publish(topic, b"theirs", qos=1)
    got = me.expect(Publish)
    assert got.payload == b"theirs"  # its own "mine", published first, never came
    me.ack(got)
    assert me.ping() == []
    plain = env.raw_connected(5)  # without no-local, one's own messages come back
    plain.subscribe(topic, qos=1)
    plain.publish(topic, b"echo", qos=1)
    assert plain.expect(Publish).payload == b"echo"


def test_shared_subscription_splits_messages_across_members(env: MqttEnv) -> None:
    topic = uid("shared/")
    a = env.raw_connected(5)
    b = env.raw_connected(5)
    everyone = env.raw_connected(5)
    assert a.subscribe(f"$share/g/{topic}", qos=1).reason_codes == [ReasonCode.GRANTED_QOS_1]
    assert b.subscribe(f"$share/g/{topic}", qos=1).reason_codes == [ReasonCode.GRANTED_QOS_1]
    everyone.subscribe(topic, qos=1)
    pub = env.raw_connected(5)
    n = 20
    for i in range(n):
        pub.publish(topic, b"%02d" % i, qos=1)
    pub.publish(topic, b"marker", qos=1)
    for p in everyone.publishes(n + 1):
        everyone.ack(p)
    got: dict[str, list[Publish]] = {"a": [], "b": []}

    deadline = time.monotonic() + 10
    while len(got["a"]) + len(got["b"]) < n + 1:  # two clients: poll with a deadline
        assert time.monotonic() < deadline, f"the group got only {got}"
        env.broker.turn()
        for name, member in (("a", a), ("b", b)):
            member._read()
            taken, member.pending = member.pending, []
            for packet in taken:
                assert isinstance(packet, Publish), packet
                got[name].append(packet)
                member.ack(packet)
    assert a.ping() == [] and b.ping() == []  # and nothing twice
    got_a = [p.payload for p in got["a"] if p.payload != b"marker"]
    got_b = [p.payload for p in got["b"] if p.payload != b"marker"]
    assert sorted(got_a + got_b) == [b"%02d" % i for i in range(n)]  # each exactly once
    assert got_a and got_b, (got_a, got_b)  # both members got a share
    assert [p.topic for p in got["a"] + got["b"]] == [topic] * (n + 1)


def test_assigned_client_identifier_v5(env: MqttEnv) -> None:
    raw = env.raw(5)
    ack = raw.connect("")
    assigned = ack.properties.assigned_client_identifier
    assert assigned, ack
    assert raw.ping() == []
    other = env.raw(5)
    assert other.connect("").properties.assigned_client_identifier not in (None, assigned)


def test_empty_client_id_v311(env: MqttEnv) -> None:
    ok = env.raw(4)
    assert ok.connect("", clean=True).reason_code == ReasonCode.SUCCESS
    bad = env.raw(4)
    ack = bad.connect("", clean=False, expect_success=False)
    assert ack.reason_code == reason_code_from_v311_connack(2)  # identifier rejected
    assert bad.until_closed() == []


# ---------------------------------------------------------------------------- reason codes


def test_reason_codes_on_acks(env: MqttEnv) -> None:
    base = uid("rc/")
    raw = env.raw_connected(5)
    suback = raw.subscribe((base + "/0", SubscriptionOptions(qos=0)),
                           (base + "/1", SubscriptionOptions(qos=1)),
                           (base + "/2", SubscriptionOptions(qos=2)))
    assert suback.reason_codes == [ReasonCode.GRANTED_QOS_0, ReasonCode.GRANTED_QOS_1,
                                   ReasonCode.GRANTED_QOS_2]
    unsuback = raw.unsubscribe(base + "/1", base + "/never")
    assert unsuback.reason_codes == [ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED]
    puback = raw.publish(uid("nobody/"), b"x", qos=1)
    assert isinstance(puback, Puback)
    assert puback.reason_code in (ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS)
    pubcomp = raw.publish(base + "/2", b"y", qos=2)
    assert pubcomp is not None and pubcomp.reason_code == ReasonCode.SUCCESS  # type: ignore[union-attr]


def test_server_disconnect_carries_reason_string(env: MqttEnv) -> None:
    raw = env.raw_connected(5)
    raw.send_bytes(_publish_with_alias("t", 9999))
    got = raw.until_closed()
    assert len(got) == 1 and isinstance(got[0], Disconnect)
    assert got[0].reason_code == ReasonCode.TOPIC_ALIAS_INVALID
    assert got[0].properties.reason_string  # a human-readable reason


# ---------------------------------------------------------------------------- packet sizes


def test_client_maximum_packet_size_is_respected(env: MqttEnv) -> None:
    topic = uid("maxpkt/")
    sub = env.raw(5)
    ack = sub.connect(uid("small"), properties=Properties(maximum_packet_size=200))
    assert ack.properties.maximum_packet_size  # the broker announces its own maximum
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(5)
    pub.publish(topic, b"s" * 50, qos=1)
    pub.publish(topic, b"B" * 500, qos=1)
    pub.publish(topic, b"marker", qos=1)
    got = [sub.expect(Publish), sub.expect(Publish)]
    assert [p.payload for p in got] == [b"s" * 50, b"marker"]  # the big one was not sent
    assert all(len(encode(p, 5)) <= 200 for p in got)
    for p in got:
        sub.ack(p)
    assert sub.ping() == []  # and it does not come later either


def test_connack_announces_limits(env: MqttEnv) -> None:
    raw = env.raw(5)
    ack: Connack = raw.connect(uid("limits"))
    p = ack.properties
    assert p.receive_maximum == env.runtime.config.mqtt.receive_maximum
    assert p.maximum_packet_size == env.runtime.config.mqtt.max_packet_size
    assert p.retain_available in (None, 1)
    assert p.topic_alias_maximum is not None and p.topic_alias_maximum >= 1


# ---------------------------------------------------------------------------- auth


@pytest.mark.parametrize("level", LEVELS)
def test_raw_auth_refusals_close_the_connection(auth_env: MqttEnv, level: int) -> None:
    for username, password in [("system", b"nope"), (None, None), ("ghost", b"manager")]:
        raw = auth_env.raw(level)
        ack = raw.connect(uid("refused"), username=username, password=password,
                          expect_success=False)
        expected = ReasonCode.NOT_AUTHORIZED if level == 5 \
            else reason_code_from_v311_connack(5)
        assert ack.reason_code == expected, (username, ack)
        assert ack.session_present is False
        assert raw.until_closed() == []
    ok = auth_env.raw(level)
    ok.connect(uid("ok"), username="system", password=b"manager")
    assert ok.ping() == []
    assert ok.publish(uid("auth/"), b"still fine", qos=1) is not None


def test_plain_enhanced_auth_v5(auth_env: MqttEnv) -> None:
    ok = auth_env.raw(5)
    ack = ok.connect(uid("plain"), properties=Properties(
        authentication_method="PLAIN", authentication_data=b"\0system\0manager"))
    assert ack.reason_code == ReasonCode.SUCCESS
    assert ok.ping() == []
    bad = auth_env.raw(5)
    ack = bad.connect(uid("plainbad"), expect_success=False, properties=Properties(
        authentication_method="PLAIN", authentication_data=b"\0system\0wrong"))
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert bad.until_closed() == []
    other = auth_env.raw(5)
    ack = other.connect(uid("scram"), expect_success=False, properties=Properties(
        authentication_method="SCRAM-SHA-1", authentication_data=b"n,,n=system,r=abc"))
    assert ack.reason_code == ReasonCode.BAD_AUTHENTICATION_METHOD
    assert other.until_closed() == []


# ---------------------------------------------------------------------------- receive maximum in


@pytest.fixture
def small_window() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(mqtt=MqttConfig(receive_maximum=2))) as e:
        yield e


def test_broker_receive_maximum_counts_qos2_until_pubcomp(small_window: MqttEnv) -> None:
    """MQTT 5 4.9: a QoS 2 PUBLISH uses the receive quota until its PUBCOMP. With the
    broker's receive maximum 2, a third QoS 2 PUBLISH while two wait for PUBREL exceeds
    it: DISCONNECT 0x93."""
    bystander = small_window.raw_connected(5)
    raw = small_window.raw(5)
    ack = raw.connect(uid("greedy"))
    assert ack.properties.receive_maximum == 2
    topic = uid("window/")
    for pid in (1, 2):
        raw.send(Publish(topic, b"%d" % pid, qos=2, packet_id=pid))
        assert raw.expect(Pubrec).packet_id == pid
    raw.send(Publish(topic, b"3", qos=2, packet_id=3))
    raw.send(Pingreq())  # answered only if the broker let the third PUBLISH through
    got = raw.until_closed_or(Pingresp)
    assert len(got) == 1 and isinstance(got[0], Disconnect), got
    assert got[0].reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    small_window.assert_healthy(bystander)


def test_broker_receive_maximum_allows_completed_flows(small_window: MqttEnv) -> None:
    raw = small_window.raw(5)
    raw.connect(uid("polite"))
    topic = uid("window/")
    for i in range(6):  # each QoS 2 flow completes before the next: never above 2
        comp = raw.publish(topic, b"%d" % i, qos=2)
        assert isinstance(comp, Pubcomp) and comp.reason_code == ReasonCode.SUCCESS
    assert raw.ping() == []
