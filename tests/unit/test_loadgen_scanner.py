"""The load generator's consumer reads MESSAGE timestamps without building frames
(bench/loadgen.py, ``StompScanner``): whatever the frames and however the stream is cut
into reads, it must find exactly the timestamps (in order) and the other frames that
the full parser finds."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.protocol.stomp import StompParser

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from loadgen import StompScanner

_TS = struct.Struct("<d")


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One server frame as brokers write them: LF or CRLF lines, with or without
    content-length, heart-beat EOLs before it."""
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    kind = draw(st.sampled_from(["MESSAGE", "MESSAGE", "MESSAGE", "RECEIPT", "ERROR"]))
    stamp = _TS.pack(draw(st.floats(allow_nan=False, allow_infinity=False)))
    if kind == "MESSAGE":
        body = stamp + draw(st.binary(max_size=40))
    elif kind == "ERROR":
        body = draw(st.binary(max_size=20))
    else:
        body = b""
    with_length = kind != "RECEIPT" and (b"\0" in body or draw(st.booleans()))
    headers = [b"destination:/queue/q", b"message-id:ID:1:%d" % draw(st.integers(0, 99))]
    if kind == "RECEIPT":
        headers = [b"receipt-id:r%d" % draw(st.integers(0, 99))]
    if with_length:
        headers.insert(draw(st.integers(0, len(headers))), b"content-length:%d" % len(body))
    beats = eol * draw(st.integers(0, 2))
    return beats + eol.join([kind.encode(), *headers, b"", body]) + b"\0"


def _reference(stream: bytes) -> tuple[list[float], list[tuple[str, bytes]]]:
    stamps: list[float] = []
    others: list[tuple[str, bytes]] = []
    for f in StompParser(version="1.2").feed(stream):
        if f.command == "MESSAGE":
            stamps.append(_TS.unpack_from(f.body)[0])
        else:
            others.append((f.command, f.body))
    return stamps, others


@given(st.lists(frames(), max_size=12), st.lists(st.integers(1, 64), max_size=30))
def test_the_scanner_finds_what_the_parser_finds_however_the_stream_is_cut(
        parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    scanner = StompScanner()
    stamps: list[float] = []
    others: list[tuple[str, bytes]] = []
    pos = 0
    for size in [*cuts, len(stream)]:
        for f in scanner.feed(stream[pos:pos + size], stamps):
            others.append((f.command, f.body))
        pos += size
    assert (stamps, others) == _reference(stream)
    assert not scanner.buf


def test_a_message_whose_body_is_not_ended_by_nul_at_its_length_is_refused() -> None:
    with pytest.raises(ValueError, match="does not end with NUL"):
        StompScanner().feed(b"MESSAGE\ncontent-length:2\n\nabc\0", [])
