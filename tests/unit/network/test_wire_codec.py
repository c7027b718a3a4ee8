"""The wire codec: round trips (Hypothesis), any split of the byte stream, and clear
errors for garbage."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.store.helpers import messages as every_field_messages
from tests.store.helpers import msg

from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.core.message_codec import encode_forwarded, encode_message, str_bytes
from meshmq.errors import RemoteProtocolError, StoreError
from meshmq.protocol.wire import (
    FEATURE_ACK_RANGES,
    FEATURE_SHARD,
    FEATURES,
    MAGIC,
    AckStatus,
    FrameType,
    RecordsBuilder,
    SettleKind,
    WireDecoder,
    WireFrame,
    ack_runs,
    decode_ack_ranges,
    decode_acks,
    decode_deliver,
    decode_json,
    decode_messages,
    decode_settle,
    encode_ack_ranges,
    encode_acks,
    encode_deliver,
    encode_json,
    encode_messages,
    encode_ping,
    encode_records,
    encode_settle,
)

messages = st.builds(
    lambda i, body, persistent, path, props: Message(
        message_id=f"ID:{i}", destination=dst.queue(f"q.{i % 3}"), body=body,
        persistent=persistent, broker_path=tuple(path), properties=props),
    st.integers(0, 10_000), st.binary(max_size=300), st.booleans(),
    st.lists(st.sampled_from(["A", "B", "C"]), max_size=3),
    st.dictionaries(st.text("abc", min_size=1, max_size=4), st.integers(-5, 5), max_size=3))


@given(st.lists(st.tuples(st.integers(0, 2**63), messages), max_size=20), st.data())
def test_messages_round_trip_through_any_split(batch, data) -> None:
    stream = MAGIC + encode_messages(batch) + encode_ping() + \
        encode_acks([(s, AckStatus.STORED) for s, _ in batch])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = WireDecoder(expect_magic=True)
    frames = []
    last = 0
    for cut in [*cuts, len(stream)]:
        frames += decoder.feed(stream[last:cut])
        last = cut
    assert [f.type for f in frames] == [FrameType.MESSAGES, FrameType.PING, FrameType.ACKS]
    got = decode_messages(frames[0])
    assert [s for s, _ in got] == [s for s, _ in batch]
    for (_, a), (_, b) in zip(got, batch, strict=True):
        assert (a.message_id, a.destination, a.body, a.persistent, a.broker_path,
                a.properties) == (b.message_id, b.destination, b.body, b.persistent,
                                  b.broker_path, b.properties)
    assert decode_acks(frames[2]) == [(s, AckStatus.STORED) for s, _ in batch]


@given(st.lists(st.tuples(st.integers(0, 2**63), messages), min_size=1, max_size=5))
def test_messages_sent_again_travel_in_their_own_frame_type(batch) -> None:
    records = [(s, encode_message(m)) for s, m in batch]
    frames = WireDecoder(expect_magic=False).feed(
        encode_records(records, FrameType.MESSAGES_AGAIN) + encode_records(records))
    assert [f.type for f in frames] == [FrameType.MESSAGES_AGAIN, FrameType.MESSAGES]
    assert [[(s, m.message_id) for s, m in decode_messages(f)] for f in frames] == \
        [[(s, m.message_id) for s, m in batch]] * 2


@given(st.lists(st.tuples(st.integers(0, 2**63), messages), max_size=20),
       st.lists(st.tuples(st.integers(0, 2**63), messages), min_size=1, max_size=5),
       st.sampled_from([FrameType.MESSAGES, FrameType.MESSAGES_AGAIN]))
def test_frames_built_record_by_record_are_encode_records_frames(first, second, ftype) -> None:
    builder = RecordsBuilder()
    for records, kind in ((first, ftype), (second, FrameType.MESSAGES)):
        encoded = [(s, encode_message(m)) for s, m in records]
        for seq, data in encoded:
            builder.add(seq, data)
        assert (builder.count, builder.size) == (len(encoded), sum(len(d) for _, d in encoded))
        # Each frame holds only what was added since the previous one.
        assert builder.frame(kind) == encode_records(encoded, kind)
        assert (builder.count, builder.size) == (0, 0)


@given(st.lists(st.tuples(st.integers(0, 2**63), every_field_messages, st.booleans()),
                min_size=1, max_size=6),
       st.lists(st.text(max_size=300), max_size=3), st.text(max_size=300))
def test_messages_added_in_parts_are_their_forwarded_encodings(records, path, producer) -> None:
    """``add_message`` (the message's parts straight into the frame) builds the frame
    ``add`` builds from ``encode_forwarded``'s bytes, mixed with ``add`` in one frame."""
    path_bytes = b"".join(str_bytes(name) for name in path)
    producer_bytes = str_bytes(producer)
    builder = RecordsBuilder()
    expected = []
    for seq, m, in_parts in records:
        data = encode_forwarded(m, path_bytes, len(path), producer_bytes)
        if in_parts:
            builder.add_message(seq, m, path_bytes, len(path), producer_bytes)
        else:
            builder.add(seq, data)
        expected.append((seq, data))
    assert (builder.count, builder.size) == (len(expected), sum(len(d) for _, d in expected))
    assert builder.frame() == encode_records(expected)


def test_a_message_the_codec_cannot_hold_adds_nothing_to_the_frame() -> None:
    good = msg(1)
    bad = msg(2)
    bad.properties["list"] = [1, 2]  # type: ignore[assignment]
    builder = RecordsBuilder()
    builder.add_message(1, good, b"", 0, str_bytes("p"))
    with pytest.raises(StoreError):
        builder.add_message(2, bad, b"", 0, str_bytes("p"))
    builder.add_message(3, good, b"", 0, str_bytes("p"))
    data = encode_forwarded(good, b"", 0, str_bytes("p"))
    assert builder.frame() == encode_records([(1, data), (3, data)])


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.sampled_from(list(AckStatus))),
                max_size=30))
