"""STOMP headers and bodies across protocol versions, through the real STOMP session of a
broker driven in memory: each connection reads headers in its own version's escaping
(whatever version the producer spoke), reserved SEND headers are not passed on as
message properties, receipts and ERROR frames are escaped for the connection that gets
them, and bodies arrive byte for byte."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import MemoryRawClient, frame_bytes, uid

VERSIONS = ["1.0", "1.1", "1.2"]


def _connected(broker, version: str) -> MemoryRawClient:
    r = MemoryRawClient(broker)
    r.connect(None if version == "1.0" else version)
    return r


def _subscribed(broker, version: str, q: str) -> MemoryRawClient:
    r = _connected(broker, version)
    headers = [("destination", q), ("receipt", "sub")]
    if version != "1.0":
        headers.append(("id", "s"))
    r.send_frame("SUBSCRIBE", headers)
    r.read_until_receipt("sub")
    return r


def _wire_text(r: MemoryRawClient) -> str:
    """The bytes of the next complete frame, as the broker wrote them."""
    r.broker.wait_for(lambda: r.take() and b"\x00" in r.buf, what="a frame")
    return bytes(r.buf).decode("utf-8")


# A value with every character some version escapes: ':', LF, backslash and CR.
NASTY = "a:b\nc\\d\re"
# What each version's consumer reads: 1.0 has no escaping, so LF and CR become spaces
# (a 1.0 peer could not tell a line break from the end of the header); 1.1 and 1.2
# round-trip the text exactly.
READ_AS = {"1.0": "a:b c\\d e", "1.1": NASTY, "1.2": NASTY}


@pytest.mark.parametrize("consumer_version", VERSIONS)
def test_each_consumer_reads_a_header_in_its_own_version(broker, consumer_version):
    q = f"/queue/{uid('xver')}"
    consumer = _subscribed(broker, consumer_version, q)
    producer = _connected(broker, "1.2")
    escaped = NASTY.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c") \
        .replace("\r", "\\r")
    producer.send_frame("SEND", [("destination", q), ("x-nasty", escaped)], b"x")
    msg = consumer.read_frame()
    assert msg["x-nasty"] == READ_AS[consumer_version]


@pytest.mark.parametrize("consumer_version", VERSIONS)
def test_a_stomp10_header_with_colons_and_backslashes_reaches_every_version(
        broker, consumer_version):
    q = f"/queue/{uid('from10')}"
    consumer = _subscribed(broker, consumer_version, q)
    producer = _connected(broker, "1.0")
    producer.send_frame("SEND", [("destination", q), ("path", "C:\\dir\\n")], b"x")
    assert consumer.read_frame()["path"] == "C:\\dir\\n"


def test_stomp11_escapes_colon_lf_and_backslash_but_sends_cr_as_is(broker):
    q = f"/queue/{uid('esc11')}"
    consumer = _subscribed(broker, "1.1", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("k\\cx", "1\\c2\\n3\\\\4\\r5")], b"x")
    text = _wire_text(consumer)
    assert "\nk\\cx:1\\c2\\n3\\\\4\r5\n" in text
    assert consumer.read_frame()["k:x"] == "1:2\n3\\4\r5"


def test_non_ascii_header_names_and_values_round_trip(broker):
    q = f"/queue/{uid('utf8')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("größe", "日本語 ✓")], b"x")
    assert consumer.read_frame()["größe"] == "日本語 ✓"


def test_an_empty_header_value_is_kept(broker):
    q = f"/queue/{uid('empty')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("x-empty", "")], b"x")
    assert consumer.read_frame().get("x-empty") == ""


def test_reserved_send_headers_are_not_passed_on(broker):
    q = f"/queue/{uid('reserved')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("BEGIN", [("transaction", "t")])
    producer.send_frame("SEND", [("destination", q), ("receipt", "r-1"), ("transaction", "t"),
                                 ("message-id", "forged"), ("redelivered", "true"),
                                 ("subscription", "forged"), ("x-kept", "yes")], b"x")
    producer.send_frame("COMMIT", [("transaction", "t"), ("receipt", "c")])
    producer.read_until_receipt("c")
    msg = consumer.read_frame()
    names = [k for k, _ in msg.headers]
    assert "receipt" not in names
    assert "transaction" not in names
    assert msg["message-id"] != "forged"
    assert msg["subscription"] == "s"
    assert msg.get("redelivered") is None
    assert msg["x-kept"] == "yes"
    assert len(names) == len(set(names)), msg.headers  # each header once


def test_topic_subscribers_share_the_message_id_but_not_the_subscription(broker):
    t = f"/topic/{uid('share')}"
    a = _subscribed(broker, "1.2", t)
    b = _connected(broker, "1.1")
    b.send_frame("SUBSCRIBE", [("destination", t), ("id", "other"), ("receipt", "s")])
    b.read_until_receipt("s")
    p = _connected(broker, "1.2")
    p.send_frame("SEND", [("destination", t)], b"fan")
    ma, mb = a.read_frame(), b.read_frame()
    assert ma["message-id"] == mb["message-id"]
    assert (ma["subscription"], mb["subscription"]) == ("s", "other")


@pytest.mark.parametrize("version", VERSIONS)
def test_receipt_ids_come_back_as_sent(broker, version):
    r = _connected(broker, version)
    rid = "id:with\\colon" if version == "1.0" else "id\\cwith\\\\colon"
    r.send_frame("BEGIN", [("transaction", "t"), ("receipt", rid)])
    receipt = r.read_frame()
    assert receipt.command == "RECEIPT"
    assert receipt["receipt-id"] == "id:with\\colon"


@pytest.mark.parametrize("version", VERSIONS)
def test_error_frames_are_written_in_the_connections_version(broker, version):
    r = _connected(broker, version)
    r.send_frame("SEND", [("destination", "nowhere"), ("receipt", "bad")], b"x")
    text = _wire_text(r)
    # the reason names the illegal destination, with a ':' in it
    if version == "1.0":
        assert "\nmessage:Illegal destination name: [nowhere]" in text
    else:
        assert "\nmessage:Illegal destination name\\c [nowhere]" in text
    err = r.expect_error_and_close()
    assert err["message"].startswith("Illegal destination name: [nowhere]")
    assert err["receipt-id"] == "bad"


@pytest.mark.parametrize(("value", "persistent"), [
    ("true", True), ("TRUE", True), ("yes", True), ("1", True),
    ("false", False), ("0", False), ("", False),
])
def test_persistent_header_spellings(broker, value, persistent):
    q = f"/queue/{uid('pers')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("persistent", value)], b"x")
    msg = consumer.read_frame()
    assert (msg.get("persistent") == "true") is persistent


def test_a_body_without_content_length_ends_at_the_first_nul(broker):
    q = f"/queue/{uid('nulend')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_bytes(b"SEND\ndestination:" + q.encode() + b"\n\nbefore\x00"
                        + frame_bytes("SEND", [("destination", q)], b"second"))
    first, second = consumer.read_frame(), consumer.read_frame()
    assert (first.body, second.body) == (b"before", b"second")
    assert first["content-length"] == "6"


def test_binary_body_without_nul_needs_no_content_length(broker):
    q = f"/queue/{uid('bin')}"
    body = bytes(range(1, 256))
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q)], body)
    msg = consumer.read_frame()
    assert msg.body == body
    assert msg["content-length"] == "255"


def test_content_length_counts_bytes_not_characters(broker):
    q = f"/queue/{uid('clen')}"
    body = "ünïcödé ✓".encode()
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("content-length", str(len(body)))], body)
    assert consumer.read_frame().body == body


def test_a_content_length_header_from_the_producer_is_replaced_by_the_real_one(broker):
    """MESSAGE frames carry the length of the body they carry, once."""
    q = f"/queue/{uid('clen2')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), ("content-length", "4")], b"abcd")
    msg = consumer.read_frame()
    assert [v for k, v in msg.headers if k == "content-length"] == ["4"]


@pytest.mark.parametrize("header", ["correlation-id", "type", "JMSXGroupID", "content-type"])
def test_escaped_standard_headers_survive(broker, header):
    q = f"/queue/{uid('std')}"
    consumer = _subscribed(broker, "1.2", q)
    producer = _connected(broker, "1.2")
    producer.send_frame("SEND", [("destination", q), (header, "a\\cb\\nc")], b"x")
    assert consumer.read_frame()[header] == "a:b\nc"
