"""Bad input: the offending client gets an ERROR with a precise
reason and is closed; a client connected at the same time keeps working; the broker
stays up."""

from __future__ import annotations

import pytest
from tests.support.memory_stomp_client import MemoryClient
from tests.support.raw_stomp import MemoryRawClient, frame_bytes, uid
from tests.support.stomp_bad_input import Bystander, bad

from meshmq.config.model import StompConfig


@pytest.fixture
def bystander(broker):
    b = Bystander(broker, MemoryClient, MemoryRawClient)
    yield b
    b.client.disconnect()




# ------------------------------------------------------------------ malformed frames


@pytest.mark.parametrize(("payload", "reason"), [
    (b"SEND\ndestination/queue/a\n\nbody\x00", "missing ':' in header line 1"),
    (b"send\ndestination:/queue/a\n\nx\x00", "malformed command line"),
    (b"SE ND\ndestination:/queue/a\n\nx\x00", "malformed command line"),
    (b"SEND\n:value\n\nx\x00", "empty header name in header line 1"),
    (b"SEND\ndestination:/queue/a\ncontent-length:abc\n\nx\x00", "invalid content-length"),
    (b"SEND\ndestination:/queue/a\ncontent-length:-1\n\nx\x00", "invalid content-length"),
    (b"SEND\ndestination:/queue/a\ncontent-length:2\n\nxyz\x00",
     "frame body not terminated by NUL after content-length 2"),
])
def test_malformed_frame(broker, raw, bystander, payload, reason):
    err = bad(raw, payload)
    assert reason in err["message"]
    bystander.check()


def test_unknown_command(broker, raw, bystander):
    err = bad(raw, frame_bytes("FROBNICATE", [("x", "y")]))
    assert err["message"] == "Unknown STOMP action: FROBNICATE"
    bystander.check()


def test_server_command_from_client_is_rejected(broker, raw, bystander):
    err = bad(raw, frame_bytes("MESSAGE", [("destination", "/queue/x"),
                                            ("message-id", "1"), ("subscription", "1")]))
    assert "MESSAGE" in err["message"]
    bystander.check()


@pytest.mark.parametrize(("version", "command", "headers", "missing"), [
    ("1.2", "SEND", [], "destination"),
    ("1.0", "SEND", [], "destination"),
    ("1.2", "SUBSCRIBE", [("destination", "/queue/a")], "id"),
    ("1.1", "SUBSCRIBE", [("destination", "/queue/a")], "id"),
    ("1.2", "SUBSCRIBE", [("id", "1")], "destination"),
    ("1.2", "UNSUBSCRIBE", [], "id"),
    ("1.2", "ACK", [], "id"),
    ("1.2", "NACK", [], "id"),
    ("1.1", "ACK", [("message-id", "m")], "subscription"),
    ("1.1", "NACK", [("subscription", "s")], "message-id"),
    ("1.0", "ACK", [], "message-id"),
    ("1.2", "BEGIN", [], "transaction"),
    ("1.2", "COMMIT", [], "transaction"),
    ("1.0", "ABORT", [], "transaction"),
])
def test_missing_required_header(broker, raw, bystander, version, command, headers, missing):
    err = bad(raw, frame_bytes(command, [*headers, ("receipt", "r1")]), version)
    assert err["message"] == (f"{command} frame is missing the required header "
                              f"'{missing}'")
    assert err.get("receipt-id") == "r1"
    bystander.check()


@pytest.mark.parametrize(("version", "value", "reason"), [
    ("1.2", "a\\tb", "invalid escape sequence '\\t' in header 'x-h'"),
    ("1.1", "a\\rb", "invalid escape sequence '\\r' in header 'x-h'"),  # \r is 1.2 only
    ("1.2", "trailing\\", "invalid escape sequence '\\' at end of header 'x-h'"),
])
def test_bad_header_escape(broker, raw, bystander, version, value, reason):
    err = bad(raw, frame_bytes("SEND", [("destination", "/queue/esc"), ("x-h", value)]),
               version)
    assert err["message"] == reason
    bystander.check()


def test_backslash_is_literal_in_10(broker, raw, bystander):
    r = raw()
    r.connect(None)
    q = f"/queue/{uid('bs10')}"
    r.send_frame("SUBSCRIBE", [("destination", q)])
    r.send_frame("SEND", [("destination", q), ("x-h", "a\\tb")], b"x")
    msg = r.read_frame()
    assert msg["x-h"] == "a\\tb"
    bystander.check()


