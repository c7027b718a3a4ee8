"""Topic subscriptions, durable and not (core/subscriptions.py, core/routing.py):
what an offline durable subscriber keeps, across a restart too, what replaces or
removes a durable subscription, and what a plain subscriber never sees."""

from __future__ import annotations

import pytest
from tests.support.core_restart import restart
from tests.unit.core.test_broker_core import (
    Clock,
    bodies,
    connect,
    make_broker,
    pump,
    send,
    sub,
)

from meshmq.core import destinations as dst
from meshmq.core.consumer import AckMode
from meshmq.core.message import Message
from meshmq.errors import ProtocolError
from meshmq.store.base import AddMessage, DropKey, PutDurableSubscription


def test_an_offline_durable_keeps_what_was_sent_in_order_and_resumes() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:news", subscription_name="s"))
    for i in range(5):
        send(broker, conn, "topic:news", f"m{i}", persistent=True)
    assert broker.durables[("app", "s")].queue.depth == 5
    sub(broker, conn, "d", "topic:news", subscription_name="s")
    assert bodies(pump(broker, store)) == [f"m{i}" for i in range(5)]


def test_only_persistent_messages_of_an_offline_durable_survive_a_restart() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:news", subscription_name="s"))
    send(broker, conn, "topic:news", "kept", persistent=True)
    send(broker, conn, "topic:news", "volatile", persistent=False)
    assert broker.durables[("app", "s")].queue.depth == 2
    store.write(broker.take_ops())
    again = restart(broker.config, store, Clock())
    conn = connect(again, client_id="app")
    sub(again, conn, "d", "topic:news", subscription_name="s")
    assert bodies(pump(again, store)) == ["kept"]


def test_a_durable_active_elsewhere_cannot_be_taken_over() -> None:
    broker, _, _ = make_broker()
    first = connect(broker, client_id="app")
    sub(broker, first, "d", "topic:t", subscription_name="s")
    broker.close_connection(first)
    second = connect(broker, client_id="app")
    sub(broker, second, "d", "topic:t", subscription_name="s")
    with pytest.raises(ProtocolError) as refused:
        sub(broker, second, "d2", "topic:t", subscription_name="s")
    assert refused.value.code == "durable-in-use"


def test_the_same_subscription_name_under_two_client_ids_is_two_subscriptions() -> None:
    broker, _, store = make_broker()
    a, b = connect(broker, client_id="a"), connect(broker, client_id="b")
    sa = sub(broker, a, "d", "topic:t", subscription_name="s")
    broker.unsubscribe(b, sub(broker, b, "d", "topic:t", subscription_name="s"))
    send(broker, a, "topic:t", "m", persistent=True)
    assert [d.consumer for d in pump(broker, store)] == [sa]
    assert broker.durables[("b", "s")].queue.depth == 1


def test_removing_a_durable_needs_a_client_id() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    with pytest.raises(ProtocolError) as refused:
        broker.remove_durable(conn, "s")
    assert refused.value.code == "client-id-required"


def test_resubscribing_with_the_same_topic_and_selector_resumes_without_a_new_record() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:t", subscription_name="s",
                                 selector="x > 1"))
    broker.take_ops()
    sub(broker, conn, "d", "topic:t", subscription_name="s", selector="x > 1")
    assert not any(isinstance(op, (PutDurableSubscription, DropKey)) for op in broker.take_ops())


def test_changing_a_durables_topic_drops_the_messages_it_kept() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:old", subscription_name="s"))
    send(broker, conn, "topic:old", "stale", persistent=True)
    store.write(broker.take_ops())
    sub(broker, conn, "d", "topic:new", subscription_name="s")
    store.write(broker.take_ops())
    assert pump(broker, store) == []
    assert store.key_info("durable://app:s").count == 0
    send(broker, conn, "topic:old", "ignored", persistent=True)
    send(broker, conn, "topic:new", "wanted", persistent=True)
    assert bodies(pump(broker, store)) == ["wanted"]


def test_an_offline_durable_with_a_selector_stores_only_matching_messages() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:t", subscription_name="s",
                                 selector="region = 'eu'"))
    broker.take_ops()
    for region in ("eu", "us", "eu"):
        send(broker, conn, "topic:t", region, persistent=True, properties={"region": region})
    assert broker.durables[("app", "s")].queue.depth == 2
    adds = [op for op in broker.take_ops() if isinstance(op, AddMessage)]
    assert len(adds) == 2


