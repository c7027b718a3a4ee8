"""Table-driven tests for the incremental STOMP parser: every rule, every error message."""

from __future__ import annotations

import pytest

from meshmq.errors import FrameTooLargeError, RemoteProtocolError
from meshmq.protocol.stomp import Frame, StompParser


def parse(data: bytes, version: str = "1.2", **limits: int) -> list[Frame]:
    parser = StompParser(version=version, **limits)
    frames = parser.feed(data)
    assert not parser.in_frame
    assert parser.buffered == 0
    return frames


def F(command: str, *headers: tuple[str, str], body: bytes = b"") -> Frame:  # noqa: N802
    return Frame(command, list(headers), body)


VALID = [
    ("minimal", "1.2", b"DISCONNECT\n\n\x00", [F("DISCONNECT")]),
    ("headers-and-body", "1.2", b"SEND\ndestination:/queue/a\nx:1\n\nhello\x00",
     [F("SEND", ("destination", "/queue/a"), ("x", "1"), body=b"hello")]),
    ("crlf", "1.2", b"SEND\r\ndestination:/queue/a\r\n\r\nhi\x00",
     [F("SEND", ("destination", "/queue/a"), body=b"hi")]),
    ("crlf-command-only", "1.2", b"CONNECT\r\n\r\n\x00", [F("CONNECT")]),
    ("crlf-then-lf-blank", "1.2", b"SEND\r\na:b\r\n\nx\x00", [F("SEND", ("a", "b"), body=b"x")]),
    ("lf-then-crlf-blank", "1.2", b"SEND\na:b\n\r\nx\x00", [F("SEND", ("a", "b"), body=b"x")]),
    # A blank line in the body after a CRLF blank line: the block ends at the first.
    ("lf-then-crlf-blank-body-blank-line", "1.2", b"SEND\na:b\n\r\nx\n\ny\x00",
     [F("SEND", ("a", "b"), body=b"x\n\ny")]),
    ("lf-then-crlf-blank-binary-body", "1.2", b"SEND\ncontent-length:4\n\r\n\xff\n\n\xfe\x00",
     [F("SEND", ("content-length", "4"), body=b"\xff\n\n\xfe")]),
    ("lf-cr-in-value-then-lf-blank", "1.0", b"SEND\na:b\rc\n\nx\n\r\ny\x00",
     [F("SEND", ("a", "b\rc"), body=b"x\n\r\ny")]),
    ("value-with-colons", "1.0", b"SEND\nurl:tcp://h:61613\n\n\x00",
     [F("SEND", ("url", "tcp://h:61613"))]),
    ("empty-value", "1.2", b"SEND\na:\n\n\x00", [F("SEND", ("a", ""))]),
    ("value-spaces-kept", "1.2", b"SEND\na: b \n\n\x00", [F("SEND", ("a", " b "))]),
    ("repeated-headers-kept", "1.2", b"SEND\na:1\na:2\n\n\x00",
     [F("SEND", ("a", "1"), ("a", "2"))]),
    ("unknown-command-parsed", "1.2", b"FOO\n\n\x00", [F("FOO")]),
    ("utf8-headers", "1.2", "SEND\nnäme:välue€\n\n\x00".encode(), [F("SEND", ("näme", "välue€"))]),
    ("content-length-nuls", "1.2", b"SEND\ncontent-length:5\n\n\x00a\x00b\x00\x00",
     [F("SEND", ("content-length", "5"), body=b"\x00a\x00b\x00")]),
    ("content-length-zero", "1.2", b"SEND\ncontent-length:0\n\n\x00",
     [F("SEND", ("content-length", "0"))]),
    ("content-length-whitespace", "1.2", b"SEND\ncontent-length: 2 \n\nab\x00",
     [F("SEND", ("content-length", " 2 "), body=b"ab")]),
    ("first-content-length-wins", "1.2", b"SEND\ncontent-length:3\ncontent-length:1\n\na\x00b\x00",
     [F("SEND", ("content-length", "3"), ("content-length", "1"), body=b"a\x00b")]),
    ("body-to-first-nul", "1.2", b"SEND\n\nab\x00CD\n\n\x00",
     [F("SEND", body=b"ab"), F("CD")]),
    ("heartbeats-between", "1.2", b"\n\r\n\nA\n\n\x00\n\r\n\n\nB\n\n\x00\n",
     [F("A"), F("B")]),
    ("only-heartbeats", "1.2", b"\n\r\n\n\r\n", []),
    ("body-with-newlines", "1.2", b"SEND\n\n\nline\r\n\x00", [F("SEND", body=b"\nline\r\n")]),
    ("cr-inside-value-1-0", "1.0", b"SEND\na:x\ry\n\n\x00", [F("SEND", ("a", "x\ry"))]),
    # Escapes.
    ("escapes-1-2", "1.2", b"SEND\na\\cb:x\\ny\\cz\\\\w\\r\n\n\x00",
     [F("SEND", ("a:b", "x\ny:z\\w\r"))]),
    ("escapes-1-1", "1.1", b"SEND\na\\cb:x\\ny\\cz\\\\w\n\n\x00",
     [F("SEND", ("a:b", "x\ny:z\\w"))]),
    ("no-escapes-1-0", "1.0", b"SEND\na\\cb:x\\ny\\t\n\n\x00",
     [F("SEND", ("a\\cb", "x\\ny\\t"))]),
    ("connect-not-unescaped", "1.2", b"CONNECT\nlogin:a\\tb\\c\n\n\x00",
     [F("CONNECT", ("login", "a\\tb\\c"))]),
    ("connected-not-unescaped", "1.1", b"CONNECTED\nserver:x\\y\n\n\x00",
     [F("CONNECTED", ("server", "x\\y"))]),
    ("stomp-is-unescaped", "1.2", b"STOMP\nlogin:a\\cb\n\n\x00", [F("STOMP", ("login", "a:b"))]),
]


