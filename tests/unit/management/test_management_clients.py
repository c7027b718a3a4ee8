"""/api/broker, /api/ha, /api/connections and /api/subscriptions through the real
management application without a socket, with STOMP and MQTT 3.1.1/5 clients of a
broker driven in memory: what is listed, and closing a connection or deleting a durable
subscription for an operator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from tests.support.memory_broker import StompClient, memory_config
from tests.support.memory_management import MemoryManagement, memory_management
from tests.support.memory_mqtt import MemoryMqtt, uid

from meshmq import __version__
from meshmq.config.model import UsageConfig
from meshmq.protocol.mqtt import Disconnect, ReasonCode
from meshmq.store.journal import JournalStore


@pytest.fixture
def api(tmp_path: Path) -> Iterator[MemoryManagement]:
    with memory_management(memory_config(persistent=True,
                                         usage=UsageConfig(memory_limit=10_000_000)),
                           store=JournalStore(tmp_path / "journal", fsync=False)) as api:
        yield api


def connections(api: MemoryManagement) -> list[dict[str, Any]]:
    return api.get("/api/connections")["connections"]  # type: ignore[no-any-return]


def wait_connections(api: MemoryManagement, count: int) -> list[dict[str, Any]]:
    """The connection list once it has ``count`` entries."""
    def listed() -> list[dict[str, Any]] | None:
        found = connections(api)
        return found if len(found) == count else None

    return api.poll(listed, what=f"{count} connections listed")


def stomp(api: MemoryManagement, **headers: str) -> StompClient:
    client = api.broker.stomp()
    assert client.connect(**headers).command == "CONNECTED"
    return client


def mqtt(api: MemoryManagement, level: int, client_id: str | None = None) -> MemoryMqtt:
    client = MemoryMqtt(api.broker, level)
    client.connect(uid("raw") if client_id is None else client_id)
    return client


def test_broker_document(api: MemoryManagement) -> None:
    client = stomp(api)
    client.send("SEND", {"destination": "/queue/held", "persistent": "true",
                         "receipt": "r"}, b"x" * 1000)
    client.expect("RECEIPT")
    api.poll(lambda: api.get("/api/broker")["memory"]["bytes"] > 0,
             what="the queued message counted in memory")
    body = api.get("/api/broker")
    assert body["name"] == api.broker.config.broker_name and body["version"] == __version__
    assert body["role"] == "standalone"
    assert body["connections"] == 1 and body["destinations"] == 1
    assert body["memory"]["limit_bytes"] == 10_000_000
    assert body["memory"]["percent"] == round(100 * body["memory"]["bytes"] / 10_000_000, 1)
    assert body["store"]["kind"] == "journal" and body["store"]["bytes"] > 0
    assert body["store"]["limit_bytes"] == 0 and body["store"]["percent"] == 0.0
    started = datetime.fromisoformat(body["started_at"])
    assert started.tzinfo is not None
    assert 0 <= body["uptime_ms"] < 600_000
    # One limit per listener: a memory broker has none (the served test shows one).
    assert body["limits"]["max_connections"] == {}
    assert body["limits"]["memory_bytes"] == 10_000_000


def test_ha_of_a_standalone_broker(api: MemoryManagement) -> None:
    body = api.get("/api/ha")
    assert body == {"mode": "none", "role": "standalone", "epoch": 0,
                    "broker": api.broker.config.broker_name, "serving": True}


def test_connections_list_every_client_protocol(api: MemoryManagement) -> None:
    client = stomp(api, **{"client-id": "stomp-1", "login": "someone", "passcode": "x"})
    client.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "s1",
                              "ack": "client-individual", "selector": "prio > 3"})
    client.send("SEND", {"destination": "/queue/other", "receipt": "r1"}, b"hi")
    client.expect("RECEIPT")
    m5 = mqtt(api, 5, "mqtt-1")
    m5.subscribe("sensors/+", qos=1)
    other = stomp(api)
    conns = wait_connections(api, 3)
    by_client = {c["client_id"]: c for c in conns}
    s = by_client["stomp-1"]
    assert s["protocol"] == "stomp" and s["user"] == "anonymous"
    assert s["messages_in"] == 1 and s["messages_out"] == 0
    assert s["subscriptions"] == [{"id": "s1", "destination": "queue://orders",
                                   "selector": "prio > 3", "ack": "client-individual"}]
    assert str(s["address"]).startswith("127.0.0.1:")
    datetime.fromisoformat(str(s["connected_at"]))
    m = by_client["mqtt-1"]
    assert m["protocol"].startswith("mqtt")
    assert [sub["destination"] for sub in m["subscriptions"]] == ["topic://sensors.*"]
    assert len({c["id"] for c in conns}) == 3
    client.drop()
    other.send("DISCONNECT")
    assert [c["client_id"] for c in wait_connections(api, 1)] == ["mqtt-1"]


def test_closing_a_stomp_connection_sends_an_error_frame(api: MemoryManagement) -> None:
    client = stomp(api)
    bystander = mqtt(api, 4)
    (conn,) = [c for c in wait_connections(api, 2) if c["protocol"] == "stomp"]
    status, body = api.call("DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert (status, body) == (200, {"closed": conn["id"]})
    frame = client.expect("ERROR")
    assert frame.get("message") == "connection closed by an administrator"
    client.wait_closed()
    assert client.received() == []
    assert [c["protocol"] for c in wait_connections(api, 1)] == ["mqtt"]
    assert bystander.ping() == []  # nobody else affected
    status, body = api.call("DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert status == 404 and "GET /api/connections" in body["error"]


@pytest.mark.parametrize("level", [4, 5])
def test_closing_an_mqtt_connection(api: MemoryManagement, level: int) -> None:
    client = mqtt(api, level, uid("admin-close"))
    (conn,) = wait_connections(api, 1)
    status, _ = api.call("DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert status == 200
    packets = client.until_closed()
    if level == 5:
        assert len(packets) == 1 and isinstance(packets[0], Disconnect)
        assert packets[0].reason_code == ReasonCode.ADMINISTRATIVE_ACTION
        assert packets[0].properties.reason_string == "connection closed by an administrator"
    else:
        assert packets == []  # MQTT 3.1.1 has no server DISCONNECT: just closed
    api.poll(lambda: connections(api) == [], what="the connection gone")


def test_closing_an_unknown_connection_is_404(api: MemoryManagement) -> None:
    status, body = api.call("DELETE", "/api/connections/no-such-id")
    assert status == 404 and "no-such-id" in body["error"]


def test_subscriptions_and_deleting_a_durable_one(api: MemoryManagement) -> None:
    client = stomp(api, **{"client-id": "dur-client"})
    client.send("SUBSCRIBE", {"destination": "/topic/prices", "id": "d1",
                              "activemq.subscriptionName": "watch", "receipt": "r1"})
    client.expect("RECEIPT")
    client.send("SUBSCRIBE", {"destination": "/queue/work", "id": "q1", "receipt": "r2"})
    client.expect("RECEIPT")
    subs = api.get("/api/subscriptions")["subscriptions"]
    kinds = {s["kind"]: s for s in subs}
    assert set(kinds) == {"durable", "queue"}
    assert kinds["durable"]["client_id"] == "dur-client"
    assert kinds["durable"]["name"] == "watch" and kinds["durable"]["active"] is True
    assert kinds["durable"]["destination"] == "topic://prices"
    assert kinds["queue"]["destination"] == "queue://work"
    path = "/api/subscriptions/durable/dur-client/watch"
    status, body = api.call("DELETE", path)
    assert status == 409 and "active" in body["error"]
    client.send("DISCONNECT", {"receipt": "bye"})
    client.expect("RECEIPT")
    api.poll(lambda: not api.get("/api/subscriptions")["subscriptions"][0]["active"],
             what="the durable subscription offline")
    offline = api.get("/api/subscriptions")["subscriptions"]
    assert offline == [{"kind": "durable", "connection": None, "client_id": "dur-client",
                        "name": "watch", "destination": "topic://prices", "selector": None,
                        "pending": 0, "dispatched": 0, "active": False}]
    # Messages published while it is offline are kept for it, then dropped with it.
    sender = stomp(api)
    sender.send("SEND", {"destination": "/topic/prices"}, b"42")
    api.poll(lambda: api.get("/api/subscriptions")["subscriptions"][0]["pending"] == 1,
             what="a message kept for the offline subscription")
    status, body = api.call("DELETE", path)
    assert (status, body) == (200, {"deleted": {"client_id": "dur-client", "name": "watch",
                                                "messages_dropped": 1}})
    assert sorted(name for cid, name in api.broker.runtime.broker.durables
                  if cid == "dur-client") == []
    assert api.call("DELETE", path)[0] == 404