def test_acks_frame_layout(acks: list[tuple[int, AckStatus]]) -> None:
    """docs/wire-protocol.md: u32 length, u8 type, u32 count, then u64 seq + u8 status."""
    payload = struct.pack(">I", len(acks)) + b"".join(struct.pack(">QB", s, st)
                                                      for s, st in acks)
    assert encode_acks(acks) == struct.pack(">IB", len(payload) + 1, FrameType.ACKS) + payload


def test_json_frames() -> None:
    frame = WireDecoder(expect_magic=False).feed(
        encode_json(FrameType.HELLO, {"broker": "A", "n": [1, 2]}))[0]
    assert frame.type is FrameType.HELLO and decode_json(frame) == {"broker": "A", "n": [1, 2]}


@pytest.mark.parametrize(("data", "fragment"), [
    (b"CONNECT\n", "bad magic"),
    (b"MMQ2", "bad magic"),
    (MAGIC + b"\x00\x00\x00\x00\x01", "out of range"),
    (MAGIC + b"\x00\x00\x00\x01\x63", "unknown frame type 99"),
    (MAGIC + b"\x7f\xff\xff\xff\x05", "out of range"),
])
def test_garbage_is_a_clear_protocol_error(data: bytes, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match=fragment):
        WireDecoder(expect_magic=True).feed(data)


def test_bad_payloads() -> None:
    dec = WireDecoder(expect_magic=False)
    bad_json = dec.feed(b"\x00\x00\x00\x03\x04[]")[0]
    with pytest.raises(RemoteProtocolError, match="JSON object"):
        decode_json(bad_json)
    truncated = dec.feed(b"\x00\x00\x00\x09\x05\x00\x00\x00\x01\x00\x00\x00\x00")[0]
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_messages(truncated)
    acks = dec.feed(b"\x00\x00\x00\x0e\x06\x00\x00\x00\x01" + b"\x00" * 8 + b"\x09")[0]
    with pytest.raises(RemoteProtocolError, match="unknown ack status 9"):
        decode_acks(acks)


# ------------------------------------------------------------ shard links: DELIVER, SETTLE
deliveries = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                                st.integers(0, 2**32 - 1), messages), max_size=20)
settles = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                             st.sampled_from(list(SettleKind))), max_size=30)


@given(deliveries, settles, st.data())
def test_deliver_and_settle_round_trip_through_any_split(batch, settled, data) -> None:
    stream = MAGIC + encode_deliver([(r, t, c, encode_message(m)) for r, t, c, m in batch]) \
        + encode_settle(settled)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = WireDecoder(expect_magic=True)
    frames = []
    last = 0
    for cut in [*cuts, len(stream)]:
        frames += decoder.feed(stream[last:cut])
        last = cut
    assert [f.type for f in frames] == [FrameType.DELIVER, FrameType.SETTLE]
    got = decode_deliver(frames[0])
    assert [(r, t, c) for r, t, c, _ in got] == [(r, t, c) for r, t, c, _ in batch]
    for (*_, a), (*_, b) in zip(got, batch, strict=True):
        assert (a.message_id, a.destination, a.body, a.persistent, a.broker_path,
                a.properties) == (b.message_id, b.destination, b.body, b.persistent,
                                  b.broker_path, b.properties)
        assert a.wire_cache == {"store": encode_message(b)}  # relayed without re-encoding
    assert decode_settle(frames[1]) == settled


