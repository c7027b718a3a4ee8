"""The WebSocket adapter byte by byte: the test plays the client with wsproto's client
codec against ``WebSocketProtocol`` on a fake TCP transport, and a recording inner
protocol shows what STOMP or MQTT would see. No sockets, no sleeps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from meshmq.transport.websocket import (
    Negotiated,
    WebSocketOptions,
    WebSocketProtocol,
    frame_header,
    http_error,
    negotiate_subprotocol,
)


def masked(opcode: int, payload: bytes) -> bytes:
    """A final client frame (< 126 bytes) with an all-zero masking key."""
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\x00\x00\x00\x00" + payload


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


class FakeTcp(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.aborted = False
        self.eof = False
        self.reading = True
        self.limits = (65536, 16384)
        self.closed_event = asyncio.Event()

    def write(self, data: Any) -> None:
        assert not self.closed, "write after close"
        self.out += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closed = True
        self.closed_event.set()

    def abort(self) -> None:
        self.aborted = self.closed = True
        self.closed_event.set()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high or 0, low or 0)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.limits

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.7", 4242) if name == "peername" else default

    def take(self) -> bytes:
        data = bytes(self.out)
        self.out.clear()
        return data


class Inner(asyncio.Protocol):
    """Records what the hosted protocol sees."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data = bytearray()
        self.lost: list[Exception | None] = []
        self.flow: list[str] = []
        self.on_data: Callable[[Inner, bytes], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.on_data is not None:
            self.on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.flow.append("pause")

    def resume_writing(self) -> None:
        self.flow.append("resume")


class Peer:
    """The client side: wsproto's client codec, talking to the adapter under test."""

    def __init__(self, names: tuple[str, ...] = ("v12.stomp", "v11.stomp", "stomp", "mqtt"),
                 options: WebSocketOptions | None = None) -> None:
        self.inners: list[Inner] = []

        def factory() -> Inner:
            inner = Inner()
            self.inners.append(inner)
            return inner

        self.tcp = FakeTcp()
        self.proto = WebSocketProtocol(dict.fromkeys(names, factory), options)
        self.proto.connection_made(self.tcp)
        self.ws = WSConnection(ConnectionType.CLIENT)

    @property
    def inner(self) -> Inner:
        assert len(self.inners) == 1
        return self.inners[0]

    def handshake_bytes(self, subprotocols: list[str], target: str = "/") -> bytes:
        return self.ws.send(Request(host="localhost", target=target, subprotocols=subprotocols))

    def feed(self, data: bytes, step: int | None = None) -> None:
        step = step or len(data) or 1
        for i in range(0, len(data), step):
            self.proto.data_received(data[i:i + step])

    def events(self) -> list[Event]:
        self.ws.receive_data(self.tcp.take())
        return list(self.ws.events())

    def open(self, subprotocols: list[str] | None = None) -> AcceptConnection:
        self.feed(self.handshake_bytes(["v12.stomp"] if subprotocols is None
                                       else subprotocols))
        events = self.events()
        assert len(events) == 1 and isinstance(events[0], AcceptConnection), events
        return events[0]

    def send(self, event: Event) -> None:
        self.feed(self.ws.send(event))


def test_pure_helpers() -> None:
    supported = ["v12.stomp", "v11.stomp", "v10.stomp", "stomp", "mqtt"]
    assert negotiate_subprotocol(["v10.stomp", "v12.stomp"], supported, "stomp") == \
        Negotiated("v12.stomp", "v12.stomp")
    assert negotiate_subprotocol(["MQTT"], supported, "stomp") == Negotiated("mqtt", "MQTT")
    assert negotiate_subprotocol([], supported, "stomp") == Negotiated("stomp", None)
    assert negotiate_subprotocol([], supported, None) is None
    assert negotiate_subprotocol([], ["mqtt"], "stomp") is None
    assert negotiate_subprotocol(["wamp"], supported, "stomp") is None
    assert frame_header(0x2, 0) == b"\x82\x00"
    assert frame_header(0x1, 125) == b"\x81\x7d"
    assert frame_header(0x2, 126) == b"\x82\x7e\x00\x7e"
    assert frame_header(0x2, 65536) == b"\x82\x7f" + (65536).to_bytes(8, "big")
    response = http_error(400, "nope ✗", [(b"X-A", b"b")])
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n") == [b"HTTP/1.1 400 Bad Request",
                                   b"Content-Type: text/plain; charset=utf-8",
                                   b"Content-Length: 9", b"Connection: close", b"X-A: b"]
    assert body == "nope ✗\n".encode()


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_data_frames_parse_in_a_real_client_codec(size: int) -> None:
    async def scenario() -> None:
        peer = Peer(("mqtt",))
        peer.open(["mqtt"])
        assert peer.inner.transport is not None
        payload = bytes(i % 251 for i in range(size))
        peer.inner.transport.write(payload)
        events = peer.events()
        if size == 0:
            assert events == []  # an empty write sends nothing
        else:
            assert events == [BytesMessage(data=payload, frame_finished=True,
                                           message_finished=True)]
    run(scenario)