@pytest.mark.parametrize(("payload", "reason"), [
    (b"SEND\ndestination:/queue/a\nx-h:\xff\xfe\n\nx\x00", "invalid UTF-8 in header line 2"),
    (b"SEND\n\xc3(:v\n\nx\x00", "invalid UTF-8 in header line 1"),
    (b"S\xffND\n\nx\x00", "malformed command line"),
])
def test_invalid_utf8_in_headers(broker, raw, bystander, payload, reason):
    err = bad(raw, payload)
    assert err["message"] == reason
    bystander.check()


def test_invalid_utf8_in_connect(broker, raw, bystander):
    err = bad(raw, b"CONNECT\naccept-version:1.2\nlogin:\xff\n\n\x00", connect=False)
    assert "invalid UTF-8" in err["message"]
    bystander.check()


def test_binary_garbage(broker, raw, bystander):
    err = bad(raw, bytes(range(1, 256)) * 4 + b"\n\n\x00")
    assert err["message"]
    bystander.check()


# ------------------------------------------------------------------ limits


@pytest.fixture
def limited(broker_factory):
    return broker_factory(stomp=StompConfig(max_frame_size=4096, max_header_size=1024,
                                            max_headers=20))


@pytest.fixture
def timed(broker_factory):
    """Short timeouts on the broker's real timer (test_broker_stomp_timers.py checks
    each deadline on a clock it moves). No bystander here: on a busy machine a client
    can take longer than 300 ms from accept to CONNECT."""
    return broker_factory(stomp=StompConfig(frame_timeout_ms=300, connect_timeout_ms=300))


@pytest.fixture
def limited_bystander(limited):
    b = Bystander(limited, MemoryClient, MemoryRawClient)
    yield b
    b.client.disconnect()


def test_oversized_body_without_content_length(limited, raw, limited_bystander):
    r = raw(on=limited)
    r.connect("1.2")
    r.send_bytes(b"SEND\ndestination:/queue/big\n\n" + b"x" * 5000 + b"\x00")
    err = r.expect_error_and_close()
    assert err["message"] == "frame larger than 4096 bytes"
    limited_bystander.check()


def test_oversized_content_length_rejected_before_body(limited, raw, limited_bystander):
    r = raw(on=limited)
    r.connect("1.2")
    # only the header block is sent: the declared length alone is enough to refuse
    r.send_bytes(b"SEND\ndestination:/queue/big\ncontent-length:100000\n\n")
    err = r.expect_error_and_close()
    assert err["message"] == "frame larger than 4096 bytes"
    limited_bystander.check()


def test_frame_just_under_the_limit_is_fine(limited, raw, limited_bystander):
    r = raw(on=limited)
    r.connect("1.2")
    q = f"/queue/{uid('fit')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1")])
    head = f"SEND\ndestination:{q}\n\n".encode()
    body = b"y" * (4096 - len(head) - 1)
    r.send_bytes(head + body + b"\x00")
    msg = r.read_frame()
    assert msg.body == body
    limited_bystander.check()


def test_oversized_header_block(limited, raw, limited_bystander):
    r = raw(on=limited)
    r.connect("1.2")
    r.send_bytes(b"SEND\ndestination:/queue/a\nx-big:" + b"h" * 2000 + b"\n\nx\x00")
    err = r.expect_error_and_close()
    assert err["message"] == "header block larger than 1024 bytes"
    limited_bystander.check()


def test_too_many_headers(limited, raw, limited_bystander):
    r = raw(on=limited)
    r.connect("1.2")
    r.send_frame("SEND", [("destination", "/queue/a")] + [(f"h{i}", "v") for i in range(30)])
    err = r.expect_error_and_close()
    assert err["message"] == "too many headers (limit 20)"
    limited_bystander.check()


def test_partial_frame_that_never_completes_times_out(timed, raw):
    r = raw(on=timed)
    r.connect("1.2")
    r.send_bytes(b"SEND\ndestination:/queue/a\n\npartial body, no NUL")
    err = r.expect_error_and_close()
    assert "incomplete frame" in err["message"]
    assert timed.runtime.started


def test_no_connect_in_time(timed, raw):
    r = raw(on=timed)
    err = r.expect_error_and_close()
    assert "no CONNECT frame received in time" in err["message"]
    assert timed.runtime.started


# ------------------------------------------------------------------ semantic errors


