"""Nanoseconds per message for the acknowledgements of one 500-message batch: encoding
(the receiving broker) and decoding (the forwarding broker), as ``ACKS`` (one record per
message) and as ``ACK_RANGES`` (one record per run of sequence numbers).

    PYTHONPATH=<build or src>:. .venv/bin/python bench/ack_codec.py

Min of 7 repetitions of 2000 frames each; writes nothing.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

import meshmq.build
from meshmq.protocol.wire import (
    AckStatus,
    FrameType,
    WireFrame,
    decode_ack_ranges,
    decode_acks,
    encode_acks,
)

BATCH = 500
FRAMES = 2000


def per_message(fn: Callable[[], object]) -> float:
    return min(timeit.repeat(fn, number=FRAMES, repeat=7)) / FRAMES / BATCH * 1e9


def main() -> None:
    acks = [(seq, AckStatus.STORED) for seq in range(1001, 1001 + BATCH)]
    plain = WireFrame(FrameType.ACKS, encode_acks(acks)[5:])
    ranged = WireFrame(FrameType.ACK_RANGES, encode_acks(acks, as_ranges=True)[5:])
    print(f"compiled: {meshmq.build.compiled()}")
    print(f"encode ACKS        {per_message(lambda: encode_acks(acks)):6.1f} ns/msg")
    print(f"encode ACK_RANGES  "
          f"{per_message(lambda: encode_acks(acks, as_ranges=True)):6.1f} ns/msg")
    print(f"decode ACKS        {per_message(lambda: decode_acks(plain)):6.1f} ns/msg "
          f"({len(plain.payload)} B)")
    print(f"decode ACK_RANGES  {per_message(lambda: decode_ack_ranges(ranged)):6.1f} ns/msg "
          f"({len(ranged.payload)} B)")


if __name__ == "__main__":
    main()
