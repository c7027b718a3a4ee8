"""Rights per destination for STOMP clients (docs/security.md#authorization), through a
broker driven in memory.

The map, the same for every test:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from tests.support.authorization_map import MAP, PASSWORDS, USERS
from tests.support.memory_stomp_client import MemoryClient, StompTestBroker
from tests.support.raw_stomp import uid

from meshmq.config.model import (
    AuthConfig,
)


@pytest.fixture
def env(broker_factory: Callable[..., StompTestBroker]) -> StompTestBroker:
    return broker_factory(auth=AuthConfig(anonymous_access=False, users=USERS,
                                          authorization=MAP))


def stomp(env: StompTestBroker, user: str, **kw: Any) -> MemoryClient:
    return MemoryClient(env, "1.2", login=user, passcode=PASSWORDS[user], **kw)


def error_after(client: MemoryClient, send: Any) -> str:
    """Run ``send`` and return the message header of the ERROR it gets."""
    before = len(client.listener.errors)
    send()
    client.listener.wait(lambda: len(client.listener.errors) > before, what="an ERROR")
    return str(client.listener.errors[-1].headers.get("message"))


def stats(env: StompTestBroker) -> dict[str, Any]:
    return env.stats()


def depth(env: StompTestBroker, queue: str) -> int | None:
    for d in stats(env)["destinations"]:
        if d["name"] == queue and d["type"] == "queue":
            return int(d["depth"])
    return None


def durables(env: StompTestBroker, client_id: str) -> list[str]:
    return sorted(name for cid, name in env.broker.durables if cid == client_id)


def test_stomp_send_is_refused_with_activemqs_words_and_the_connection_stays_usable(
        env: StompTestBroker) -> None:
    alice = stomp(env, "alice")
    alice.send("/queue/orders.new", "one")
    rid = uid("r")
    msg = error_after(alice, lambda: alice.conn.send("/queue/secret", "x",
                                                     headers={"receipt": rid}))
    assert msg == "User alice is not authorized to write to: queue://secret"
    err = alice.listener.errors[-1]
    assert err.headers.get("receipt-id") == rid  # the refused frame's receipt, no RECEIPT
    assert rid not in alice.listener.receipts
    alice.send("/queue/orders.new", "two")  # same connection, still serving
    bob = stomp(env, "bob")
    bob.subscribe("/queue/orders.new")
    assert sorted(m.body for m in bob.wait_messages(2)) == ["one", "two"]
    assert depth(env, "secret") is None  # never created
    msg = error_after(bob, lambda: bob.conn.send("/queue/orders.new", "from bob"))
    assert msg == "User bob is not authorized to write to: queue://orders.new"


def test_stomp_subscribe_and_browse_need_read(env: StompTestBroker) -> None:
    carol = stomp(env, "carol")
    carol.send("/queue/secret", "classified")
    bob = stomp(env, "bob")
    for headers in ({}, {"browser": "true"}):
        msg = error_after(bob, lambda h=headers: bob.conn.subscribe(
            "/queue/secret", uid("s"), headers=h))
        assert msg == "User bob is not authorized to read from: queue://secret"
    bob.subscribe("/queue/orders.open")  # allowed: the connection still works
    assert depth(env, "secret") == 1  # nothing was consumed
    carol.subscribe("/queue/secret", headers={"browser": "true"})
    assert carol.wait_messages(1)[0].body == "classified"  # then the end-of-browse frame


def test_the_send_that_creates_a_destination_needs_admin(env: StompTestBroker) -> None:
    dave = stomp(env, "dave")
    msg = error_after(dave, lambda: dave.conn.send("/queue/logs.app", "line 1"))
    assert msg.startswith("User dave is not authorized to create: queue://logs.app")
    assert "admin right" in msg
    carol = stomp(env, "carol")
    carol.send("/queue/logs.app", "created by an admin")
    dave.send("/queue/logs.app", "line 2")  # it exists now: write is enough
    assert depth(env, "logs.app") == 2


def test_a_composite_send_needs_every_part_and_delivers_none_when_refused(
        env: StompTestBroker) -> None:
    alice = stomp(env, "alice")
    msg = error_after(alice, lambda: alice.conn.send("/queue/orders.c,/queue/secret", "x"))
    assert msg == "User alice is not authorized to write to: queue://secret"
    assert depth(env, "orders.c") is None and depth(env, "secret") is None
    alice.send("/queue/orders.c,/topic/prices.c", "both allowed")
    assert depth(env, "orders.c") == 1


def test_wildcard_subscriptions_carry_only_what_the_user_may_read(env: StompTestBroker) -> None:
    carol = stomp(env, "carol")
    bob = stomp(env, "bob")
    bob.subscribe("/topic/>")
    bob.subscribe("/queue/>")
    carol.send("/queue/orders.w", "order")
    carol.send("/queue/secret", "classified")
    alice = stomp(env, "alice")
    alice.send("/topic/prices.eur", "1.08")
    carol.send("/topic/news.today", "headline")
    carol.send("/queue/orders.w2", "created after the subscription")
    carol.send("/queue/secret2", "classified too")
    marker = "/topic/prices.end"
    alice.send(marker, "end")
    bob.listener.wait(lambda: "end" in bob.listener.bodies()
                      and "created after the subscription" in bob.listener.bodies(),
                      what="the marker")
    bob.barrier()
    bodies = bob.listener.bodies()
    assert sorted(bodies) == sorted(["order", "1.08", "created after the subscription",
                                     "end"])
    assert depth(env, "secret") == 1 and depth(env, "secret2") == 1
    # A wildcard that can match nothing the user may read is refused outright.
    msg = error_after(alice, lambda: alice.conn.subscribe("/topic/news.>", uid("s")))
    assert msg == "User alice is not authorized to read from: topic://news.>"


def test_temporary_destinations_use_the_temp_entry(env: StompTestBroker) -> None:
    alice = stomp(env, "alice")
    msg = error_after(alice, lambda: alice.conn.subscribe("/temp-queue/replies", uid("s")))
    assert msg.startswith("User alice is not authorized to create: temp-queue://")
    bob = stomp(env, "bob")
    bob.subscribe("/temp-queue/replies")
    bob.send("/temp-queue/replies", "to myself")
    assert [m.body for m in bob.wait_messages(1)] == ["to myself"]


def test_durable_subscriptions_and_advisories_need_read(env: StompTestBroker) -> None:
    bob_id = uid("bob-")
    bob = stomp(env, "bob", client_id=bob_id)
    msg = error_after(bob, lambda: bob.conn.subscribe(
        "/topic/audit", uid("s"), headers={"activemq.subscriptionName": "mine"}))
    assert msg == "User bob is not authorized to read from: topic://audit"
    assert durables(env, bob_id) == []
    msg = error_after(bob, lambda: bob.conn.subscribe("/topic/ActiveMQ.Advisory.Connection",
                                                      uid("s")))
    assert msg == ("User bob is not authorized to read from: "
                   "topic://ActiveMQ.Advisory.Connection")
    carol = stomp(env, "carol")
    carol.subscribe("/topic/ActiveMQ.Advisory.Connection")
    stomp(env, "alice")  # its connection is advised to carol (the broker writes it)
    carol.listener.wait(lambda: carol.listener.messages, what="a connection advisory")


def test_denials_are_counted_per_user_and_logged_once_per_minute(
        env: StompTestBroker, caplog: pytest.LogCaptureFixture) -> None:
    alice = stomp(env, "alice")
    with caplog.at_level(logging.WARNING, logger="meshmq.broker"):
        for _ in range(5):
            error_after(alice, lambda: alice.conn.send("/queue/secret", "x"))
        error_after(alice, lambda: alice.conn.subscribe("/queue/secret", uid("s")))
    lines = [r.getMessage() for r in caplog.records if "not authorized" in r.getMessage()]
    assert len(lines) == 2, lines  # one per (user, right, destination)
    assert lines[0].startswith("User alice is not authorized to write to: queue://secret")
    denied = stats(env)["denied"]
    assert denied == {"total": 6, "by_user": {"alice": 6}}
