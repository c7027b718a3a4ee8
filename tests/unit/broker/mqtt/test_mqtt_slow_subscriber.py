"""A slow subscriber pushes back on the producers of its topics: while its transport is
above the high-water mark (``pause_writing``), the broker stops reading the connections
that publish to its topics instead of queueing for it without bound, and reads them
again once it drains. Producers of other topics, and shared subscriptions with a member
still reading, are not held. Through a broker driven in memory; the transport's
``pause_writing``/``resume_writing`` are called as asyncio would."""

from __future__ import annotations

import time

import pytest
from tests.support.memory_mqtt import LEVELS, MemoryMqtt, MqttEnv, uid


def reading(client: MemoryMqtt) -> bool:
    return bool(client.client.transport.reading)


def pause(sub: MemoryMqtt) -> None:
    session = sub.session
    sub.broker.call(session.pause_writing)


def resume(sub: MemoryMqtt) -> None:
    session = sub.session
    sub.broker.call(session.resume_writing)


@pytest.mark.parametrize("level", LEVELS)
def test_a_slow_subscriber_holds_its_topics_producer_until_it_drains(
        env: MqttEnv, level: int) -> None:
    topic = uid("slow/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=0)
    pub = env.raw_connected(level)
    pub.publish(topic, b"before")
    assert [p.payload for p in sub.publishes(1)] == [b"before"]
    assert reading(pub)

    pause(sub)
    pub.publish(topic, b"held 1")
    pub.publish(topic, b"held 2")  # already read by the socket: handled, not lost
    env.broker.turn()
    assert not reading(pub)
    assert sub.ping() == []  # nothing is written to the paused subscriber

    resume(sub)
    env.broker.wait_for(lambda: reading(pub), what="the producer read again")
    assert [p.payload for p in sub.publishes(2)] == [b"held 1", b"held 2"]


def test_producers_of_other_topics_are_read_on(env: MqttEnv) -> None:
    slow_topic, other_topic = uid("slow/"), uid("other/")
    slow = env.raw_connected()
    slow.subscribe(slow_topic, qos=0)
    fast = env.raw_connected()
    fast.subscribe(other_topic, qos=0)
    held = env.raw_connected()
    free = env.raw_connected()
    pause(slow)
    held.publish(slow_topic, b"x")
    free.publish(other_topic, b"y")
    env.broker.turn()
    assert not reading(held)
    assert reading(free)
    assert [p.payload for p in fast.publishes(1)] == [b"y"]


def test_a_shared_subscription_with_a_member_reading_holds_nobody(env: MqttEnv) -> None:
    topic = uid("shared/")
    stuck, live = env.raw_connected(5), env.raw_connected(5)
    stuck.subscribe(f"$share/g/{topic}", qos=0)
    live.subscribe(f"$share/g/{topic}", qos=0)
    pub = env.raw_connected(5)
    pause(stuck)
    for n in range(4):
        pub.publish(topic, str(n).encode())
    env.broker.turn()
    assert reading(pub)
    assert [p.payload for p in live.publishes(4)] == [b"0", b"1", b"2", b"3"]


def test_a_slow_subscriber_that_goes_away_releases_the_producer(env: MqttEnv) -> None:
    topic = uid("gone/")
    sub = env.raw_connected()
    sub.subscribe(topic, qos=0)
    pub = env.raw_connected()
    pause(sub)
    pub.publish(topic, b"x")
    env.broker.turn()
    assert not reading(pub)
    sub.abort()  # no resume_writing ever comes: the producer is looked at again
    env.broker.wait_for(lambda: reading(pub), what="the producer read again")
    env.assert_healthy(pub)


def test_a_slow_stomp_subscriber_holds_an_mqtt_producer_too(env: MqttEnv) -> None:
    topic = uid("mixed/")
    stomp = env.stomp()
    stomp.send("SUBSCRIBE", {"destination": "/topic/" + topic.replace("/", "."),
                             "id": "1", "receipt": "r"})
    assert stomp.expect("RECEIPT").get("receipt-id") == "r"
    pub = env.raw_connected()
    env.broker.call(stomp.protocol.pause_writing)
    pub.publish(topic, b"x")
    env.broker.turn()
    assert not reading(pub)
    env.broker.call(stomp.protocol.resume_writing)
    env.broker.wait_for(lambda: reading(pub), what="the producer read again")
    assert stomp.expect("MESSAGE").body == b"x"


@pytest.mark.parametrize("level", LEVELS)
def test_a_held_producer_is_not_timed_out_for_its_silence(env: MqttEnv, level: int) -> None:
    topic = uid("ka/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=0)
    pub = env.raw(level)
    pub.connect(uid("held"), keep_alive=10)
    pause(sub)
    pub.publish(topic, b"x")
    env.broker.turn()
    assert not reading(pub)
    session = pub.session
    env.broker.call(lambda: session.check_timeouts(time.monotonic() + 100))
    assert not pub.eof
    resume(sub)
    env.broker.wait_for(lambda: reading(pub), what="the producer read again")
    # Its keep-alive counts from when reading resumed.
    env.broker.call(lambda: session.check_timeouts(time.monotonic() + 14))
    assert not pub.eof
    assert pub.ping() == []
