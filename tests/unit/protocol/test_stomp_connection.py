"""The STOMP connection machine without sockets: a client built from the codec
(``encode_frame`` out, ``StompParser`` in) talks to ``StompConnection`` directly, fed
whole and byte by byte, with the clock passed in."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.errors import LocalProtocolError, RemoteProtocolError
from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from meshmq.protocol.stomp.connection import (
    HEARTBEAT_DUE,
    TRANSITIONS,
    Connected,
    ConnectionState,
    Error,
    HeartBeat,
    Input,
    PeerTimedOut,
    ProtocolViolation,
    Receipt,
    StompConnection,
)
from meshmq.protocol.stomp.frames import Ack, Connect, Disconnect, Nack, Send, Subscribe

S = ConnectionState


def machine(now: float = 0.0, **options: object) -> StompConnection:
    kwargs: dict[str, object] = {
        "max_frame_size": 1 << 20, "max_headers": 100, "max_header_size": 8192,
        "default_heartbeat": (0, 0), "server_heartbeat_ms": 10_000, "max_heartbeat_ms": 0,
        "heartbeat_grace": 1.5, "connect_timeout_s": 5.0, "frame_timeout_s": 2.0}
    kwargs.update(options)
    return StompConnection(now, **kwargs)  # type: ignore[arg-type]


def server_frames(data: bytes, version: str = "1.2") -> list[Frame]:
    """What a client reads from the machine's bytes."""
    return StompParser(version=version).feed(data)


def connect(m: StompConnection, *headers: tuple[str, str], command: str = "CONNECT",
            now: float = 0.0) -> Frame:
    """CONNECT and accept it; returns the CONNECTED frame as the client reads it."""
    events = m.receive_data(encode_frame(command, list(headers)), now)
    assert len(events) == 1 and isinstance(events[0], Connect)
    assert m.state is S.AUTHENTICATING
    [frame] = server_frames(m.send(Connected("sess-1", "meshmq/test")), m.version)
    assert m.state is S.CONNECTED
    return frame


V12 = ("accept-version", "1.0,1.1,1.2")


# ------------------------------------------------------------------ negotiation
@pytest.mark.parametrize(("accept", "version"), [
    (None, "1.0"), ("1.0", "1.0"), ("1.1", "1.1"), ("1.0,1.1", "1.1"), ("1.2,1.0", "1.2"),
    (" 1.1 , 1.2 ", "1.2"),
])
def test_version_negotiation(accept: str | None, version: str) -> None:
    m = machine()
    headers = [("accept-version", accept)] if accept is not None else []
    connected = connect(m, *headers)
    assert m.version == version
    assert connected.command == "CONNECTED"
    assert connected.get("version") == version
    assert connected.get("session") == "sess-1"
    assert connected.get("server") == "meshmq/test"
    # 1.0 has no heart-beats, so CONNECTED names none.
    assert (connected.get("heart-beat") is None) == (version == "1.0")


@pytest.mark.parametrize("accept", ["2.0", "", "1.3,3"])
def test_unsupported_version_is_answered_with_the_supported_ones(accept: str) -> None:
    m = machine()
    [event] = m.receive_data(encode_frame("CONNECT", [("accept-version", accept),
                                                      ("receipt", "r")]), 0.0)
    assert isinstance(event, ProtocolViolation) and event.unsupported_version
    assert m.state is S.CLOSED
    [error] = server_frames(m.send(Error(event.reason, event.frame, unsupported_version=True)))
    assert error.command == "ERROR"
    assert error.get("version") == "1.0,1.1,1.2"
    assert error.body == b"Supported protocol versions are 1.0,1.1,1.2"
    assert m.receive_data(b"SEND\ndestination:/queue/a\n\n\x00", 0.0) == []


@pytest.mark.parametrize(("client_hb", "server_ms", "cap", "header", "send_s", "recv_s"), [
    ("0,0", 10_000, 0, "0,0", 0.0, 0.0),
    ("1000,2000", 5000, 0, "5000,1000", 5.0, 1.0),  # send max(5000, 2000), recv max(1000, 1000)
    ("1000,0", 5000, 0, "0,1000", 0.0, 1.0),  # the client wants none: we send none
    ("0,3000", 1000, 0, "1000,0", 3.0, 0.0),
    ("60000,0", 5000, 10_000, "0,10000", 0.0, 10.0),  # the cap bounds the client's silence
])
def test_heartbeat_negotiation(client_hb: str, server_ms: int, cap: int, header: str,
                               send_s: float, recv_s: float) -> None:
    m = machine(server_heartbeat_ms=server_ms, max_heartbeat_ms=cap)
    connected = connect(m, V12, ("heart-beat", client_hb))
    assert connected.get("heart-beat") == header
    assert (m.send_interval, m.recv_interval) == (send_s, recv_s)


