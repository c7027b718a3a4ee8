"""An MQTT client with very many subscriptions does not stall the broker when it goes
away: its consumers (and, for a session that ends with it, its durable subscriptions)
are removed a budget per event-loop turn, and other clients are served in between. A
client that reconnects with the same client id meanwhile finds its session exactly as
an instantaneous close would have left it."""

from __future__ import annotations

import json

import pytest
from tests.support.memory_broker import StompClient, memory_config
from tests.support.memory_mqtt import MemoryMqtt, MqttEnv, mqtt_env, uid

from meshmq.protocol.mqtt import (
    Properties,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Will,
    encode,
)
from meshmq.protocol.stomp.frames import Frame
from meshmq.transport import mqtt_server

BATCH = 1000  # topic filters per SUBSCRIBE


def subscribe_many(client: MemoryMqtt, filters: list[str], qos: int) -> None:
    """SUBSCRIBE every filter, BATCH per packet, all packets pipelined."""
    batches = [filters[i:i + BATCH] for i in range(0, len(filters), BATCH)]
    pids = [client.next_pid() for _ in batches]
    client.send_bytes(b"".join(
        encode(Subscribe(pid, [(f, SubscriptionOptions(qos=qos)) for f in batch]),
               client.level) for pid, batch in zip(pids, batches, strict=True)))
    for pid, batch in zip(pids, batches, strict=True):
        ack = client.expect(Suback, timeout=60)
        assert ack.packet_id == pid
        assert ack.reason_codes == [ReasonCode(qos)] * len(batch)


def consumers_of(env: MqttEnv, client_id: str) -> int:
    broker = env.runtime.broker
    return sum(len(c.consumers) for c in broker.connections.values()
               if c.client_id == client_id)


def messages(observer: StompClient) -> list[Frame]:
    return [f for f in observer.received() if f.command == "MESSAGE"]


def test_other_clients_are_served_while_a_big_client_is_taken_apart(env: MqttEnv) -> None:
    count = 20_000
    big_id, topic = uid("big"), f"probe/{uid('t')}"
    dest = topic.replace("/", ".")
    # One STOMP consumer on the probe topic and the connection advisories: it sees, in
    # the order the broker routed them, the big client's will (its close has begun), the
    # probe's message and the advisory that the big client's connection is gone.
    observer = env.stomp()
    observer.send("SUBSCRIBE", {
        "id": "1", "receipt": "sub",
        "destination": f"/topic/{dest},/topic/ActiveMQ.Advisory.Connection"})
    assert observer.expect("RECEIPT").get("receipt-id") == "sub"
    big = env.raw(4)
    big.connect(big_id, will=Will(topic=topic, payload=b"will", qos=0))
    subscribe_many(big, [f"many/{big_id}/{i}" for i in range(count)], qos=0)
    assert consumers_of(env, big_id) == count

    big.abort()
    env.broker.wait_for(lambda: any(m.body == b"will" for m in messages(observer)),
                        30, "the will")
    probe = env.raw_connected(4)
    assert probe.publish(topic, b"probe", qos=1) is not None  # the PUBACK
    probe.close()

    def removed(m: Frame) -> bool:
        return m.get("advisoryType") == "ConnectionRemoved" \
            and json.loads(m.body).get("clientId") == big_id

    env.broker.wait_for(lambda: any(removed(m) for m in messages(observer))
                        and any(m.body == b"probe" for m in messages(observer)), 60,
                        "the probe's message and the big connection's end")
    order = [("probe" if m.body == b"probe" else "will" if m.body == b"will" else "removed")
             for m in messages(observer) if m.body in (b"probe", b"will") or removed(m)]
    # The probe was served while the big connection was still being taken apart.
    assert order == ["will", "probe", "removed"], order
    assert consumers_of(env, big_id) == 0
    env.assert_healthy()


