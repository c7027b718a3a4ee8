"""STOMP 1.0/1.1/1.2 protocol behaviour, frame by frame, without sockets."""

from __future__ import annotations

import time

import pytest
from tests.support.raw_stomp import ClosedError, MemoryRawClient, escape, frame_bytes, uid

from meshmq.config.model import StompConfig

# ------------------------------------------------------------------ connect / negotiation




@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
@pytest.mark.parametrize(("accept", "expected"), [
    (None, "1.0"), ("1.0", "1.0"), ("1.1", "1.1"), ("1.0,1.1", "1.1"),
    ("1.1,1.2", "1.2"), ("1.0,1.1,1.2", "1.2"), ("1.2,3.0", "1.2"),
])
def test_version_negotiation_picks_highest_common(broker, raw, command, accept, expected):
    r = raw()
    connected = r.connect(accept, command=command)
    assert connected["version"] == expected
    assert connected.get("session")
    if expected == "1.0":
        assert connected.get("heart-beat") is None
    else:
        assert connected["heart-beat"] == "0,0"


@pytest.mark.parametrize("accept", ["2.0", "0.9,3.1", ""])
def test_unsupported_version_gets_error_listing_versions_then_close(broker, raw, accept):
    r = raw()
    r.send_frame("CONNECT", [("accept-version", accept), ("host", "localhost")])
    err = r.expect_error_and_close()
    assert err["version"] == "1.0,1.1,1.2"
    assert "1.0,1.1,1.2" in err["message"]


def test_connect_receipt_follows_connected(broker, raw):
    r = raw()
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "x"), ("receipt", "c-1")])
    assert r.read_frame().command == "CONNECTED"
    receipt = r.read_frame()
    assert receipt.command == "RECEIPT"
    assert receipt["receipt-id"] == "c-1"


def test_second_connect_is_an_error(broker, raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")])
    err = r.expect_error_and_close()
    assert "already connected" in err["message"]


def test_frame_before_connect_is_rejected(broker, raw):
    r = raw()
    r.send_frame("SEND", [("destination", "/queue/early")], b"x")
    err = r.expect_error_and_close()
    assert "before CONNECT" in err["message"]


# ------------------------------------------------------------------ heart-beats


def test_server_sends_heartbeats_when_asked_raw(broker_factory, raw):
    b = broker_factory(stomp=StompConfig(server_heartbeat_ms=100))
    r = raw(on=b)
    connected = r.connect("1.2", heartbeat="0,100")
    sx, sy = (int(x) for x in connected["heart-beat"].split(","))
    assert sx == 100
    assert sy == 0
    deadline = time.monotonic() + 10
    while r.heartbeats < 3:
        with pytest.raises(TimeoutError):
            # nothing but heart-beats may arrive: no frame ever completes
            r.read_frame(timeout=max(0.001, min(0.5, deadline - time.monotonic())))
        assert time.monotonic() < deadline, "no heart-beats from the broker"


def test_server_sends_no_heartbeats_when_not_asked(broker_factory, raw):
    b = broker_factory(stomp=StompConfig(server_heartbeat_ms=50))
    r = raw(on=b)
    connected = r.connect("1.2", heartbeat="0,0")
    assert connected["heart-beat"].split(",")[0] == "0"
    r.receipt_roundtrip()
    r.receipt_roundtrip()
    assert r.heartbeats == 0




def test_broker_closes_silent_client_after_grace(broker_factory, raw):
    b = broker_factory(stomp=StompConfig(heartbeat_grace=1.5))
    r = raw(on=b)
    connected = r.connect("1.2", heartbeat="100,0")
    # the broker expects a beat from us at least every 100 ms
    assert connected["heart-beat"].split(",")[1] == "100"
    t0 = time.monotonic()
    err = r.expect_error_and_close(timeout=10)
    assert "heart-beat" in err["message"]
    assert time.monotonic() - t0 >= 0.1  # not (much) before interval * grace
    b.wait_for(lambda: b.stats()["connections"] == 0, what="the connection to be forgotten")




def test_heartbeat_eols_from_client_are_ignored_between_frames(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('eol')}"
    r.send_bytes(b"\n\r\n\n" + frame_bytes("SUBSCRIBE", [("destination", q), ("id", "1")])
                 + b"\n\n" + frame_bytes("SEND", [("destination", q)], b"b") + b"\r\n")
    msg = r.read_frame()
    assert msg.command == "MESSAGE"
    assert msg.body == b"b"


# ------------------------------------------------------------------ receipts on every frame


def test_receipt_on_every_client_frame_raw_12(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('rcpt')}"

    def expect_receipt(rid):
        frame, before = r.read_until("RECEIPT")
        assert frame["receipt-id"] == rid
        return before

    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "s"), ("ack", "client-individual"),
                               ("receipt", "r-sub")])
    expect_receipt("r-sub")
    r.send_frame("SEND", [("destination", q), ("receipt", "r-send")], b"one")
    expect_receipt("r-send")
    msgs = [f for f in r.receipt_roundtrip() if f.command == "MESSAGE"]
    assert len(msgs) == 1
    r.send_frame("NACK", [("id", msgs[0]["ack"]), ("receipt", "r-nack")])
    expect_receipt("r-nack")
    again = [f for f in r.receipt_roundtrip() if f.command == "MESSAGE"]
    assert len(again) == 1
    assert again[0].get("redelivered") == "true"
    r.send_frame("BEGIN", [("transaction", "t1"), ("receipt", "r-begin")])
    expect_receipt("r-begin")
    r.send_frame("ACK", [("id", again[0]["ack"]), ("transaction", "t1"), ("receipt", "r-ack")])
    expect_receipt("r-ack")
    r.send_frame("COMMIT", [("transaction", "t1"), ("receipt", "r-commit")])
    expect_receipt("r-commit")
    r.send_frame("BEGIN", [("transaction", "t2"), ("receipt", "r-begin2")])
    expect_receipt("r-begin2")
    r.send_frame("ABORT", [("transaction", "t2"), ("receipt", "r-abort")])
    expect_receipt("r-abort")
    r.send_frame("UNSUBSCRIBE", [("id", "s"), ("receipt", "r-unsub")])
    expect_receipt("r-unsub")
    r.send_frame("DISCONNECT", [("receipt", "r-disc")])
    frames = r.expect_closed()
    assert [f.command for f in frames] == ["RECEIPT"]
    assert frames[0]["receipt-id"] == "r-disc"