def test_default_heartbeat_applies_when_the_client_names_none() -> None:
    m = machine(default_heartbeat=(4000, 0))
    assert connect(m, V12).get("heart-beat") == "0,4000"
    assert m.recv_interval == 4.0


@pytest.mark.parametrize("value", ["1000", "a,b", "-1,0", "99999999999,0"])
def test_invalid_heartbeat_is_refused_on_accept(value: str) -> None:
    m = machine()
    m.receive_data(encode_frame("CONNECT", [V12, ("heart-beat", value)]), 0.0)
    with pytest.raises(RemoteProtocolError, match="invalid heart-beat"):
        m.send(Connected("s", "x"))
    assert m.state is S.AUTHENTICATING
    [error] = server_frames(m.send(Error("invalid heart-beat", None)))
    assert error.get("message") == "invalid heart-beat"
    assert m.state is S.CLOSED


def test_connected_carries_extra_headers_and_is_never_escaped() -> None:
    m = machine()
    m.receive_data(encode_frame("STOMP", [V12]), 0.0)
    data = m.send(Connected("ID:host-1", "meshmq/1", [("x-peers", "a:1,b:2")]))
    assert b"session:ID:host-1\n" in data and b"x-peers:a:1,b:2\n" in data


def test_connected_only_after_connect() -> None:
    m = machine()
    with pytest.raises(LocalProtocolError):
        m.send(Connected("s", "x"))
    connect(m, V12)
    with pytest.raises(LocalProtocolError):
        m.send(Connected("s", "x"))


# ------------------------------------------------------------------ frames and checks
def test_frames_are_typed_events_and_heartbeats_are_seen() -> None:
    m = machine()
    connect(m, V12)
    wire = b"".join([
        encode_frame("SEND", [("destination", "/queue/a")], b"hi"),
        encode_frame("SUBSCRIBE", [("destination", "/queue/a"), ("id", "1")]),
        encode_frame("ACK", [("id", "1-1")]),
        encode_frame("NACK", [("id", "1-2")]),
    ])
    events = m.receive_data(wire, 1.0)
    assert [type(e) for e in events] == [Send, Subscribe, Ack, Nack]
    assert events[0] == Frame("SEND", [("destination", "/queue/a"), ("content-length", "2")],
                              b"hi")
    [beat] = m.receive_data(b"\r\n", 2.0)
    assert isinstance(beat, HeartBeat)
    assert m.last_read == 2.0


def test_frames_pipelined_behind_connect_use_the_negotiated_escaping() -> None:
    m = machine()
    wire = encode_frame("CONNECT", [("accept-version", "1.2")]) + \
        b"SEND\ndestination:/queue/a\nkey:a\\cb\n\n\x00"
    [event] = m.receive_data(wire, 0.0)
    assert isinstance(event, Connect)
    # More arrives while the CONNECT is being authenticated: held, in order.
    assert m.receive_data(b"SEND\ndestination:/queue/b\n\n\x00", 0.5) == []
    m.send(Connected("s", "x"))
    events = m.received_while_authenticating()
    assert [e.get("destination") for e in events if isinstance(e, Frame)] == [
        "/queue/a", "/queue/b"]
    assert isinstance(events[0], Frame) and events[0].get("key") == "a:b"


@pytest.mark.parametrize(("wire", "reason"), [
    (b"FOO\n\n\x00", "Unknown STOMP action: FOO"),
    (b"CONNECT\n\n\x00", "already connected"),
    (b"SUBSCRIBE\ndestination:/queue/a\n\n\x00",
     "SUBSCRIBE frame is missing the required header 'id'"),
    (b"BEGIN\n\n\x00", "BEGIN frame is missing the required header 'transaction'"),
    (b"ACK\nmessage-id:1\n\n\x00", "ACK frame is missing the required header 'id'"),
])
def test_frames_the_protocol_refuses(wire: bytes, reason: str) -> None:
    m = machine()
    connect(m, V12)
    ok = encode_frame("SEND", [("destination", "/queue/a")])
    events = m.receive_data(ok + wire + ok, 1.0)
    # The frame before is delivered, the violation ends the stream.
    assert isinstance(events[0], Send)
    assert isinstance(events[1], ProtocolViolation) and events[1].reason == reason
    assert len(events) == 2
    assert m.state is S.CLOSED
    assert m.receive_data(ok, 2.0) == []


