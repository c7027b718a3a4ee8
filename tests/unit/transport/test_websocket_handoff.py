"""What a WebSocket connection's handoff carries (transport/websocket.py's
``handoff_bytes``): a WebSocket adopted from those bytes and state, fed what the client
sends next, hands its inner protocol (after the bytes that protocol had pending)
exactly what the original would have after the offer, whatever the client's frames,
fragments, pings and read sizes were, and answers in text or binary as the original
did."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.transport import websocket
from meshmq.transport.websocket import (
    WebSocketProtocol,
    WebSocketState,
    WebSocketTransport,
    frame_header,
    frame_length,
    handoff_bytes,
    split_handoff,
)

UPGRADE = (b"GET /stomp HTTP/1.1\r\nHost: node\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v12.stomp\r\n\r\n")


class FakeTcp(asyncio.Transport):
    """The socket's side: records writes, never closes on its own."""

    def __init__(self, tls: bool = False) -> None:
        super().__init__()
        self.written = bytearray()
        self.tls = tls

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return ("127.0.0.1", 4242)
        if name == "ssl_object":
            return object() if self.tls else None
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class Inner(asyncio.Protocol):
    """Collects the payload bytes; at the end of message ``offer_after`` asks for the
    handoff, as the STOMP session does, and notes how many reads had arrived."""

    def __init__(self, offer_after: int | None = None, pending: bytes = b"") -> None:
        self.data = bytearray()
        self.offer_after = offer_after
        self.pending = pending
        self.messages = 0
        self.transport: WebSocketTransport | None = None
        self.offered: tuple[bytes, WebSocketState | None] | None = None
        self.offered_at: tuple[int, int] | None = None  # (reads fed, payload bytes seen)
        self.reads = 0
        self.text_at_offer: bool | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, WebSocketTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        assert self.transport is not None
        ws = self.transport._owner
        if ws._message_end:
            self.messages += 1
            if self.messages == self.offer_after and self.offered is None:
                self.offered = handoff_bytes(self.transport, self.pending)
                self.offered_at = (self.reads, len(self.data))
                self.text_at_offer = ws._client_text
                self.transport.handoff_done()


def masked_frame(opcode: int, payload: bytes, fin: bool, key: bytes) -> bytes:
    """A client frame as a browser writes it: masked with a random key."""
    length = len(payload)
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        head = bytes((first, 0x80 | length))
    elif length < 0x10000:
        head = bytes((first, 0x80 | 126)) + length.to_bytes(2, "big")
    else:
        head = bytes((first, 0x80 | 127)) + length.to_bytes(8, "big")
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return head + key + body


@st.composite
def client_stream(draw: st.DrawFn) -> tuple[list[bytes], bytes]:
    """The client's bytes after the upgrade: messages of ASCII payload (text or binary,
    in one or several frames, pings between frames), and the payload they carry."""
    out = bytearray()
    payload = bytearray()
    for _ in range(draw(st.integers(1, 6))):
        text = draw(st.booleans())
        body = draw(st.binary(min_size=1, max_size=300).map(
            lambda b: bytes(65 + (x % 26) for x in b)))
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)),
                                        max_size=3))))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)
                 if body[a:b]]
        for i, part in enumerate(parts):
            opcode = (0x1 if text else 0x2) if i == 0 else 0x0
            out += masked_frame(opcode, part, i == len(parts) - 1, os.urandom(4))
            if draw(st.booleans()):
                out += masked_frame(0x9, b"p", True, os.urandom(4))  # ping
        payload += body
    sizes = draw(st.lists(st.integers(1, 200), min_size=1, max_size=40))
    reads, at = [], 0
    for size in sizes:
        if at >= len(out):
            break
        reads.append(bytes(out[at:at + size]))
        at += size
    if at < len(out):
        reads.append(bytes(out[at:]))
    return reads, bytes(payload)


def run(protocol: WebSocketProtocol, tcp: FakeTcp, reads: list[bytes],
        inner: Inner) -> None:
    async def go() -> None:
        protocol.connection_made(tcp)
        for data in reads:
            protocol.data_received(data)
            inner.reads += 1
    asyncio.run(go())


@settings(max_examples=150, deadline=None)
@given(client_stream(), st.integers(1, 6), st.binary(max_size=40).map(
    lambda b: bytes(97 + (x % 26) for x in b)))
