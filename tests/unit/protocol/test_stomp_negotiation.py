"""Version and heart-beat negotiation, required headers, Frame lookups."""

from __future__ import annotations

import pytest

from meshmq.errors import RemoteProtocolError
from meshmq.protocol.stomp import (
    CLIENT_COMMANDS,
    REQUIRED_HEADERS,
    SERVER_COMMANDS,
    SUPPORTED_VERSIONS,
    Frame,
    missing_headers,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
)


@pytest.mark.parametrize(("accept", "expected"), [
    (None, "1.0"),
    ("1.0", "1.0"),
    ("1.1", "1.1"),
    ("1.0,1.1,1.2", "1.2"),
    ("1.2,1.0", "1.2"),
    (" 1.0 , 1.1 ", "1.1"),
    ("1.1,2.0", "1.1"),
    ("2.0", None),
    ("", None),
    ("1.3,0.9", None),
])
def test_negotiate_version(accept: str | None, expected: str | None) -> None:
    assert negotiate_version(accept) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (None, (0, 0)),
    ("0,0", (0, 0)),
    ("1000,5000", (1000, 5000)),
    (" 10 , 20 ", (10, 20)),
    ("2147483647,0", (2147483647, 0)),
])
def test_parse_heartbeat(value: str | None, expected: tuple[int, int]) -> None:
    assert parse_heartbeat(value) == expected


@pytest.mark.parametrize("value", [
    "", "1000", "a,b", "-1,0", "0,-5", "1,2,3", "1.5,2", ",", "2147483648,0", "9" * 5000 + ",0",
    "\u0661,\u0662",  # Arabic-Indic digits: str.isdigit() says yes
])
def test_parse_heartbeat_rejects_garbage(value: str) -> None:
    with pytest.raises(RemoteProtocolError, match="invalid heart-beat header") as info:
        parse_heartbeat(value)
    assert len(info.value.message) < 120


@pytest.mark.parametrize(("client", "server", "expected"), [
    ((0, 0), (0, 0), (0, 0)),
    ((1000, 2000), (0, 0), (0, 0)),
    ((0, 0), (1000, 2000), (0, 0)),
    # server sends every max(sx, cy); expects every max(cx, sy).
    ((1000, 2000), (3000, 500), (3000, 1000)),
    ((5000, 100), (200, 10000), (200, 10000)),
    ((0, 2000), (3000, 4000), (3000, 0)),
    ((1000, 0), (3000, 4000), (0, 4000)),
])
def test_negotiate_heartbeat(client: tuple[int, int], server: tuple[int, int],
                             expected: tuple[int, int]) -> None:
    assert negotiate_heartbeat(client, server) == expected


@pytest.mark.parametrize(("version", "command", "headers", "missing"), [
    ("1.0", "SEND", [], ["destination"]),
    ("1.0", "SUBSCRIBE", [("destination", "/q")], []),
    ("1.1", "SUBSCRIBE", [("destination", "/q")], ["id"]),
    ("1.2", "SUBSCRIBE", [("id", "1")], ["destination"]),
    ("1.0", "UNSUBSCRIBE", [], []),
    ("1.1", "UNSUBSCRIBE", [], ["id"]),
    ("1.0", "ACK", [], ["message-id"]),
    ("1.1", "ACK", [("message-id", "m")], ["subscription"]),
    ("1.1", "NACK", [], ["message-id", "subscription"]),
    ("1.2", "ACK", [("message-id", "m")], ["id"]),
    ("1.2", "NACK", [("id", "")], []),  # present but empty is the session's call
    ("1.2", "BEGIN", [], ["transaction"]),
    ("1.0", "COMMIT", [("transaction", "t")], []),
    ("1.1", "ABORT", [], ["transaction"]),
    ("1.2", "CONNECT", [], []),
    ("1.2", "STOMP", [], []),
    ("1.2", "DISCONNECT", [], []),
    ("1.2", "FROB", [], []),
    ("1.2", "MESSAGE", [("destination", "/q")], ["message-id", "subscription"]),
])
def test_missing_headers(version: str, command: str, headers: list[tuple[str, str]],
                         missing: list[str]) -> None:
    assert missing_headers(Frame(command, headers), version) == missing


def test_required_headers_cover_every_client_command() -> None:
    assert set(REQUIRED_HEADERS) == set(SUPPORTED_VERSIONS)
    for version in ("1.1", "1.2"):
        assert set(REQUIRED_HEADERS[version]) >= CLIENT_COMMANDS
    assert CLIENT_COMMANDS - {"NACK"} <= set(REQUIRED_HEADERS["1.0"])  # NACK is 1.1+
    assert set(REQUIRED_HEADERS["1.2"]) >= SERVER_COMMANDS
    with pytest.raises(ValueError, match="unsupported STOMP version"):
        missing_headers(Frame("SEND", []), "3.0")


def test_command_sets() -> None:
    client = {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN",
              "COMMIT", "ABORT", "DISCONNECT"}
    assert client == CLIENT_COMMANDS
    assert {"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"} == SERVER_COMMANDS
    assert not CLIENT_COMMANDS & SERVER_COMMANDS


def test_frame_lookups_first_occurrence_wins() -> None:
    frame = Frame("SEND", [("a", "1"), ("b", "2"), ("a", "3")])
    assert frame.get("a") == "1"
    assert frame.get("missing") is None
    assert frame.get("missing", "d") == "d"
    assert frame.header_map() == {"a": "1", "b": "2"}
    assert list(frame.header_map()) == ["a", "b"]
    unique = Frame("SEND", [("b", "1"), ("a", "2")])  # wire order, not sorted
    assert list(unique.header_map().items()) == [("b", "1"), ("a", "2")]
    assert Frame("X", []).body == b""