def test_nack_is_not_part_of_stomp_10() -> None:
    m = machine()
    connect(m)
    [event] = m.receive_data(b"NACK\nmessage-id:1\n\n\x00", 1.0)
    assert isinstance(event, ProtocolViolation)
    assert event.reason == "Unknown STOMP action: NACK (not part of STOMP 1.0)"


def test_frame_before_connect() -> None:
    m = machine()
    [event] = m.receive_data(b"SEND\ndestination:/queue/a\n\n\x00", 0.0)
    assert isinstance(event, ProtocolViolation)
    assert event.reason == "SEND received before CONNECT: connection is not established"
    assert m.state is S.CLOSED


def test_malformed_bytes_are_a_violation() -> None:
    m = machine()
    connect(m, V12)
    [event] = m.receive_data(b"send\n\n\x00", 1.0)
    assert isinstance(event, ProtocolViolation) and event.reason == "malformed command line"
    assert m.state is S.CLOSED


def test_disconnect_ends_the_input() -> None:
    m = machine()
    connect(m, V12)
    wire = encode_frame("DISCONNECT", [("receipt", "bye")]) + \
        encode_frame("SEND", [("destination", "/queue/a")])
    events = m.receive_data(wire, 1.0)
    assert [type(e) for e in events] == [Disconnect]
    assert m.state is S.DISCONNECTED
    # Receipts still go out after DISCONNECT.
    [receipt] = server_frames(m.send(Receipt("bye")))
    assert receipt == Frame("RECEIPT", [("receipt-id", "bye")])


# ------------------------------------------------------------------ output
def test_error_names_the_receipt_and_fatal_closes() -> None:
    m = machine()
    connect(m, V12)
    bad = Frame("SEND", [("receipt", "r:1")])
    [error] = server_frames(m.send(Error("not authorized\nat all", bad, fatal=False)))
    assert error.get("receipt-id") == "r:1"
    assert error.get("message") == "not authorized\nat all"  # escaped in 1.2, so exact
    assert m.state is S.CONNECTED
    m.send(Error("bye", None))
    assert m.state is S.CLOSED


def test_error_for_connect_is_written_as_stomp_10() -> None:
    m = machine()
    [event] = m.receive_data(encode_frame("CONNECT", [V12, ("receipt", "r")]), 0.0)
    assert isinstance(event, Frame)
    data = m.send(Error("bad password: no\nentry", event))
    # 1.0 cannot escape: the LF is sent as a space, ':' as is.
    assert b"message:bad password: no entry\n" in data
    assert server_frames(data, "1.0")[0].get("receipt-id") == "r"


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_message_and_receipt_render_with_the_negotiated_version(version: str) -> None:
    m = machine()
    connect(m, ("accept-version", version))
    fixed = f"destination:{m.escape('/queue/a:b')}\n".encode()
    data = m.send_message(fixed, [("subscription", "s-1")], b"body")
    [message] = server_frames(data, version)
    assert message.get("destination") == ("/queue/a:b")
    assert message.body == b"body"
    [receipt] = server_frames(m.send(Receipt("r:1", [("x-first", "0")])), version)
    assert receipt.get("receipt-id") == "r:1" and receipt.get("x-first") == "0"


# ------------------------------------------------------------------ time
def test_connect_timeout() -> None:
    m = machine(now=100.0, connect_timeout_s=5.0)
    assert m.timeouts(104.0) == []
    [due] = m.timeouts(105.5)
    assert isinstance(due, PeerTimedOut) and due.reason == "no CONNECT frame received in time"


def test_frame_timeout_runs_only_while_a_frame_is_partial_and_reading() -> None:
    m = machine(frame_timeout_s=2.0)
    connect(m, V12)
    assert m.receive_data(b"SEND\ndestin", 10.0) == []
    assert m.timeouts(11.0) == []
    assert m.timeouts(13.0, reading_held=True) == []
    [due] = m.timeouts(12.5)
    assert isinstance(due, PeerTimedOut) and due.reason.startswith("incomplete frame")
    m.reading_resumed(20.0)
    assert m.timeouts(21.0) == []
    m.receive_data(b"ation:/queue/a\n\n\x00", 21.0)
    assert m.timeouts(30.0) == []


