"""Hypothesis properties of the STOMP codec.

* Fuzzing: arbitrary bytes, arbitrarily chunked, only ever yield frames or a
  RemoteProtocolError, and the outcome does not depend on the chunking.
* Round trip: whatever the encoder accepts, the parser gives back unchanged.
* Streams (h11 test_io style): byte-at-a-time == random chunks == all at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshmq.errors import RemoteProtocolError
from meshmq.protocol.stomp import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    StompParser,
    encode_frame,
    encode_header_block,
    encode_message_frame,
)
from meshmq.protocol.stomp.parser import LARGE_BODY

# Deterministic, no example database written into the repository, no timing flakes.
SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=400,
                    suppress_health_check=[HealthCheck.too_slow])

VERSIONS = st.sampled_from(["1.0", "1.1", "1.2"])
# Pieces that drive the parser into its interesting corners far more often than
# uniform random bytes would.
VOCABULARY = [
    b"SEND", b"MESSAGE", b"CONNECT", b"CONNECTED", b"send", b"\n", b"\r\n", b"\r", b":",
    b"\x00", b"\\", b"\\n", b"\\c", b"\\r", b"\\\\", b"\\t", b"content-length:", b"0", b"3",
    b"-1", b"99999999999999999999", b"a", b"destination:/queue/x", b"\xff", b"\xc3\xa9",
    b"\xe2\x82", b" ",
]
TOKENS = st.one_of(st.sampled_from(VOCABULARY), st.binary(max_size=4))
FIELDS = st.lists(TOKENS, max_size=4).map(b"".join)
EOLS = st.sampled_from([b"\n", b"\r\n"])
# Mostly sane names and values, with escapes (valid or not) and now and then garbage.
NAMES_LIKE = st.sampled_from([b"destination", b"id", b"a\\cb", b"x-y", b"receipt", None]).flatmap(
    lambda name: FIELDS if name is None else st.just(name))
VALUES_LIKE = st.lists(st.sampled_from([b"v", b"/queue/a", b"\\n", b"\\c", b"\\\\", b"\\r",
                                        b"\\t", b"\\", b":", b" ", b"\xc3\xa9", b"\x00"]),
                       max_size=4).map(b"".join)
HEADER_LINES = st.one_of(
    st.tuples(NAMES_LIKE, VALUES_LIKE).map(b":".join),
    st.tuples(NAMES_LIKE, VALUES_LIKE).map(b":".join),
    st.integers(-2, 14).map(lambda n: b"content-length:%d" % n),
    FIELDS,
)
COMMANDS_LIKE = st.sampled_from(
    [b"SEND", b"MESSAGE", b"CONNECT", b"CONNECTED", b"ACK", b"FOO", None]).flatmap(
    lambda command: FIELDS if command is None else st.just(command))


@st.composite
def frame_like(draw: st.DrawFn) -> bytes:
    """Mostly well-formed frames with corrupted parts, so most inputs parse a little."""
    out = [draw(COMMANDS_LIKE), draw(EOLS)]
    for line in draw(st.lists(HEADER_LINES, max_size=4)):
        out += [line, draw(EOLS)]
    out += [draw(EOLS), draw(st.binary(max_size=12)), b"\x00",
            draw(st.sampled_from([b"", b"\n", b"\r\n", b"\n\n", b"\r"]))]
    return b"".join(out)


STREAMS = st.one_of(
    st.binary(max_size=300),
    st.lists(TOKENS, max_size=60).map(b"".join),
    st.lists(frame_like(), max_size=5).map(b"".join),
)


@dataclass
class Outcome:
    frames: list[Frame]
    error: RemoteProtocolError | None


def run(data: bytes, cuts: list[int], version: str, **limits: int) -> Outcome:
    """Feed ``data`` split at ``cuts``; collect frames up to the first error."""
    parser = StompParser(version=version, **limits)
    frames: list[Frame] = []
    bounds = [0, *sorted(cuts), len(data)]
    for start, stop in itertools.pairwise(bounds):
        try:
            frames += parser.feed(data[start:stop])
        except RemoteProtocolError as exc:
            frames += parser.frames_before_error
            assert "\n" not in exc.message and exc.message
            try:
                parser.feed(b"DISCONNECT\n\n\x00")
            except RemoteProtocolError as again:
                assert type(again) is type(exc)
                assert again.message == exc.message
            else:  # pragma: no cover - failure path
                raise AssertionError("parser accepted input after an error")
            return Outcome(frames, exc)
        assert parser.buffered <= len(data)
    return Outcome(frames, None)


@SETTINGS
@given(data=STREAMS, version=VERSIONS, draw=st.data())
def test_fuzz_only_documented_errors_and_chunking_is_irrelevant(
        data: bytes, version: str, draw: st.DataObject) -> None:
    cuts = draw.draw(st.lists(st.integers(0, len(data)), max_size=8), label="cuts")
    whole = run(data, [], version)
    chunked = run(data, cuts, version)
    byte_wise = run(data, list(range(len(data))), version)
    for other in (chunked, byte_wise):
        assert other.frames == whole.frames
        assert (other.error is None) == (whole.error is None)
        if whole.error is not None and other.error is not None:
            assert type(other.error) is type(whole.error)
            assert other.error.message == whole.error.message


@SETTINGS
@given(data=STREAMS, version=VERSIONS, draw=st.data(),
       max_frame_size=st.integers(1, 80), max_headers=st.integers(0, 4),
       max_header_size=st.integers(1, 80))
def test_fuzz_with_tiny_limits(data: bytes, version: str, draw: st.DataObject,
                               max_frame_size: int, max_headers: int,
                               max_header_size: int) -> None:
    cuts = draw.draw(st.lists(st.integers(0, len(data)), max_size=8), label="cuts")
    limits = {"max_frame_size": max_frame_size, "max_headers": max_headers,
              "max_header_size": max_header_size}
    whole = run(data, [], version, **limits)
    chunked = run(data, cuts, version, **limits)
    # Which limit trips first may depend on how much had arrived, but not the frames
    # returned before it, nor whether the stream fails at all.
    assert chunked.frames == whole.frames
    assert (chunked.error is None) == (whole.error is None)
    for outcome in (whole, chunked):
        for frame in outcome.frames:
            assert len(frame.headers) <= max_headers
            assert len(frame.body) < max_frame_size


COMMANDS = st.one_of(
    st.sampled_from(sorted(CLIENT_COMMANDS | SERVER_COMMANDS)),
    st.from_regex(r"[A-Z]{1,12}", fullmatch=True),
)
NAMES = st.text(min_size=1, max_size=12).filter(lambda name: name != "content-length")
HEADERS = st.lists(st.tuples(NAMES, st.text(max_size=20)), max_size=6)
BODIES = st.one_of(st.binary(max_size=64), st.text(max_size=32).map(str.encode))


def lossless(command: str, headers: list[tuple[str, str]], version: str) -> bool:
    """Whether ``version`` can carry these headers exactly (see ``escape_header``)."""
    raw = version == "1.0" or command in ("CONNECT", "CONNECTED")
    for name, value in headers:
        text = name + value
        if raw and ("\n" in text or "\r" in text or ":" in name):
            return False
        if version == "1.1" and not raw and value.endswith("\r"):
            return False
    return True


def assert_parses_as(wire: bytes, version: str, command: str, headers: list[tuple[str, str]],
                     body: bytes) -> None:
    """Exactly the frame when the version can carry it, else still one parseable frame
    with the same command and body (the escaping is lossy, never broken)."""
    frames = StompParser(version=version).feed(wire)
    if lossless(command, headers, version):
        assert frames == [expected_frame(command, headers, body)]
    else:
        assert [(f.command, f.body) for f in frames] == [(command, body)]


def expected_frame(command: str, headers: list[tuple[str, str]], body: bytes) -> Frame:
    if body:
        headers = [*headers, ("content-length", str(len(body)))]
    return Frame(command, headers, body)


@SETTINGS
@given(command=COMMANDS, headers=HEADERS, body=BODIES, version=VERSIONS)
def test_encode_parse_round_trip(command: str, headers: list[tuple[str, str]], body: bytes,
                                 version: str) -> None:
    wire = encode_frame(command, headers, body, version=version)
    assert_parses_as(wire, version, command, headers, body)


@SETTINGS
@given(command=COMMANDS.filter(lambda c: c not in ("CONNECT", "CONNECTED")),
       headers=HEADERS, body=BODIES)
def test_crlf_line_endings_parse_the_same(command: str, headers: list[tuple[str, str]],
                                          body: bytes) -> None:
    wire = encode_frame(command, headers, body, version="1.2")
    # 1.2 escapes every CR and LF in headers, so the first blank line ends the block.
    head, _, rest = wire.partition(b"\n\n")
    crlf = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest
    assert StompParser(version="1.2").feed(crlf) == [expected_frame(command, headers, body)]


@SETTINGS
@given(fixed=HEADERS, per=HEADERS, body=BODIES, version=VERSIONS)
def test_message_frame_equals_encode_frame(fixed: list[tuple[str, str]],
                                           per: list[tuple[str, str]], body: bytes,
                                           version: str) -> None:
    block = encode_header_block(fixed, version)
    wire = encode_message_frame(block, per, body, version)
    length = ("content-length", str(len(body)))
    assert wire == encode_frame("MESSAGE", [*per, *fixed, length], body, version=version)
    frames = StompParser(version=version).feed(wire)
    if lossless("MESSAGE", [*per, *fixed], version):
        assert frames == [Frame("MESSAGE", [*per, *fixed, length], body)]
    else:
        assert [(f.command, f.body) for f in frames] == [("MESSAGE", body)]


FRAMES = st.lists(st.tuples(COMMANDS, HEADERS, BODIES), max_size=6)
HEARTBEATS = st.lists(st.sampled_from([b"\n", b"\r\n"]), max_size=3).map(b"".join)


@SETTINGS
@given(frames=FRAMES, gaps=st.lists(HEARTBEATS, min_size=7, max_size=7), version=VERSIONS,
       draw=st.data())
def test_stream_byte_at_a_time_equals_all_at_once(
        frames: list[tuple[str, list[tuple[str, str]], bytes]], gaps: list[bytes],
        version: str, draw: st.DataObject) -> None:
    wire = bytearray(gaps[0])
    expected: list[Frame] = []
    for (command, headers, body), gap in zip(frames, gaps[1:], strict=False):
        if not lossless(command, headers, version):
            continue
        wire += encode_frame(command, headers, body, version=version)
        wire += gap
        expected.append(expected_frame(command, headers, body))
    data = bytes(wire)

    parser = StompParser(version=version)
    assert parser.feed(data) == expected
    assert not parser.in_frame

    parser = StompParser(version=version)
    got: list[Frame] = []
    for index in range(len(data)):
        got += parser.feed(data[index:index + 1])
        assert parser.buffered <= index + 1
    assert got == expected
    assert not parser.in_frame
    assert parser.buffered == 0

    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=10), label="cuts"))
    parser = StompParser(version=version)
    got = []
    for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
        got += parser.feed(data[start:stop])
    assert got == expected
    assert not parser.in_frame


# Large bodies with a content-length are collected in their reads (parser.LARGE_BODY),
# not in the buffer: the same frames and errors, however the stream is cut.
LARGE_SIZES = st.sampled_from([LARGE_BODY - 1, LARGE_BODY, LARGE_BODY + 1, 3 * LARGE_BODY])


@st.composite
def large_stream(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        size = draw(LARGE_SIZES)
        body = bytes([draw(st.integers(0, 255))]) * size
        out.append(encode_frame("SEND", [("destination", "/queue/big")], body))
        if draw(st.booleans()):
            out.append(b"\n")
        if draw(st.booleans()):
            out.append(encode_frame("SEND", [("destination", "/queue/small")], b"s\x00"))
    data = b"".join(out)
    if draw(st.booleans()):
        # Corrupt one byte: often the NUL after a large body (content-length says where).
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + b"x" + data[at + 1:]
    return data


@settings(SETTINGS, max_examples=60)
@given(data=large_stream(), draw=st.data())
def test_large_bodies_parse_the_same_however_cut(data: bytes, draw: st.DataObject) -> None:
    whole = run(data, [], "1.2")
    cuts = draw.draw(st.lists(st.integers(0, len(data)), max_size=12), label="cuts")
    split = run(data, cuts, "1.2")
    assert split.frames == whole.frames
    assert (type(split.error), split.error and split.error.message) == (
        type(whole.error), whole.error and whole.error.message)


def test_large_body_in_reads_of_every_size_and_the_frames_behind_it() -> None:
    body = bytes(range(256)) * (LARGE_BODY // 256 + 3)
    data = (encode_frame("SEND", [("destination", "/queue/big")], body)
            + encode_frame("SEND", [("destination", "/queue/next")], b"after"))
    expected = run(data, [], "1.2").frames
    assert [f.body for f in expected] == [body, b"after"]
    for step in (1000, 4096, 65536, len(data) - 7):
        parser = StompParser(version="1.2")
        got: list[Frame] = []
        for start in range(0, len(data), step):
            got += parser.feed(data[start:start + step])
            assert parser.in_frame == (start + step < len(data))
            assert parser.buffered <= start + step
        assert got == expected
        assert parser.buffered == 0


def test_large_body_behind_connect_waits_for_the_version() -> None:
    body = b"b" * LARGE_BODY
    connect = encode_frame("CONNECT", [("accept-version", "1.2")], body)
    send = encode_frame("SEND", [("destination", "/queue/a:b")], b"x", version="1.2")
    parser = StompParser(await_version=True)
    first = parser.feed(connect[:100])
    first += parser.feed(connect[100:] + send)
    assert [f.command for f in first] == ["CONNECT"] and first[0].body == body
    parser.version = "1.2"
    assert [f.get("destination") for f in parser.feed(b"")] == ["/queue/a:b"]
