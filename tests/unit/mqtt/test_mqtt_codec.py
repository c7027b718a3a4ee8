"""Table-driven tests of the MQTT codec: golden bytes written from the spec,
encode/decode of every packet at both levels, and every decoder error with the
reason code it carries."""

from __future__ import annotations

import pytest

from meshmq.errors import FrameTooLargeError, LocalProtocolError, RemoteProtocolError
from meshmq.protocol.mqtt import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    MalformedPacketError,
    MqttDecoder,
    MqttProtocolError,
    Packet,
    PacketTooLargeError,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    RetainHandling,
    Suback,
    Subscribe,
    SubscriptionOptions,
    TopicError,
    Unsuback,
    Unsubscribe,
    UnsupportedProtocolVersionError,
    Will,
    encode,
    encode_publish,
)
from meshmq.protocol.mqtt.properties import decode_varint, encode_varint

R = ReasonCode
CONNECT_311 = bytes.fromhex("100d 0004 4d515454 04 02 003c 0001 61")
CONNECT_5 = bytes.fromhex("100e 0004 4d515454 05 02 003c 00 0001 61")


def h(text: str) -> bytes:
    return bytes.fromhex(text)


# ------------------------------------------------------------------ golden byte strings

# (protocol level, packet, bytes as the spec lays them out)
GOLDEN: list[tuple[int, Packet, bytes]] = [
    (4, Connect("a", keep_alive=60, protocol_level=4), CONNECT_311),
    (5, Connect("a", keep_alive=60, protocol_level=5), CONNECT_5),
    (4, Connect("c", clean_start=False, keep_alive=10, username="u", password=b"p",
                will=Will("w", b"x", qos=1, retain=True), protocol_level=4),
     h("1019 0004 4d515454 04 ec 000a 0001 63 0001 77 0001 78 0001 75 0001 70")),
    (5, Connect("", keep_alive=0, properties=Properties(session_expiry_interval=3600)),
     h("1012 0004 4d515454 05 02 0000 05 11 00000e10 0000")),
    (4, Connack(), h("20020000")),
    (4, Connack(True), h("20020100")),
    (4, Connack(reason_code=R.NOT_AUTHORIZED), h("20020005")),
    (4, Connack(reason_code=R.UNSUPPORTED_PROTOCOL_VERSION), h("20020001")),
    (5, Connack(), h("2003000000")),
    (5, Connack(reason_code=R.BANNED), h("2003008a00")),
    (5, Connack(properties=Properties(maximum_qos=1, retain_available=0)),
     h("200700000424012500")),
    (4, Publish("a/b", b"hi"), h("3007 0003 612f62 6869")),
    (5, Publish("a/b", b"hi"), h("3008 0003 612f62 00 6869")),
    (4, Publish("a/b", b"", qos=1, packet_id=10, retain=True, dup=True),
     h("3b07 0003 612f62 000a")),
    (5, Publish("", b"x", qos=2, packet_id=1, properties=Properties(topic_alias=5)),
     h("3409 0000 0001 03 230005 78")),
    (4, Puback(1), h("40020001")),
    (5, Puback(1), h("40020001")),
    (5, Puback(1, R.NO_MATCHING_SUBSCRIBERS), h("4003000110")),
    (5, Puback(1, R.SUCCESS, Properties(reason_string="ok")),
     h("4009 0001 00 05 1f00026f6b")),
    (4, Pubrec(2), h("50020002")),
    (4, Pubrel(3), h("62020003")),
    (5, Pubrel(3, R.PACKET_IDENTIFIER_NOT_FOUND), h("6203000392")),
    (4, Pubcomp(4), h("70020004")),
    (4, Subscribe(1, [("a/b", SubscriptionOptions(1))]), h("8208 0001 0003 612f62 01")),
    (5, Subscribe(1, [("a/b", SubscriptionOptions(2, no_local=True, retain_as_published=True,
                                                    retain_handling=RetainHandling.DO_NOT_SEND))]),
     h("8209 0001 00 0003 612f62 2e")),
    (5, Subscribe(2, [("#", SubscriptionOptions())],
                  Properties(subscription_identifiers=[200])),
     h("820a 0002 03 0bc801 0001 23 00")),
    (4, Suback(1, [R.GRANTED_QOS_1, R.UNSPECIFIED_ERROR]), h("9004 0001 0180")),
    (5, Suback(1, [R.GRANTED_QOS_2, R.TOPIC_FILTER_INVALID]), h("9005 0001 00 028f")),
    (4, Unsubscribe(1, ["a/b"]), h("a207 0001 0003 612f62")),
    (5, Unsubscribe(1, ["a/b"]), h("a208 0001 00 0003 612f62")),
    (4, Unsuback(1), h("b0020001")),
    (5, Unsuback(1, [R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED]), h("b005 0001 00 0011")),
    (4, Pingreq(), h("c000")),
    (5, Pingresp(), h("d000")),
    (4, Disconnect(), h("e000")),
    (5, Disconnect(), h("e000")),
    (5, Disconnect(R.SESSION_TAKEN_OVER), h("e0018e")),
    (5, Disconnect(R.SERVER_MOVED, Properties(server_reference="b")),
     h("e006 9d 04 1c000162")),
    (5, Auth(), h("f000")),
    (5, Auth(R.CONTINUE_AUTHENTICATION, Properties(authentication_method="SCRAM")),
     h("f00a 18 08 150005 534352414d")),
]
GOLDEN_IDS = [f"v{lvl}-{type(p).__name__}-{i}" for i, (lvl, p, _) in enumerate(GOLDEN)]