@pytest.mark.parametrize(("version", "data", "expected"), [c[1:] for c in VALID],
                         ids=[c[0] for c in VALID])
def test_valid(version: str, data: bytes, expected: list[Frame]) -> None:
    assert parse(data, version) == expected


ERRORS = [
    # (id, version, data, limits, exception type, message)
    ("lowercase-command", "1.2", b"send\n\n\x00", {}, RemoteProtocolError,
     "malformed command line"),
    ("digit-in-command", "1.2", b"SEND1\n\n\x00", {}, RemoteProtocolError,
     "malformed command line"),
    ("space-before-command", "1.2", b" SEND\n\n\x00", {}, RemoteProtocolError,
     "malformed command line"),
    ("lone-cr-before-command", "1.2", b"\rSEND\n\n\x00", {}, RemoteProtocolError,
     "malformed command line"),
    ("nul-as-command", "1.2", b"\x00\n\n", {}, RemoteProtocolError, "malformed command line"),
    ("non-ascii-command", "1.2", "SÉND\n\n\x00".encode(), {}, RemoteProtocolError,
     "malformed command line"),
    ("bad-utf8-command", "1.2", b"SE\xffND\n\n\x00", {}, RemoteProtocolError,
     "malformed command line"),
    ("bad-utf8-header", "1.2", b"SEND\na:b\nc:d\ne:\xc3\x28\n\n\x00", {}, RemoteProtocolError,
     "invalid UTF-8 in header line 3"),
    ("bad-utf8-header-1-0", "1.0", b"SEND\n\xfe:x\n\n\x00", {}, RemoteProtocolError,
     "invalid UTF-8 in header line 1"),
    ("no-colon", "1.2", b"SEND\na:b\nnocolon\n\n\x00", {}, RemoteProtocolError,
     "missing ':' in header line 2"),
    ("empty-name", "1.2", b"SEND\n:v\n\n\x00", {}, RemoteProtocolError,
     "empty header name in header line 1"),
    ("bad-escape-1-2", "1.2", b"SEND\nfoo:a\\tb\n\n\x00", {}, RemoteProtocolError,
     "invalid escape sequence '\\t' in header 'foo'"),
    ("cr-escape-in-1-1", "1.1", b"SEND\nfoo:a\\r\n\n\x00", {}, RemoteProtocolError,
     "invalid escape sequence '\\r' in header 'foo'"),
    ("bad-escape-in-name", "1.2", b"SEND\nf\\oo:a\n\n\x00", {}, RemoteProtocolError,
     "invalid escape sequence '\\o' in header 'f\\oo'"),
    ("trailing-backslash", "1.2", b"SEND\nfoo:a\\\n\n\x00", {}, RemoteProtocolError,
     "invalid escape sequence '\\' at end of header 'foo'"),
    ("content-length-word", "1.2", b"SEND\ncontent-length:abc\n\n\x00", {}, RemoteProtocolError,
     "invalid content-length 'abc'"),
    ("content-length-negative", "1.2", b"SEND\ncontent-length:-1\n\n\x00", {},
     RemoteProtocolError, "invalid content-length '-1'"),
    ("content-length-empty", "1.2", b"SEND\ncontent-length:\n\n\x00", {}, RemoteProtocolError,
     "invalid content-length ''"),
    ("content-length-float", "1.2", b"SEND\ncontent-length:1.0\n\nx\x00", {},
     RemoteProtocolError, "invalid content-length '1.0'"),
    ("content-length-unicode-digit", "1.2", "SEND\ncontent-length:٣\n\nabc\x00".encode(), {},
     RemoteProtocolError, "invalid content-length '٣'"),
    ("content-length-huge", "1.2", b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n", {},
     FrameTooLargeError, "frame larger than 104857600 bytes"),
    ("content-length-no-nul", "1.2", b"SEND\ncontent-length:2\n\nabc\x00", {},
     RemoteProtocolError, "frame body not terminated by NUL after content-length 2"),
    ("too-many-headers", "1.2", b"SEND\na:1\nb:2\nc:3\n\n\x00", {"max_headers": 2},
     FrameTooLargeError, "too many headers (limit 2)"),
    ("header-block-too-large", "1.2", b"SEND\na:" + b"x" * 100 + b"\n\n\x00",
     {"max_header_size": 64}, FrameTooLargeError, "header block larger than 64 bytes"),
    ("declared-body-too-large", "1.2", b"SEND\ncontent-length:100\n\n", {"max_frame_size": 64},
     FrameTooLargeError, "frame larger than 64 bytes"),
    ("body-too-large", "1.2", b"SEND\n\n" + b"x" * 100, {"max_frame_size": 64},
     FrameTooLargeError, "frame larger than 64 bytes"),
    ("complete-frame-too-large", "1.2", b"SEND\n\n" + b"x" * 100 + b"\x00",
     {"max_frame_size": 64}, FrameTooLargeError, "frame larger than 64 bytes"),
    ("error-message-is-one-line", "1.2", b"SEND\nfoo\\n:\\\x01\n\n\x00", {},
     RemoteProtocolError, "invalid escape sequence '\\\\x01' in header 'foo\\n'"),
]


