"""STOMP over WebSocket, driven by a real WebSocket client library (websockets).

The runtime does not open ``ws://`` listeners yet, so each test starts one itself on
the broker's loop with ``start_websocket_listener`` and the STOMP protocol factory,
as the runtime will. No sleeps: every wait is a receive with a deadline or a poll.
"""

from __future__ import annotations

import itertools
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from meshmq.protocol.stomp import StompParser, encode_frame
from meshmq.transport.stomp_server import StompProtocol
from meshmq.transport.websocket import WebSocketOptions, start_websocket_listener
from tests.interop.stomp_helpers import Client, uid
from tests.support.brokers import ThreadBroker, poll
from tests.support.ws_stomp import TIMEOUT, WsStomp

# A TLS handshake plus the HTTP upgrade on a machine busy with the rest of the suite (up
# to 6 s seen at a load of 17 on two cores): a deadline, not a wait.
TLS_OPEN_TIMEOUT = 30.0
STOMP_NAMES = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")

# Each test opens its own WebSocket listener with its own options inside the broker's
# runtime; STOMP and MQTT over a node's ws listener are in test_mqtt_websocket.py.
pytestmark = pytest.mark.one_broker("opens WebSocket listeners inside one broker's runtime")


def listen(broker: ThreadBroker, options: WebSocketOptions | None = None) -> tuple[Any, int]:
    """Start a WebSocket listener for STOMP on the broker's loop; return (server, port)."""
    runtime = broker.runtime
    assert runtime is not None

    def stomp() -> StompProtocol:
        return StompProtocol(runtime)

    server = broker.call(start_websocket_listener(
        broker.loop, "127.0.0.1", 0, dict.fromkeys(STOMP_NAMES, stomp), options=options))
    return server, server.sockets[0].getsockname()[1]


def stop_listener(broker: ThreadBroker, server: Any) -> None:
    async def close() -> None:
        server.close()
    broker.call(close())


@pytest.fixture
def ws(broker: ThreadBroker) -> Iterator[Callable[..., WsStomp]]:
    """``ws(subprotocols=..., text=...)``: a WebSocket STOMP client on a listener that
    serves the ``broker`` fixture; every client and the listener are closed at teardown."""
    server, port = listen(broker)
    made: list[WsStomp] = []

    def make(*args: Any, **kw: Any) -> WsStomp:
        client = WsStomp(port, *args, **kw)
        made.append(client)
        return client

    make.port = port  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for client in made:
            client.close()
        stop_listener(broker, server)


