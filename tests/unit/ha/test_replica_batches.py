"""One replicated batch's bytes (``meshmq.ha.replica_ops``): the layout a slave applies,
the exact message bytes it stores, and how a damaged batch is refused."""

from __future__ import annotations

import struct

import pytest
from tests.store.helpers import fields, msg

from meshmq.core import message_codec as codec
from meshmq.errors import RemoteProtocolError, StoreError
from meshmq.ha.replica_ops import decode_ops, encode_ops
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    PutDurableSubscription,
    RemoveRef,
    StoreOp,
)


def _str(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


def test_an_empty_batch_is_a_zero_count() -> None:
    assert encode_ops([]) == b"\x00\x00\x00\x00"
    assert decode_ops(b"\x00\x00\x00\x00") == ([], {})


def test_a_removal_is_spelled_out_byte_by_byte() -> None:
    data = encode_ops([RemoveRef("queue://q", 7)])
    assert data == struct.pack("<I", 1) + b"\x02" + _str(b"queue://q") + struct.pack("<q", 7)


def test_marks_follow_the_operations_and_count_with_them() -> None:
    data = encode_ops([DropKey("a")], {"b": 9})
    assert data[:4] == struct.pack("<I", 2)
    assert decode_ops(data) == ([DropKey("a")], {"b": 9})


def test_a_slave_stores_the_master_s_exact_message_bytes() -> None:
    """No re-encoding: the decoded message carries the bytes it arrived in."""
    message = msg(1)
    raw = codec.encoded(message)
    ops, _ = decode_ops(encode_ops([AddMessage(message, (("queue://orders", 1),))]))
    added = ops[0]
    assert isinstance(added, AddMessage)
    assert added.message.wire_cache == {codec.STORE_CACHE: raw}
    assert codec.encoded(added.message) == raw
    assert fields(added.message) == fields(message)


def test_one_message_for_several_keys_is_carried_once() -> None:
    message = msg(2, body=b"x" * 1000)
    one = encode_ops([AddMessage(message, (("topic-sub-1", 1),))])
    three = encode_ops([AddMessage(message, (("topic-sub-1", 1), ("topic-sub-2", 4),
                                            ("topic-sub-3", 9)))])
    assert len(three) < len(one) + 100
    ops, _ = decode_ops(three)
    assert isinstance(ops[0], AddMessage)
    assert ops[0].refs == (("topic-sub-1", 1), ("topic-sub-2", 4), ("topic-sub-3", 9))


@pytest.mark.parametrize(("selector", "no_local"), [
    (None, False), ("price > 10", False), (None, True), ("", True),
], ids=["plain", "selector", "no-local", "empty-selector"])
def test_durable_subscriptions_keep_their_selector_and_no_local_flag(
        selector: str | None, no_local: bool) -> None:
    """An empty selector stays empty, distinct from none."""
    sub = DurableSubscription("sub:c1:s1", "c1", "s1", "topic://prices", selector, no_local,
                              1_700_000_000_000)
    ops, _ = decode_ops(encode_ops([PutDurableSubscription(sub)]))
    assert ops == [PutDurableSubscription(sub)]


def test_keys_in_any_script_survive() -> None:
    ops: list[StoreOp] = [DropKey("queue://заказы.東京"), RemoveRef("queue://🙂", -1)]
    assert decode_ops(encode_ops(ops))[0] == ops


def test_an_unknown_store_operation_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(StoreError, match="unknown store operation"):
        encode_ops([DropKey("a"), "not an op"])  # type: ignore[list-item]


def test_an_unknown_operation_code_names_its_byte() -> None:
    data = struct.pack("<I", 1) + b"\x09"
    with pytest.raises(RemoteProtocolError, match="unknown operation 9 at byte 4"):
        decode_ops(data)


def test_a_key_that_is_not_utf8_is_refused() -> None:
    data = struct.pack("<I", 1) + b"\x05" + _str(b"\xff\xfe")
    with pytest.raises(RemoteProtocolError, match="bad UTF-8"):
        decode_ops(data)


def test_an_undecodable_message_is_refused() -> None:
    data = struct.pack("<I", 1) + b"\x01" + _str(b"garbage!") + struct.pack("<I", 0)
    with pytest.raises(RemoteProtocolError, match="bad message"):
        decode_ops(data)


def test_a_count_larger_than_the_batch_is_truncation() -> None:
    data = encode_ops([DropKey("a")])
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_ops(struct.pack("<I", 2) + data[4:])


def test_a_length_past_the_end_is_truncation_not_a_huge_read() -> None:
    data = struct.pack("<I", 1) + b"\x05" + struct.pack("<I", 0xFFFFFFFF) + b"abc"
    with pytest.raises(RemoteProtocolError, match="truncated at byte 9"):
        decode_ops(data)
