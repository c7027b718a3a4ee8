"""MESSAGE frames as the STOMP session writes them: one message fanned out to many
subscribers (each frame carries its own subscriber's headers, the rest is shared),
redeliveries among first deliveries, and large bodies written by reference (no copy
into a frame) in order with the small frames around them."""

from __future__ import annotations

import pytest
from tests.support.raw_stomp import MemoryRawClient, RawFrame, uid

from meshmq.transport.stomp_server import LARGE_BODY


def _subscribe(broker, dest: str, sub_id: str, version: str = "1.2",
               ack: str = "auto") -> MemoryRawClient:
    r = MemoryRawClient(broker)
    r.connect(version)
    r.send_frame("SUBSCRIBE", [("destination", dest), ("id", sub_id), ("ack", ack),
                               ("receipt", "sub")])
    r.read_until_receipt("sub")
    return r


def _producer(broker) -> MemoryRawClient:
    r = MemoryRawClient(broker)
    r.connect("1.2")
    return r


def _send(producer: MemoryRawClient, dest: str, body: bytes, **headers: str) -> None:
    producer.send_frame("SEND", [("destination", dest), ("content-length", str(len(body))),
                                 *headers.items()], body)


def _own(frame: RawFrame) -> dict[str, str | None]:
    return {name: frame.get(name) for name in
            ("subscription", "ack", "redelivered", "JMSXDeliveryCount")}


def test_fan_out_gives_each_subscriber_its_own_headers_and_the_same_message(broker):
    topic = f"/topic/{uid('fan')}"
    subs = [_subscribe(broker, topic, f"auto-{n}") for n in range(3)]
    acking = _subscribe(broker, topic, "acking", ack="client-individual")
    old = _subscribe(broker, topic, "s:1.1", version="1.1")
    producer = _producer(broker)
    for n in range(2):
        _send(producer, topic, b"body-%d" % n, app="a:b")
    for n in range(2):
        frames = [r.read_frame() for r in [*subs, acking, old]]
        assert [f.body for f in frames] == [b"body-%d" % n] * 5
        assert {f["message-id"] for f in frames} == {frames[0]["message-id"]}
        assert [f["app"] for f in frames] == ["a:b"] * 5
        assert [f["content-length"] for f in frames] == [str(len(b"body-0"))] * 5
        assert [_own(f) for f in frames[:3]] == [
            {"subscription": f"auto-{k}", "ack": None, "redelivered": None,
             "JMSXDeliveryCount": None} for k in range(3)]
        assert frames[3]["subscription"] == "acking"
        assert frames[3]["ack"].endswith(f"-{n + 1}")  # the tag of this delivery
        assert frames[4]["subscription"] == "s:1.1"  # escaped as 1.1, read back as is
        acking.send_frame("ACK", [("id", frames[3]["ack"])])


def test_a_redelivery_between_first_deliveries_keeps_its_headers_to_itself(broker):
    queue = f"/queue/{uid('redeliver')}"
    producer = _producer(broker)
    first = _subscribe(broker, queue, "first", ack="client-individual")
    _send(producer, queue, b"again")
    nacked = first.read_frame()
    assert nacked.get("redelivered") is None
    first.send_frame("NACK", [("id", nacked["ack"]), ("receipt", "n")])
    again = first.read_until("MESSAGE")[0]
    assert again.body == b"again"
    assert again["redelivered"] == "true"
    assert again["JMSXDeliveryCount"] == "2"
    first.send_frame("ACK", [("id", again["ack"])])
    first.send_frame("UNSUBSCRIBE", [("id", "first"), ("receipt", "u")])
    first.read_until_receipt("u")
    # An auto-ack subscriber of the same connection: a plain first delivery after it.
    first.send_frame("SUBSCRIBE", [("destination", queue), ("id", "later"), ("ack", "auto"),
                                   ("receipt", "s2")])
    first.read_until_receipt("s2")
    _send(producer, queue, b"fresh")
    fresh = first.read_frame()
    assert (fresh.body, _own(fresh)) == (b"fresh", {
        "subscription": "later", "ack": None, "redelivered": None,
        "JMSXDeliveryCount": None})


@pytest.mark.parametrize("size", [LARGE_BODY - 1, LARGE_BODY, 1024 * 1024 + 3])
def test_large_bodies_arrive_whole_and_in_order_with_small_ones(broker, size):
    queue = f"/queue/{uid('large')}"
    consumer = _subscribe(broker, queue, "big")
    calls: list[int] = []
    writelines = consumer.transport.writelines

    def counting(chunks: list[bytes]) -> None:
        calls.append(len(chunks))
        writelines(chunks)

    consumer.transport.writelines = counting  # type: ignore[method-assign]
    producer = _producer(broker)
    large = bytes(range(256)) * (size // 256) + b"\x00" * (size % 256)
    # One read with small, large, small: one pump, one flush of all three frames.
    producer.send_bytes(b"".join(
        b"SEND\ndestination:%s\ncontent-length:%d\n\n%s\x00" % (queue.encode(), len(b), b)
        for b in (b"before", large, b"after")))
    frames = [consumer.read_frame() for _ in range(3)]
    assert [f.body for f in frames] == [b"before", large, b"after"]
    assert [f["content-length"] for f in frames] == ["6", str(size), "5"]
    assert [f["subscription"] for f in frames] == ["big"] * 3
    # A body from LARGE_BODY on goes out by reference, the frames around it with it.
    assert calls == ([] if size < LARGE_BODY else [5])
