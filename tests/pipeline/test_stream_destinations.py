"""Stream destinations: offsets, x-stream-offset, retention, restarts, STOMP."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.client.simple_stomp import SimpleStompClient, StompClientError
from meshmq.config.model import BrokerConfig, StreamPolicy
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, ConsumerSpec
from meshmq.core.stream import StreamOffset, StreamQueue, parse_offset
from meshmq.errors import DestinationError, ProtocolError
from meshmq.protocol.stomp import StompParser, encode_frame
from meshmq.store.journal import JournalStore
from tests.support.brokers import ThreadBroker, make_config
from tests.unit.core.test_broker_core import Clock, connect, pump, send

STREAMS = (StreamPolicy(match="queue://stream.>", max_bytes=0),)


@given(st.integers(0, 1 << 62))
def test_offsets_parse_in_every_spelling(n: int) -> None:
    assert parse_offset(f"offset={n}") == parse_offset(str(n)) == StreamOffset("offset", n)
    assert parse_offset(f"timestamp={n % 10**10}") == StreamOffset("timestamp",
                                                                  n % 10**10 * 1000)
    for word in ("first", "last", "next", " NEXT "):
        assert parse_offset(word) == StreamOffset(word.strip().lower())


@given(st.text(st.characters(exclude_categories=("Nd",)))
       .filter(lambda t: t.strip().lower() not in ("first", "last", "next")))
def test_bad_offsets_are_protocol_errors_naming_the_header(text: str) -> None:
    with pytest.raises(ProtocolError, match="x-stream-offset"):
        parse_offset(text)
    with pytest.raises(ProtocolError):
        parse_offset("offset=-1")


def make(tmp_path: Path, streams: tuple[StreamPolicy, ...] = STREAMS,
         clock: Clock | None = None) -> tuple[Broker, JournalStore]:
    store = JournalStore(tmp_path / "j", fsync=False)
    broker = Broker(dataclasses.replace(BrokerConfig(broker_name="s"), streams=streams),
                    store, clock=clock)
    broker.recover(store.open())
    return broker, store


def read(broker: Broker, store: JournalStore, offset: str | None, sid: str,
         **spec: object) -> list[tuple[str, object]]:
    from meshmq.core import destinations as dst

    conn = connect(broker)
    broker.subscribe(conn, sid, ConsumerSpec(destinations=(dst.queue("stream.s"),),
                                             **spec),  # type: ignore[arg-type]
                     stream_offset=parse_offset(offset) if offset else None)
    return [(d.message.body.decode(), d.message.properties["x-stream-offset"])
            for d in pump(broker, store)]


def test_consumers_read_from_any_offset_without_consuming(tmp_path: Path) -> None:
    clock = Clock()
    broker, store = make(tmp_path, clock=clock)
    conn = connect(broker)
    for i in range(10):
        clock.now = 1_000_000 + i * 1000
        send(broker, conn, "stream.s", f"m{i}", timestamp=clock.now)
    pump(broker, store)
    assert read(broker, store, "first", "a") == [(f"m{i}", i) for i in range(10)]
    assert read(broker, store, "offset=7", "b") == [("m7", 7), ("m8", 8), ("m9", 9)]
    assert read(broker, store, "last", "c") == [("m9", 9)]
    assert read(broker, store, "next", "d") == []
    assert read(broker, store, None, "e") == []  # next is the default
    assert read(broker, store, "timestamp=1005", "f")[0] == ("m5", 5)
    assert read(broker, store, "offset=99", "g") == []  # beyond the end: waits
    send(broker, conn, "stream.s", "m10")
    got = pump(broker, store)
    # Every live subscriber gets the new message; the first ones were at the end.
    assert sorted(d.consumer.subscription_id for d in got) == ["a", "b", "c", "d", "e", "f",
                                                                "g"]
    stream = broker.queues[next(iter(broker.queues))]
    assert isinstance(stream, StreamQueue) and stream.depth == 11
    asyncio.run(store.close())


def test_client_acks_only_open_the_window(tmp_path: Path) -> None:
    broker, store = make(tmp_path)
    conn = connect(broker)
    for i in range(5):
        send(broker, conn, "stream.s", f"m{i}")
    pump(broker, store)
    from meshmq.core import destinations as dst

    reader = connect(broker)
    consumer = broker.subscribe(reader, "r", ConsumerSpec(
        destinations=(dst.queue("stream.s"),), ack_mode=AckMode.CLIENT_INDIVIDUAL,
        prefetch=2), stream_offset=StreamOffset("first"))
    first = pump(broker, store)
    assert [d.message.body for d in first] == [b"m0", b"m1"]
    broker.nack(reader, consumer, first[0].tag, cumulative=False)  # no redelivery
    broker.ack(reader, consumer, first[1].tag, cumulative=False)
    assert [d.message.body for d in pump(broker, store)] == [b"m2", b"m3"]
    assert read(broker, store, "first", "again")[0] == ("m0", 0)  # nothing was removed
    asyncio.run(store.close())


def test_retention_by_size_and_age_and_offsets_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    policy = (StreamPolicy(match="queue://stream.>", max_bytes=30, max_age_ms=10_000),)
    broker, store = make(tmp_path, policy, clock)
    conn = connect(broker)
    for i in range(10):
        send(broker, conn, "stream.s", f"body{i}", timestamp=clock.now)  # 5 bytes each
    pump(broker, store)
    assert [o for _, o in read(broker, store, "first", "a")] == [4, 5, 6, 7, 8, 9]
    clock.now += 20_000
    send(broker, conn, "stream.s", "new", timestamp=clock.now)
    broker.tick()
    pump(broker, store)
    assert read(broker, store, "first", "b") == [("new", 10)]
    asyncio.run(store.close())

    again, store = make(tmp_path, policy, clock)
    assert read(again, store, "first", "c") == [("new", 10)]
    send(again, connect(again), "stream.s", "after")
    pump(again, store)
    assert read(again, store, "offset=0", "d") == [("new", 10), ("after", 11)]
    asyncio.run(store.close())


def test_stream_offset_on_a_plain_queue_is_refused(tmp_path: Path) -> None:
    from meshmq.core import destinations as dst

    broker, store = make(tmp_path)
    with pytest.raises(DestinationError, match="not a stream"):
        broker.subscribe(connect(broker), "x", ConsumerSpec(destinations=(dst.queue("q"),)),
                         stream_offset=StreamOffset("first"))
    asyncio.run(store.close())


def raw_subscribe(port: int, headers: list[tuple[str, str]]) -> list[object]:
    """SUBSCRIBE with a receipt over a raw socket; the frames that come back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        parser = StompParser(version="1.2")
        sock.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
        sock.sendall(encode_frame("SUBSCRIBE", [("destination", "/queue/stream.s"),
                                                ("id", "1"), ("receipt", "r"), *headers]))
        frames: list[object] = []
        while not any(getattr(f, "command", "") in ("RECEIPT", "ERROR") for f in frames):
            data = sock.recv(65536)
            if not data:
                break
            frames += parser.feed(data)
        return frames