def test_handshake_byte_by_byte_with_a_pipelined_frame() -> None:
    async def scenario() -> None:
        peer = Peer()
        data = peer.handshake_bytes(["v10.stomp", "v11.stomp", "v12.stomp"], "/ws?client=1")
        assert peer.inners == []
        peer.feed(data[:-1], step=1)
        assert peer.inners == [] and peer.tcp.out == b""
        # the last byte of the head and the client's first message in one TCP segment
        # (a masked text frame with an all-zero masking key)
        payload = b"CONNECT\n\n\x00"
        peer.feed(data[-1:] + masked(0x1, payload))
        (accepted,) = peer.events()
        assert isinstance(accepted, AcceptConnection)
        assert accepted.subprotocol == "v12.stomp"  # the server's preference
        assert peer.inner.data == payload
        shim = peer.inner.transport
        assert shim is not None
        assert shim.get_extra_info("subprotocol") == "v12.stomp"
        assert shim.get_extra_info("path") == "/ws"
        assert shim.get_extra_info("peername") == ("10.0.0.7", 4242)
        assert shim.get_extra_info("nothing", 5) == 5
    run(scenario)


def test_text_and_fragments_reach_the_inner_protocol_as_bytes() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()
        peer.send(TextMessage(data="SEND\n\nzw", message_finished=False))
        peer.send(TextMessage(data="ölf\x00", message_finished=True))
        peer.send(BytesMessage(data=b"\x00\xff", message_finished=True))
        assert peer.inner.data == "SEND\n\nzwölf\x00".encode() + b"\x00\xff"
    run(scenario)


def test_stomp_mirrors_the_client_mqtt_is_always_binary() -> None:
    async def scenario() -> None:
        for names, offered, client_sends, expect in [
            (("v12.stomp",), ["v12.stomp"], TextMessage(data="x"), TextMessage),
            (("v12.stomp",), ["v12.stomp"], BytesMessage(data=b"x"), BytesMessage),
            (("mqtt",), ["mqtt"], TextMessage(data="x"), BytesMessage),
        ]:
            peer = Peer(names)
            peer.open(offered)
            peer.send(client_sends)
            assert peer.inner.transport is not None
            peer.inner.transport.write(b"reply")
            (event,) = peer.events()
            assert isinstance(event, expect), (names, event)
    run(scenario)


def test_ping_pong_and_client_close() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()
        peer.send(Ping(payload=b"hi"))
        assert peer.events() == [Pong(payload=b"hi")]
        peer.send(CloseConnection(code=1000, reason="bye"))
        assert peer.events() == [CloseConnection(code=1000, reason="bye")]
        assert peer.tcp.closed and not peer.tcp.aborted
        peer.proto.data_received(masked(0x2, b"after the close"))  # ignored, no error
        assert peer.inner.data == b"" and not peer.tcp.aborted
        shim = peer.inner.transport
        assert shim is not None and shim.is_closing()
        shim.write(b"too late")  # dropped, not an error
        assert peer.tcp.out == b""
        peer.proto.connection_lost(None)
        assert peer.inner.lost == [None]
    run(scenario)


def test_inner_close_sends_a_close_frame_and_waits_for_the_answer() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()
        shim = peer.inner.transport
        assert shim is not None
        shim.write(b"last words")
        shim.close()
        assert shim.is_closing() and not peer.tcp.closed
        events = peer.events()
        assert events[0] == TextMessage(data="last words", frame_finished=True,
                                        message_finished=True)
        assert events[1] == CloseConnection(code=1000, reason="")
        peer.feed(masked(0x1, b"ignored"))  # data after our close is dropped
        assert peer.inner.data == b""
        peer.send(CloseConnection(code=1000))  # the client's answer
        assert peer.tcp.closed and not peer.tcp.aborted
    run(scenario)


def test_close_timeout_when_the_client_never_answers() -> None:
    async def scenario() -> None:
        peer = Peer(options=WebSocketOptions(close_timeout=0.01))
        peer.open()
        assert peer.inner.transport is not None
        peer.inner.transport.close()
        await asyncio.wait_for(peer.tcp.closed_event.wait(), 5)
    run(scenario)