def test_bad_shard_payloads() -> None:
    dec = WireDecoder(expect_magic=False)
    truncated = dec.feed(b"\x00\x00\x00\x09\x0b\x00\x00\x00\x01\x00\x00\x00\x00")[0]
    with pytest.raises(RemoteProtocolError, match="DELIVER frame truncated"):
        decode_deliver(truncated)
    settle = dec.feed(b"\x00\x00\x00\x16\x0c\x00\x00\x00\x01" + b"\x00" * 16 + b"\x07")[0]
    with pytest.raises(RemoteProtocolError, match="unknown settle kind 7"):
        decode_settle(settle)
    short = dec.feed(b"\x00\x00\x00\x06\x0c\x00\x00\x00\x01\x00")[0]
    with pytest.raises(RemoteProtocolError, match="wrong length"):
        decode_settle(short)


def test_the_shard_feature_is_never_offered_to_network_peers() -> None:
    assert FEATURE_SHARD not in FEATURES


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.sampled_from(list(AckStatus))),
                max_size=50))
def test_acks_round_trip_every_status(acks: list[tuple[int, AckStatus]]) -> None:
    frame = WireDecoder(expect_magic=False).feed(encode_acks(acks))[0]
    decoded = decode_acks(frame)
    assert decoded == acks
    assert all(type(status) is AckStatus for _, status in decoded)


def test_unknown_ack_status_among_good_ones_is_named() -> None:
    good = encode_acks([(1, AckStatus.STORED), (2, AckStatus.REFUSED)])
    # The count says three acks; the third one's status is one past the last known.
    bad = bytearray(good[:5]) + (3).to_bytes(4, "big") + good[9:] + (3).to_bytes(8, "big")
    bad += bytes([len(AckStatus)])
    bad[:4] = (len(bad) - 4).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match=f"unknown ack status {len(AckStatus)}"):
        decode_acks(WireDecoder(expect_magic=False).feed(bytes(bad))[0])


# ------------------------------------------------------------ ACK_RANGES
def _expand(runs: list[tuple[int, int, AckStatus]]) -> list[tuple[int, AckStatus]]:
    return [(seq, status) for first, last, status in runs for seq in range(first, last + 1)]


@given(st.lists(st.tuples(st.integers(1, 60), st.sampled_from(list(AckStatus))),
                max_size=60))
def test_ack_runs_settle_exactly_what_the_acks_settle(acks) -> None:
    """Each run is consecutive sequences of one status, in the order given; expanded
    they are the acknowledgements themselves (duplicates and gaps included)."""
    runs = ack_runs(acks)
    assert _expand(runs) == acks
    for (_, last, status), (first, _, next_status) in itertools.pairwise(runs):
        assert first != last + 1 or next_status is not status  # runs are maximal


def test_a_batch_of_one_status_is_one_run() -> None:
    stored = [(seq, AckStatus.STORED) for seq in range(501, 1001)]
    assert ack_runs(stored) == [(501, 1000, AckStatus.STORED)]
    mixed = [*stored[:3], (504, AckStatus.DUPLICATE), *stored[4:6]]
    assert ack_runs(mixed) == [(501, 503, AckStatus.STORED), (504, 504, AckStatus.DUPLICATE),
                               (505, 506, AckStatus.STORED)]


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.sampled_from(list(AckStatus))),
                max_size=40))
def test_acks_as_ranges_round_trip_in_their_own_frame_type(acks) -> None:
    frame = WireDecoder(expect_magic=False).feed(encode_acks(acks, as_ranges=True))[0]
    assert frame.type is FrameType.ACK_RANGES
    runs = decode_ack_ranges(frame)
    assert _expand(runs) == acks
    assert all(type(status) is AckStatus for _, _, status in runs)


def test_ack_ranges_frame_layout() -> None:
    """docs/wire-protocol.md: u32 count, then u64 first + u64 last + u8 status."""
    runs = [(1, 500, AckStatus.STORED), (7, 7, AckStatus.REFUSED)]
    payload = struct.pack(">I", 2) + struct.pack(">QQB", 1, 500, 0) + \
        struct.pack(">QQB", 7, 7, 4)
    assert encode_ack_ranges(runs) == \
        struct.pack(">IB", len(payload) + 1, FrameType.ACK_RANGES) + payload
    assert FrameType.ACK_RANGES == 13 and FEATURE_ACK_RANGES in FEATURES


@pytest.mark.parametrize(("payload", "fragment"), [
    (b"\x00\x00", "ACK_RANGES frame too short"),
    (struct.pack(">I", 2) + struct.pack(">QQB", 1, 2, 0), "wrong length"),
    (struct.pack(">I", 1) + struct.pack(">QQB", 1, 2, len(AckStatus)),
     f"unknown ack status {len(AckStatus)}"),
    (struct.pack(">I", 1) + struct.pack(">QQB", 9, 8, 0), "run 9-8 ends before it starts"),
])
def test_bad_ack_ranges_are_named(payload: bytes, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match=fragment):
        decode_ack_ranges(WireFrame(FrameType.ACK_RANGES, payload))