@pytest.mark.parametrize("level", [4, 5])
def test_a_persistent_session_resumed_during_the_teardown_is_complete(
        env: MqttEnv, monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    # A budget of 0 holds the teardown at its first step (consumers paused, none
    # removed), so the reconnect below certainly arrives while it is pending.
    monkeypatch.setattr(mqtt_server, "CONSUMERS_CLOSED_PER_TURN", 0, raising=False)
    count = 3000
    client_id, prefix = uid("resume"), f"many/{uid('r')}"
    expiry = Properties(session_expiry_interval=300) if level == 5 else None
    first = env.raw(level)
    first.connect(client_id, clean=False, properties=expiry)
    subscribe_many(first, [f"{prefix}/{i}" for i in range(count)], qos=1)
    first.abort()
    broker = env.runtime.broker
    env.broker.wait_for(lambda: all(c.closed for c in broker.connections.values()
                                    if c.client_id == client_id),
                        30, "the broker to see the abort")

    # Queued for the session while it is away (QoS 1, so kept for it).
    away = env.raw_connected(4)
    for i in range(10):
        away.publish(f"{prefix}/{i}", b"away%d" % i, qos=1)
    away.close()

    again = env.raw(level)
    ack = again.connect(client_id, clean=False, properties=expiry)
    assert ack.session_present
    assert consumers_of(env, client_id) == count
    assert len(env.durables(client_id)) == count
    publisher = env.raw_connected(4)
    publisher.send_bytes(b"".join(encode(Publish(f"{prefix}/{i}", str(i).encode()), 4)
                                  for i in range(count)))
    assert publisher.ping() == []
    got = []
    for packet in again.publishes(count + 10, timeout=60):
        got.append(packet.payload.decode())
        again.ack(packet)
    # The messages queued while away, then each subscription's message, each once.
    assert sorted(got) == sorted([f"away{i}" for i in range(10)]
                                 + [str(i) for i in range(count)])
    assert again.ping() == []  # nothing more
    env.assert_healthy()


@pytest.mark.parametrize("level", [4, 5])
def test_subscriptions_beyond_the_limit_are_refused_in_the_suback(level: int) -> None:
    with mqtt_env(memory_config(max_subscriptions_per_connection=2)) as env:
        client = env.raw_connected(level)
        refused = 0x97 if level == 5 else 0x80  # Quota exceeded / 3.1.1 Failure
        ack = client.subscribe(("lim/a", 1), ("lim/b", 0), ("lim/c", 1))
        assert ack.reason_codes == [1, 0, refused]
        if level == 5:
            assert "broker.max_subscriptions_per_connection" in \
                (ack.properties.reason_string or "")
        # Subscribing again to a filter held replaces it: allowed at the limit.
        assert client.subscribe(("lim/a", 0)).reason_codes == [0]
        assert client.subscribe(("lim/d", 0)).reason_codes == [refused]
        # The connection stays usable, and the granted subscriptions work.
        publisher = env.raw_connected(4)
        publisher.publish("lim/c", b"not subscribed", qos=1)
        publisher.publish("lim/b", b"granted", qos=1)
        [packet] = client.publishes(1)
        assert packet.payload == b"granted"
        client.unsubscribe("lim/b")
        assert client.subscribe(("lim/c", 0)).reason_codes == [0]
        publisher.publish("lim/c", b"now subscribed", qos=1)
        [packet] = client.publishes(1)
        assert packet.payload == b"now subscribed"
        assert client.ping() == []


@pytest.mark.parametrize("held", [False, True])
def test_a_session_ending_with_its_connection_loses_every_durable_subscription(
        env: MqttEnv, monkeypatch: pytest.MonkeyPatch, held: bool) -> None:
    """MQTT 5 DISCONNECT with Session Expiry Interval 0 ends a persistent session: its
    durable subscriptions are deleted over several turns; a reconnect meanwhile (held:
    the teardown does not move by itself) finds no session, as after an instant close."""
    monkeypatch.setattr(mqtt_server, "CONSUMERS_CLOSED_PER_TURN", 0 if held else 100)
    count = 2500
    client_id, prefix = uid("ends"), f"many/{uid('e')}"
    first = env.raw(5)
    first.connect(client_id, clean=False, properties=Properties(session_expiry_interval=300))
    subscribe_many(first, [f"{prefix}/{i}" for i in range(count)], qos=1)
    assert len(env.durables(client_id)) == count
    first.disconnect(0, Properties(session_expiry_interval=0))
    first.until_closed()
    if not held:
        env.broker.wait_for(lambda: not env.durables(client_id), 30,
                            "the durables to be deleted")
    again = env.raw(5)
    ack = again.connect(client_id, clean=False,
                        properties=Properties(session_expiry_interval=300))
    assert not ack.session_present
    assert env.durables(client_id) == []
    record = env.runtime.broker.records.get(f"mqtt-session/{client_id}")
    assert record is not None and json.loads(record[1])["qos2_in"] == []  # a fresh one
    env.assert_healthy()


def test_a_session_expiring_while_its_connection_is_taken_apart_is_gone(
        env: MqttEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mqtt_server, "CONSUMERS_CLOSED_PER_TURN", 0)  # held, see above
    client_id, prefix = uid("expires"), f"many/{uid('x')}"
    first = env.raw(5)
    first.connect(client_id, clean=False, properties=Properties(session_expiry_interval=1))
    subscribe_many(first, [f"{prefix}/{i}" for i in range(1500)], qos=1)
    first.abort()
    runtime = env.runtime
    env.broker.wait_for(lambda: client_id not in runtime.mqtt.states
                        and client_id in runtime.mqtt.teardowns,
                        30, "the session to expire during the teardown")
    again = env.raw(5)
    assert not again.connect(client_id, clean=False).session_present
    assert env.durables(client_id) == []
    env.assert_healthy()
