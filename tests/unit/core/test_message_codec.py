"""Message codec: exact round trip, fuzzed input only ever raises CorruptStoreError."""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.store.golden.make_golden import codec_message
from tests.store.helpers import fields, full_msg, messages, msg

from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message
from meshmq.core.message_codec import (
    KIND_CODES,
    body_length,
    decode_message,
    encode_forwarded,
    encode_message,
    str_bytes,
)
from meshmq.errors import CorruptStoreError, StoreError

GOLDEN = Path(__file__).parents[2] / "store" / "golden" / "codec_v1.bin"
FUZZ = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(messages)
def test_round_trip(m: Message) -> None:
    data = encode_message(m)
    back = decode_message(data)
    assert fields(back) == fields(m)
    assert body_length(data) == len(m.body)
    assert fields(decode_message(memoryview(data))) == fields(m)


_names = st.text(max_size=300)  # past 254 UTF-8 bytes too: the long length prefix


@FUZZ
@given(messages, st.lists(_names, max_size=4), _names)
def test_forwarded_encoding_replaces_path_and_producer(m: Message, path: list[str],
                                                       producer: str) -> None:
    """What a forwarder sends (its parts encoded once, ``encode_forwarded``) is the
    message with the hop's path and producer, byte for byte ``encode_message``'s."""
    data = encode_forwarded(m, b"".join(str_bytes(name) for name in path), len(path),
                            str_bytes(producer))
    assert data == encode_message(m, broker_path=tuple(path), producer_id=producer)
    back = decode_message(data)
    assert back.broker_path == tuple(path)
    assert back.producer_id == producer
    assert fields(back) == fields(replace(m, broker_path=tuple(path), producer_id=producer))


@FUZZ
@given(st.integers(0, 9), st.booleans(), st.sampled_from(list(DestKind)),
       st.integers(-(2**63), 2**63 - 1), st.integers(0, 17), st.integers(0, 17),
       st.integers(0, 1), st.binary(max_size=40))
def test_the_header_of_a_plain_message_is_the_documented_layout(
        priority: int, persistent: bool, kind: DestKind, timestamp: int, props: int,
        hops: int, expiration: int, body: bytes) -> None:
    """Messages without optional fields take a path that packs only part of the header
    (the rest comes from tables); the bytes are the layout's all the same."""
    m = Message(message_id="ID:1", destination=Destination(kind, "d"), body=body,
                persistent=persistent, priority=priority, timestamp=timestamp,
                expiration=expiration, properties={f"p{i}": i for i in range(props)},
                broker_path=tuple(f"b{i}" for i in range(hops)))
    head = struct.pack("<BBBBIqqqHH", 1, int(persistent), priority,
                       KIND_CODES.index(kind), len(body), timestamp, expiration, 0, props,
                       hops)
    assert encode_message(m)[:len(head)] == head
    assert fields(decode_message(encode_message(m))) == fields(m)


def test_consecutive_messages_sharing_a_length_or_a_timestamp_keep_their_own() -> None:
    """The encoder reuses the packed body length and timestamp of the message before
    when both match: one that shares only one of them gets its own."""
    def plain(body: bytes, timestamp: int) -> Message:
        return Message(message_id="ID:1", destination=Destination(DestKind.QUEUE, "d"),
                       body=body, timestamp=timestamp)

    for body, timestamp in [(b"abc", 5), (b"abc", 5), (b"xyz", 6), (b"wxyz", 6),
                            (b"", 6), (b"", 0), (b"abc", 5)]:
        data = encode_message(plain(body, timestamp))
        assert body_length(data) == len(body)
        back = decode_message(data)
        assert (back.body, back.timestamp) == (body, timestamp)


def test_round_trip_every_field_and_special_values() -> None:
    m = full_msg(1)
    m.properties["nan"] = math.nan
    m.properties["long"] = "x" * 70_000
    back = decode_message(encode_message(m))
    assert math.isnan(back.properties.pop("nan"))  # type: ignore[arg-type]
    m.properties.pop("nan")
    assert fields(back) == fields(m)
    assert type(back.properties["t"]) is bool
    assert type(back.properties["int"]) is int


def test_wire_cache_not_encoded() -> None:
    m = msg(1)
    m.wire_cache = {"stomp": b"cached"}
    assert not decode_message(encode_message(m)).wire_cache


def test_unsupported_values_raise_store_error() -> None:
    m = msg(1)
    m.properties["bad"] = [1, 2]  # type: ignore[assignment]
    with pytest.raises(StoreError):
        encode_message(m)
    with pytest.raises(StoreError):
        encode_message(msg(2, priority=300))


def test_encoding_is_stable() -> None:
    """The committed bytes pin codec version 1; a change must bump CODEC_VERSION."""
    assert encode_message(codec_message()) == GOLDEN.read_bytes()
    assert fields(decode_message(GOLDEN.read_bytes())) == fields(codec_message())


@FUZZ
@given(st.binary(max_size=400))
def test_decode_arbitrary_bytes(data: bytes) -> None:
    try:
        decode_message(data)
    except CorruptStoreError:
        pass


@FUZZ
@given(messages, st.data())
def test_decode_damaged_encodings(m: Message, data: st.DataObject) -> None:
    raw = bytearray(encode_message(m))
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)),
                               max_size=3))
    for pos, x in flips:
        raw[pos] ^= x
    damaged = bytes(raw[:cut]) if cut < len(raw) else bytes(raw)
    try:
        decode_message(damaged)
    except CorruptStoreError:
        pass
    if cut < len(raw):
        with pytest.raises(CorruptStoreError):
            decode_message(bytes(encode_message(m))[:cut])


def test_rejects_unknown_version() -> None:
    data = bytearray(encode_message(msg(1)))
    data[0] = 2
    with pytest.raises(CorruptStoreError, match="version"):
        decode_message(bytes(data))