def raw_http(port: int, request: bytes) -> bytes:
    """Send ``request`` on a bare socket; return everything the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- round trips


def test_stomp12_text_round_trip(ws: Callable[..., WsStomp]) -> None:
    c = ws(("v10.stomp", "v11.stomp", "v12.stomp"))  # stomp.js's offer, in its order
    assert c.ws.subprotocol == "v12.stomp"  # the server's preference wins
    connected = c.connect()
    assert connected.get("version") == "1.2"
    q = f"/queue/{uid('wstext')}"
    c.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    c.send("SEND", [("destination", q), ("content-type", "text/plain")], "héllo ✓".encode())
    message = c.next("MESSAGE")
    assert message.body == "héllo ✓".encode()
    assert message.get("destination") == q
    assert set(c.kinds) == {str}  # a text client gets text messages


def test_stomp_binary_frames_and_binary_bodies(ws: Callable[..., WsStomp]) -> None:
    c = ws(text=False)
    c.connect()
    q = f"/queue/{uid('wsbin')}"
    c.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    body = bytes(range(256)) * 4 + b"\x00in the middle"
    c.send("SEND", [("destination", q)], body)
    assert c.next("MESSAGE").body == body
    assert set(c.kinds) == {bytes}  # a binary client gets binary messages


def test_text_client_gets_non_utf8_body_as_binary(ws: Callable[..., WsStomp]) -> None:
    sender, receiver = ws(text=False), ws(text=True)
    sender.connect()
    receiver.connect()
    q = f"/queue/{uid('wsmix')}"
    receiver.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    sender.send("SEND", [("destination", q)], b"\xff\xfe not utf-8")
    assert receiver.next("MESSAGE").body == b"\xff\xfe not utf-8"
    # CONNECTED and RECEIPT were text; the MESSAGE could not be a text message
    assert receiver.kinds == [str, str, bytes]


def test_fragmented_messages_and_frames_split_across_messages(
        ws: Callable[..., WsStomp]) -> None:
    c = ws(text=False)
    c.connect()
    q = f"/queue/{uid('wsfrag')}"
    c.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    frame = encode_frame("SEND", [("destination", q), ("k", "v")], b"0123456789" * 100)
    # one WebSocket message in seven fragments, split inside the header and the body
    cuts = [0, 3, 9, 20, 40, 300, 700, len(frame)]
    c.ws.send([frame[a:b] for a, b in itertools.pairwise(cuts)])
    assert c.next("MESSAGE").body == b"0123456789" * 100
    # one STOMP frame over three WebSocket messages, then two frames in one message
    c.send_raw(frame[:10])
    c.send_raw(frame[10:500])
    c.send_raw(frame[500:])
    assert c.next("MESSAGE").get("k") == "v"
    c.send_raw(encode_frame("SEND", [("destination", q)], b"a")
               + encode_frame("SEND", [("destination", q)], b"b"))
    assert [c.next("MESSAGE").body, c.next("MESSAGE").body] == [b"a", b"b"]
    # text fragments too, split inside a multi-byte character
    t = ws(text=True)
    t.connect()
    text = encode_frame("SEND", [("destination", q)], "zwölf €".encode()).decode()
    t.ws.send([text[:5], text[5:-4], text[-4:]])
    assert c.next("MESSAGE").body == "zwölf €".encode()


def test_large_message(ws: Callable[..., WsStomp]) -> None:
    c = ws(text=False)
    c.connect()
    q = f"/queue/{uid('wsbig')}"
    c.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    body = bytes(range(251)) * (8 * 1024 * 1024 // 251)  # ~8 MiB, 64-bit length frames
    c.send("SEND", [("destination", q)], body)
    assert c.next("MESSAGE", timeout=30).body == body


def test_message_over_the_limit_closes_with_1009(broker: ThreadBroker) -> None:
    server, port = listen(broker, WebSocketOptions(max_message_size=4096))
    try:
        c = WsStomp(port, text=False)
        c.connect()
        c.send("SEND", [("destination", "/queue/toobig")], b"x" * 5000)
        with pytest.raises(ConnectionClosed) as info:
            c.next()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        poll(lambda: broker.stats()["connections"] == 0, what="the connection to go")
    finally:
        stop_listener(broker, server)


def test_tcp_and_websocket_clients_share_a_queue(
        ws: Callable[..., WsStomp], client: Callable[..., Client]) -> None:
    q = f"/queue/{uid('wstcp')}"
    tcp = client()
    tcp.subscribe(q)
    w = ws()
    w.connect()
    w.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    # with two competing consumers, each message reaches exactly one of them
    for i in range(20):
        w.send("SEND", [("destination", q)], f"from-ws-{i}".encode())
    for i in range(20):
        tcp.send(q, f"from-tcp-{i}")
    total = 40
    got_ws: list[bytes] = []

    def all_delivered() -> bool:
        got_tcp = len(tcp.listener.messages)
        return got_tcp + len(got_ws) >= total

    deadline = time.monotonic() + TIMEOUT
    while not all_delivered():
        assert time.monotonic() < deadline, "not every message was delivered"
        try:
            got_ws.append(w.next("MESSAGE", timeout=0.05).body)
        except TimeoutError:
            pass
    bodies = sorted([b.decode() for b in got_ws] + list(tcp.listener.bodies()))
    assert bodies == sorted([f"from-ws-{i}" for i in range(20)]
                            + [f"from-tcp-{i}" for i in range(20)])


def test_tcp_to_websocket_and_back(
        ws: Callable[..., WsStomp], client: Callable[..., Client]) -> None:
    to_ws, to_tcp = f"/queue/{uid('to-ws')}", f"/queue/{uid('to-tcp')}"
    tcp = client()
    tcp.subscribe(to_tcp)
    w = ws()
    w.connect()
    w.receipt("SUBSCRIBE", [("destination", to_ws), ("id", "1")])
    tcp.send(to_ws, "ping from tcp", headers={"color": "red"})
    message = w.next("MESSAGE")
    assert message.body == b"ping from tcp" and message.get("color") == "red"
    w.send("SEND", [("destination", to_tcp), ("color", "blue")], b"pong from ws")
    got = tcp.listener.wait_messages(1)
    assert got[0].body == "pong from ws" and got[0].headers["color"] == "blue"


# ---------------------------------------------------------------- handshake


def test_subprotocol_negotiation(ws: Callable[..., WsStomp]) -> None:
    assert ws(("mqtt", "v11.stomp")).ws.subprotocol == "v11.stomp"  # mqtt not served here
    assert ws(("stomp",)).ws.subprotocol == "stomp"
    assert ws(("V12.STOMP",)).ws.subprotocol == "V12.STOMP"  # the client's spelling echoed
    # no subprotocol at all: served as STOMP (the default), no header in the answer
    plain = ws(None)
    assert plain.ws.subprotocol is None
    assert plain.connect().get("version") == "1.2"


def test_unsupported_subprotocols_get_400(ws: Callable[..., WsStomp]) -> None:
    with pytest.raises(InvalidStatus) as info:
        ws(("mqtt", "wamp"))
    response = info.value.response
    assert response.status_code == 400
    body = response.body.decode()
    assert "unsupported WebSocket subprotocol" in body and "mqtt, wamp" in body
    assert "v12.stomp" in body  # it says what it does speak
    assert ws().connect().get("version") == "1.2"


def test_plain_http_and_garbage_get_400_and_the_broker_stays_healthy(
        broker: ThreadBroker, ws: Callable[..., WsStomp]) -> None:
    port: int = ws.port  # type: ignore[attr-defined]
    healthy = ws()
    healthy.connect()
    answers = [
        raw_http(port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"),  # no upgrade
        raw_http(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"),
        raw_http(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),  # TLS-ish
        raw_http(port, encode_frame("CONNECT", [("accept-version", "1.2")]) + b"\r\n\r\n"),
        raw_http(port, b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000),  # huge head
        raw_http(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                       b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       b"Sec-WebSocket-Version: 8\r\n\r\n"),  # an old protocol version
    ]
    statuses = [a.split(b"\r\n", 1)[0] for a in answers]
    assert statuses == [b"HTTP/1.1 400 Bad Request"] * 5 + [b"HTTP/1.1 426 Upgrade Required"]
    assert b"WebSocket endpoint" in answers[0]
    assert b"Sec-WebSocket-Version: 13" in answers[5]
    # the broker and its clients are unaffected
    q = f"/queue/{uid('healthy')}"
    healthy.receipt("SUBSCRIBE", [("destination", q), ("id", "1")])
    healthy.send("SEND", [("destination", q)], b"still here")
    assert healthy.next("MESSAGE").body == b"still here"
    assert ws().connect().get("version") == "1.2"
    poll(lambda: broker.stats()["connections"] == 2, what="two STOMP connections")


def test_handshake_timeout_gets_408(broker: ThreadBroker) -> None:
    server, port = listen(broker, WebSocketOptions(handshake_timeout=0.2))
    try:
        answer = raw_http(port, b"GET / HTTP/1.1\r\n")  # never finishes its head
        assert answer.startswith(b"HTTP/1.1 408 ")
    finally:
        stop_listener(broker, server)


def test_path_restriction(broker: ThreadBroker) -> None:
    server, port = listen(broker, WebSocketOptions(paths=frozenset({"/stomp"})))
    try:
        assert WsStomp(port, path="/stomp?x=1").connect().get("version") == "1.2"
        with pytest.raises(InvalidStatus) as info:
            WsStomp(port, path="/other")
        assert info.value.response.status_code == 404
    finally:
        stop_listener(broker, server)


# ---------------------------------------------------------------- closing


def test_client_close_handshake_closes_the_session(
        broker: ThreadBroker, ws: Callable[..., WsStomp]) -> None:
    c = ws()
    c.connect()
    poll(lambda: broker.stats()["connections"] == 1, what="the connection")
    c.ws.close(code=1000, reason="bye")
    poll(lambda: broker.stats()["connections"] == 0, what="the session to close")


def test_abrupt_tcp_close_closes_the_session(
        broker: ThreadBroker, ws: Callable[..., WsStomp]) -> None:
    c = ws()
    c.connect()
    poll(lambda: broker.stats()["connections"] == 1, what="the connection")
    c.ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame
    poll(lambda: broker.stats()["connections"] == 0, what="the session to close")


def test_disconnect_ends_with_a_normal_close(
        broker: ThreadBroker, ws: Callable[..., WsStomp]) -> None:
    c = ws()
    c.connect()
    c.send("DISCONNECT", [("receipt", "bye")])
    assert c.next("RECEIPT").get("receipt-id") == "bye"
    with pytest.raises(ConnectionClosed) as info:
        c.next()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1000
    poll(lambda: broker.stats()["connections"] == 0, what="the session to close")


def test_stomp_error_is_delivered_before_the_close(ws: Callable[..., WsStomp]) -> None:
    c = ws()
    c.connect()
    c.send("BOGUS", [])
    error = c.next("ERROR")
    assert "BOGUS" in (error.get("message") or "")
    with pytest.raises(ConnectionClosed) as info:
        c.next()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1000


def test_ping_gets_pong(ws: Callable[..., WsStomp]) -> None:
    c = ws()
    c.connect()
    assert c.ws.ping(b"are you there").wait(TIMEOUT)


# ---------------------------------------------------------------- wss://


def test_stomp_over_wss(broker: ThreadBroker, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate (Debian package openssl)")
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(crt, key)
    runtime = broker.runtime
    assert runtime is not None
    # The server's upgrade deadline as long as the client's: under a loaded suite the
    # request can take longer than the default 10 s to follow the TLS handshake.
    server = broker.call(start_websocket_listener(
        broker.loop, "127.0.0.1", 0, {"v12.stomp": lambda: StompProtocol(runtime)},
        ssl_context=server_ctx, options=WebSocketOptions(handshake_timeout=TLS_OPEN_TIMEOUT)))
    port = server.sockets[0].getsockname()[1]
    try:
        client_ctx = ssl.create_default_context(cafile=str(crt))
        with connect(f"wss://localhost:{port}/", ssl=client_ctx, subprotocols=["v12.stomp"],
                     compression=None, proxy=None, open_timeout=TLS_OPEN_TIMEOUT) as conn:
            assert conn.subprotocol == "v12.stomp"
            conn.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
            conn.send(encode_frame("SUBSCRIBE", [("destination", "/queue/wss"), ("id", "1")]))
            conn.send(encode_frame("SEND", [("destination", "/queue/wss")], b"secret"))
            parser, frames = StompParser(version="1.2"), []
            while not any(f.command == "MESSAGE" for f in frames):
                message = conn.recv(timeout=TIMEOUT)
                assert isinstance(message, bytes)
                frames += parser.feed(message)
            assert [f.body for f in frames if f.command == "MESSAGE"] == [b"secret"]
        # plain HTTP on the TLS port gets nowhere and hurts nothing
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as plain:
            plain.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            while plain.recv(65536):
                pass
        poll(lambda: broker.stats()["connections"] == 0, what="the wss session to close")
    finally:
        stop_listener(broker, server)
