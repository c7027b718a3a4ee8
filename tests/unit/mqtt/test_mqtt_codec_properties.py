"""Hypothesis properties of the MQTT codec.

* Fuzzing: arbitrary bytes, arbitrarily chunked, only ever yield packets or an
  MqttProtocolError (a RemoteProtocolError), and the outcome does not depend on
  the chunking.
* Round trip: every packet the encoder accepts decodes back unchanged, at both
  protocol levels, whole or byte by byte.
* The prepared PUBLISH encoder (the broker's delivery fast path) writes exactly
  what ``encode_publish`` writes, and fails where it fails.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshmq.errors import LocalProtocolError, RemoteProtocolError
from meshmq.protocol.mqtt import (
    ALLOWED_PROPERTIES,
    PROPERTY_TYPES,
    WILL_CONTEXT,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    PropertyId,
    PropertyType,
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
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_properties,
    encode_publish,
    encode_publish_prepared,
    publish_topic_field,
)
from meshmq.protocol.mqtt.reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                    suppress_health_check=[HealthCheck.too_slow])

CONNECT_311 = bytes.fromhex("100d00044d51545404 02003c000161")
CONNECT_5 = bytes.fromhex("100e00044d51545405 02003c00000161")
LEVELS = st.sampled_from([4, 5])

# ----------------------------------------------------------------------------- fuzzing

VOCABULARY = [
    CONNECT_311, CONNECT_5, b"\x30", b"\x32", b"\x3b", b"\x40\x02\x00\x01", b"\x62\x02\x00\x01",
    b"\x82", b"\xa2", b"\xc0\x00", b"\xe0\x00", b"\xf0\x00", b"\x00", b"\x01", b"\x02",
    b"\x7f", b"\x80", b"\xff", b"\x00\x03a/b", b"\x00\x01#", b"\x00\x01+", b"\x00\x00",
    b"\x26\x00\x01a\x00\x01b", b"\x23\x00\x00", b"\x0b\x00", b"\xc3\xa9", b"\xed\xa0\x80",
    b"\x00\x04MQTT", b"\x00\x06MQIsdp", b"\x05", b"\x04", b"\x00\x07$share/",
]
TOKENS = st.one_of(st.sampled_from(VOCABULARY), st.binary(max_size=6))


@st.composite
def packet_like(draw: st.DrawFn) -> bytes:
    """A first byte, a correct remaining length, and a body of tokens."""
    body = b"".join(draw(st.lists(TOKENS, max_size=6)))
    first = draw(st.one_of(st.sampled_from([0x10, 0x30, 0x32, 0x34, 0x3d, 0x40, 0x62, 0x82,
                                            0xa2, 0xc0, 0xe0, 0xf0]),
                           st.integers(0, 255)))
    return bytes((first, len(body))) + body if len(body) < 128 else bytes((first, 0))


STREAMS = st.tuples(
    st.sampled_from([b"", CONNECT_311, CONNECT_5]),
    st.lists(st.one_of(packet_like(), TOKENS), max_size=8).map(b"".join),
).map(b"".join)


def run(stream: bytes, cuts: list[int], **kwargs: Any) -> tuple[list[Packet], object]:
    decoder = MqttDecoder(**kwargs)
    out: list[Packet] = []
    error: object = None
    prev = 0
    try:
        for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
            out += decoder.feed(stream[prev:cut])
            prev = max(prev, cut)
    except RemoteProtocolError as exc:
        assert isinstance(exc, MqttProtocolError)
        assert isinstance(exc.reason_code, ReasonCode)
        out += decoder.packets_before_error
        error = (type(exc), exc.reason_code, exc.packet_type)
    return out, error


@SETTINGS
@given(stream=STREAMS, cuts=st.lists(st.integers(0, 10_000), max_size=6),
       max_size=st.sampled_from([64, 1 << 20]))
def test_fuzz_only_documented_errors_and_chunking_does_not_matter(
        stream: bytes, cuts: list[int], max_size: int) -> None:
    whole = run(stream, [], max_packet_size=max_size)
    assert run(stream, cuts, max_packet_size=max_size) == whole
    assert run(stream, list(range(len(stream))), max_packet_size=max_size) == whole


@SETTINGS
@given(stream=st.binary(max_size=64), level=LEVELS, server=st.booleans())
def test_fuzz_raw_bytes(stream: bytes, level: int, server: bool) -> None:
    run(stream, [])
    run(stream, [], protocol_level=level, server_side=server)


@SETTINGS
@given(data=st.data(), level=LEVELS)
def test_fuzz_mutated_valid_streams(data: st.DataObject, level: int) -> None:
    packets = data.draw(st.lists(client_packets(level), min_size=1, max_size=4))
    stream = bytearray(b"".join(encode(p, level) for p in packets))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(stream) - 1))
        stream[i] = data.draw(st.integers(0, 255))
    cuts = data.draw(st.lists(st.integers(0, 10_000), max_size=4))
    kwargs = {"protocol_level": level}
    assert run(bytes(stream), cuts, **kwargs) == run(bytes(stream), [], **kwargs)


# -------------------------------------------------------------------------- round trip

TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
               max_size=8)
LEVEL_TEXT = st.text(st.characters(exclude_categories=("Cs",),
                                   exclude_characters="\x00/+#"), max_size=6)
TOPICS = st.lists(LEVEL_TEXT, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.one_of(LEVEL_TEXT, st.just("+"))
FILTERS = st.tuples(st.lists(FILTER_LEVELS, min_size=1, max_size=4), st.booleans()).map(
    lambda t: "/".join([*t[0], "#"] if t[1] else t[0])).filter(bool)
PACKET_IDS = st.integers(1, 0xFFFF)
U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFFFFFF)


def prop_value(pid: PropertyId) -> st.SearchStrategy[Any]:
    kind = PROPERTY_TYPES[pid]
    if pid is PropertyId.RESPONSE_TOPIC:
        return TOPICS
    if kind is PropertyType.BYTE:
        return st.integers(0, 1)
    if kind is PropertyType.TWO_BYTE_INT:
        return st.integers(1, 0xFFFF)
    if kind is PropertyType.FOUR_BYTE_INT:
        return st.integers(1 if pid is PropertyId.MAXIMUM_PACKET_SIZE else 0, 0xFFFFFFFF)
    if kind is PropertyType.UTF8_STRING:
        return TEXT
    if kind is PropertyType.BINARY:
        return st.binary(max_size=8)
    raise AssertionError(pid)


@st.composite
def properties(draw: st.DrawFn, context: int, from_client: bool = True) -> Properties:
    allowed = sorted(ALLOWED_PROPERTIES[context])
    chosen = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=4)) if allowed else []
    props = Properties()
    for pid in chosen:
        if pid is PropertyId.USER_PROPERTY:
            props.user_properties = draw(st.lists(st.tuples(TEXT, TEXT), min_size=1,
                                                  max_size=3))
        elif pid is PropertyId.SUBSCRIPTION_IDENTIFIER:
            if context == PacketType.PUBLISH and from_client:
                continue
            size = 3 if context == PacketType.PUBLISH else 1
            props.subscription_identifiers = draw(st.lists(
                st.integers(1, 268_435_455), min_size=1, max_size=size))
        else:
            setattr(props, pid.field_name, draw(prop_value(pid)))
    if (context == PacketType.CONNECT and props.authentication_data is not None
            and props.authentication_method is None):
        props.authentication_method = "m"
    if context == PacketType.DISCONNECT and not from_client:
        props.session_expiry_interval = None
    return props


def codes(allowed: frozenset[int]) -> st.SearchStrategy[ReasonCode]:
    return st.sampled_from(sorted(ReasonCode(c) for c in allowed))


SUCCESS = st.just(ReasonCode.SUCCESS)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    v5 = level == 5
    username = draw(st.none() | TEXT)
    password = draw(st.none() | st.binary(max_size=8))
    if not v5 and username is None:
        password = None
    client_id = draw(TEXT)
    clean = draw(st.booleans()) or (not v5 and not client_id)
    will = None
    if draw(st.booleans()):
        will = Will(draw(TOPICS), draw(st.binary(max_size=8)), draw(st.integers(0, 2)),
                    draw(st.booleans()),
                    draw(properties(WILL_CONTEXT)) if v5 else Properties())
    return Connect(client_id, clean, draw(U16), username, password, will,
                   draw(properties(1)) if v5 else Properties(), "MQTT", level)


def props_for(level: int, context: int, from_client: bool = True) -> st.SearchStrategy[
        Properties]:
    return properties(context, from_client) if level == 5 else st.just(Properties())


@st.composite
def publishes(draw: st.DrawFn, level: int, from_client: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props_for(level, 3, from_client))
    topic = draw(TOPICS)
    if level == 5 and props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(topic, draw(st.binary(max_size=40)), qos, draw(st.booleans()),
                   bool(qos) and draw(st.booleans()), draw(PACKET_IDS) if qos else None, props)


def acks(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == 5

    def ack(cls: type[Any], allowed: frozenset[int], ctx: int) -> st.SearchStrategy[Packet]:
        return st.builds(cls, PACKET_IDS, codes(allowed) if v5 else SUCCESS,
                         props_for(level, ctx))
    return st.one_of(ack(Puback, PUBACK_REASON_CODES, 4), ack(Pubrec, PUBACK_REASON_CODES, 5),
                     ack(Pubrel, PUBREL_REASON_CODES, 6), ack(Pubcomp, PUBREL_REASON_CODES, 7))


def sub_options(level: int) -> st.SearchStrategy[SubscriptionOptions]:
    if level == 4:
        return st.builds(SubscriptionOptions, st.integers(0, 2))
    return st.builds(SubscriptionOptions, st.integers(0, 2), st.booleans(), st.booleans(),
                     st.sampled_from(list(RetainHandling)))


def client_packets(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == 5
    choices = [
        publishes(level, from_client=True),
        acks(level),
        st.builds(Subscribe, PACKET_IDS,
                  st.lists(st.tuples(FILTERS, sub_options(level)), min_size=1, max_size=3),
                  props_for(level, 8)),
        st.builds(Unsubscribe, PACKET_IDS, st.lists(FILTERS, min_size=1, max_size=3),
                  props_for(level, 10)),
        st.builds(Pingreq),
        st.builds(Disconnect, codes(DISCONNECT_REASON_CODES) if v5 else SUCCESS,
                  props_for(level, 14)),
    ]
    if v5:
        choices.append(st.builds(Auth, codes(AUTH_REASON_CODES), props_for(level, 15)))
    return st.one_of(choices)


def server_packets(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == 5
    v311_connack = frozenset({0x00, 0x84, 0x85, 0x88, 0x86, 0x87})
    choices = [
        st.builds(lambda code, present, props: Connack(present and not code, code, props),
                  codes(CONNACK_REASON_CODES if v5 else v311_connack), st.booleans(),
                  props_for(level, 2)),
        publishes(level, from_client=False),
        acks(level),
        st.builds(Suback, PACKET_IDS,
                  st.lists(codes(SUBACK_REASON_CODES if v5 else frozenset({0, 1, 2, 0x80})),
                           min_size=1, max_size=4), props_for(level, 9)),
        st.builds(Unsuback, PACKET_IDS,
                  st.lists(codes(UNSUBACK_REASON_CODES), min_size=1, max_size=4)
                  if v5 else st.just([]), props_for(level, 11)),
        st.builds(Pingresp),
    ]
    if v5:
        choices.append(st.builds(Disconnect, codes(DISCONNECT_REASON_CODES),
                                 props_for(level, 14, from_client=False)))
        choices.append(st.builds(Auth, codes(AUTH_REASON_CODES), props_for(level, 15)))
    return st.one_of(choices)


def decode_all(stream: bytes, byte_by_byte: bool, **kwargs: Any) -> list[Packet]:
    decoder = MqttDecoder(**kwargs)
    if not byte_by_byte:
        return decoder.feed(stream)
    out: list[Packet] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i:i + 1])
    assert decoder.buffered == 0
    return out


@SETTINGS
@given(data=st.data(), level=LEVELS, byte_by_byte=st.booleans())
def test_round_trip_client_to_server(data: st.DataObject, level: int,
                                     byte_by_byte: bool) -> None:
    connect = data.draw(connects(level))
    packets = [connect, *data.draw(st.lists(client_packets(level), max_size=5))]
    stream = b"".join(encode(p, level) for p in packets)
    assert decode_all(stream, byte_by_byte) == packets


@SETTINGS
@given(data=st.data(), level=LEVELS, byte_by_byte=st.booleans())
def test_round_trip_server_to_client(data: st.DataObject, level: int,
                                     byte_by_byte: bool) -> None:
    packets = data.draw(st.lists(server_packets(level), min_size=1, max_size=5))
    stream = b"".join(encode(p, level) for p in packets)
    assert decode_all(stream, byte_by_byte, protocol_level=level, server_side=False) == packets


@SETTINGS
@given(level=LEVELS, data=st.data())
def test_encoding_is_canonical(level: int, data: st.DataObject) -> None:
    # decode(encode(p)) re-encodes to the same bytes: one wire form per packet.
    packet = data.draw(client_packets(level))
    wire = encode(packet, level)
    (again,) = MqttDecoder(protocol_level=level).feed(wire)
    assert encode(again, level) == wire


# ------------------------------------------------------- prepared PUBLISH == general

# Payload sizes around the 1/2/3-byte remaining length boundaries (127, 16383).
PAYLOADS = st.one_of(st.binary(max_size=300),
                     st.integers(16_000, 16_700).map(lambda n: b"p" * n))
# Lone surrogates (not encodable) and long topics too, to compare the errors.
ANY_TOPICS = st.one_of(TOPICS, st.text(max_size=6),
                       st.integers(65_530, 65_540).map(lambda n: "t" * n))


@SETTINGS
@given(data=st.data(), level=LEVELS, topic=ANY_TOPICS, payload=PAYLOADS,
       qos=st.integers(0, 2), retain=st.booleans())
def test_prepared_publish_equals_general_encoder(data: st.DataObject, level: int, topic: str,
                                                 payload: bytes, qos: int,
                                                 retain: bool) -> None:
    dup = bool(qos) and data.draw(st.booleans())
    pid = data.draw(PACKET_IDS) if qos else None
    props = data.draw(st.one_of(st.none(), properties(3, from_client=False))) \
        if level == 5 else None
    try:
        expected: object = encode_publish(topic, payload, qos=qos, retain=retain, dup=dup,
                                          packet_id=pid, protocol_level=level,
                                          properties=props)
    except LocalProtocolError as exc:
        expected = exc.message
    try:
        header = publish_topic_field(topic)
        if pid is not None:
            header += pid.to_bytes(2, "big")
        if level == 5:
            header += b"\x00" if props is None else encode_properties(props, 3)
        flags = qos << 1 | (8 if dup else 0) | (1 if retain else 0)
        got: object = encode_publish_prepared(flags, header, payload)
    except LocalProtocolError as exc:
        got = exc.message
    assert got == expected


# --------------------------------------------- inline remaining length, topic name cache

@SETTINGS
@given(size=st.one_of(st.integers(100, 140), st.integers(16_370, 16_400), st.integers(0, 300)),
       cut=st.integers(0, 5), level=LEVELS, topic=TOPICS)
def test_publish_sizes_decode_whole_and_split_in_the_header(size: int, cut: int, level: int,
                                                            topic: str) -> None:
    # Remaining lengths of one, two (decoded inline) and three bytes, with the stream
    # cut inside the fixed header.
    packet = Publish(topic, b"p" * size)
    wire = encode(packet, level)
    assert MqttDecoder(protocol_level=level).feed(wire) == [packet]
    split = MqttDecoder(protocol_level=level)
    assert split.feed(wire[:cut]) + split.feed(wire[cut:]) == [packet]


@SETTINGS
@given(topic=st.text(max_size=6), level=LEVELS)
def test_topic_names_decode_the_same_the_second_time(topic: str, level: int) -> None:
    # The checked-name cache must not change the outcome: same packet or same error.
    try:
        raw = topic.encode()
    except UnicodeEncodeError:
        raw = topic.encode("utf-8", "surrogatepass")  # invalid UTF-8 on the wire
    wire = bytes((0x30, len(raw) + 3, len(raw) >> 8, len(raw) & 0xFF)) + raw + b"x"
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(MqttDecoder(protocol_level=level).feed(wire))
        except MqttProtocolError as exc:
            outcomes.append((type(exc), exc.reason_code))
    assert outcomes[0] == outcomes[1]
