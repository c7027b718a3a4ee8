"""meshmq's broker-to-broker wire protocol (see docs/wire-protocol.md): a sans-I/O codec."""

from meshmq.protocol.wire.codec import (
    MAGIC,
    MAX_FRAME,
    WIRE_VERSION,
    AckStatus,
    FrameType,
    WireDecoder,
    WireFrame,
    decode_acks,
    decode_json,
    decode_messages,
    encode_acks,
    encode_json,
    encode_messages,
    encode_ping,
    encode_records,
)

__all__ = [
    "MAGIC",
    "MAX_FRAME",
    "WIRE_VERSION",
    "AckStatus",
    "FrameType",
    "WireDecoder",
    "WireFrame",
    "decode_acks",
    "decode_json",
    "decode_messages",
    "encode_acks",
    "encode_json",
    "encode_messages",
    "encode_ping",
    "encode_records",
]