@pytest.mark.parametrize(("version", "data", "limits", "exc_type", "message"),
                         [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_errors(version: str, data: bytes, limits: dict[str, int],
                exc_type: type[RemoteProtocolError], message: str) -> None:
    parser = StompParser(version=version, **limits)
    with pytest.raises(exc_type) as info:
        parser.feed(data)
    assert type(info.value) is exc_type
    assert info.value.message == message
    assert "\n" not in message
    # Dead after an error: the same error again, whatever comes next.
    with pytest.raises(exc_type) as again:
        parser.feed(b"DISCONNECT\n\n\x00")
    assert again.value.message == message
    assert not parser.in_frame
    assert parser.buffered == 0


@pytest.mark.parametrize(("data", "limits"), [
    (b"SEND\na:" + b"x" * 200, {"max_header_size": 64}),
    (b"SEND\n\n" + b"x" * 65, {"max_frame_size": 64}),
    (b"SEND\na:" + b"x" * 200, {"max_header_size": 1000, "max_frame_size": 64}),
    (b"SEND\ncontent-length:1000\n\nabc", {"max_frame_size": 64}),
])
def test_limits_raise_without_waiting_for_the_rest(data: bytes, limits: dict[str, int]) -> None:
    with pytest.raises(FrameTooLargeError):
        StompParser(version="1.2", **limits).feed(data)


def test_limits_are_inclusive() -> None:
    frame = b"SEND\n\n" + b"x" * 57 + b"\x00"  # exactly 64 bytes
    assert len(frame) == 64
    assert parse(frame, max_frame_size=64) == [F("SEND", body=b"x" * 57)]
    with pytest.raises(FrameTooLargeError):
        StompParser(max_frame_size=63).feed(frame)
    frame = b"SEND\ncontent-length:3\n\nabc\x00"
    assert parse(frame, max_frame_size=len(frame))[0].body == b"abc"
    with pytest.raises(FrameTooLargeError):
        StompParser(max_frame_size=len(frame) - 1).feed(frame)
    head = b"SEND\na:" + b"x" * 56 + b"\n"  # command + header lines: 64 bytes
    assert len(head) == 64
    assert parse(head + b"\n\x00", max_header_size=64)[0].get("a") == "x" * 56
    with pytest.raises(FrameTooLargeError, match="header block larger than 63 bytes"):
        StompParser(max_header_size=63).feed(head + b"\n\x00")
    lines = b"SEND\n" + b"a:1\n" * 3 + b"\n\x00"
    assert len(parse(lines, max_headers=3)[0].headers) == 3


def test_a_crlf_blank_line_within_the_header_limit_ends_the_block() -> None:
    """The first "\\n\\n" lies beyond the header limit, but the block ended before, at a
    CRLF blank line: the frame is parsed, not refused as too large."""
    frame = b"SEND\na:b\n\r\n" + b"x" * 100 + b"\n\n\x00"
    assert parse(frame, max_header_size=20) == [F("SEND", ("a", "b"), body=b"x" * 100 + b"\n\n")]


def test_frames_before_error_are_kept() -> None:
    parser = StompParser()
    with pytest.raises(RemoteProtocolError):
        parser.feed(b"SEND\n\na\x00BEGIN\n\n\x00bad\n\n\x00")
    assert parser.frames_before_error == [F("SEND", body=b"a"), F("BEGIN")]


def test_split_at_every_offset() -> None:
    stream = (b"\r\nSEND\r\ndestination:/q\r\ncontent-length:3\r\n\r\na\x00b\x00\n"
              b"MESSAGE\nh:a\\cb\n\nbody\x00\n\nCONNECT\n\n\x00"
              b"SEND\na:b\n\r\n\xff\n\n\x00")
    expected = parse(stream)
    assert len(expected) == 4 and expected[3].body == b"\xff\n\n"
    for cut in range(len(stream) + 1):
        parser = StompParser(version="1.2")
        frames = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert frames == expected, cut
        for cut2 in range(cut, len(stream) + 1, 7):
            parser = StompParser(version="1.2")
            frames = (parser.feed(stream[:cut]) + parser.feed(stream[cut:cut2])
                      + parser.feed(stream[cut2:]))
            assert frames == expected, (cut, cut2)


def state(parser: StompParser) -> tuple[bool, int]:
    return parser.in_frame, parser.buffered


def test_in_frame_and_buffered() -> None:
    parser = StompParser()
    assert state(parser) == (False, 0)
    assert parser.feed(b"\n\r") == []
    assert state(parser) == (False, 1)  # a half-received heart-beat is not a frame
    assert parser.feed(b"\n") == []
    assert state(parser) == (False, 0)
    assert parser.feed(b"SE") == []
    assert state(parser) == (True, 2)
    assert parser.feed(b"ND\ncontent-length:4\n\nab") == []
    assert state(parser) == (True, 25)
    assert parser.feed(b"cd") == []
    assert state(parser) == (True, 27)
    assert parser.feed(b"\x00\n") == [F("SEND", ("content-length", "4"), body=b"abcd")]
    assert state(parser) == (False, 0)


def test_version_is_settable_and_controls_unescaping() -> None:
    parser = StompParser()
    assert parser.version == "1.0"
    data = b"SEND\na:x\\cy\n\n\x00"
    assert parser.feed(data)[0].get("a") == "x\\cy"
    parser.version = "1.1"
    assert parser.feed(data)[0].get("a") == "x:y"
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        parser.version = "2.0"
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        StompParser(version="1.3")


def test_empty_feed_is_harmless() -> None:
    parser = StompParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"SEND\n\n") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\x00") == [F("SEND")]


def test_byte_at_a_time_large_header_is_linear_enough() -> None:
    # Resumed searches keep byte-at-a-time feeding of a big header block cheap.
    data = b"SEND\n" + b"h:" + b"v" * 60000 + b"\n\n\x00"
    parser = StompParser()
    frames: list[Frame] = []
    for i in range(len(data)):
        frames += parser.feed(data[i:i + 1])
    assert frames == [F("SEND", ("h", "v" * 60000))]


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_await_version_stops_behind_connect(command: str) -> None:
    connect = f"{command}\naccept-version:1.2\nhost:h\n\n\x00".encode()
    send = b"SEND\ndestination:/queue/a\nk:a\\cb\n\nx\x00"
    parser = StompParser(await_version=True)
    frames = parser.feed(connect + send)
    assert [f.command for f in frames] == [command]
    assert parser.buffered == len(send)
    parser.version = "1.2"
    (frame,) = parser.feed(b"")
    assert frame.get("k") == "a:b"
    # Once the version is set, later frames are not held back.
    assert [f.command for f in parser.feed(send + send)] == ["SEND", "SEND"]


def test_await_version_byte_at_a_time() -> None:
    data = b"CONNECT\naccept-version:1.1\n\n\x00SEND\ndestination:/q\nk:\\t\n\n\x00"
    parser = StompParser(await_version=True)
    got: list[Frame] = []
    with pytest.raises(RemoteProtocolError, match=r"invalid escape sequence '\\t'"):
        for i in range(len(data)):
            got += parser.feed(data[i:i + 1])
            if got:
                parser.version = "1.1"
    assert [f.command for f in got] == ["CONNECT"]


def test_without_await_version_every_frame_is_returned() -> None:
    data = b"CONNECT\n\n\x00SEND\ndestination:/q\n\n\x00"
    assert [f.command for f in StompParser().feed(data)] == ["CONNECT", "SEND"]


@pytest.mark.parametrize("size", [0, 1, 8 * 1024 - 1, 8 * 1024, 8 * 1024 + 1, 70 * 1024])
@pytest.mark.parametrize("with_length", [True, False])
def test_bodies_either_side_of_the_copy_threshold_come_out_whole(
        size: int, with_length: bool) -> None:
    # Small bodies are copied through a bytearray slice, large ones through a view: the
    # bytes around each boundary (and a neighbouring frame's) must not leak in or out.
    body = bytes((i * 7 + 1) % 255 + 1 for i in range(size))  # no NUL: fits either form
    head = f"SEND\ndestination:/q\ncontent-length:{size}\n\n" if with_length else \
        "SEND\ndestination:/q\n\n"
    frame = head.encode() + body + b"\x00"
    stream = frame + b"\n" + frame
    expected_headers = [("destination", "/q")] + (
        [("content-length", str(size))] if with_length else [])
    for cut in (len(stream), len(head), len(frame) - 1, len(frame) + 5):
        parser = StompParser(version="1.2")
        frames = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        assert [(f.command, f.headers, f.body) for f in frames] == \
            [("SEND", expected_headers, body)] * 2, cut
