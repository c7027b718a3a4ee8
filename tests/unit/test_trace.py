"""Message trace: sampling, the JSON-lines encoding, rolling sinks, broker hooks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.core.test_broker_core import Clock, connect, pump, send, sub

from meshmq.config.model import BrokerConfig, DestinationPolicy
from meshmq.core import destinations as dst
from meshmq.core import trace as tr
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message, PropertyValue
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore
from meshmq.transport import trace_files as tf

# ------------------------------------------------------------------ sampling


@given(st.text(min_size=1, max_size=60), st.floats(0, 1), st.floats(0, 1))
def test_sampling_is_deterministic_and_monotone_in_the_rate(mid: str, r1: float,
                                                            r2: float) -> None:
    low, high = sorted((r1, r2))
    assert tr.sampled(mid, low) == tr.sampled(mid, low)
    if tr.sampled(mid, low):
        assert tr.sampled(mid, high)  # raising the rate never drops a traced message
    assert tr.sampled(mid, 1.0)
    assert not tr.sampled(mid, 0.0)


def test_sampling_keeps_about_the_rate() -> None:
    ids = [f"ID:b-1-c{i}-{i}" for i in range(20_000)]
    kept = sum(tr.sampled(i, 0.25) for i in ids)
    assert 4_500 < kept < 5_500


def test_tracer_skips_unsampled_messages() -> None:
    tracer = tr.Tracer("b", sample_rate=0.5, clock_ns=lambda: 7000)
    msgs = [Message(f"ID:{i}", dst.queue("q"), b"") for i in range(200)]
    for m in msgs:
        tracer.message(tr.RECEIVED, m)
    assert {e[2].message_id for e in tracer.take() if e[2]} == {m.message_id for m in msgs
                                             if tr.sampled(m.message_id, 0.5)}
    with pytest.raises(ValueError, match="sample_rate"):
        tr.Tracer("b", sample_rate=1.5)


# ------------------------------------------------------------------ encoding

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@given(mid=_text, dest=st.sampled_from(["q", "a.b", "we:ird"]), dedup=st.none() | _text,
       path=st.lists(_text, max_size=3), consumer=st.none() | _text,
       peer=st.none() | _text, reason=st.none() | _text, count=st.integers(0, 50),
       body=st.binary(max_size=20), persistent=st.booleans())
def test_jsonl_round_trips_every_field(mid: str, dest: str, dedup: str | None,
                                       path: list[str], consumer: str | None,
                                       peer: str | None, reason: str | None, count: int,
                                       body: bytes, persistent: bool) -> None:
    props: dict[str, PropertyValue] = {} if dedup is None else {"dedup-id": dedup}
    msg = Message(mid, dst.topic(dest), body, props, persistent=persistent, timestamp=99,
                  broker_path=tuple(path))
    event: tr.Event = (123_456, tr.DISPATCHED, msg, dst.queue(dest), count, consumer, peer,
                       "conn" if peer else None, reason)
    text = tr.encode_jsonl([event, event], 'bro"ker', "b00t")
    assert text.count("\n") == 2 and text.endswith("\n")
    row = tr.decode_jsonl_line(text.splitlines()[1])
    assert set(row) == set(tr.COLUMN_NAMES)
    expected = {"v": 1, "ts": 123, "event": "dispatched", "broker": 'bro"ker',
                "boot": "b00t", "message_id": mid, "dedup_id": dedup,
                "destination": f"queue://{dest}", "msg_ts": 99, "size": len(body),
                "persistent": persistent, "path": path, "delivery_count": count or None,
                "consumer": consumer, "peer": peer, "connector": "conn" if peer else None,
                "reason": reason}
    assert row == expected
    assert tr.to_rows([event], 'bro"ker', "b00t") == [expected]


def test_broker_events_have_empty_message_fields() -> None:
    tracer = tr.Tracer("b", clock_ns=lambda: 5000)
    tracer.broker_event(tr.BROKER_STARTED)
    row = tr.decode_jsonl_line(tr.encode_jsonl(tracer.take(), "b", "x"))
    assert row["event"] == "broker_started" and row["message_id"] == "" and row["ts"] == 5


def test_decoding_rejects_other_schema_versions() -> None:
    with pytest.raises(ValueError, match="version 1"):
        tr.decode_jsonl_line(json.dumps({"v": 2, "event": "acked"}))


# ------------------------------------------------------------------ sinks


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def event(i: int) -> tr.Event:
    return (i * 1000, tr.RECEIVED, Message(f"ID:{i}", dst.queue("q"), b"0123456789"), None, 0, None,
            None, None, None)


def read_all(directory: Path) -> list[dict[str, object]]:
    rows = []
    for path in sorted(directory.glob("*.jsonl*")):
        rows += [tr.decode_jsonl_line(line) for line in path.read_text().splitlines()]
    return rows


def test_jsonl_sink_writes_open_files_and_seals_them(tmp_path: Path) -> None:
    clock = FakeClock()
    sink = tf.JsonLinesSink(tmp_path, "b 1", "x", roll_interval_ms=1000, clock=clock)
    sink.write([event(1), event(2)])
    sink.tick()  # not due: flushed to the OS, still open
    (open_file,) = tmp_path.iterdir()
    assert open_file.name == "trace-b_1-x-000001.jsonl.open"
    assert [r["ts"] for r in read_all(tmp_path)] == [1, 2]
    clock.now += 1.0
    sink.tick()  # due: sealed
    assert [p.name for p in tmp_path.iterdir()] == ["trace-b_1-x-000001.jsonl"]
    sink.write([event(3)])
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace-b_1-x-000001.jsonl", "trace-b_1-x-000002.jsonl"]
    assert [r["ts"] for r in read_all(tmp_path)] == [1, 2, 3]


def test_jsonl_sink_rolls_by_size_and_keeps_max_files(tmp_path: Path) -> None:
    sink = tf.JsonLinesSink(tmp_path, "b", "x", max_file_bytes=300, roll_interval_ms=0,
                            max_files=2)
    for i in range(20):
        sink.write([event(i)])
    sink.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2 and all(p.suffix == ".jsonl" for p in files)
    assert [r["ts"] for r in read_all(tmp_path)][-1] == 19


def test_a_restart_seals_files_left_open_by_a_crash(tmp_path: Path) -> None:
    crashed = tf.JsonLinesSink(tmp_path, "b", "old")
    crashed.write([event(1)])
    crashed.tick()
    crashed._file.close()  # the process dies here: the file stays .open
    other = tmp_path / "trace-other-z-000001.jsonl.open"
    other.write_text("")
    tf.JsonLinesSink(tmp_path, "b", "new")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["trace-b-old-000001.jsonl", "trace-other-z-000001.jsonl.open"]


def test_parquet_sink_writes_the_documented_schema(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    sink = tf.open_sink(tmp_path, "b", "x", fmt="parquet", max_file_bytes=1 << 20,
                        roll_interval_ms=0, max_files=0)
    assert isinstance(sink, tf.ParquetSink)
    msg = Message("ID:9", dst.topic("t"), b"abcd", {"dedup-id": "d-1"}, persistent=True,
                  timestamp=3, broker_path=("a", "b"))
    forwarded: tr.Event = (5000, tr.FORWARDED, msg, None, 2, "c:1", "peer", "nc", None)
    sink.write([event(1), forwarded])
    assert not list(tmp_path.glob("*.parquet"))  # collected until the roll
    sink.close()
    (path,) = tmp_path.glob("*.parquet")
    table = pq.read_table(path)
    assert table.schema.names == list(tr.COLUMN_NAMES)
    rows = table.to_pylist()
    assert rows[1] == {"v": 1, "ts": 5, "event": "forwarded", "broker": "b", "boot": "x",
                       "message_id": "ID:9", "dedup_id": "d-1", "destination": "topic://t",
                       "msg_ts": 3, "size": 4, "persistent": True, "path": ["a", "b"],
                       "delivery_count": 2, "consumer": "c:1", "peer": "peer",
                       "connector": "nc", "reason": None}
    assert rows[0]["delivery_count"] is None


# ------------------------------------------------------------------ broker hooks


def traced_broker(**changes: object) -> tuple[Broker, Clock, MemoryStore, tr.Tracer]:
    clock = Clock()
    store = MemoryStore()
    config = dataclasses.replace(BrokerConfig(broker_name="unit"), **changes)  # type: ignore[arg-type]
    broker = Broker(config, store, clock=clock)
    broker.recover(store.open())
    tracer = tr.Tracer("unit", clock_ns=lambda: clock.now * 1_000_000)
    broker.tracer = tracer
    return broker, clock, store, tracer


def kinds(tracer: tr.Tracer) -> list[tuple[str, str, int, str | None]]:
    return [(r["event"], r["destination"], r["delivery_count"] or 0, r["reason"])
            for r in tr.to_rows(tracer.take(), "unit", "x")]


def test_a_consumed_message_is_received_stored_dispatched_acked() -> None:
    broker, _, store, tracer = traced_broker()
    conn = connect(broker)
    consumer = sub(broker, conn, "s", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "hi", persistent=True)
    (delivery,) = pump(broker, store)
    broker.ack(conn, consumer, delivery.tag, cumulative=False)
    events = tr.to_rows(tracer.take(), "unit", "x")
    assert [(e["event"], e["destination"]) for e in events] == [
        ("received", "queue://q"), ("stored", "queue://q"), ("dispatched", "queue://q"),
        ("acked", "queue://q")]
    assert {e["message_id"] for e in events} == {delivery.message.message_id}
    assert events[2]["consumer"] == consumer.id and events[2]["delivery_count"] == 1


def test_nack_redelivery_dlq_and_expiry_are_traced() -> None:
    policy = DestinationPolicy(match="queue://>", max_redeliveries=1)
    broker, clock, store, tracer = traced_broker(policies=(policy,))
    conn = connect(broker)
    consumer = sub(broker, conn, "s", "q", ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "q", "x", persistent=True)
    for _ in range(2):
        (d,) = pump(broker, store)
        broker.nack(conn, consumer, d.tag, cumulative=False)
    pump(broker, store)
    got = kinds(tracer)
    assert got[:6] == [
        ("received", "queue://q", 0, None), ("stored", "queue://q", 0, None),
        ("dispatched", "queue://q", 1, None), ("redelivered", "queue://q", 1, "rejected (NACK)"),
        ("dispatched", "queue://q", 2, None),
        ("dlq", "queue://q", 2, "message was rejected (NACK) too many times -> ActiveMQ.DLQ")]
    assert got[6] == ("stored", "queue://ActiveMQ.DLQ", 0, None)
    broker.unsubscribe(conn, consumer)
    send(broker, conn, "q2", "old", expiration=clock.now + 10)
    clock.now += 11
    broker.tick()
    assert kinds(tracer)[-1] == ("expired", "queue://q2", 0, None)


def test_topic_without_subscribers_and_purges_are_drops() -> None:
    broker, _, store, tracer = traced_broker()
    conn = connect(broker)
    send(broker, conn, "topic:news", "nobody listens")
    consumer = sub(broker, conn, "s", "topic:news")
    broker.set_paused(conn, True)  # the subscriber's socket is full: the message waits
    send(broker, conn, "topic:news", "pending")
    pump(broker, store)
    broker.unsubscribe(conn, consumer)
    got = kinds(tracer)
    assert got == [("received", "topic://news", 0, None),
                   ("dropped", "topic://news", 0, "no subscriber"),
                   ("received", "topic://news", 0, None),
                   ("dropped", "topic://news", 0, "purged")]


def test_bridge_hooks_and_recovered_messages(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j", fsync=False)
    broker = Broker(BrokerConfig(broker_name="unit"), store)
    broker.recover(store.open())
    tracer = broker.tracer = tr.Tracer("unit")
    conn = connect(broker)
    for i in range(3):
        send(broker, conn, "q", "kept", persistent=True, properties={"dedup-id": f"p-{i}"})
    store.write(broker.take_ops())
    msg = Message("ID:remote-1", dst.queue("q"), b"abc", broker_path=("a",))
    broker.trace_received_from_bridge(msg, from_broker="a", connector="a->unit")
    broker.trace_forwarded(msg, to_broker="c", connector="unit->c")
    events = tr.to_rows(tracer.take(), "unit", "x")
    assert events[0]["dedup_id"] == "p-0"
    assert [(e["event"], e["peer"], e["connector"], e["path"]) for e in events[6:]] == [
        ("received_from_bridge", "a", "a->unit", ["a"]),
        ("forwarded", "c", "unit->c", ["a"])]
    asyncio.run(store.close())
    # A restart over the same store finds the stored messages again (paging through).
    store = JournalStore(tmp_path / "j", fsync=False)
    again = Broker(broker.config, store)
    again.recover(store.open())
    again.tracer = tr.Tracer("unit")
    assert again.trace_recovered(page=2) == 3
    assert [(e["event"], e["dedup_id"]) for e in tr.to_rows(again.tracer.take(), "u", "x")
            ] == [("recovered", f"p-{i}") for i in range(3)]
    asyncio.run(store.close())


def test_without_a_tracer_the_hooks_do_nothing() -> None:
    broker, _, store, _ = traced_broker()
    broker.tracer = None
    msg = Message("ID:1", dst.queue("q"), b"")
    broker.trace_forwarded(msg, to_broker="x", connector="c")
    broker.trace_received_from_bridge(msg, from_broker="x", connector="c")
    broker.trace_dropped(msg, "why")
    assert broker.trace_recovered() == 0
    conn = connect(broker)
    send(broker, conn, "q", "x")
    pump(broker, store)


def test_refused_sends_and_subscriptions_are_traced_as_denied() -> None:
    from meshmq.config.model import (
        AuthConfig,
        AuthorizationConfig,
        AuthorizationEntry,
    )
    from meshmq.core.auth import Principal
    from meshmq.errors import AuthorizationError

    authz = AuthorizationConfig(entries=(AuthorizationEntry(queue="open", write=("*",)),))
    broker, _, _, tracer = traced_broker(auth=AuthConfig(authorization=authz))
    conn = broker.open_connection(Principal("bob", frozenset({"users"})))
    with pytest.raises(AuthorizationError):
        send(broker, conn, "closed", "refused")
    with pytest.raises(AuthorizationError):
        sub(broker, conn, "s", "closed")
    events = tracer.take()
    rows = tr.to_rows(events, "unit", "x")
    assert [(r["event"], r["destination"], r["reason"]) for r in rows] == [
        ("denied", "queue://closed", "User bob is not authorized to write to: queue://closed"),
        ("denied", "queue://closed", "User bob is not authorized to read from: queue://closed")]
    assert rows[0]["message_id"] and rows[1]["message_id"] == ""
    lines = tr.encode_jsonl(events, "unit", "x").splitlines()
    assert [tr.decode_jsonl_line(line) for line in lines] == rows