# ------------------------------------------------------------------ transactions


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_transaction_commit_delivers_and_abort_discards(broker, client, version):
    producer = client(version)
    consumer = client(version)
    q = f"/queue/{uid('tx')}"
    consumer.subscribe(q, "s")
    producer.begin("t1")
    producer.conn.send(q, "in-tx-1", headers={"transaction": "t1"})
    producer.conn.send(q, "in-tx-2", headers={"transaction": "t1"})
    producer.send(q, "outside")  # receipt: everything before it was handled
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies() == ["outside"]
    producer.commit("t1")
    consumer.wait_messages(3)
    assert consumer.bodies() == ["outside", "in-tx-1", "in-tx-2"]

    producer.begin("t2")
    producer.conn.send(q, "aborted", headers={"transaction": "t2"})
    producer.abort("t2")
    producer.send(q, "marker")
    consumer.wait_messages(4)
    consumer.barrier()
    assert consumer.bodies() == ["outside", "in-tx-1", "in-tx-2", "marker"]


def test_transactional_ack_abort_keeps_message_unacked(broker, client):
    c = client("1.2")
    q = f"/queue/{uid('txack')}"
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.begin("t")
    c.ack(m, transaction="t")
    c.abort("t")
    c.disconnect()
    # the aborted ack did not consume it: the next consumer gets it redelivered
    c2 = client("1.2")
    c2.subscribe(q, "s2")
    (again,) = c2.wait_messages(1)
    assert again.body == "m"
    assert again.headers.get("redelivered") == "true"


def test_transactional_ack_commit_consumes(broker, client):
    c = client("1.2")
    q = f"/queue/{uid('txack')}"
    c.subscribe(q, "s", ack="client-individual")
    c.send(q, "m")
    (m,) = c.wait_messages(1)
    c.begin("t")
    c.ack(m, transaction="t")
    c.commit("t")
    c.disconnect()
    c2 = client("1.2")
    c2.subscribe(q, "s2")
    c2.send(q, "marker")
    c2.wait_messages(1)
    c2.barrier()
    assert c2.bodies() == ["marker"]