def test_pause_reading_holds_messages_until_resume() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()

        def pause_on_first(inner: Inner, data: bytes) -> None:
            if data == b"one":
                assert inner.transport is not None
                inner.transport.pause_reading()

        peer.inner.on_data = pause_on_first
        shim = peer.inner.transport
        assert shim is not None
        peer.feed(peer.ws.send(BytesMessage(data=b"one")) + peer.ws.send(BytesMessage(data=b"two"))
                  + peer.ws.send(Ping(payload=b"p")))
        assert peer.inner.data == b"one" and not peer.tcp.reading and not shim.is_reading()
        shim.resume_reading()
        assert peer.tcp.reading and peer.inner.data == b"one"  # delivered next loop turn
        for _ in range(3):
            await asyncio.sleep(0)  # yield to the loop; not a timed wait
        assert peer.inner.data == b"onetwo"
        assert peer.events() == [Pong(payload=b"p")]
    run(scenario)


def test_flow_control_and_buffer_limits_are_the_tcp_transports() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.proto.pause_writing()  # before the handshake: replayed to the inner protocol
        peer.open()
        assert peer.inner.flow == ["pause"]
        peer.proto.resume_writing()
        peer.proto.pause_writing()
        assert peer.inner.flow == ["pause", "resume", "pause"]
        shim = peer.inner.transport
        assert shim is not None
        shim.set_write_buffer_limits(high=4096, low=1024)
        assert peer.tcp.limits == (4096, 1024) == shim.get_write_buffer_limits()
        assert shim.get_write_buffer_size() == 0
    run(scenario)


def test_connection_lost_reaches_the_inner_protocol_once() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()
        error = ConnectionResetError()
        peer.proto.connection_lost(error)
        peer.proto.connection_lost(None)
        assert peer.inner.lost == [error]
        peer.proto.pause_writing()
        assert peer.inner.flow == []
    run(scenario)


def test_rejections_are_http_responses() -> None:
    async def scenario() -> None:
        cases: list[tuple[bytes, int, bytes]] = [
            (b"hello\r\n\r\n", 400, b"WebSocket endpoint"),
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, b"Upgrade"),
            (b"\xff" * 20000, 400, b"larger than"),
            (b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: Upgrade\r\nUpgrade: websocket"
             b"\r\nSec-WebSocket-Key: a2V5\r\nSec-WebSocket-Version: 13\r\n\r\n", 400, b""),
        ]
        for data, status, text in cases:
            peer = Peer(options=WebSocketOptions(close_timeout=0.01))
            peer.feed(data)
            answer = peer.tcp.take()
            assert answer.startswith(b"HTTP/1.1 %d " % status), answer
            assert text in answer
            # a lingering close: EOF first, input discarded, TCP closed later
            assert peer.tcp.eof and not peer.tcp.closed
            peer.feed(b"more bytes are ignored")
            assert peer.tcp.out == b"" and peer.inners == []
            await asyncio.wait_for(peer.tcp.closed_event.wait(), 5)
            assert not peer.tcp.aborted
        peer = Peer()
        peer.feed(peer.handshake_bytes(["wamp"]))
        events = peer.events()
        assert isinstance(events[0], RejectConnection) and events[0].status_code == 400
        assert any(isinstance(e, RejectData) and b"v12.stomp" in e.data for e in events)
    run(scenario)


def test_protocol_violations_close_with_a_code() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()
        peer.feed(b"\x82\x03abc")  # an unmasked client frame
        events = peer.events()
        assert isinstance(events[0], CloseConnection) and events[0].code == 1002
        assert peer.tcp.closed and peer.inner.data == b""

        peer = Peer(options=WebSocketOptions(max_message_size=10))
        peer.open()
        peer.send(BytesMessage(data=b"0123456789", message_finished=False))
        peer.send(BytesMessage(data=b"!", message_finished=True))
        assert peer.inner.data == b"0123456789"
        (event,) = peer.events()
        assert isinstance(event, CloseConnection) and event.code == 1009
    run(scenario)


def test_a_failing_inner_protocol_does_not_escape() -> None:
    async def scenario() -> None:
        peer = Peer()
        peer.open()

        def boom(inner: Inner, data: bytes) -> None:
            raise RuntimeError("bug in the inner protocol")

        peer.inner.on_data = boom
        peer.send(BytesMessage(data=b"x"))  # logged, not raised
        assert peer.tcp.aborted
    run(scenario)


@settings(max_examples=200, deadline=None)
@given(before=st.booleans(), chunks=st.lists(st.binary(max_size=300), max_size=8))
def test_arbitrary_bytes_never_break_the_adapter(before: bool, chunks: list[bytes]) -> None:
    """Arbitrary bytes, before or after the handshake: only documented outcomes (an HTTP
    error, a close frame, data for the inner protocol), never an internal error."""
    async def scenario() -> None:
        peer = Peer()
        if not before:
            peer.open()
        for chunk in chunks:
            peer.feed(chunk)
        assert not peer.tcp.aborted  # internal errors abort; documented outcomes do not

    logger = logging.getLogger("meshmq.websocket")
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        run(scenario)
    finally:
        logger.removeHandler(handler)
    assert errors == []
