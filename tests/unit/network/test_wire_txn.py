"""The shard links' TXN frame (docs/wire-protocol.md, "Transactions across shards"):
its head and messages round-trip, and a damaged frame is a protocol error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.core.message_codec import encode_message
from meshmq.errors import RemoteProtocolError
from meshmq.protocol.wire import FrameType, WireDecoder, WireFrame, decode_txn, encode_txn

_HEADS = st.fixed_dictionaries({
    "op": st.sampled_from(["prepare", "prepared", "refused", "commit", "abort",
                           "committed", "ask"]),
    "txn": st.text(max_size=30),
    "acks": st.lists(st.lists(st.integers(0, 2**63), min_size=2, max_size=2), max_size=5)})


def _frame(data: bytes) -> WireFrame:
    decoder = WireDecoder(expect_magic=False)
    [frame] = decoder.feed(data)
    return frame


@given(_HEADS, st.lists(st.binary(max_size=50), max_size=5))
def test_a_txn_frame_round_trips(head: dict[str, object], bodies: list[bytes]) -> None:
    messages = [Message(message_id=f"ID:m-{i}", destination=dst.queue("q.t"), body=b)
                for i, b in enumerate(bodies)]
    frame = _frame(encode_txn(head, [encode_message(m) for m in messages]))
    assert frame.type is FrameType.TXN
    got_head, got = decode_txn(frame)
    assert got_head == head
    assert [(m.message_id, m.body) for m in got] == [(m.message_id, m.body) for m in messages]


@given(st.integers(1, 40))
def test_a_truncated_txn_frame_is_a_protocol_error(cut: int) -> None:
    data = encode_txn({"op": "prepare", "txn": "t"}, [encode_message(Message(
        message_id="ID:x", destination=dst.queue("q"), body=b"payload"))])
    frame = _frame(data)
    damaged = WireFrame(frame.type, frame.payload[:max(0, len(frame.payload) - cut)])
    with pytest.raises(RemoteProtocolError):
        decode_txn(damaged)
