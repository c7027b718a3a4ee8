"""Frames of the replication link (``meshmq.ha.replica_wire``): JSON head plus binary
payload, APPEND's batch list, ``[term, index]`` positions, and what a malformed frame
from a peer is refused with."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.errors import RemoteProtocolError
from meshmq.ha.replica_wire import (
    decode_append,
    decode_mixed,
    encode_append,
    encode_mixed,
    position,
)
from meshmq.protocol.wire.codec import FrameType, WireDecoder, WireFrame


def one_frame(data: bytes) -> WireFrame:
    frames = WireDecoder(expect_magic=False).feed(data)
    assert len(frames) == 1
    return frames[0]


def raw_mixed(ftype: FrameType, head: bytes, payload: bytes = b"",
              declared: int | None = None) -> WireFrame:
    n = len(head) if declared is None else declared
    return WireFrame(ftype, struct.pack(">I", n) + head + payload)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)
heads = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@given(heads, st.binary(max_size=300))
def test_a_head_and_payload_come_back_as_sent(head: dict[str, Any], payload: bytes) -> None:
    frame = one_frame(encode_mixed(FrameType.REPL_SNAPSHOT, head, payload))
    assert frame.type is FrameType.REPL_SNAPSHOT
    assert decode_mixed(frame) == (head, payload)


batches = st.lists(st.tuples(st.tuples(st.integers(0, 2**20), st.integers(0, 2**40)),
                             st.binary(max_size=60)), max_size=6)


@given(heads.filter(lambda h: "entries" not in h), batches)
def test_an_append_carries_its_batches_in_order(head: dict[str, Any],
                                                sent: list[tuple[tuple[int, int], bytes]]
                                                ) -> None:
    frame = one_frame(encode_append(head, sent))
    assert frame.type is FrameType.REPL_APPEND
    got_head, got = decode_append(frame)
    assert got == sent
    assert got_head == dict(head, entries=[[t, i, len(p)] for (t, i), p in sent])


def test_an_empty_append_is_a_heartbeat_with_no_batches() -> None:
    head, got = decode_append(one_frame(encode_append({"term": 3}, [])))
    assert got == [] and head == {"term": 3, "entries": []}


def test_an_append_without_an_entry_list_has_no_batches() -> None:
    frame = one_frame(encode_mixed(FrameType.REPL_APPEND, {"term": 1}))
    assert decode_append(frame) == ({"term": 1}, [])


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x00\x00"])
def test_a_frame_too_short_for_its_head_length_is_refused(payload: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="REPL_SNAPSHOT frame too short"):
        decode_mixed(WireFrame(FrameType.REPL_SNAPSHOT, payload))


@pytest.mark.parametrize(("head", "why"), [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),  # not UTF-8
    (b"[1, 2]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
])
def test_a_head_that_is_no_json_object_is_refused(head: bytes, why: str) -> None:
    with pytest.raises(RemoteProtocolError, match=f"REPL_APPEND head is {why}"):
        decode_mixed(raw_mixed(FrameType.REPL_APPEND, head))


def test_a_head_length_beyond_the_frame_is_refused_as_such() -> None:
    """The declared head runs past the frame's end, even though what is there parses."""
    frame = raw_mixed(FrameType.REPL_APPEND, b"{}", declared=50)
    with pytest.raises(RemoteProtocolError, match="head length 50 runs past the frame"):
        decode_mixed(frame)


@pytest.mark.parametrize("entries", [
    [[1, 1]],  # no length
    [[1, 1, 3, 4]],
    [["one", 1, 3]],
    [[1, None, 3]],
    7,
    [{"term": 1}],
], ids=["short", "long", "term-text", "index-null", "not-a-list", "object"])
def test_malformed_entries_are_refused(entries: object) -> None:
    frame = one_frame(encode_mixed(FrameType.REPL_APPEND, {"entries": entries}, b"abc"))
    with pytest.raises(RemoteProtocolError, match="APPEND entries malformed"):
        decode_append(frame)


@pytest.mark.parametrize(("entries", "payload"), [
    ([[1, 1, 3]], b"ab"),  # the payload ends early
    ([[1, 1, 3]], b"abcd"),  # bytes left over
    ([[1, 1, 2], [1, 2, 2]], b"abc"),
], ids=["short", "trailing", "second-short"])
def test_a_payload_that_does_not_match_its_entries_is_refused(
        entries: list[list[int]], payload: bytes) -> None:
    frame = one_frame(encode_mixed(FrameType.REPL_APPEND, {"entries": entries}, payload))
    with pytest.raises(RemoteProtocolError, match="APPEND payload does not match"):
        decode_append(frame)


@pytest.mark.parametrize(("entries", "payload"), [
    ([[1, 1, 5], [1, 2, -5]], b""),  # a negative length walks back to the start
    ([[1, 1, -1]], b""),
], ids=["walks-back", "negative"])
def test_a_negative_batch_length_is_refused(entries: list[list[int]], payload: bytes) -> None:
    frame = one_frame(encode_mixed(FrameType.REPL_APPEND, {"entries": entries}, payload))
    with pytest.raises(RemoteProtocolError, match="APPEND"):
        decode_append(frame)


@pytest.mark.parametrize(("value", "expected"), [
    ([3, 17], (3, 17)),
    ((0, 0), (0, 0)),
    (["2", "5"], (2, 5)),  # numbers written as text by a hand-made peer still read
])
def test_a_position_is_a_term_index_pair(value: object, expected: tuple[int, int]) -> None:
    assert position(value, "APPEND prev") == expected


@pytest.mark.parametrize("value", [None, 5, [1], [1, 2, 3], ["a", 1], "12", {"a": 1, "b": 2}],
                         ids=["null", "number", "one", "three", "text", "string",
                              "object"])
def test_anything_else_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(RemoteProtocolError,
                       match=r"^ACK last is not a \[term, index\] pair: "):
        position(value, "ACK last")


def test_a_frame_s_bytes_are_length_type_and_head() -> None:
    """The layout other implementations follow (docs/wire-protocol.md)."""
    data = encode_mixed(FrameType.REPL_SNAPSHOT, {"a": 1}, b"P")
    head = json.dumps({"a": 1}, separators=(",", ":")).encode()
    assert data == struct.pack(">IB", 1 + 4 + len(head) + 1, FrameType.REPL_SNAPSHOT) \
        + struct.pack(">I", len(head)) + head + b"P"
