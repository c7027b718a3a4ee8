"""core/recovery.py: the tables rebuilt from what a store holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.core.test_broker_core import Clock, bodies, connect, pump, send, sub

from meshmq.config.model import BrokerConfig
from meshmq.core import destinations as dst
from meshmq.core.broker import Broker
from meshmq.core.message import Message
from meshmq.store.base import AddMessage, DropKey
from meshmq.store.journal import JournalStore


def test_queues_durables_retained_and_records_come_back(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "j", fsync=False)
    config = BrokerConfig(broker_name="unit")
    before = Broker(config, store, clock=Clock())
    before.recover(store.open())
    conn = connect(before, client_id="app")
    c = sub(before, conn, "d", "topic:t", subscription_name="s1")
    before.unsubscribe(conn, c)
    send(before, conn, "q", "kept", persistent=True)
    send(before, conn, "topic:t", "for-s1", persistent=True)
    before.retain(Message(message_id="r", destination=dst.topic("t"), body=b"last"))
    before.put_record("session", b"state")
    # A non-queue key in the store is dropped at recovery.
    store.write([*before.take_ops(), AddMessage(Message(message_id="x",
                                                        destination=dst.topic("odd"),
                                                        body=b"?"), (("topic://odd", 1),))])
    asyncio.run(store.close())
    store = JournalStore(tmp_path / "j", fsync=False)
    after = Broker(config, store, clock=Clock())
    after.recover(store.open())
    assert after.take_ops() == [DropKey("topic://odd")]
    assert after.records == {"session": (1, b"state")}
    assert [m.body for m in after.retained_for((dst.topic("t"),))] == [b"last"]
    assert ("app", "s1") in after.durables
    conn = connect(after, client_id="app")
    sub(after, conn, "q", "q")
    sub(after, conn, "d", "topic:t", subscription_name="s1")
    assert sorted(bodies(pump(after, store))) == ["for-s1", "kept"]
    asyncio.run(store.close())
