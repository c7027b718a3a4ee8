"""Rights on the send and subscribe paths of the core (core/access.py with the map of
tests/support/authorization_map.py): which right each request needs, the admin right
of the request that creates a destination, wildcard subscriptions filtered per
destination, temporary destinations, and the denial record."""

from __future__ import annotations

import dataclasses
import re

import pytest
from tests.support.authorization_map import MAP
from tests.unit.core.test_broker_core import Clock, bodies, pump, send, sub

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    BrokerConfig,
)
from meshmq.core import destinations as dst
from meshmq.core.auth import Principal
from meshmq.core.broker import Broker, Connection
from meshmq.core.destinations import DestKind
from meshmq.core.message import Message
from meshmq.errors import AuthorizationError
from meshmq.store.memory import MemoryStore

GROUPS = {"alice": "producers", "bob": "consumers", "carol": "admins", "dave": "writers"}


def authz_broker(authorization: AuthorizationConfig) -> Broker:
    config = dataclasses.replace(BrokerConfig(broker_name="unit"),
                                 auth=AuthConfig(authorization=authorization))
    store = MemoryStore()
    broker = Broker(config, store, clock=Clock())
    broker.recover(store.open())
    return broker


@pytest.fixture
def broker() -> Broker:
    return authz_broker(MAP)


def login(broker: Broker, user: str) -> Connection:
    return broker.open_connection(Principal(user, frozenset({GROUPS[user]})))


def test_sending_needs_the_write_right(broker: Broker) -> None:
    alice, bob = login(broker, "alice"), login(broker, "bob")
    send(broker, alice, "orders.eu", "ok")
    with pytest.raises(AuthorizationError, match=re.escape(
            "User bob is not authorized to write to: queue://orders.eu")):
        send(broker, bob, "orders.eu", "refused")
    assert broker.queues[dst.queue("orders.eu")].depth == 1


def test_the_send_that_creates_a_destination_needs_the_admin_right(broker: Broker) -> None:
    dave, carol = login(broker, "dave"), login(broker, "carol")
    with pytest.raises(AuthorizationError, match="creating a destination"):
        send(broker, dave, "logs.app", "first")
    assert dst.queue("logs.app") not in broker.queues
    admin_made = Message("m", dst.queue("logs.app"), b"by carol")
    broker.send(carol, (dst.queue("logs.app"),), admin_made)
    send(broker, dave, "logs.app", "now it exists")
    assert broker.queues[dst.queue("logs.app")].depth == 2


def test_subscribing_needs_read_and_creating_a_queue_needs_admin(broker: Broker) -> None:
    alice, bob, carol = login(broker, "alice"), login(broker, "bob"), login(broker, "carol")
    with pytest.raises(AuthorizationError, match="read from"):
        sub(broker, alice, "s", "orders.eu")
    sub(broker, bob, "s", "orders.new")  # consumers may create orders queues
    # bob reads prices topics without the admin right: a topic subscription creates
    # nothing (docs/security.md), only a queue subscription does.
    sub(broker, bob, "p", "topic:prices.new")
    with pytest.raises(AuthorizationError, match="read from"):
        sub(broker, bob, "x", "billing")  # only admins read what no entry covers
    sub(broker, carol, "x", "billing")
    assert bob.consumers.keys() == {"s", "p"}


def test_a_queue_subscription_that_would_create_the_queue_needs_admin() -> None:
    broker = authz_broker(AuthorizationConfig(
        entries=(AuthorizationEntry(queue="jobs.>", read=("workers",)),),
        default=AuthorizationRights(read=("ops",), write=("ops",), admin=("ops",))))
    worker = broker.open_connection(Principal("w", frozenset({"workers"})))
    ops = broker.open_connection(Principal("o", frozenset({"ops"})))
    with pytest.raises(AuthorizationError, match=re.escape(
            "not authorized to create: queue://jobs.a")):
        sub(broker, worker, "s", "jobs.a")
    assert dst.queue("jobs.a") not in broker.queues
    send(broker, ops, "jobs.a", "made by ops")
    sub(broker, worker, "s", "jobs.a")
    assert bodies(pump(broker, MemoryStore())) == ["made by ops"]


def test_a_composite_subscription_needs_read_on_every_part(broker: Broker) -> None:
    bob = login(broker, "bob")
    with pytest.raises(AuthorizationError):
        sub(broker, bob, "s", "orders.a,billing")
    assert bob.consumers == {} and broker.consumer_count(dst.queue("orders.a")) == 0


def test_a_wildcard_topic_subscription_carries_only_readable_topics(broker: Broker) -> None:
    bob, carol = login(broker, "bob"), login(broker, "carol")
    s = sub(broker, bob, "s", "topic:>")
    for name in ("prices.ibm", "news.ibm"):
        send(broker, carol, f"topic:{name}", name)
    out = [d for d in pump(broker, MemoryStore()) if d.consumer is s]
    assert bodies(out) == ["prices.ibm"]


def test_a_wildcard_queue_consumer_joins_only_readable_new_queues(broker: Broker) -> None:
    bob, carol = login(broker, "bob"), login(broker, "carol")
    s = sub(broker, bob, "s", ">")
    send(broker, carol, "orders.a", "readable")
    send(broker, carol, "billing", "not readable")
    assert [q.destination for q in s.sources] == [dst.queue("orders.a")]


def test_a_wildcard_nobody_may_read_under_is_refused(broker: Broker) -> None:
    alice = login(broker, "alice")
    with pytest.raises(AuthorizationError):
        sub(broker, alice, "s", "topic:news.>")


def test_temporary_destinations_follow_the_temp_entry(broker: Broker) -> None:
    bob, alice = login(broker, "bob"), login(broker, "alice")
    temp = broker.create_temp(bob, DestKind.TEMP_QUEUE)
    with pytest.raises(AuthorizationError):
        broker.create_temp(alice, DestKind.TEMP_QUEUE)
    with pytest.raises(AuthorizationError):
        broker.send(alice, (temp,), Message("r", temp, b"reply"))
    broker.send(bob, (temp,), Message("r", temp, b"reply"))


def test_the_brokers_own_connections_are_never_checked(broker: Broker) -> None:
    internal = broker.open_connection(Principal("bridge", frozenset(), internal=True))
    assert not internal.checked
    send(broker, internal, "anything.at.all", "m")
    sub(broker, internal, "s", "topic:news.>")


def test_denials_are_counted_per_user_in_the_statistics(broker: Broker) -> None:
    bob, alice = login(broker, "bob"), login(broker, "alice")
    for conn, name in ((bob, "orders.a"), (bob, "billing"), (alice, "billing")):
        with pytest.raises(AuthorizationError):
            send(broker, conn, name, "m")
    assert broker.statistics()["denied"] == {"total": 3, "by_user": {"alice": 1, "bob": 2}}


def test_retained_messages_are_offered_only_where_the_reader_may_read(broker: Broker) -> None:
    for name in ("prices.ibm", "news.ibm"):
        broker.retain(Message(name, dst.topic(name), name.encode()))
    bob = Principal("bob", frozenset({"consumers"}))
    assert [m.body for m in broker.retained_for([dst.topic(">")], bob)] == [b"prices.ibm"]
    assert len(broker.retained_for([dst.topic(">")])) == 2  # the broker itself sees all