SERVER_TO_CLIENT = (Connack, Suback, Unsuback, Pingresp)


def decoder_for(packet: Packet, level: int) -> MqttDecoder:
    if isinstance(packet, SERVER_TO_CLIENT):
        return MqttDecoder(protocol_level=level, server_side=False)
    if isinstance(packet, Connect):
        return MqttDecoder()
    return MqttDecoder(protocol_level=level)


@pytest.mark.parametrize(("level", "packet", "wire"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_encode(level: int, packet: Packet, wire: bytes) -> None:
    assert encode(packet, level) == wire


@pytest.mark.parametrize(("level", "packet", "wire"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_decode(level: int, packet: Packet, wire: bytes) -> None:
    assert decoder_for(packet, level).feed(wire) == [packet]


@pytest.mark.parametrize(("level", "packet", "wire"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_byte_by_byte(level: int, packet: Packet, wire: bytes) -> None:
    decoder = decoder_for(packet, level)
    out: list[Packet] = []
    for i in range(len(wire)):
        out += decoder.feed(wire[i:i + 1])
        if i < len(wire) - 1:
            assert out == []
    assert out == [packet]
    assert decoder.buffered == 0


def test_long_forms_decode_as_short_forms() -> None:
    # A v5 ack may spell out "success, no properties"; DISCONNECT and AUTH too.
    d = MqttDecoder(protocol_level=5)
    assert d.feed(h("4004000100 00") + h("e0020000") + h("e00100")) == [
        Puback(1), Disconnect(), Disconnect()]
    c = MqttDecoder(protocol_level=5, server_side=False)
    assert c.feed(h("f0020000") + h("f00100")) == [Auth(), Auth()]


# ----------------------------------------------------------------- remaining length

@pytest.mark.parametrize(("value", "wire"), [
    (0, "00"), (127, "7f"), (128, "8001"), (16383, "ff7f"), (16384, "808001"),
    (2097151, "ffff7f"), (2097152, "80808001"), (268435455, "ffffff7f"),
])
def test_varint_golden(value: int, wire: str) -> None:
    assert encode_varint(value) == h(wire)
    assert decode_varint(h(wire), 0, len(h(wire))) == (value, len(h(wire)))


@pytest.mark.parametrize("value", [-1, 268435456])
def test_varint_out_of_range(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 70000])
def test_publish_sizes_round_trip(size: int) -> None:
    packet = Publish("t", bytes(range(256)) * (size // 256) + bytes(size % 256))
    wire = encode(packet, 4)
    assert MqttDecoder(protocol_level=4).feed(wire) == [packet]


def test_many_packets_in_one_feed_and_split_feeds() -> None:
    packets: list[Packet] = [Publish(f"t/{i}", b"x" * i, qos=i % 2, packet_id=i or None)
                             if i % 2 else Publish(f"t/{i}", b"y" * i) for i in range(50)]
    packets += [Pingreq(), Puback(9), Disconnect()]
    stream = CONNECT_5 + b"".join(encode(p, 5) for p in packets)
    whole = MqttDecoder().feed(stream)
    assert whole[1:] == packets
    for chunk in (1, 2, 3, 7, 64):
        d = MqttDecoder()
        out: list[Packet] = []
        for i in range(0, len(stream), chunk):
            out += d.feed(stream[i:i + chunk])
        assert out == whole


def test_accepts_bytearray_and_memoryview() -> None:
    d = MqttDecoder()
    assert len(d.feed(bytearray(CONNECT_311))) == 1
    assert d.feed(memoryview(h("c000"))) == [Pingreq()]


def test_protocol_level_learnt_from_connect() -> None:
    assert MqttDecoder().protocol_level is None
    d = MqttDecoder()
    d.feed(CONNECT_5 + h("3008 0003 612f62 00 6869"))
    assert d.protocol_level == 5
    d = MqttDecoder()
    # The same PUBLISH bytes mean something else at level 4: the 00 is payload.
    assert d.feed(CONNECT_311 + h("3008 0003 612f62 00 6869"))[1] == Publish("a/b", b"\x00hi")


def test_encode_publish_accepts_pre_encoded_topic_and_properties() -> None:
    props = Properties(content_type="text/plain", user_properties=[("k", "v"), ("k", "w")])
    from meshmq.protocol.mqtt import encode_properties
    block = encode_properties(props, PacketType.PUBLISH)
    a = encode_publish(b"a/b", b"x", qos=1, packet_id=3, protocol_level=5, properties=block)
    b = encode(Publish("a/b", b"x", qos=1, packet_id=3, properties=props), 5)
    assert a == b
    assert MqttDecoder(protocol_level=5).feed(a)[0].properties == props  # type: ignore[union-attr]


def test_v5_fields_are_left_out_for_311() -> None:
    # SUBACK failures all become 3.1.1's 0x80 (decoded back as UNSPECIFIED_ERROR).
    assert encode(Suback(1, [R.NOT_AUTHORIZED]), 4) == h("9003 0001 80")
    assert encode(Connack(reason_code=R.BANNED), 4) == h("20020005")
    assert encode(Connack(reason_code=R.MALFORMED_PACKET), 4) == h("20020003")
    packet = Publish("a", b"", properties=Properties(content_type="x"))
    assert encode(packet, 4) == h("30030001" "61")
    assert encode(Puback(1, R.NO_MATCHING_SUBSCRIBERS), 4) == h("40020001")
    assert encode(Disconnect(R.SERVER_BUSY), 4) == h("e000")
    assert encode(Unsuback(1, [R.SUCCESS]), 4) == h("b0020001")


# --------------------------------------------------------------------- encoder errors

@pytest.mark.parametrize(("level", "packet"), [
    (4, Publish("a", b"", qos=1)),
    (4, Publish("a", b"", qos=1, packet_id=0)),
    (4, Publish("a", b"", qos=1, packet_id=65536)),
    (4, Publish("a", b"", qos=3, packet_id=1)),
    (4, Publish("a", b"", dup=True)),
    (4, Publish("a", b"", packet_id=1)),
    (4, Publish("\ud800", b"")),
    (4, Publish("a" * 65536, b"")),
    (5, Publish("a", b"", properties=Properties(session_expiry_interval=1))),
    (5, Publish("a", b"", properties=Properties(topic_alias=70000))),
    (5, Subscribe(1, [("a", SubscriptionOptions())],
                  Properties(subscription_identifiers=[1, 2]))),
    (5, Subscribe(1, [("a", SubscriptionOptions())], Properties(subscription_identifiers=[0]))),
    (4, Subscribe(1, [("a", SubscriptionOptions(no_local=True))])),
    (4, Subscribe(1, [])),
    (4, Unsubscribe(1, [])),
    (4, Suback(1, [])),
    (5, Unsuback(1, [])),
    (4, Auth()),
    (5, Puback(1, R.GRANTED_QOS_1)),
    (5, Pubrel(1, R.NOT_AUTHORIZED)),
    (5, Disconnect(R.GRANTED_QOS_1)),
    (5, Connack(True, R.NOT_AUTHORIZED)),
    (4, Connect("a", password=b"p", protocol_level=4)),
    (4, Connect("a", keep_alive=70000, protocol_level=4)),
    (3, Pingreq()),
])
def test_encoder_refuses(level: int, packet: Packet) -> None:
    with pytest.raises(LocalProtocolError):
        encode(packet, level)


def test_encode_rejects_non_packets() -> None:
    with pytest.raises(LocalProtocolError):
        encode("PUBLISH", 4)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- decoder errors

def publish_v5(props: str, topic: str = "0001 61", head: str = "30") -> bytes:
    body = h(topic) + bytes((len(h(props)),)) + h(props) + b"x"
    return bytes((int(head, 16), len(body))) + body


ERRORS: list[tuple[str, bytes, ReasonCode, type[MqttProtocolError]]] = [
    # (name, stream, reason code, error class) -- fed to a fresh server-side decoder
    ("first packet not CONNECT", h("c000"), R.PROTOCOL_ERROR, MqttProtocolError),
    ("second CONNECT", CONNECT_311 + CONNECT_311, R.PROTOCOL_ERROR, MqttProtocolError),
    ("reserved type 0", CONNECT_311 + h("0000"), R.MALFORMED_PACKET, MalformedPacketError),
    ("CONNECT flags", h("11") + CONNECT_311[1:], R.MALFORMED_PACKET, MalformedPacketError),
    ("PUBREL flags", CONNECT_311 + h("60020001"), R.MALFORMED_PACKET, MalformedPacketError),
    ("SUBSCRIBE flags", CONNECT_311 + h("8008 0001 0003 612f62 01"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("PINGREQ flags", CONNECT_311 + h("c100"), R.MALFORMED_PACKET, MalformedPacketError),
    ("QoS 3", CONNECT_311 + h("3607 0003 612f62 0001"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("DUP on QoS 0", CONNECT_311 + h("3805 0003 612f62"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("remaining length of 5 bytes", CONNECT_311 + h("30ffffffff01"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("remaining length not minimal", CONNECT_311 + h("308000"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("invalid UTF-8 topic", CONNECT_311 + h("3005 0003 61ff62"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("overlong UTF-8 topic", CONNECT_311 + h("3004 0002 c0af"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("surrogate in topic", CONNECT_311 + h("3005 0003 eda080"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("NUL in topic", CONNECT_311 + h("3005 0003 610062"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("topic length past the end", CONNECT_311 + h("3003 0005 61"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("+ in topic", CONNECT_311 + h("3005 0003 612f2b"), R.TOPIC_NAME_INVALID, TopicError),
    ("# in topic", CONNECT_311 + h("3003 0001 23"), R.TOPIC_NAME_INVALID, TopicError),
    ("empty topic 3.1.1", CONNECT_311 + h("3002 0000"), R.TOPIC_NAME_INVALID, TopicError),
    ("empty topic v5 without alias", CONNECT_5 + h("3003 0000 00"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("packet id 0 on PUBLISH", CONNECT_311 + h("3205 0001 61 0000"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("packet id 0 on PUBACK", CONNECT_311 + h("40020000"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("packet id missing", CONNECT_311 + h("3203 0001 61"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("MQIsdp", h("100f 0006 4d5149736470 03 02 003c 0001 61"), R.UNSUPPORTED_PROTOCOL_VERSION,
     UnsupportedProtocolVersionError),
    ("level 6", h("100d 0004 4d515454 06 02 003c 0001 61"), R.UNSUPPORTED_PROTOCOL_VERSION,
     UnsupportedProtocolVersionError),
    ("level 3 with MQTT", h("100d 0004 4d515454 03 02 003c 0001 61"),
     R.UNSUPPORTED_PROTOCOL_VERSION, UnsupportedProtocolVersionError),
    ("protocol name HTTP", h("100d 0004 48545450 04 02 003c 0001 61"),
     R.UNSUPPORTED_PROTOCOL_VERSION, MqttProtocolError),
    ("CONNECT reserved flag", h("100d 0004 4d515454 04 03 003c 0001 61"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("will QoS 3", h("1013 0004 4d515454 04 1e 003c 0001 61 0001 77 0001 78"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("will retain without will", h("100d 0004 4d515454 04 22 003c 0001 61"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("will QoS without will", h("100d 0004 4d515454 04 0a 003c 0001 61"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("will topic with wildcard", h("1013 0004 4d515454 04 06 003c 0001 61 0001 23 0001 78"),
     R.TOPIC_NAME_INVALID, TopicError),
    ("password without user name 3.1.1", h("1010 0004 4d515454 04 42 003c 0001 61 0001 70"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("empty client id without clean session 3.1.1", h("100c 0004 4d515454 04 00 003c 0000"),
     R.CLIENT_IDENTIFIER_NOT_VALID, MqttProtocolError),
    ("CONNECT trailing bytes", h("100e 0004 4d515454 04 02 003c 0001 61 00"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("CONNECT truncated", h("100b 0004 4d515454 04 02 003c 00"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("auth data without method", h("1011 0004 4d515454 05 02 003c 04 160001ff 0000"),
     R.PROTOCOL_ERROR, MqttProtocolError),
    ("receive maximum 0", h("1010 0004 4d515454 05 02 003c 03 210000 0000"),
     R.PROTOCOL_ERROR, MqttProtocolError),
    ("request problem information 2", h("100f 0004 4d515454 05 02 003c 02 1702 0000"),
     R.PROTOCOL_ERROR, MqttProtocolError),
    ("filter # not last", CONNECT_311 + h("820a 0001 0005 612f232f62 00"),
     R.TOPIC_FILTER_INVALID, TopicError),
    ("filter a+", CONNECT_311 + h("8207 0001 0002 612b 00"), R.TOPIC_FILTER_INVALID,
     TopicError),
    ("empty filter", CONNECT_311 + h("8205 0001 0000 00"), R.TOPIC_FILTER_INVALID, TopicError),
    ("SUBSCRIBE without filters", CONNECT_311 + h("82020001"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("filter without options", CONNECT_311 + h("8205 0001 0001 61"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("3.1.1 options reserved bits", CONNECT_311 + h("8206 0001 0001 61 04"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("subscription QoS 3", CONNECT_311 + h("8206 0001 0001 61 03"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("v5 retain handling 3", CONNECT_5 + h("8207 0001 00 0001 61 30"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("v5 options reserved bits", CONNECT_5 + h("8207 0001 00 0001 61 40"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("no local on shared subscription", CONNECT_5 + h("8210 0001 00 000a 2473686172652f672f61 04"),
     R.PROTOCOL_ERROR, MqttProtocolError),
    ("share name with wildcard", CONNECT_5 + h("8210 0001 00 000a 2473686172652f2b2f61 00"),
     R.TOPIC_FILTER_INVALID, TopicError),
    ("UNSUBSCRIBE without filters", CONNECT_311 + h("a2020001"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("UNSUBSCRIBE invalid filter", CONNECT_311 + h("a2060001 0002 2b61"),
     R.TOPIC_FILTER_INVALID, TopicError),
    ("duplicate property", CONNECT_5 + publish_v5("030001 61 030001 62"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("property not allowed in PUBLISH", CONNECT_5 + publish_v5("1100000001"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("unknown property", CONNECT_5 + publish_v5("7f00"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("property truncated", CONNECT_5 + publish_v5("0200"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("property length past the end", CONNECT_5 + h("3005 0001 61 09 00"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("topic alias 0", CONNECT_5 + publish_v5("230000"), R.TOPIC_ALIAS_INVALID,
     MqttProtocolError),
    ("subscription identifier from a client", CONNECT_5 + publish_v5("0b01"),
     R.PROTOCOL_ERROR, MqttProtocolError),
    ("payload format indicator 2", CONNECT_5 + publish_v5("0102"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("response topic with wildcard", CONNECT_5 + publish_v5("080001 23"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("invalid UTF-8 in a property", CONNECT_5 + publish_v5("030001 ff"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("NUL in a user property", CONNECT_5 + publish_v5("26 0001 00 0001 61"),
     R.MALFORMED_PACKET, MalformedPacketError),
    ("PINGREQ with a body", CONNECT_311 + h("c00100"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("3.1.1 PUBACK with a reason code", CONNECT_311 + h("4003000100"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("3.1.1 DISCONNECT with a body", CONNECT_311 + h("e00100"), R.MALFORMED_PACKET,
     MalformedPacketError),
    ("v5 PUBACK invalid reason code", CONNECT_5 + h("4003000101"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("v5 DISCONNECT invalid reason code", CONNECT_5 + h("e00101"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("v5 AUTH invalid reason code", CONNECT_5 + h("f00101"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("AUTH in 3.1.1", CONNECT_311 + h("f000"), R.MALFORMED_PACKET, MalformedPacketError),
    ("CONNACK from a client", CONNECT_311 + h("20020000"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("SUBACK from a client", CONNECT_311 + h("9003000100"), R.PROTOCOL_ERROR,
     MqttProtocolError),
    ("PINGRESP from a client", CONNECT_311 + h("d000"), R.PROTOCOL_ERROR, MqttProtocolError),
]


@pytest.mark.parametrize(("stream", "reason", "cls"), [e[1:] for e in ERRORS],
                         ids=[e[0] for e in ERRORS])
def test_decoder_errors(stream: bytes, reason: ReasonCode,
                        cls: type[MqttProtocolError]) -> None:
    for chunk in (len(stream), 1):
        d = MqttDecoder()
        with pytest.raises(MqttProtocolError) as info:
            for i in range(0, len(stream), chunk):
                d.feed(stream[i:i + chunk])
        err = info.value
        assert type(err) is cls
        assert isinstance(err, RemoteProtocolError)
        assert err.reason_code == reason
        assert err.code == "mqtt-" + reason.name.lower().replace("_", "-")
        assert err.retriable is False
        assert d.error is err
        # Dead from now on, with the same class and reason code.
        with pytest.raises(cls) as again:
            d.feed(h("c000"))
        assert again.value.reason_code == reason


def test_error_keeps_packets_completed_before_it() -> None:
    d = MqttDecoder()
    with pytest.raises(MqttProtocolError) as info:
        d.feed(CONNECT_311 + h("c000") + h("3003 0001 23"))
    assert [type(p) for p in d.packets_before_error] == [Connect, Pingreq]
    assert info.value.packet_type == PacketType.PUBLISH


def test_error_packet_type_is_connect_during_connect() -> None:
    d = MqttDecoder()
    with pytest.raises(UnsupportedProtocolVersionError) as info:
        d.feed(h("100d 0004 4d515454 06 02 003c 0001 61"))
    assert info.value.packet_type == PacketType.CONNECT


def test_error_in_v5_connect_knows_the_level() -> None:
    d = MqttDecoder()
    with pytest.raises(MqttProtocolError):
        d.feed(h("100f 0004 4d515454 05 02 003c 02 1702 0000"))
    assert d.protocol_level == 5


def test_packet_too_large_is_detected_from_the_header() -> None:
    d = MqttDecoder(max_packet_size=100, protocol_level=4)
    assert d.feed(encode(Publish("t", b"x" * 95), 4)) != []  # 100 bytes: fits
    with pytest.raises(PacketTooLargeError) as info:
        d.feed(h("30c801"))  # remaining length 200, no body yet
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    assert isinstance(info.value, FrameTooLargeError)


def test_garbage_is_rejected_at_the_first_byte() -> None:
    d = MqttDecoder()
    with pytest.raises(MqttProtocolError):
        d.feed(b"G")  # "GET / HTTP/1.1"


def test_client_side_decoder() -> None:
    c = MqttDecoder(protocol_level=5, server_side=False)
    assert c.feed(h("2003000000") + h("e0018b")) == [
        Connack(), Disconnect(R.SERVER_SHUTTING_DOWN)]
    for stream, reason in [
        (h("c000"), R.PROTOCOL_ERROR),  # PINGREQ from a server
        (h("e007 00 05 1100000001"), R.PROTOCOL_ERROR),  # session expiry from a server
        (h("2003018700"), R.PROTOCOL_ERROR),  # session present on failure
        (h("2003000100"), R.PROTOCOL_ERROR),  # reason 0x01 not a CONNACK code
        (h("2003020000"), R.MALFORMED_PACKET),  # reserved ack flag
    ]:
        with pytest.raises(MqttProtocolError) as info:
            MqttDecoder(protocol_level=5, server_side=False).feed(stream)
        assert info.value.reason_code == reason, stream.hex()
    c4 = MqttDecoder(protocol_level=4, server_side=False)
    with pytest.raises(MqttProtocolError):
        c4.feed(h("20020006"))  # reserved 3.1.1 return code
    with pytest.raises(MqttProtocolError):
        MqttDecoder(protocol_level=4, server_side=False).feed(h("e000"))
    with pytest.raises(MqttProtocolError):
        MqttDecoder(protocol_level=4, server_side=False).feed(h("9003000103"))


def test_retain_and_qos_limits() -> None:
    d = MqttDecoder(protocol_level=4, retain_available=False)
    with pytest.raises(MqttProtocolError) as info:
        d.feed(h("3103 0001 61"))
    assert info.value.reason_code == R.RETAIN_NOT_SUPPORTED
    d = MqttDecoder(protocol_level=4, maximum_qos=1)
    assert d.feed(encode(Publish("a", b"", 1, packet_id=1), 4))
    with pytest.raises(MqttProtocolError) as info:
        d.feed(encode(Publish("a", b"", 2, packet_id=1), 4))
    assert info.value.reason_code == R.QOS_NOT_SUPPORTED
    will = Connect("a", will=Will("w", b"", qos=2, retain=True), protocol_level=5)
    for kwargs, reason in [({"retain_available": False}, R.RETAIN_NOT_SUPPORTED),
                           ({"maximum_qos": 1}, R.QOS_NOT_SUPPORTED)]:
        with pytest.raises(MqttProtocolError) as info:
            MqttDecoder(**kwargs).feed(encode(will, 5))  # type: ignore[arg-type]
        assert info.value.reason_code == reason
        assert info.value.packet_type == PacketType.CONNECT


def test_v5_allows_password_without_username_and_empty_topic_with_alias() -> None:
    connect = Connect("", password=b"secret", protocol_level=5)
    d = MqttDecoder()
    assert d.feed(encode(connect, 5)) == [connect]
    pub = Publish("", b"x", properties=Properties(topic_alias=1))
    assert d.feed(encode(pub, 5)) == [pub]


def test_decoder_arguments() -> None:
    with pytest.raises(ValueError, match="level"):
        MqttDecoder(protocol_level=3)
    with pytest.raises(ValueError, match="client-side"):
        MqttDecoder(server_side=False)
    with pytest.raises(ValueError, match="max_packet_size"):
        MqttDecoder(max_packet_size=1)


def test_errors_pickle() -> None:
    import pickle
    err = TopicError("bad", reason_code=R.TOPIC_FILTER_INVALID, packet_type=8)
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.reason_code, copy.packet_type, copy.message) == (
        TopicError, R.TOPIC_FILTER_INVALID, 8, "bad")


def test_codec_is_sans_io() -> None:
    # Principle 1: the codec never imports asyncio, socket or time (nor the core).
    import ast
    from pathlib import Path

    import meshmq.protocol.mqtt as package
    forbidden = {"asyncio", "socket", "time", "selectors", "threading", "meshmq.core"}
    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not any(name == f or name.startswith(f + ".") for f in forbidden), (
                    f"{path.name} imports {name}")


def test_properties_lists_are_per_instance() -> None:
    a = Properties()
    a.user_properties.append(("k", "v"))
    a.subscription_identifiers.append(1)
    b = Properties()
    assert b.user_properties == [] and b.subscription_identifiers == []
    assert Publish("t").properties.user_properties == []
    assert a == Properties(user_properties=[("k", "v")], subscription_identifiers=[1])
    assert a != b and b == Properties() and b.is_empty() and not a.is_empty()
    assert repr(Properties(topic_alias=2)) == "Properties(topic_alias=2)"
    with pytest.raises(TypeError):
        Properties(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        b.bogus  # type: ignore[attr-defined]  # noqa: B018
