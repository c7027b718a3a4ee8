"""core/advisories.py: advisory messages, consumer counts and interest events."""

from __future__ import annotations

import json

from tests.unit.core.test_broker_core import connect, make_broker, pump, sub

from meshmq.core import destinations as dst
from meshmq.core.advisories import ConsumerEvent, advisory_topic


def test_an_advisory_is_built_only_when_somebody_listens() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q")  # nobody reads advisories: nothing routed
    assert dst.topic("ActiveMQ.Advisory.Consumer.Queue.q") not in broker.topics
    watcher = sub(broker, conn, "w", "topic:ActiveMQ.Advisory.Consumer.Queue.q")
    sub(broker, conn, "c2", "q")
    out = [d for d in pump(broker, store) if d.consumer is watcher]
    assert len(out) == 1
    body = json.loads(out[0].message.body)
    assert body["advisoryType"] == "ConsumerAdded" and body["consumerCount"] == 2
    assert advisory_topic("Consumer", dst.queue("q")) == out[0].message.destination


def test_listeners_hear_consumers_come_and_go_with_their_counts() -> None:
    broker, _, _ = make_broker()
    events: list[ConsumerEvent] = []
    broker.add_listener(events.append)
    conn = connect(broker)
    c = sub(broker, conn, "c", "q")
    broker.unsubscribe(conn, c)
    broker.remove_listener(events.append)
    sub(broker, conn, "c2", "q")
    assert [(e.added, e.consumer_count[dst.queue("q")]) for e in events] == [(True, 1),
                                                                           (False, 0)]
    assert broker.consumer_count(dst.queue("q")) == 1


def test_no_advisories_when_support_is_off() -> None:
    broker, _, store = make_broker(advisory_support=False)
    conn = connect(broker)
    sub(broker, conn, "w", "topic:ActiveMQ.Advisory.Consumer.Queue.q")
    sub(broker, conn, "c", "q")
    assert pump(broker, store) == []
    broker.advise_master_broker({"brokerName": "unit"})
    assert broker.retained == {}