def test_stomp_subscribe_with_x_stream_offset(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data", streams=STREAMS)
    broker = ThreadBroker(config).start()
    try:
        with SimpleStompClient("127.0.0.1", broker.port) as client:
            for i in range(4):
                client.send("/queue/stream.s", f"m{i}".encode())
            client.subscribe("/queue/stream.s", "s", headers={"x-stream-offset": "offset=2"})
            got = [client.receive(timeout=10) for _ in range(2)]
            assert [(f.body, f.get("x-stream-offset")) for f in got if f] == [
                (b"m2", "2"), (b"m3", "3")]
        frames = raw_subscribe(broker.port, [("x-stream-offset", "next")])
        receipt = next(f for f in frames if getattr(f, "command", "") == "RECEIPT")
        assert receipt.get("x-stream-first") == "0"  # type: ignore[attr-defined]
        assert receipt.get("x-stream-next") == "4"  # type: ignore[attr-defined]
        (error,) = [f for f in raw_subscribe(broker.port, [("x-stream-offset", "soon")])
                    if getattr(f, "command", "") == "ERROR"]
        assert "invalid x-stream-offset 'soon'" in error.get("message")  # type: ignore[attr-defined]
        with SimpleStompClient("127.0.0.1", broker.port) as client, \
                pytest.raises(StompClientError, match="not a stream destination"):
            client.subscribe("/queue/plain", "p", headers={"x-stream-offset": "first"})
    finally:
        broker.stop()
