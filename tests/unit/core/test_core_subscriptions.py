"""core/subscriptions.py: consumers, shared groups and durable subscriptions."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.core import destinations as dst
from meshmq.core.consumer import ConsumerSpec
from meshmq.errors import DestinationError, ProtocolError
from meshmq.store.base import DropKey, PutDurableSubscription


def test_changing_a_durable_subscriptions_selector_replaces_it() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    c = sub(broker, conn, "d", "topic:t", subscription_name="s1")
    broker.unsubscribe(conn, c)
    assert broker.durables[("app", "s1")].consumer is None  # outlives its consumer
    sub(broker, conn, "d2", "topic:t", subscription_name="s1", selector="x = 1")
    ops = broker.take_ops()
    assert isinstance(ops[0], PutDurableSubscription)
    assert ops[1] == DropKey("durable://app:s1")
    assert isinstance(ops[2], PutDurableSubscription) and ops[2].subscription.selector == "x = 1"


def test_removing_an_active_durable_subscription_is_refused() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    c = sub(broker, conn, "d", "topic:t", subscription_name="s1")
    with pytest.raises(ProtocolError):
        broker.remove_durable(conn, "s1")
    broker.unsubscribe(conn, c)
    broker.remove_durable(conn, "s1")
    assert ("app", "s1") not in broker.durables
    with pytest.raises(DestinationError):
        broker.remove_durable(conn, "s1")


def test_a_shared_group_competes_and_goes_with_its_last_member() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    a = sub(broker, conn, "a", "topic:t", shared_group="g")
    b = sub(broker, conn, "b", "topic:t", shared_group="g")
    for i in range(4):
        send(broker, conn, "topic:t", f"m{i}")
    assert [d.consumer for d in pump(broker, store)] == [a, b, a, b]
    broker.unsubscribe(conn, a)
    assert len(broker.subs_for(dst.topic("t"))) == 1
    broker.unsubscribe(conn, b)
    assert broker.subs_for(dst.topic("t")) == []


def test_a_stream_offset_on_a_plain_queue_is_refused_and_leaves_nothing() -> None:
    from meshmq.core.stream import parse_offset

    broker, _, _ = make_broker()
    conn = connect(broker)
    with pytest.raises(DestinationError):
        broker.subscribe(conn, "s", ConsumerSpec(destinations=(dst.queue("q"),)),
                         stream_offset=parse_offset("first"))
    assert conn.consumers == {} and broker.consumer_count(dst.queue("q")) == 0


def test_paused_connection_gets_nothing_until_resumed() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    sub(broker, conn, "c", "q")
    broker.set_paused(conn, True)
    send(broker, conn, "q", "m0")
    assert pump(broker, store) == []
    broker.set_paused(conn, False)
    assert bodies(pump(broker, store)) == ["m0"]