def test_an_adopted_websocket_goes_on_where_the_offer_left_off(
        stream: tuple[list[bytes], bytes], offer_after: int, pending: bytes) -> None:
    reads, payload = stream
    original = Inner(offer_after, pending)
    run(WebSocketProtocol({"v12.stomp": lambda: original}, handoff={"v12.stomp"}), FakeTcp(),
        [UPGRADE, *reads], original)
    assert bytes(original.data) == payload  # (the original is not paused by the offer)
    if original.offered is None:
        assert original.messages < offer_after  # there were fewer messages
        return
    assert original.offered_at is not None
    carried, state = original.offered
    assert state is not None
    assert {k: state[k] for k in ("subprotocol", "path")} == {
        "subprotocol": "v12.stomp", "path": "/stomp"}
    parts = split_handoff(carried, state)
    assert parts is not None and parts[0] == pending
    fed, seen = original.offered_at
    # The adopting side: its inner protocol takes its pending bytes as it is adopted,
    # then the WebSocket goes on with the codec's bytes and what the client sent after
    # the read the offer was made in (``fed`` counts the upgrade request too).
    adopted_inner = Inner()
    adopted_inner.data += parts[0]
    adopted = WebSocketProtocol.adopted(adopted_inner, state, parts[1])
    tcp = FakeTcp()
    run(adopted, tcp, reads[fed:], adopted_inner)
    assert bytes(adopted_inner.data) == pending + payload[seen:]
    # Replies go out as the original's would: text after a text message.
    assert state["text"] is original.text_at_offer
    assert original.transport is not None
    assert adopted._client_text is original.transport._owner._client_text
    assert adopted_inner.transport is not None
    adopted_inner.transport.write(b"reply")
    opcode = 0x1 if adopted._client_text else 0x2
    assert tcp.written.endswith(frame_header(opcode, 5) + b"reply")


def test_a_tls_websocket_is_not_offered() -> None:
    inner = Inner(offer_after=1, pending=b"x")
    frame = masked_frame(0x1, b"hello", True, b"abcd")
    run(WebSocketProtocol({"v12.stomp": lambda: inner}, handoff={"v12.stomp"}), FakeTcp(tls=True),
        [UPGRADE, frame], inner)
    assert inner.messages == 1 and inner.offered is None


def test_a_listener_without_handoff_keeps_nothing_and_offers_nothing() -> None:
    inner = Inner(offer_after=1)
    protocol = WebSocketProtocol({"v12.stomp": lambda: inner})
    run(protocol, FakeTcp(), [UPGRADE, masked_frame(0x2, b"hello", True, b"abcd")], inner)
    assert inner.offered is None and protocol._track is None


@given(st.sampled_from([0x1, 0x2]), st.binary(max_size=70_000), st.booleans())
@settings(max_examples=30, deadline=None)
def test_a_frame_measures_as_long_as_it_is(opcode: int, payload: bytes,
                                           masked: bool) -> None:
    frame = masked_frame(opcode, payload, True, b"wxyz") if masked else \
        frame_header(opcode, len(payload)) + payload
    assert frame_length(frame) == len(frame)
    assert frame_length(frame[:1]) is None


def test_a_plain_connection_carries_its_pending_bytes_as_they_are() -> None:
    assert handoff_bytes(FakeTcp(), b"SEND") == (b"SEND", None)


@pytest.mark.parametrize("inner", [-1, 5, "2", True, None])
def test_bytes_that_do_not_split_where_the_state_says_are_refused(inner: object) -> None:
    assert split_handoff(b"abcd", {"subprotocol": "stomp", "inner": inner}) is None


def test_more_than_an_offer_may_carry_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(websocket, "_TRACK_LIMIT", 100)
    inner = Inner(offer_after=1)
    protocol = WebSocketProtocol({"v12.stomp": lambda: inner}, handoff={"v12.stomp"})
    run(protocol, FakeTcp(), [UPGRADE, masked_frame(0x2, b"y" * 150, True, b"abcd")], inner)
    assert inner.messages == 1 and inner.offered is None and protocol._track is None


@pytest.mark.parametrize("text", [True, False])
def test_an_adopted_websocket_answers_as_the_client_last_wrote(text: bool) -> None:
    inner = Inner()
    tcp = FakeTcp()
    adopted = WebSocketProtocol.adopted(inner, {"subprotocol": "v12.stomp", "path": "/",
                                                "text": text}, b"")
    run(adopted, tcp, [], inner)
    assert inner.transport is not None
    inner.transport.write(b"RECEIPT")
    assert bytes(tcp.written) == frame_header(0x1 if text else 0x2, 7) + b"RECEIPT"