def test_a_wildcard_durable_collects_every_matching_topic() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:prices.>", subscription_name="s"))
    for name in ("prices.ibm", "prices.ibm.nyse", "prices", "stocks.ibm"):
        send(broker, conn, f"topic:{name}", name, persistent=True)
    sub(broker, conn, "d", "topic:prices.>", subscription_name="s")
    assert bodies(pump(broker, store)) == ["prices.ibm", "prices.ibm.nyse"]


def test_a_composite_durable_comes_back_with_all_its_topics_after_a_restart() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "d", "topic:a,topic:b", subscription_name="s"))
    store.write(broker.take_ops())
    again = restart(broker.config, store, Clock())
    producer = connect(again)
    for name in ("a", "b", "c"):
        send(again, producer, f"topic:{name}", name, persistent=True)
    assert again.durables[("app", "s")].queue.depth == 2
    store.write(again.take_ops())
    conn = connect(again, client_id="app")
    sub(again, conn, "d", "topic:a,topic:b", subscription_name="s")
    assert bodies(pump(again, store)) == ["a", "b"]


def test_a_no_local_durable_skips_its_own_connections_messages_while_online() -> None:
    broker, _, store = make_broker()
    conn, other = connect(broker, client_id="app"), connect(broker)
    d = sub(broker, conn, "d", "topic:t", subscription_name="s", no_local=True)
    for who, body in ((conn, "mine"), (other, "theirs")):
        broker.send(who, (dst.topic("t"),), Message(body, dst.topic("t"), body.encode(),
                                                    persistent=True, producer_id=who.id))
    out = pump(broker, store)
    assert [(o.consumer, o.message.body) for o in out] == [(d, b"theirs")]


def test_unacked_durable_messages_come_back_flagged_on_the_next_subscription() -> None:
    broker, _, store = make_broker()
    conn = connect(broker, client_id="app")
    d = sub(broker, conn, "d", "topic:t", subscription_name="s",
            ack_mode=AckMode.CLIENT_INDIVIDUAL)
    send(broker, conn, "topic:t", "m", persistent=True)
    pump(broker, store)
    broker.unsubscribe(conn, d)
    sub(broker, conn, "d", "topic:t", subscription_name="s")
    (again,) = pump(broker, store)
    assert again.message.body == b"m" and again.redelivered


def test_the_statistics_list_durables_with_pending_counts_and_activity() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    broker.unsubscribe(conn, sub(broker, conn, "off", "topic:t", subscription_name="off"))
    sub(broker, conn, "on", "topic:t", subscription_name="on",
        ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    send(broker, conn, "topic:t", "1", persistent=True)
    send(broker, conn, "topic:t", "2", persistent=True)
    broker.dispatch_dirty()
    durables = broker.statistics()["durable_subscriptions"]
    assert durables == [
        {"clientId": "app", "name": "off", "destination": "topic://t", "pending": 2,
         "active": False},
        {"clientId": "app", "name": "on", "destination": "topic://t", "pending": 2,
         "active": True}]


def test_a_persistent_message_stores_references_only_for_durables() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker, client_id="app")
    sub(broker, conn, "plain", "topic:t")
    sub(broker, conn, "d", "topic:t", subscription_name="s")
    broker.take_ops()
    send(broker, conn, "topic:t", "m", persistent=True)
    (add,) = [op for op in broker.take_ops() if isinstance(op, AddMessage)]
    assert add.refs == (("durable://app:s", 1),)


def test_a_plain_subscriber_sees_nothing_sent_before_it_subscribed() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    send(broker, conn, "topic:t", "before", persistent=True)
    sub(broker, conn, "s", "topic:t")
    send(broker, conn, "topic:t", "after")
    assert bodies(pump(broker, store)) == ["after"]


def test_a_plain_subscribers_undelivered_messages_go_with_it() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    s = sub(broker, conn, "s", "topic:t")
    broker.set_paused(conn, True)
    send(broker, conn, "topic:t", "x" * 1000)
    assert broker.usage.used > 1000
    broker.unsubscribe(conn, s)
    assert broker.usage.used == 0 and broker.subs_for(dst.topic("t")) == []


def test_a_topic_message_with_no_subscriber_is_counted_and_kept_nowhere() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    broker.take_ops()
    assert broker.send(conn, (dst.topic("t"),),
                       Message("m", dst.topic("t"), b"x", persistent=True)) is False
    assert broker.take_ops() == []
    assert broker.topics[dst.topic("t")].enqueued == 1
    assert broker.topics[dst.topic("t")].dispatched == 0