def test_unknown_transaction_is_an_error(broker, raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("COMMIT", [("transaction", "nope"), ("receipt", "x")])
    err = r.expect_error_and_close()
    assert "nope" in err["message"]
    assert err.get("receipt-id") == "x"


# ------------------------------------------------------------------ header encoding




def test_header_escaping_on_the_wire_12(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('escw')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1"), ("receipt", "s")])
    r.read_until("RECEIPT")
    # escaped on the way in: colon, LF, backslash and CR (1.2 only), and in a header name
    r.send_frame("SEND", [("destination", q), ("k\\cey", "v\\c1\\n2\\\\3\\r4")], b"x")
    r.broker.wait_for(lambda: r.take() and b"\x00" in r.buf, what="the MESSAGE bytes")
    text = bytes(r.buf).decode()
    assert "\nk\\cey:v\\c1\\n2\\\\3\\r4\n" in text
    msg = r.read_frame()
    assert msg["k:ey"] == "v:1\n2\\3\r4"


def test_stomp10_header_values_are_not_unescaped(broker, raw):
    r = raw()
    r.connect(None)  # 1.0
    q = f"/queue/{uid('esc10')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("receipt", "s")])
    r.read_until("RECEIPT")
    r.send_frame("SEND", [("destination", q), ("path", "C:\\temp\\n"), ("url", "a:b:c")], b"x")
    msg = r.read_frame()
    assert msg["path"] == "C:\\temp\\n"
    assert msg["url"] == "a:b:c"


def test_content_length_body_with_nuls_raw(broker, raw):
    body = b"\x00a\x00\x00b\x00\xff\xfe\x00"
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('nul')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1"), ("receipt", "s")])
    r.read_until("RECEIPT")
    r.send_frame("SEND", [("destination", q), ("content-length", str(len(body))),
                          ("receipt", "p")], body)
    msg, _ = r.read_until("MESSAGE")
    assert msg.body == body
    assert msg["content-length"] == str(len(body))




def test_content_length_zero_and_binary_body_between_frames(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('cl0')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1")])
    r.send_bytes(frame_bytes("SEND", [("destination", q), ("content-length", "0")])
                 + frame_bytes("SEND", [("destination", q), ("content-length", "3")],
                               b"\x00\x00\x00"))
    first = r.read_frame()
    second = r.read_frame()
    assert (first.body, second.body) == (b"", b"\x00\x00\x00")


def test_repeated_headers_first_wins(broker, raw):
    r = raw()
    r.connect("1.2")
    q1 = f"/queue/{uid('rep')}"
    q2 = f"/queue/{uid('rep')}"
    r.send_frame("SUBSCRIBE", [("destination", q1), ("id", "1")])
    r.send_frame("SUBSCRIBE", [("destination", q2), ("id", "2"), ("receipt", "s")])
    r.read_until("RECEIPT")
    r.send_frame("SEND", [("destination", q1), ("destination", q2), ("color", "red"),
                          ("color", "blue"), ("receipt", "p")], b"x")
    frames = r.read_until_receipt("p") + r.receipt_roundtrip()
    msgs = [f for f in frames if f.command == "MESSAGE"]
    assert len(msgs) == 1
    assert msgs[0]["destination"] == q1
    assert msgs[0]["subscription"] == "1"
    assert [v for k, v in msgs[0].headers if k == "color"] == ["red"]




@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_crlf_line_endings(broker, raw, version):
    r = raw()
    r.send_bytes(frame_bytes("CONNECT", [("accept-version", version), ("host", "h")],
                             eol=b"\r\n"))
    connected = r.read_frame()
    assert connected.command == "CONNECTED"
    r.version = connected["version"]
    q = f"/queue/{uid('crlf')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1"), ("receipt", "s")],
                 eol=b"\r\n")
    assert r.read_frame()["receipt-id"] == "s"
    r.send_frame("SEND", [("destination", q), ("k", "v")], b"line1\r\nline2", eol=b"\r\n")
    msg = r.read_frame()
    assert msg.command == "MESSAGE"
    assert msg["k"] == "v"  # no stray CR in the value
    assert msg["destination"] == q
    assert msg.body == b"line1\r\nline2"


