"""Rights per destination on the MQTT 3.1.1 and MQTT 5 doors and over WebSocket (paho
and STOMP), with real sockets and real clients (docs/security.md#authorization). The
STOMP rights are tested in memory in
tests/unit/broker/stomp/test_broker_stomp_authorization.py.

The map, the same for every test:

- queue ``orders.>``: read consumers/admins, write producers/admins, admin everybody named
- topic ``prices.>``: read consumers, write producers, admin producers
- queue ``logs.>``: write writers (no admin: the first send cannot create one)
- default: everything for admins; temporary destinations: consumers only
"""

from __future__ import annotations

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
from tests.interop.mqtt_helpers import MqttEnv

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


def stats(env: MqttEnv) -> dict[str, Any]:
    return dict(env.broker.run(env.runtime.broker.statistics))


def depth(env: MqttEnv, queue: str) -> int | None:
    for d in stats(env)["destinations"]:
        if d["name"] == queue and d["type"] == "queue":
            return int(d["depth"])
    return None


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