def test_heartbeat_timers() -> None:
    m = machine(server_heartbeat_ms=1000, heartbeat_grace=1.5)
    connect(m, V12, ("heart-beat", "2000,1000"), now=0.0)
    assert (m.send_interval, m.recv_interval) == (1.0, 2.0)
    assert m.heartbeat_delay() == 0.5
    m.last_write = 0.0
    assert m.timeouts(0.4) == []
    assert m.timeouts(0.5) == [HEARTBEAT_DUE]
    [data] = [m.send(HEARTBEAT_DUE)]
    assert data == b"\n"
    m.last_write = 5.3
    m.receive_data(b"\n", 2.5)
    assert m.timeouts(5.4) == []
    [due] = m.timeouts(5.6)
    assert isinstance(due, PeerTimedOut) and due.reason.startswith("heart-beat timeout")
    assert m.timeouts(5.6, reading_held=True) == []


def test_no_heartbeats_no_delay() -> None:
    m = machine()
    connect(m)
    assert m.heartbeat_delay() is None
    assert m.timeouts(1e9) == []


# ------------------------------------------------------------------ properties
CLIENT_FRAMES = st.sampled_from([
    encode_frame("SEND", [("destination", "/queue/a"), ("k", "v:1")], b"x\x00y"),
    encode_frame("SUBSCRIBE", [("destination", "/topic/t"), ("id", "s")]),
    encode_frame("UNSUBSCRIBE", [("id", "s")]),
    encode_frame("ACK", [("id", "1-1")]),
    encode_frame("NACK", [("id", "1-1")]),
    encode_frame("BEGIN", [("transaction", "t")]),
    encode_frame("COMMIT", [("transaction", "t")]),
    encode_frame("ABORT", [("transaction", "t")]),
    encode_frame("DISCONNECT", [("receipt", "r")]),
    encode_frame("CONNECT", [V12]),
    encode_frame("STOMP", [("accept-version", "1.1")]),
    encode_frame("CONNECT", [("accept-version", "9.9")]),
    encode_frame("FOO", []),
    encode_frame("SUBSCRIBE", [("destination", "/queue/a")]),
    b"\n", b"\r\n", b"bad\n\n\x00",
])


def describe(events: list[object]) -> list[object]:
    return [(type(e).__name__, e.command, e.headers, e.body) if isinstance(e, Frame)
            else (type(e).__name__, getattr(e, "reason", None)) for e in events]


@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(CLIENT_FRAMES, max_size=12), accept=st.booleans(), data=st.data())
def test_any_input_any_split_same_events_and_only_table_transitions(
        chunks: list[bytes], accept: bool, data: st.DataObject) -> None:
    wire = b"".join(chunks)

    def run(pieces: list[bytes]) -> tuple[list[object], list[ConnectionState]]:
        m = machine()
        events: list[object] = []
        states = [m.state]
        for piece in pieces:
            got = m.receive_data(piece, 0.0)
            states.append(m.state)
            events += got
            for event in got:
                if isinstance(event, Connect) and m.state is S.AUTHENTICATING and accept:
                    m.send(Connected("s", "x"))
                    states.append(m.state)
                    events += m.received_while_authenticating()
                elif isinstance(event, ProtocolViolation):
                    m.send(Error(event.reason, event.frame))
            states.append(m.state)
        return describe(events), states

    whole, whole_states = run([wire])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8), label="cuts"))
    split, split_states = run([wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)],
                                                         strict=True)])
    byte_by_byte, _ = run([wire[i:i + 1] for i in range(len(wire))])
    # Heart-beat events depend on where the bytes were cut; frames and violations do not.
    def frames_only(events: list[object]) -> list[object]:
        return [e for e in events if e != ("HeartBeat", None)]

    assert frames_only(split) == frames_only(whole) == frames_only(byte_by_byte)
    assert whole_states[-1] == split_states[-1]
    for states in (whole_states, split_states):
        for before, after in pairwise(states):
            assert before == after or TRANSITIONS.get(
                (before, _input_for(before, after))) == after
    # After a violation nothing more is read.
    if any(e[0] == "ProtocolViolation" for e in whole):
        assert whole[-1][0] == "ProtocolViolation"
        assert whole_states[-1] is S.CLOSED


def _input_for(before: ConnectionState, after: ConnectionState) -> object:
    for (state, event), target in TRANSITIONS.items():
        if state == before and target == after:
            return event
    return None


def test_every_state_can_fail_and_closed_is_final() -> None:
    for state in ConnectionState:
        assert TRANSITIONS[(state, Input.FAIL)] is S.CLOSED
    assert {target for (s, _), target in TRANSITIONS.items() if s is S.CLOSED} == {S.CLOSED}
