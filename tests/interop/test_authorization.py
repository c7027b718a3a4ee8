"""Rights per destination on every door: STOMP, MQTT 3.1.1, MQTT 5, STOMP and MQTT over
WebSocket, with real sockets and real clients (docs/security.md#authorization).

The map, the same for every test:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    User,
)
from meshmq.protocol.mqtt.packets import Puback, Publish
from meshmq.protocol.mqtt.properties import ReasonCode
from tests.interop.mqtt_helpers import MqttEnv, uid

USERS = (User("alice", "a-pw", ("producers",)), User("bob", "b-pw", ("consumers",)),
         User("carol", "c-pw", ("admins",)), User("dave", "d-pw", ("writers",)))
MAP = AuthorizationConfig(
    entries=(
        AuthorizationEntry(queue="orders.>", read=("consumers", "admins"),
                           write=("producers", "admins"),
                           admin=("producers", "consumers", "admins")),
        AuthorizationEntry(topic="prices.>", read=("consumers",), write=("producers",),
                           admin=("producers",)),
        AuthorizationEntry(queue="logs.>", write=("writers",)),
    ),
    default=AuthorizationRights(read=("admins",), write=("admins",), admin=("admins",)),
    temp=AuthorizationRights(read=("consumers",), write=("consumers",), admin=("consumers",)),
)
PASSWORDS = {u.name: u.password for u in USERS}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data", auth=AuthConfig(anonymous_access=False, users=USERS,
                                                    authorization=MAP))
    try:
        yield e
    finally:
        e.close()


def stomp(env: MqttEnv, user: str, **kw: Any) -> Any:
    return env.stomp(login=user, passcode=PASSWORDS[user], **kw)


def error_after(client: Any, send: Any) -> str:
    """Run ``send`` and return the message header of the ERROR it gets."""
    before = len(client.listener.errors)
    send()
    client.listener.wait(lambda: len(client.listener.errors) > before, what="an ERROR")
    return str(client.listener.errors[-1].headers.get("message"))


def stats(env: MqttEnv) -> dict[str, Any]:
    return dict(env.broker.run(env.runtime.broker.statistics))


def depth(env: MqttEnv, queue: str) -> int | None:
    for d in stats(env)["destinations"]:
        if d["name"] == queue and d["type"] == "queue":
            return int(d["depth"])
    return None


# ------------------------------------------------------------------------------- STOMP


def test_stomp_send_is_refused_with_activemqs_words_and_the_connection_stays_usable(
        env: MqttEnv) -> None:
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


def test_stomp_subscribe_and_browse_need_read(env: MqttEnv) -> None:
    carol = stomp(env, "carol")
    carol.send("/queue/secret", "classified")
    bob = stomp(env, "bob")
    for headers in ({}, {"browser": "true"}):
        msg = error_after(bob, lambda h=headers: bob.conn.subscribe(  # type: ignore[misc]
            "/queue/secret", uid("s"), headers=h))
        assert msg == "User bob is not authorized to read from: queue://secret"
    bob.subscribe("/queue/orders.open")  # allowed: the connection still works
    assert depth(env, "secret") == 1  # nothing was consumed
    carol.subscribe("/queue/secret", headers={"browser": "true"})
    assert carol.wait_messages(1)[0].body == "classified"  # then the end-of-browse frame


def test_the_send_that_creates_a_destination_needs_admin(env: MqttEnv) -> None:
    dave = stomp(env, "dave")
    msg = error_after(dave, lambda: dave.conn.send("/queue/logs.app", "line 1"))
    assert msg.startswith("User dave is not authorized to create: queue://logs.app")
    assert "admin right" in msg
    carol = stomp(env, "carol")
    carol.send("/queue/logs.app", "created by an admin")
    dave.send("/queue/logs.app", "line 2")  # it exists now: write is enough
    assert depth(env, "logs.app") == 2


def test_a_composite_send_needs_every_part_and_delivers_none_when_refused(
        env: MqttEnv) -> None:
    alice = stomp(env, "alice")
    msg = error_after(alice, lambda: alice.conn.send("/queue/orders.c,/queue/secret", "x"))
    assert msg == "User alice is not authorized to write to: queue://secret"
    assert depth(env, "orders.c") is None and depth(env, "secret") is None
    alice.send("/queue/orders.c,/topic/prices.c", "both allowed")
    assert depth(env, "orders.c") == 1


def test_wildcard_subscriptions_carry_only_what_the_user_may_read(env: MqttEnv) -> None:
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
    bodies = bob.listener.wait(lambda: "end" in bob.listener.bodies()
                               and "created after the subscription" in bob.listener.bodies()
                               and bob.listener.bodies(), what="the marker")
    assert sorted(bodies) == sorted(["order", "1.08", "created after the subscription",
                                     "end"])
    assert depth(env, "secret") == 1 and depth(env, "secret2") == 1
    # A wildcard that can match nothing the user may read is refused outright.
    msg = error_after(alice, lambda: alice.conn.subscribe("/topic/news.>", uid("s")))
    assert msg == "User alice is not authorized to read from: topic://news.>"


def test_temporary_destinations_use_the_temp_entry(env: MqttEnv) -> None:
    alice = stomp(env, "alice")
    msg = error_after(alice, lambda: alice.conn.subscribe("/temp-queue/replies", uid("s")))
    assert msg.startswith("User alice is not authorized to create: temp-queue://")
    bob = stomp(env, "bob")
    bob.subscribe("/temp-queue/replies")
    bob.send("/temp-queue/replies", "to myself")
    assert [m.body for m in bob.wait_messages(1)] == ["to myself"]


def test_durable_subscriptions_and_advisories_need_read(env: MqttEnv) -> None:
    bob = stomp(env, "bob", client_id=uid("bob-"))
    msg = error_after(bob, lambda: bob.conn.subscribe(
        "/topic/audit", uid("s"), headers={"activemq.subscriptionName": "mine"}))
    assert msg == "User bob is not authorized to read from: topic://audit"
    assert env.durables(bob._headers["client-id"]) == []
    msg = error_after(bob, lambda: bob.conn.subscribe("/topic/ActiveMQ.Advisory.Connection",
                                                      uid("s")))
    assert msg == ("User bob is not authorized to read from: "
                   "topic://ActiveMQ.Advisory.Connection")
    carol = stomp(env, "carol")
    carol.subscribe("/topic/ActiveMQ.Advisory.Connection")
    stomp(env, "alice")  # its connection is advised to carol (the broker writes it)
    carol.listener.wait(lambda: carol.listener.messages, what="a connection advisory")


def test_denials_are_counted_per_user_and_logged_once_per_minute(
        env: MqttEnv, caplog: pytest.LogCaptureFixture) -> None:
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


# -------------------------------------------------------------------------------- MQTT


def test_mqtt311_refused_subscription_is_0x80_and_a_refused_publish_is_dropped(
        env: MqttEnv) -> None:
    bob = env.raw_connected(4, username="bob", password=b"b-pw")
    ack = bob.subscribe("prices/#", "secret/x", qos=1)
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1, 0x80]
    carol = env.raw_connected(4, username="carol", password=b"c-pw")
    carol.subscribe("secret/#", qos=1)
    alice = env.raw_connected(4, username="alice", password=b"a-pw")
    ack = alice.publish("secret/x", b"spoof", qos=1)
    assert isinstance(ack, Puback)  # 3.1.1 has no refusal: acknowledged and dropped
    alice.publish("secret/y", b"spoof", qos=2)  # the QoS 2 exchange completes too
    alice.publish("prices/eur", b"1.08", qos=1)
    assert [p.payload for p in bob.publishes(1)] == [b"1.08"]
    assert carol.ping() == []  # nothing reached the admin's subscription
    assert stats(env)["denied"]["by_user"] == {"alice": 2, "bob": 1}


def test_mqtt5_refusals_say_not_authorized_with_a_reason(env: MqttEnv) -> None:
    bob = env.raw_connected(5, username="bob", password=b"b-pw")
    ack = bob.subscribe("prices/+", "orders/x", qos=1)
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED]
    assert ack.properties.reason_string == \
        "User bob is not authorized to read from: topic://orders.x"
    alice = env.raw_connected(5, username="alice", password=b"a-pw")
    ack = alice.publish("news/x", b"spoof", qos=1)
    assert isinstance(ack, Puback) and ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert ack.properties.reason_string == \
        "User alice is not authorized to write to: topic://news.x"
    alice.publish("prices/usd", b"1.0", qos=1)
    got = bob.publishes(1)
    assert isinstance(got[0], Publish) and got[0].payload == b"1.0"


def test_retained_messages_reach_only_readers(env: MqttEnv) -> None:
    carol = env.raw_connected(5, username="carol", password=b"c-pw")
    carol.publish("secret/state", b"classified", qos=1, retain=True)
    alice = env.raw_connected(5, username="alice", password=b"a-pw")
    alice.publish("prices/eur", b"1.08", qos=1, retain=True)
    bob = env.raw_connected(5, username="bob", password=b"b-pw")
    ack = bob.subscribe("#", qos=1)  # allowed: bob may read prices/...
    assert list(ack.reason_codes) == [ReasonCode.GRANTED_QOS_1]
    assert [p.payload for p in bob.publishes(1)] == [b"1.08"]
    assert bob.ping() == []  # and not the secret one


def test_websocket_doors_apply_the_same_rights(env: MqttEnv) -> None:
    paho = env.paho(5, transport="websockets", username="bob", password="b-pw")
    codes = paho.subscribe("secret/x", 1)
    assert [getattr(c, "value", c) for c in codes] == [ReasonCode.NOT_AUTHORIZED]
    ws = env.ws_stomp("alice", "a-pw")
    ws.send("SEND", [("destination", "/queue/secret"), ("receipt", "r1")], b"x")
    err = ws.next("ERROR")
    assert err.get("message") == "User alice is not authorized to write to: queue://secret"
    assert err.get("receipt-id") == "r1"
    ws.receipt("SEND", [("destination", "/queue/orders.ws")], b"fine")  # still connected
    assert depth(env, "orders.ws") == 1