@pytest.mark.parametrize(("destination", "reason"), [
    ("foo", "Illegal destination name: [foo]"),
    ("/bar/baz", "Illegal destination name: [/bar/baz]"),
    ("/queue/", "destination name is empty"),
    ("/queue/a..b", "empty segment"),
    ("/queue/orders.*", "cannot send to a wildcard destination"),
    ("/topic/orders.>", "cannot send to a wildcard destination"),
    ("/queue/a,/topic/b.*", "cannot send to a wildcard destination"),
    ("", "empty destination"),
])
def test_send_to_invalid_destination(broker, raw, bystander, destination, reason):
    err = bad(raw, frame_bytes("SEND", [("destination", destination), ("receipt", "r")], b"x"))
    assert reason in err["message"]
    assert err.get("receipt-id") == "r"
    bystander.check()




def test_subscribe_to_invalid_destination(broker, raw, bystander):
    err = bad(raw, frame_bytes("SUBSCRIBE", [("destination", "queue-without-slash"),
                                              ("id", "1")]))
    assert "Illegal destination name" in err["message"]
    bystander.check()


@pytest.mark.parametrize("selector", [
    "color = ", "a LIKE 3", "x IN ()", "JMSPriority >", "((a = 1)", "a = 'unterminated",
    "a BETWEEN 1", "= 5",
])
def test_invalid_selector(broker, raw, bystander, selector):
    err = bad(raw, frame_bytes("SUBSCRIBE", [("destination", "/queue/sel"), ("id", "1"),
                                              ("selector", selector), ("receipt", "r")]))
    message = err["message"]
    assert "selector" in message.lower() or "column" in message, message
    assert err.get("receipt-id") == "r"
    bystander.check()




def test_nack_in_stomp10(broker, raw, bystander):
    err = bad(raw, frame_bytes("NACK", [("message-id", "m1")]), None)
    assert "Unknown STOMP action: NACK" in err["message"]
    bystander.check()


@pytest.mark.parametrize(("headers", "reason"), [
    ([("priority", "high")], "header 'priority' must be an integer from 0 to 9, got 'high'"),
    ([("priority", "10")], "header 'priority' must be an integer from 0 to 9, got '10'"),
    ([("priority", "-1")], "header 'priority' must be an integer from 0 to 9, got '-1'"),
    ([("expires", "soon")], "header 'expires' must be an integer"),
    ([("expires", "-5")], "header 'expires' must be an integer from 0 to"),
    # Beyond a Java long (and the store's 64-bit field).
    ([("expires", "1" * 30)], "header 'expires' must be an integer from 0 to"),
    ([("JMSXGroupSeq", "-9")], "header 'JMSXGroupSeq' must be an integer from -1 to"),
    ([("JMSXGroupSeq", "2147483648")], "header 'JMSXGroupSeq' must be an integer"),
    ([("AMQ_SCHEDULED_DELAY", "-1")], "header 'AMQ_SCHEDULED_DELAY' must be an integer"),
    ([("AMQ_SCHEDULED_PERIOD", "later")], "header 'AMQ_SCHEDULED_PERIOD' must be an integer"),
    ([("AMQ_SCHEDULED_REPEAT", "-3")], "header 'AMQ_SCHEDULED_REPEAT' must be an integer"),
])
def test_bad_send_header_values(broker, raw, bystander, headers, reason):
    err = bad(raw, frame_bytes("SEND", [("destination", "/queue/hv"), ("persistent", "true"),
                                         *headers], b"x"))
    assert reason in err["message"]
    bystander.check()


def test_in_range_send_header_values_are_kept(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('hvok')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "s")])
    r.send_frame("SEND", [("destination", q), ("persistent", "true"),
                          ("JMSXGroupID", "g"), ("JMSXGroupSeq", "-1"),
                          ("AMQ_SCHEDULED_DELAY", "0"), ("expires", "0"), ("receipt", "r")],
                 b"kept")
    frame, _ = r.read_until("MESSAGE")
    assert frame.get("JMSXGroupSeq") == "-1"
    assert frame.get("AMQ_SCHEDULED_DELAY") == "0"


