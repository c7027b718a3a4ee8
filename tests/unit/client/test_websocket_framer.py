"""STOMP and MQTT over WebSocket, the client's framing: the upgrade request, the
server's answer (with protocol bytes that came along), data frames both ways, pings,
closes and refusals; a wsproto server plays the broker's side."""

from __future__ import annotations

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)

from meshmq.client.errors import BrokerError, ConnectionLostError
from meshmq.client.websocket import WebSocketFramer


def server_for(framer: WebSocketFramer) -> tuple[WSConnection, Request]:
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(framer.request())
    (request,) = list(server.events())
    assert isinstance(request, Request)
    return server, request


def opened(protocol: str = "stomp") -> tuple[WebSocketFramer, WSConnection]:
    framer = WebSocketFramer("broker:61614", "/ws", protocol)
    server, request = server_for(framer)
    accepted, leftover = framer.handshake(server.send(AcceptConnection(
        subprotocol=request.subprotocols[0])))
    assert accepted and leftover == b""
    return framer, server


@pytest.mark.parametrize(("protocol", "subprotocol"), [("stomp", "v12.stomp"),
                                                       ("mqtt", "mqtt")])
def test_the_upgrade_request_offers_the_protocols_subprotocol(protocol: str,
                                                              subprotocol: str) -> None:
    _, request = server_for(WebSocketFramer("broker:61614", "/ws", protocol))
    assert (request.host, request.target, request.subprotocols) == (
        "broker:61614", "/ws", [subprotocol])


def test_an_empty_path_asks_for_the_root() -> None:
    _, request = server_for(WebSocketFramer("h:80", "", "stomp"))
    assert request.target == "/"


def test_protocol_bytes_that_come_with_the_acceptance_are_kept() -> None:
    framer = WebSocketFramer("h:80", "/", "stomp")
    server, _ = server_for(framer)
    answer = server.send(AcceptConnection(subprotocol="v12.stomp")) + server.send(
        BytesMessage(data=b"CONNECTED\n\n\x00"))
    assert framer.handshake(answer) == (True, b"CONNECTED\n\n\x00")
    assert framer.open


def test_an_answer_split_anywhere_is_accepted_once_complete() -> None:
    framer = WebSocketFramer("h:80", "/", "mqtt")
    server, _ = server_for(framer)
    answer = server.send(AcceptConnection(subprotocol="mqtt"))
    results = [framer.handshake(answer[i:i + 1]) for i in range(len(answer))]
    assert results[:-1] == [(False, b"")] * (len(answer) - 1)
    assert results[-1] == (True, b"")


def test_a_refused_upgrade_is_a_broker_error_with_the_status() -> None:
    framer = WebSocketFramer("h:80", "/", "stomp")
    server, _ = server_for(framer)
    with pytest.raises(BrokerError, match=r"WebSocket upgrade refused \(403\)"):
        framer.handshake(server.send(RejectConnection(status_code=403)))


def test_protocol_bytes_travel_as_binary_messages_both_ways() -> None:
    framer, server = opened()
    server.receive_data(framer.encode(b"SEND\n\nhi\x00"))
    (message,) = list(server.events())
    assert isinstance(message, BytesMessage) and message.data == b"SEND\n\nhi\x00"
    assert framer.decode(server.send(BytesMessage(data=b"MESSAGE\n\n\x00"))) == \
        (b"MESSAGE\n\n\x00", b"")


def test_text_messages_are_read_as_utf8() -> None:
    framer, server = opened()
    assert framer.decode(server.send(TextMessage(data="RECEIPT\nx:é\n\n\x00")))[0] == \
        "RECEIPT\nx:é\n\n\x00".encode()


def test_several_messages_in_one_read_are_joined_in_order() -> None:
    framer, server = opened("mqtt")
    data = b"".join(server.send(BytesMessage(data=bytes([i]) * 3)) for i in range(3))
    assert framer.decode(data) == (b"\x00\x00\x00\x01\x01\x01\x02\x02\x02", b"")


def test_a_ping_is_answered_with_a_pong() -> None:
    framer, server = opened()
    payload, reply = framer.decode(server.send(Ping(payload=b"are you there")))
    assert payload == b""
    server.receive_data(reply)
    (pong,) = list(server.events())
    assert isinstance(pong, Pong) and pong.payload == b"are you there"


def test_a_close_from_the_broker_ends_the_connection_with_its_reason() -> None:
    framer, server = opened()
    with pytest.raises(ConnectionLostError, match=r"closed by the broker \(1001 going away\)"):
        framer.decode(server.send(CloseConnection(code=1001, reason="going away")))
