"""One destination model: MQTT topics and STOMP /topic/ destinations are the same topics
(`/` <-> `.`, `+` <-> `*`, `#` <-> `>`), in both directions, with QoS/persistence,
wildcards (including `#` matching its parent level) and STOMP selectors on MQTT 5 user
properties.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes

from meshmq.protocol.mqtt import Publish
from tests.interop.mqtt_helpers import LEVELS, MqttEnv, paho_props, uid


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data")
    try:
        yield e
    finally:
        e.close()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_publish_reaches_stomp_subscriber(env: MqttEnv, level: int, qos: int) -> None:
    base = uid("a")
    stomp = env.stomp()
    stomp.subscribe(f"/topic/{base}.b.c")
    pub = env.raw_connected(level)
    pub.publish(f"{base}/b/c", b"from mqtt", qos=qos)
    if qos == 0:
        assert pub.ping() == []
    msg = stomp.wait_messages(1)[0]
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
    stomp = env.stomp()
    stomp.send(f"/topic/{base}.b.c", "plain")
    stomp.send(f"/topic/{base}.x.c", "durable", headers={"persistent": "true"})
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
    star = env.stomp()
    star.subscribe(f"/topic/{base}.*.c")
    deep = env.stomp()
    deep.subscribe(f"/topic/{base}.>")
    pub = env.paho(5)
    pub.publish(f"{base}/b/c", b"1", 1)
    pub.publish(f"{base}/b/c/d", b"2", 1)
    assert star.wait_messages(1)[0].body == "1"
    assert [m.body for m in deep.wait_messages(2)] == ["1", "2"]
    star.barrier()
    assert star.bodies() == ["1"]


@pytest.mark.parametrize("level", LEVELS)
def test_hash_matches_the_parent_level(env: MqttEnv, level: int) -> None:
    base = uid("parent")
    sub = env.paho(level)
    sub.subscribe(f"{base}/#", 1)
    pub = env.paho(level)
    pub.publish(base, b"parent", 1)
    pub.publish(f"{base}/child", b"child", 1)
    pub.publish(f"{base}x", b"not a child", 1)
    pub.publish(f"{base}/child/grandchild", b"grandchild", 1)
    got = sub.wait_for(b"grandchild")
    assert [(m.topic, m.payload) for m in got] == [
        (base, b"parent"), (f"{base}/child", b"child"),
        (f"{base}/child/grandchild", b"grandchild")]
    stomp = env.stomp()  # and a STOMP publish to the parent reaches it too
    stomp.send(f"/topic/{base}", "from stomp")
    assert sub.wait_for(b"from stomp")[-1].topic == base


def test_stomp_selector_on_mqtt5_user_property(env: MqttEnv) -> None:
    topic = uid("sel/")
    stomp = env.stomp()
    stomp.subscribe(f"/topic/{topic.replace('/', '.')}", headers={"selector": "color = 'red'"})
    pub = env.paho(5)
    for color in ("blue", "red"):
        pub.publish(topic, color.encode(), 1, properties=paho_props(  # type: ignore[arg-type]
            PacketTypes.PUBLISH, UserProperty=[("color", color)]))
    msg = stomp.wait_messages(1)[0]
    assert msg.body == "red"  # blue was published first and filtered out
    assert msg.headers["color"] == "red"
    stomp.barrier()
    assert stomp.bodies() == ["red"]


def test_stomp_headers_become_mqtt5_user_properties(env: MqttEnv) -> None:
    topic = uid("hdr/")
    sub = env.raw_connected(5)
    sub.subscribe(topic, qos=1)
    stomp = env.stomp()
    stomp.send(f"/topic/{topic.replace('/', '.')}", "with headers",
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
    stomp = env.stomp(client_id=uid("stompdur"))
    stomp.subscribe(f"/topic/{base}.x", "d1", headers={"activemq.subscriptionName": "s1"},
                    ack="client-individual")
    cid = stomp._headers["client-id"]
    stomp.disconnect()
    pub = env.paho(4)
    pub.publish(f"{base}/x", b"kept for stomp", 1)
    back = env.stomp(client_id=cid)
    back.subscribe(f"/topic/{base}.x", "d1", headers={"activemq.subscriptionName": "s1"},
                   ack="client-individual")
    msg = back.wait_messages(1)[0]
    assert msg.body == "kept for stomp"
    back.ack(msg)