def test_frames_split_across_many_packets(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('split')}"
    data = (frame_bytes("SUBSCRIBE", [("destination", q), ("id", "1")])
            + frame_bytes("SEND", [("destination", q), ("content-length", "5")], b"a\x00b\x00c"))
    for i in range(len(data)):
        r.send_bytes(data[i:i + 1])
    msg = r.read_frame()
    assert msg.body == b"a\x00b\x00c"


def test_escape_helper_is_consistent():
    assert escape("a:b\n\\") == "a\\cb\\n\\\\"


def test_raw_client_detects_close(broker):
    r = MemoryRawClient(broker)
    try:
        r.connect("1.2")
        r.send_frame("DISCONNECT")
        with pytest.raises(ClosedError):
            r.read_frame()
    finally:
        r.close()


def test_default_heartbeat_applies_to_connect_without_header(broker_factory, raw):
    b = broker_factory(stomp=StompConfig(default_heartbeat=(100, 0)))
    r = raw(on=b)
    connected = r.connect("1.2")  # no heart-beat header: assumed "100,0"
    assert connected["heart-beat"] == "0,100"
    err = r.expect_error_and_close()
    assert "heart-beat" in err["message"]


def test_max_heartbeat_caps_what_a_client_may_ask_for(broker_factory, raw):
    # docs/config.md: stomp.max_heartbeat_ms is the "cap on heart-beat intervals a client
    # may ask for". A client promising a beat only every minute is held to the cap, so a
    # silent one is detected after cap x grace, not after a minute and a half.
    b = broker_factory(stomp=StompConfig(max_heartbeat_ms=200))
    r = raw(on=b)
    r.connect("1.2", heartbeat="60000,0")
    try:
        err = r.expect_error_and_close(timeout=5)
    except TimeoutError:
        pytest.fail("a silent client that asked for a 60 s interval was not closed within "
                    "5 s although stomp.max_heartbeat_ms=200")
    assert "heart-beat" in err["message"]


def test_stomp10_ignores_heartbeat_header(broker_factory, raw):
    b = broker_factory(stomp=StompConfig(server_heartbeat_ms=50))
    r = raw(on=b)
    connected = r.connect(None, heartbeat="100,100")
    assert connected["version"] == "1.0"
    assert connected.get("heart-beat") is None
    r.receipt_roundtrip()
    r.receipt_roundtrip()
    assert r.heartbeats == 0


def test_unsubscribe_by_destination_in_10(broker, raw):
    r = raw()
    r.connect(None)
    q = f"/queue/{uid('u10')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("receipt", "s")])
    r.read_until_receipt("s")
    r.send_frame("SEND", [("destination", q), ("receipt", "p1")], b"one")
    frames = r.read_until_receipt("p1") + r.receipt_roundtrip()
    assert [f.body for f in frames if f.command == "MESSAGE"] == [b"one"]
    r.send_frame("UNSUBSCRIBE", [("destination", q), ("receipt", "u")])
    r.read_until_receipt("u")
    r.send_frame("SEND", [("destination", q), ("receipt", "p2")], b"two")
    frames = r.read_until_receipt("p2") + r.receipt_roundtrip()
    assert [f for f in frames if f.command == "MESSAGE"] == []


def test_message_frames_carry_content_length(broker, raw):
    r = raw()
    r.connect("1.2")
    q = f"/queue/{uid('clen')}"
    r.send_frame("SUBSCRIBE", [("destination", q), ("id", "1")])
    r.send_frame("SEND", [("destination", q)], "héllo".encode())
    msg = r.read_frame()
    assert msg["content-length"] == str(len("héllo".encode()))
    assert msg.body.decode() == "héllo"


def test_error_frame_for_bad_frame_carries_receipt_id(broker, raw):
    r = raw()
    r.connect("1.2")
    r.send_frame("SEND", [("destination", "/queue/a.*"), ("receipt", "wild-1")], b"x")
    err = r.expect_error_and_close()
    assert err["receipt-id"] == "wild-1"
    assert err.get("content-type", "").startswith("text/plain")
    assert err.body.decode() .startswith("cannot send to a wildcard destination")