@pytest.mark.parametrize(("headers", "reason"), [
    ([("ack", "sometimes")], "invalid ack mode 'sometimes'"),
    ([("activemq.prefetchSize", "many")], "header 'activemq.prefetchSize' must be an integer"),
    ([("activemq.prefetchSize", "-1")],
     "header 'activemq.prefetchSize' must be an integer from 0 to 2147483647, got '-1'"),
    ([("activemq.prefetchSize", "99999999999999")],
     "header 'activemq.prefetchSize' must be an integer from 0 to 2147483647"),
    ([("activemq.priority", "128")], "header 'activemq.priority' must be an integer from -128"),
])
def test_bad_subscribe_header_values(broker, raw, bystander, headers, reason):
    err = bad(raw, frame_bytes("SUBSCRIBE", [("destination", "/queue/sh"), ("id", "1"),
                                              *headers]))
    assert reason in err["message"]
    bystander.check()


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_undefined_escape_in_frame_pipelined_behind_connect(broker, raw, bystander, version):
    """Frames that arrive in the same packet as CONNECT are parsed with the escaping of
    the version CONNECT negotiates: an undefined escape such as \\t is fatal there too."""
    r = raw()
    r.version = version
    r.send_bytes(
        frame_bytes("CONNECT", [("accept-version", version), ("host", "h")])
        + frame_bytes("SEND", [("destination", "/queue/esc"), ("x", "a\\tb")], b"x"))
    assert r.read_frame().command == "CONNECTED"
    err = r.expect_error_and_close()
    assert "invalid escape sequence '\\t' in header 'x'" in err["message"]
    bystander.check()


def test_escaped_header_pipelined_behind_connect_is_unescaped(broker, raw):
    r = raw()
    r.version = "1.2"
    q = f"/queue/{uid('esc')}"
    r.send_bytes(
        frame_bytes("CONNECT", [("accept-version", "1.2"), ("host", "h")])
        + frame_bytes("SUBSCRIBE", [("destination", q), ("id", "s")])
        + frame_bytes("SEND", [("destination", q), ("k", "a\\cb")], b"x"))
    frame, before = r.read_until("MESSAGE")
    assert [f.command for f in before] == ["CONNECTED"]
    assert frame.get("k") == "a:b"


def test_duplicate_subscription_id(broker, raw, bystander):
    r = raw()
    r.connect("1.2")
    r.send_frame("SUBSCRIBE", [("destination", "/queue/d1"), ("id", "same")])
    r.send_frame("SUBSCRIBE", [("destination", "/queue/d2"), ("id", "same")])
    err = r.expect_error_and_close()
    assert "'same' is already in use" in err["message"]
    bystander.check()


def test_ack_of_unknown_message(broker, raw, bystander):
    err = bad(raw, frame_bytes("ACK", [("id", "99-99")]))
    assert "unknown ack id '99-99'" in err["message"]
    bystander.check()


def test_unsubscribe_unknown_id(broker, raw, bystander):
    err = bad(raw, frame_bytes("UNSUBSCRIBE", [("id", "ghost")]))
    assert "no subscription with id 'ghost'" in err["message"]
    bystander.check()


def test_invalid_heartbeat_header(broker, raw, bystander):
    r = raw()
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "h"),
                             ("heart-beat", "often")])
    err = r.expect_error_and_close()
    assert "invalid heart-beat header 'often'" in err["message"]
    bystander.check()


def test_bad_frame_after_good_frames_in_one_packet(broker, raw, bystander):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('mixed')}"
    r.send_bytes(frame_bytes("SUBSCRIBE", [("destination", q), ("id", "1")])
                 + frame_bytes("SEND", [("destination", q)], b"good")
                 + b"garbage without colon\n\n\x00")
    frames = r.expect_closed()
    assert frames[-1].command == "ERROR"
    bystander.check()


def test_many_bad_clients_do_not_hurt_the_broker(broker, raw, bystander):
    payloads = [b"\x00\x01\x02\n\n\x00", b"FOO\n\n\x00", b"SEND\nno-colon\n\n\x00",
                b"CONNECT\naccept-version:9.9\n\n\x00"]
    clients = [raw() for _ in range(12)]
    for i, r in enumerate(clients):
        r.send_bytes(payloads[i % len(payloads)])
    for r in clients:
        r.expect_error_and_close()
    bystander.check()
    broker.wait_for(lambda: broker.stats()["connections"] == 1,
                    what="bad connections to be cleaned up")


def test_abrupt_disconnect_mid_frame(broker, raw, bystander):
    r = raw()
    r.connect("1.2")
    r.send_bytes(b"SEND\ndestination:/queue/abrupt\ncontent-length:100\n\nonly part")
    r.close()
    bystander.check()
    broker.wait_for(lambda: broker.stats()["connections"] == 1, what="the dead connection to go")
