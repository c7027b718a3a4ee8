"""One destination model: MQTT topics and STOMP /topic/ destinations are the same topics
(`/` <-> `.`, `+` <-> `*`, `#` <-> `>`), in both directions, with QoS/persistence,
wildcards (including `#` matching its parent level) and STOMP selectors on MQTT 5 user
properties. MQTT and STOMP clients of one broker driven in memory.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.memory_mqtt import LEVELS, MqttEnv, uid
from tests.support.memory_stomp_client import MemoryClient

from meshmq.protocol.mqtt import Properties, Publish


def stomp(env: MqttEnv, **kw: Any) -> MemoryClient:
    return MemoryClient(env.broker, "1.2", **kw)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_publish_reaches_stomp_subscriber(env: MqttEnv, level: int, qos: int) -> None:
    base = uid("a")
    sub = stomp(env)
    sub.subscribe(f"/topic/{base}.b.c")
    pub = env.raw_connected(level)
    pub.publish(f"{base}/b/c", b"from mqtt", qos=qos)
    if qos == 0:
        assert pub.ping() == []
    msg = sub.wait_messages(1)[0]
    assert msg.body == "from mqtt"
    assert msg.headers["destination"] == f"/topic/{base}.b.c"
    assert msg.headers["ActiveMQ.MQTT.QoS"] == str(qos)
    assert msg.headers.get("persistent", "false") == ("true" if qos else "false")


@pytest.mark.parametrize("level", LEVELS)
def test_stomp_send_reaches_mqtt_wildcard_subscriber(env: MqttEnv, level: int) -> None:
    base = uid("s")
    q0 = env.raw_connected(level)
    q0.subscribe(f"{base}/+/c", qos=0)
    q1 = env.raw_connected(level)
    q1.subscribe(f"{base}/+/c", qos=1)
    q2 = env.raw_connected(level)
    q2.subscribe(f"{base}/#", qos=2)
    sender = stomp(env)
    sender.send(f"/topic/{base}.b.c", "plain")
    sender.send(f"/topic/{base}.x.c", "durable", headers={"persistent": "true"})
    for sub, expected in ((q0, [0, 0]), (q1, [0, 1]), (q2, [0, 1])):
        got = sub.publishes(2)
        assert [(p.topic, p.payload) for p in got] == \
            [(f"{base}/b/c", b"plain"), (f"{base}/x/c", b"durable")]
        assert [p.qos for p in got] == expected  # persistent:true counts as QoS 1
        for p in got:
            sub.ack(p)
        assert sub.ping() == []


def test_stomp_wildcards_see_mqtt_topics(env: MqttEnv) -> None:
    base = uid("w")
    star = stomp(env)
    star.subscribe(f"/topic/{base}.*.c")
    deep = stomp(env)
    deep.subscribe(f"/topic/{base}.>")
    pub = env.raw_connected(5)
    pub.publish(f"{base}/b/c", b"1", qos=1)
    pub.publish(f"{base}/b/c/d", b"2", qos=1)
    assert star.wait_messages(1)[0].body == "1"
    assert [m.body for m in deep.wait_messages(2)] == ["1", "2"]
    star.barrier()
    assert star.bodies() == ["1"]


@pytest.mark.parametrize("level", LEVELS)
def test_hash_matches_the_parent_level(env: MqttEnv, level: int) -> None:
    base = uid("parent")
    sub = env.raw_connected(level)
    sub.subscribe(f"{base}/#", qos=1)
    pub = env.raw_connected(level)
    pub.publish(base, b"parent", qos=1)
    pub.publish(f"{base}/child", b"child", qos=1)
    pub.publish(f"{base}x", b"not a child", qos=1)
    pub.publish(f"{base}/child/grandchild", b"grandchild", qos=1)
    got = sub.publishes(3)
    assert [(p.topic, p.payload) for p in got] == [
        (base, b"parent"), (f"{base}/child", b"child"),
        (f"{base}/child/grandchild", b"grandchild")]
    for p in got:
        sub.ack(p)
    sender = stomp(env)  # and a STOMP publish to the parent reaches it too
    sender.send(f"/topic/{base}", "from stomp")
    last = sub.expect(Publish)
    assert (last.topic, last.payload) == (base, b"from stomp")


def test_stomp_selector_on_mqtt5_user_property(env: MqttEnv) -> None:
    topic = uid("sel/")
    sub = stomp(env)
    sub.subscribe(f"/topic/{topic.replace('/', '.')}", headers={"selector": "color = 'red'"})
    pub = env.raw_connected(5)
    for color in ("blue", "red"):
        pub.publish(topic, color.encode(), qos=1,
                    properties=Properties(user_properties=[("color", color)]))
    msg = sub.wait_messages(1)[0]
    assert msg.body == "red"  # blue was published first and filtered out
    assert msg.headers["color"] == "red"
    sub.barrier()
    assert sub.bodies() == ["red"]


def test_stomp_headers_become_mqtt5_user_properties(env: MqttEnv) -> None:
    topic = uid("hdr/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=1)
    sender = stomp(env)
    sender.send(f"/topic/{topic.replace('/', '.')}", "with headers",
                headers={"region": "eu", "content-type": "text/plain",
                         "correlation-id": "c-17", "persistent": "true"})
    got = sub.expect(Publish)
    assert got.payload == b"with headers" and got.qos == 1
    assert ("region", "eu") in got.properties.user_properties
    assert got.properties.correlation_data == b"c-17"
    assert got.properties.content_type is not None
    assert got.properties.content_type.startswith("text/plain")


def test_mqtt_publish_to_stomp_durable_subscriber_while_offline(env: MqttEnv) -> None:
    base = uid("dur")
    cid = uid("stompdur")
    first = stomp(env, client_id=cid)
    first.subscribe(f"/topic/{base}.x", "d1", headers={"activemq.subscriptionName": "s1"},
                    ack="client-individual")
    first.disconnect()
    pub = env.raw_connected(4)
    pub.publish(f"{base}/x", b"kept for stomp", qos=1)
    back = stomp(env, client_id=cid)
    back.subscribe(f"/topic/{base}.x", "d1", headers={"activemq.subscriptionName": "s1"},
                   ack="client-individual")
    msg = back.wait_messages(1)[0]
    assert msg.body == "kept for stomp"
    back.ack(msg)
    back.barrier()
    assert back.bodies() == ["kept for stomp"]
