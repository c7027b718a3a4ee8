"""Encoder tests: escaping per version, content-length, the shared MESSAGE header block."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.errors import LocalProtocolError
from meshmq.protocol.stomp import (
    HEARTBEAT,
    Frame,
    StompParser,
    encode_frame,
    encode_header_block,
    encode_message_frame,
    escape_header,
)
from meshmq.protocol.stomp.encoder import (
    FRAME_END,
    encode_message_start,
    escape_12,
    message_head_end,
)


@given(st.text(alphabet=st.sampled_from("ab:\\\n\r\u00e9"), max_size=12))
def test_escape_12_fast_paths_escape_as_the_four_replacements_do(text: str) -> None:
    """Every mix of the escaped characters gives what escaping each in turn gives (the
    fast paths skip passes that would find nothing), and the parser reads it back."""
    reference = (text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
                 .replace("\r", "\\r"))
    assert escape_12(text) == reference
    frame = StompParser(version="1.2").feed(
        encode_frame("MESSAGE", [("h", text)], version="1.2"))[0]
    assert frame.get("h") == text


@pytest.mark.parametrize(("value", "version", "expected"), [
    ("plain", "1.2", "plain"),
    ("a:b", "1.2", "a\\cb"),
    ("a\nb", "1.2", "a\\nb"),
    ("a\\b", "1.2", "a\\\\b"),
    ("a\rb", "1.2", "a\\rb"),
    ("\\n", "1.2", "\\\\n"),  # backslash first, so existing text is not double-read
    ("a:b\n\\", "1.1", "a\\cb\\n\\\\"),
    ("a\rb", "1.1", "a\rb"),  # 1.1 has no CR escape; an inner CR is sent raw
    ("a:b\\n", "1.0", "a:b\\n"),
    ("", "1.0", ""),
    # 1.0 cannot escape: a line break would end the header, so CR and LF become spaces.
    ("a\nb", "1.0", "a b"),
    ("ab\r", "1.0", "ab "),
    ("a\r\nb", "1.0", "a  b"),
    ("ab\r", "1.1", "ab\r"),
])
def test_escape_header(value: str, version: str, expected: str) -> None:
    assert escape_header(value, version) == expected


@pytest.mark.parametrize(("value", "version", "fragment"), [
    ("x", "2.0", "unsupported STOMP version"),
])
def test_escape_header_errors(value: str, version: str, fragment: str) -> None:
    with pytest.raises(LocalProtocolError, match=fragment):
        escape_header(value, version)


def test_encode_frame_basic() -> None:
    assert encode_frame("SEND", [("destination", "/queue/a")], b"hi") == (
        b"SEND\ndestination:/queue/a\ncontent-length:2\n\nhi\x00")
    assert encode_frame("DISCONNECT", []) == b"DISCONNECT\n\n\x00"
    assert HEARTBEAT == b"\n"


def test_encode_frame_escapes_per_version() -> None:
    headers = [("k:1", "v\n2")]
    assert encode_frame("SEND", headers, version="1.2") == b"SEND\nk\\c1:v\\n2\n\n\x00"
    assert encode_frame("SEND", [("k", "a\rb")], version="1.2") == b"SEND\nk:a\\rb\n\n\x00"
    assert encode_frame("SEND", [("k", "a:b")], version="1.0") == b"SEND\nk:a:b\n\n\x00"
    assert encode_frame("SEND", [("k", "a\nb")], version="1.0") == b"SEND\nk:a b\n\n\x00"
    # A 1.0 peer reads a name up to its first ':'; it is sent as is, as 1.0 defines no
    # way to write it otherwise.
    assert encode_frame("SEND", [("k:x", "v")], version="1.0") == b"SEND\nk:x:v\n\n\x00"


def test_connect_and_connected_are_never_escaped() -> None:
    assert encode_frame("CONNECT", [("passcode", "a:b\\c")]) == (
        b"CONNECT\npasscode:a:b\\c\n\n\x00")
    assert encode_frame("CONNECTED", [("server", "meshmq:1")], version="1.1") == (
        b"CONNECTED\nserver:meshmq:1\n\n\x00")
    assert encode_frame("CONNECT", [("login", "a\nb")]) == b"CONNECT\nlogin:a b\n\n\x00"
    # STOMP (the 1.2 CONNECT alias) is escaped like any other frame.
    assert encode_frame("STOMP", [("login", "a:b")]) == b"STOMP\nlogin:a\\cb\n\n\x00"


def test_content_length_rules() -> None:
    given = encode_frame("SEND", [("content-length", "3")], b"abc")
    assert given == b"SEND\ncontent-length:3\n\nabc\x00"
    with pytest.raises(LocalProtocolError, match="does not match"):
        encode_frame("SEND", [("content-length", "2")], b"abc")
    assert encode_frame("SEND", [], b"abc", content_length=False) == b"SEND\n\nabc\x00"
    # A NUL in the body forces content-length, or the frame would be cut short.
    assert encode_frame("SEND", [], b"a\x00", content_length=False) == (
        b"SEND\ncontent-length:2\n\na\x00\x00")
    assert encode_frame("SEND", [], b"") == b"SEND\n\n\x00"


@pytest.mark.parametrize(("command", "headers", "fragment"), [
    ("send", [], "invalid STOMP command"),
    ("", [], "invalid STOMP command"),
    ("SEND\n", [], "invalid STOMP command"),
    ("SEND", [("", "v")], "empty header name"),
    ("SEND", [("k", "\ud800")], "not encodable as UTF-8"),
])
def test_encode_frame_errors(command: str, headers: list[tuple[str, str]],
                             fragment: str) -> None:
    with pytest.raises(LocalProtocolError, match=fragment):
        encode_frame(command, headers)


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_message_frame_matches_encode_frame(version: str) -> None:
    fixed = [("destination", "/topic/x"), ("persistent", "true"), ("app", "a:b")]
    if version == "1.0":
        fixed[2] = ("app", "a b")
    block = encode_header_block([*fixed, ("content-length", "999")], version)
    assert b"content-length" not in block
    per = [("subscription", "s:1" if version != "1.0" else "s1"), ("message-id", "m-1")]
    frame = encode_message_frame(block, per, b"\x00body", version)
    assert frame == encode_frame("MESSAGE", per + fixed, b"\x00body", version=version)
    parser = StompParser(version=version)
    assert parser.feed(frame) == [
        Frame("MESSAGE", [*per, *fixed, ("content-length", "5")], b"\x00body")]


def test_message_frame_per_delivery_headers_win() -> None:
    block = encode_header_block([("subscription", "stale"), ("destination", "/q/a")], "1.2")
    frame = encode_message_frame(block, [("subscription", "fresh"), ("content-length", "0")],
                                 b"x", "1.2")
    parsed = StompParser(version="1.2").feed(frame)[0]
    assert parsed.get("subscription") == "fresh"
    assert parsed.get("content-length") == "1"
    assert encode_message_frame(block, [], b"text", "1.2", content_length=False) == (
        b"MESSAGE\nsubscription:stale\ndestination:/q/a\n\ntext\x00")


def test_header_block_errors() -> None:
    with pytest.raises(LocalProtocolError, match="empty header name"):
        encode_header_block([("", "x")], "1.2")
    with pytest.raises(LocalProtocolError, match="empty header name"):
        encode_message_frame(b"", [("", "x")], b"", "1.2")
    with pytest.raises(LocalProtocolError, match="unsupported STOMP version"):
        encode_header_block([], "9")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@pytest.mark.parametrize("body", [b"", b"text", b"with\x00nul", bytes(range(256)) * 300])
@pytest.mark.parametrize("content_length", [True, False])
def test_message_frame_in_parts_is_the_whole_frame(version: str, body: bytes,
                                                   content_length: bool) -> None:
    block = encode_header_block([("destination", "/topic/x"), ("app", "v")], version)
    per = [("subscription", "s-1"), ("ack", "1-7"), ("content-length", "999")]
    parts = (encode_message_start(per, version),
             message_head_end(block, body, content_length=content_length), body, FRAME_END)
    whole = encode_message_frame(block, per, body, version, content_length=content_length)
    assert b"".join(parts) == whole
    frame = StompParser(version=version).feed(whole)[0]
    assert frame.body == body
    assert frame.get("content-length") == (
        str(len(body)) if content_length or b"\x00" in body else None)
    assert frame.get("subscription") == "s-1"


def test_message_start_escapes_and_refuses_empty_names() -> None:
    assert encode_message_start([("subscription", "a:b")], "1.2") == (
        b"MESSAGE\nsubscription:a\\cb\n")
    assert encode_message_start([("subscription", "a\nb")], "1.0") == (
        b"MESSAGE\nsubscription:a b\n")
    with pytest.raises(LocalProtocolError, match="empty header name"):
        encode_message_start([("", "x")], "1.2")
