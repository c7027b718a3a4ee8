"""MQTT QoS 0/1/2 on the wire (raw packets with meshmq's codec), packet identifiers,
QoS downgrade, DUP on redelivery after a persistent session resumes, and the v5 receive
maximum window.
"""

from __future__ import annotations

import pytest
from tests.support.memory_mqtt import LEVELS, MemoryMqtt, MqttEnv, uid

from meshmq.protocol.mqtt import (
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)


def persistent_connect(raw: MemoryMqtt, client_id: str) -> bool:
    """Connect a persistent session (3.1.1 clean session 0, v5 clean start 0 + expiry)."""
    props = Properties(session_expiry_interval=300) if raw.level == 5 else None
    return raw.connect(client_id, clean=False, properties=props).session_present


@pytest.mark.parametrize("level", LEVELS)
def test_qos0_publish_gets_no_ack_and_is_delivered(env: MqttEnv, level: int) -> None:
    topic = uid("q0/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=0)
    pub = env.raw_connected(level)
    pub.publish(topic, b"zero", qos=0)
    assert pub.ping() == []  # no PUBACK/PUBREC for QoS 0
    got = sub.expect(Publish)
    assert (got.topic, got.payload, got.qos, got.packet_id, got.dup, got.retain) == \
        (topic, b"zero", 0, None, False, False)


@pytest.mark.parametrize("level", LEVELS)
def test_qos1_publish_puback_carries_the_packet_id(env: MqttEnv, level: int) -> None:
    topic = uid("q1/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(level)
    pub.send(Publish(topic, b"one", qos=1, packet_id=4242))
    ack = pub.expect(Puback)
    assert ack.packet_id == 4242
    assert ack.reason_code == ReasonCode.SUCCESS
    got = sub.expect(Publish)
    assert (got.payload, got.qos, got.dup) == (b"one", 1, False)
    assert got.packet_id is not None and got.packet_id > 0
    sub.send(Puback(got.packet_id))
    assert sub.ping() == []  # acked: nothing comes back


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_inbound_exact_flow_and_exactly_once(env: MqttEnv, level: int) -> None:
    topic = uid("q2/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=2)
    pub = env.raw_connected(level)
    pub.send(Publish(topic, b"two", qos=2, packet_id=77))
    rec = pub.expect(Pubrec)
    assert rec.packet_id == 77 and rec.reason_code == ReasonCode.SUCCESS
    # A retransmission (DUP) before PUBREL is acknowledged again but not re-published.
    pub.send(Publish(topic, b"two", qos=2, packet_id=77, dup=True))
    rec2 = pub.expect(Pubrec)
    assert rec2.packet_id == 77
    pub.send(Pubrel(77))
    comp = pub.expect(Pubcomp)
    assert comp.packet_id == 77 and comp.reason_code == ReasonCode.SUCCESS
    assert pub.ping() == []
    # marker after, same topic: the subscriber sees "two" exactly once, then the marker
    pub.publish(topic, b"marker", qos=1)
    first = sub.expect(Publish)
    assert (first.payload, first.qos) == (b"two", 2)
    sub.ack(first)
    second = sub.expect(Publish)
    assert second.payload == b"marker"


@pytest.mark.parametrize("level", LEVELS)
def test_pubrel_for_unknown_packet_id_gets_pubcomp(env: MqttEnv, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send(Pubrel(999))
    comp = raw.expect(Pubcomp)
    assert comp.packet_id == 999
    if level == 5:
        assert comp.reason_code == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


@pytest.mark.parametrize("level", LEVELS)
def test_qos2_outbound_exact_flow(env: MqttEnv, level: int) -> None:
    topic = uid("q2out/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=2)
    pub = env.raw_connected(level)
    pub.publish(topic, b"first", qos=2)
    got = sub.expect(Publish)
    assert (got.payload, got.qos, got.dup) == (b"first", 2, False)
    assert got.packet_id
    sub.send(Pubrec(got.packet_id))
    rel = sub.expect(Pubrel)
    assert rel.packet_id == got.packet_id and rel.reason_code == ReasonCode.SUCCESS
    sub.send(Pubcomp(got.packet_id))
    assert sub.ping() == []  # nothing resent after PUBCOMP
    pub.publish(topic, b"second", qos=2)
    nxt = sub.expect(Publish)
    assert nxt.payload == b"second" and nxt.qos == 2 and nxt.dup is False


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("sub_qos", "expected"), [(0, [0, 0, 0]), (1, [0, 1, 1]),
                                                   (2, [0, 1, 2])])
def test_delivery_qos_is_min_of_subscription_and_publish(env: MqttEnv, level: int,
                                                          sub_qos: int,
                                                          expected: list[int]) -> None:
    topic = uid("down/")
    sub = env.raw_connected(level)
    ack = sub.subscribe(topic, qos=sub_qos)
    assert ack.reason_codes == [ReasonCode(sub_qos)]
    pub = env.raw_connected(level)
    for qos in (0, 1, 2):
        pub.publish(topic, f"q{qos}".encode(), qos=qos)
    got = sub.publishes(3)
    assert [p.payload for p in got] == [b"q0", b"q1", b"q2"]
    assert [p.qos for p in got] == expected
    for p in got:
        assert (p.packet_id is None) == (p.qos == 0)
        sub.ack(p)
    assert sub.ping() == []


@pytest.mark.parametrize("level", LEVELS)
def test_outbound_packet_ids_are_distinct_and_reused_after_ack(env: MqttEnv,
                                                               level: int) -> None:
    topic = uid("pids/")
    sub = env.raw_connected(level)
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(level)
    for i in range(5):
        pub.publish(topic, b"%d" % i, qos=1)
    got = sub.publishes(5)
    pids = [p.packet_id for p in got]
    assert all(pid and 0 < pid <= 65535 for pid in pids)
    assert len(set(pids)) == 5, pids
    assert [p.payload for p in got] == [b"0", b"1", b"2", b"3", b"4"]
    for p in got:
        sub.ack(p)
    pub.publish(topic, b"after", qos=1)
    assert sub.expect(Publish).payload == b"after"


@pytest.mark.parametrize("level", LEVELS)
def test_unacked_qos1_redelivered_with_dup_on_session_resume(env: MqttEnv, level: int) -> None:
    cid = uid("dup")
    topic = uid("dup/")
    sub = env.raw(level)
    persistent_connect(sub, cid)
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(level)
    for i in range(3):
        pub.publish(topic, b"m%d" % i, qos=1)
    first = sub.publishes(3)
    assert [p.dup for p in first] == [False] * 3
    sub.abort()  # no PUBACKs

    again = env.raw(level)
    assert persistent_connect(again, cid) is True
    redelivered = again.publishes(3)
    assert [p.payload for p in redelivered] == [b"m0", b"m1", b"m2"]
    assert [p.dup for p in redelivered] == [True] * 3
    assert [p.qos for p in redelivered] == [1] * 3
    for p in redelivered:
        again.ack(p)
    assert again.ping() == []
    again.disconnect()
    again.until_closed()

    third = env.raw(level)
    assert persistent_connect(third, cid) is True
    assert third.ping() == []  # acknowledged: not delivered a third time


def test_receive_maximum_limits_unacked_outbound_v5(env: MqttEnv) -> None:
    topic = uid("rmax/")
    sub = env.raw(5)
    sub.connect(uid("rmax"), properties=Properties(receive_maximum=2))
    sub.subscribe(topic, qos=1)
    pub = env.raw_connected(5)
    for i in range(5):
        pub.publish(topic, b"%d" % i, qos=1)  # PUBACKed: all five are in the broker
    window = sub.ping()
    assert [p.payload for p in window] == [b"0", b"1"]  # at most 2 unacked in flight
    sub.ack(window[0])  # type: ignore[arg-type]
    third = sub.expect(Publish)
    assert third.payload == b"2"
    assert sub.ping() == []  # still 2 outstanding: "1" and "2"
    sub.ack(window[1])  # type: ignore[arg-type]
    sub.ack(third)
    rest = sub.publishes(2)
    assert [p.payload for p in rest] == [b"3", b"4"]
