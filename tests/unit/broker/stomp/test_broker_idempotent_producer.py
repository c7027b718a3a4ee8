"""The broker's idempotent-producer window: a re-sent ``dedup-id`` is confirmed again
but stored and delivered once (the STOMP header; the MQTT 5 user property is tested
with paho in tests/interop)."""

from __future__ import annotations

from typing import Any

from tests.support.raw_stomp import uid


def _stat(broker: Any) -> dict[str, object]:
    result: dict[str, object] = broker.broker.statistics()
    return result


def _depth(broker: Any, name: str) -> int:
    for d in _stat(broker)["destinations"]:  # type: ignore[attr-defined]
        if d["name"] == name:
            return int(d["depth"])
    return 0


def test_resent_dedup_id_is_confirmed_and_stored_once(broker, client):
    producer = client()
    q = uid("idem")
    for _ in range(3):  # receipts are awaited: each re-send is confirmed
        producer.send(f"/queue/{q}", "payload", {"dedup-id": "order-17", "persistent": "true"})
    producer.send(f"/queue/{q}", "other", {"dedup-id": "order-18", "persistent": "true"})
    assert _depth(broker, q) == 2
    assert _stat(broker)["duplicates_dropped"] == 2
    consumer = client()
    consumer.subscribe(f"/queue/{q}")
    got = consumer.listener.wait_messages(2)
    assert [m.body for m in got] == ["payload", "other"]
    assert [m.headers["dedup-id"] for m in got] == ["order-17", "order-18"]  # carried through
    producer.send(f"/queue/{q}", "late", {"dedup-id": "order-17"})  # still in the window
    producer.send(f"/queue/{q}", "fresh", receipt=True)  # no dedup-id: never dropped
    broker.wait_for(lambda: len(consumer.listener.messages) == 3, what="the fresh message")
    assert consumer.listener.messages[-1].body == "fresh"


def test_topic_fan_out_is_also_deduplicated(broker, client):
    sub1, sub2, producer = client(), client(), client()
    t = f"/topic/{uid('idemt')}"
    sub1.subscribe(t)
    sub2.subscribe(t)
    for _ in range(2):
        producer.send(t, "x", {"dedup-id": "evt-1"})
    producer.send(t, "y", {"dedup-id": "evt-2"})
    for s in (sub1, sub2):
        broker.wait_for(lambda s=s: len(s.listener.messages) >= 2, what="two messages")
        assert s.bodies() == ["x", "y"]


def test_transaction_commit_is_checked_and_rollback_forgets_nothing(broker, client):
    producer, consumer = client(), client()
    q = f"/queue/{uid('idemtx')}"
    consumer.subscribe(q)
    producer.conn.begin("t1")
    producer.conn.send(q, "rolled back", headers={"dedup-id": "tx-a", "transaction": "t1"})
    producer.conn.abort("t1")
    # The aborted send never counted, so the same id is accepted later.
    producer.send(q, "committed", {"dedup-id": "tx-a"})
    producer.conn.begin("t2")
    producer.conn.send(q, "dup in txn", headers={"dedup-id": "tx-a", "transaction": "t2"})
    producer.conn.commit("t2")
    producer.send(q, "marker")
    broker.wait_for(lambda: len(consumer.listener.messages) == 2, what="two messages")
    assert consumer.bodies() == ["committed", "marker"]


def test_window_forgets_the_oldest_ids_beyond_its_size(broker_factory, client) -> None:
    b = broker_factory(duplicate_window=2)
    producer = client(on=b)
    q = uid("idemw")
    # Remembered while fewer than 2 newer ids came, gone once 3 (2 * 2 - 1) have.
    for key in ("a", "b", "c", "d", "a"):
        producer.send(f"/queue/{q}", key, {"dedup-id": key})
    producer.send(f"/queue/{q}", "c-again", {"dedup-id": "c"})  # two newer: remembered
    producer.send(f"/queue/{q}", "a-again", {"dedup-id": "a"})  # just sent again
    assert _depth(b, q) == 5


def test_window_zero_turns_deduplication_off(broker_factory, client) -> None:
    b = broker_factory(duplicate_window=0)
    producer = client(on=b)
    q = uid("idemoff")
    for _ in range(2):
        producer.send(f"/queue/{q}", "x", {"dedup-id": "same"})
    assert _depth(b, q) == 2
