"""Bad input on an MQTT connection. MQTT 5 clients get the spec's reason code (a
DISCONNECT, or a CONNACK while connecting), 3.1.1 clients get the spec's disconnect (the
connection is closed; CONNACK return codes for CONNECT errors). After each, a connected
client still round-trips and the broker still accepts new connections.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_mqtt import LEVELS, MemoryMqtt, MqttEnv, mqtt_env, uid

from meshmq.config.model import MqttConfig
from meshmq.protocol.mqtt import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Publish,
    ReasonCode,
    Suback,
    encode,
)

MAX_PACKET = 1024


@pytest.fixture
def env() -> Iterator[MqttEnv]:
    with mqtt_env(memory_config(mqtt=MqttConfig(max_packet_size=MAX_PACKET))) as e:
        yield e


@pytest.fixture
def quick() -> Iterator[MqttEnv]:
    """A 500 ms connect timeout on the broker's real timer. No bystander or fresh
    clients here: on a busy machine a client can take longer than that from accept to
    CONNECT."""
    with mqtt_env(memory_config(mqtt=MqttConfig(connect_timeout_ms=500))) as e:
        yield e


@pytest.fixture
def bystander(env: MqttEnv) -> MemoryMqtt:
    return env.raw_connected(5)


def str16(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def publish_bytes(topic: bytes, level: int, *, first: int = 0x30, pid: bytes = b"") -> bytes:
    body = str16(topic) + pid + (b"\x00" if level == 5 else b"") + b"payload"
    return bytes([first, len(body)]) + body


def expect_rejection(raw: MemoryMqtt, code: ReasonCode) -> None:
    """v5: exactly one DISCONNECT with ``code``, then close; 3.1.1: closed, nothing sent."""
    got = raw.until_closed()
    if raw.level == 5:
        assert len(got) == 1 and isinstance(got[0], Disconnect), got
        assert got[0].reason_code == code, got[0]
    else:
        assert got == [], got


def bytes_until_closed(env: MqttEnv, data: bytes) -> bytes:
    """Raw bytes the broker answers to ``data`` on a fresh connection, until it closes
    (for answers sent before a protocol level is known)."""
    raw = env.raw(4)
    raw.send_bytes(data)
    env.broker.wait_for(lambda: raw.eof, what="the broker to close")
    return bytes(raw.client.transport.written)


def connect_bytes(name: bytes, level: int) -> bytes:
    body = str16(name) + bytes([level, 0x02]) + b"\x00\x3c" + str16(b"cid")
    return bytes([0x10, len(body)]) + body


# ---------------------------------------------------------------------------- framing


@pytest.mark.parametrize("level", LEVELS)
def test_malformed_remaining_length(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(b"\x30\xff\xff\xff\xff\x01")  # a fifth length byte
    expect_rejection(raw, ReasonCode.MALFORMED_PACKET)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_non_minimal_remaining_length(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(b"\xc0\x80\x00")  # PINGREQ, remaining length 0 in two bytes
    expect_rejection(raw, ReasonCode.MALFORMED_PACKET)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_packet_larger_than_maximum(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw(level)
    ack = raw.connect(uid("big"))
    if level == 5:
        assert ack.properties.maximum_packet_size == MAX_PACKET
    ok = encode(Publish(uid("fits/"), b"x" * (MAX_PACKET - 100)), level)
    raw.send_bytes(ok)
    assert raw.ping() == []
    raw.send_bytes(encode(Publish(uid("big/"), b"x" * (MAX_PACKET * 2)), level))
    expect_rejection(raw, ReasonCode.PACKET_TOO_LARGE)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_oversized_packet_header_alone_is_rejected(env: MqttEnv, bystander: MemoryMqtt,
                                                   level: int) -> None:
    """Only the fixed header of a 100 MB packet arrives: rejected without waiting for it."""
    raw = env.raw_connected(level)
    raw.send_bytes(b"\x30\x80\x80\x80\x30")  # remaining length 100663296
    expect_rejection(raw, ReasonCode.PACKET_TOO_LARGE)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_reserved_packet_type_and_bad_flags(env: MqttEnv, bystander: MemoryMqtt,
                                            level: int) -> None:
    for data in (b"\x00\x00", b"\xc1\x00", b"\x38" + publish_bytes(b"t", level)[1:]):
        # reserved type 0; PINGREQ with flags; DUP on a QoS 0 PUBLISH
        raw = env.raw_connected(level)
        raw.send_bytes(data)
        expect_rejection(raw, ReasonCode.MALFORMED_PACKET)
    env.assert_healthy(bystander)


# ---------------------------------------------------------------------------- topics


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("topic", [b"bad/\xff\xfe", b"nul/\x00/x", b"\xed\xa0\x80surrogate"])
def test_invalid_utf8_or_nul_in_topic(env: MqttEnv, bystander: MemoryMqtt, level: int,
                                      topic: bytes) -> None:
    watcher = env.raw_connected(level)
    watcher.subscribe("bad/#", "nul/#", "+", qos=0)  # where the topics would land
    raw = env.raw_connected(level)
    raw.send_bytes(publish_bytes(topic, level))
    expect_rejection(raw, ReasonCode.MALFORMED_PACKET)
    assert [p for p in watcher.ping() if isinstance(p, Publish) and p.payload == b"payload"] \
        == []  # nothing was published
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("topic", [b"a/+", b"a/#", b"+", b"#"])
def test_wildcard_in_publish_topic(env: MqttEnv, bystander: MemoryMqtt, level: int,
                                   topic: bytes) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(publish_bytes(topic, level))
    expect_rejection(raw, ReasonCode.TOPIC_NAME_INVALID)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_empty_publish_topic_without_alias(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(publish_bytes(b"", level))
    expect_rejection(raw, ReasonCode.TOPIC_NAME_INVALID if level == 4
                     else ReasonCode.PROTOCOL_ERROR)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("flt", [b"a/#/b", b"a/b#", b"a+/b", b""])
def test_invalid_subscription_filter(env: MqttEnv, bystander: MemoryMqtt, level: int,
                                     flt: bytes) -> None:
    raw = env.raw_connected(level)
    body = b"\x00\x05" + (b"\x00" if level == 5 else b"") + str16(flt) + b"\x01"
    raw.send_bytes(bytes([0x82, len(body)]) + body)
    got = raw.until_closed() if level == 4 else [raw.recv()]
    if level == 4:
        assert got == [], got
    else:
        # the spec allows either answer: SUBACK 0x8F for the filter, or DISCONNECT 0x8F
        packet: Packet = got[0]
        if isinstance(packet, Suback):
            assert packet.reason_codes == [ReasonCode.TOPIC_FILTER_INVALID]
            assert raw.ping() == []
        else:
            assert isinstance(packet, Disconnect), packet
            assert packet.reason_code == ReasonCode.TOPIC_FILTER_INVALID
            assert raw.until_closed() == []
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_subscribe_with_packet_id_zero_or_no_filters(env: MqttEnv, bystander: MemoryMqtt,
                                                     level: int) -> None:
    props = b"\x00" if level == 5 else b""
    for body in (b"\x00\x00" + props + str16(b"ok") + b"\x01",  # packet id 0
                 b"\x00\x05" + props):  # no topic filter at all
        raw = env.raw_connected(level)
        raw.send_bytes(bytes([0x82, len(body)]) + body)
        got = raw.until_closed()
        if level == 5:
            assert len(got) == 1 and isinstance(got[0], Disconnect), got
            assert got[0].reason_code in (ReasonCode.MALFORMED_PACKET,
                                          ReasonCode.PROTOCOL_ERROR)
        else:
            assert got == []
    env.assert_healthy(bystander)


# ---------------------------------------------------------------------------- CONNECT


@pytest.mark.parametrize("level", LEVELS)
def test_second_connect(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send(Connect(client_id=uid("again"), protocol_level=level))
    expect_rejection(raw, ReasonCode.PROTOCOL_ERROR)
    env.assert_healthy(bystander)


def test_mqtt31_mqisdp_gets_return_code_1(env: MqttEnv, bystander: MemoryMqtt) -> None:
    # unacceptable protocol version
    assert bytes_until_closed(env, connect_bytes(b"MQIsdp", 3)) == b"\x20\x02\x00\x01"
    env.assert_healthy(bystander)


def test_unsupported_protocol_level(env: MqttEnv, bystander: MemoryMqtt) -> None:
    for level in (3, 6, 0):
        answer = bytes_until_closed(env, connect_bytes(b"MQTT", level))
        # 3.1.1 form (return code 1) or the v5 form (0x84, empty properties)
        assert answer in (b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00"), (level, answer)
    env.assert_healthy(bystander)


def test_unknown_protocol_name(env: MqttEnv, bystander: MemoryMqtt) -> None:
    answer = bytes_until_closed(env, connect_bytes(b"MQTX", 4))
    # the server may close silently or refuse with "unacceptable protocol version"
    assert answer in (b"", b"\x20\x02\x00\x01", b"\x20\x03\x00\x84\x00"), answer
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_qos3_publish(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(publish_bytes(b"q3", level, first=0x36, pid=b"\x00\x01"))
    expect_rejection(raw, ReasonCode.MALFORMED_PACKET)
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_qos3_will_in_connect(env: MqttEnv, bystander: MemoryMqtt, level: int) -> None:
    props = b"\x00" if level == 5 else b""
    body = (str16(b"MQTT") + bytes([level, 0x02 | 0x04 | 0x18]) + b"\x00\x3c" + props
            + str16(b"cid") + props + str16(b"will/t") + str16(b"w"))
    raw = env.raw(level)
    raw.send_bytes(bytes([0x10, len(body)]) + body)
    got = raw.until_closed()
    if level == 5:  # a CONNACK with the malformed-packet reason code, then close
        assert len(got) == 1 and isinstance(got[0], Connack), got
        assert got[0].reason_code == ReasonCode.MALFORMED_PACKET, got
    else:  # closed; 3.1.1 has no return code for this, a refusing CONNACK is tolerated
        assert got == [] or (len(got) == 1 and isinstance(got[0], Connack)
                             and got[0].reason_code != 0), got
    env.assert_healthy(bystander)


@pytest.mark.parametrize("first", [b"\x30", b"\x82", b"\xc0", b"\xe0"])
def test_packet_before_connect_closes_the_connection(env: MqttEnv, bystander: MemoryMqtt,
                                                     first: bytes) -> None:
    if first == b"\x30":
        data = publish_bytes(b"early", 4)
    elif first == b"\x82":
        data = b"\x82\x06\x00\x01" + str16(b"t")[:2] + b"t\x01"
        data = bytes([0x82, len(data) - 2]) + data[2:]
    else:
        data = first + b"\x00"
    answer = bytes_until_closed(env, data)
    # MQTT-3.1.0-1 / 4.8: the first packet must be CONNECT, else the server closes the
    # connection. A CONNACK is only acceptable as a refusal (never success).
    assert answer == b"" or (answer[0] == 0x20 and answer[-1] != 0), answer
    env.assert_healthy(bystander)


def test_silent_connection_closed_after_connect_timeout(quick: MqttEnv) -> None:
    raw = quick.raw(4)
    t0 = time.monotonic()
    quick.broker.wait_for(lambda: raw.eof, 5, "the broker to close a silent connection")
    assert time.monotonic() - t0 >= 0.4
    assert bytes(raw.client.transport.written) == b""
    assert quick.runtime.started


def test_connect_timeout_is_the_configured_one(quick: MqttEnv) -> None:
    """The session's clock decides: silent 0.4 s is kept, silent 0.6 s is closed."""
    raw = quick.raw(4)
    now = time.monotonic()
    raw.session.check_timeouts(now + 0.4)
    assert not raw.eof
    raw.session.check_timeouts(now + 0.6)
    assert raw.until_closed() == []


def test_http_request_on_mqtt_port(env: MqttEnv, bystander: MemoryMqtt) -> None:
    answer = bytes_until_closed(env, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer == b"" or (answer[0] == 0x20 and answer[-1] != 0), answer
    env.assert_healthy(bystander)


@pytest.mark.parametrize("level", LEVELS)
def test_truncated_packet_then_abrupt_close_leaves_broker_healthy(env: MqttEnv,
                                                                  bystander: MemoryMqtt,
                                                                  level: int) -> None:
    raw = env.raw_connected(level)
    raw.send_bytes(encode(Publish(uid("half/"), b"x" * 200, qos=1, packet_id=3),
                          level)[:50])
    raw.abort()
    env.assert_healthy(bystander)
