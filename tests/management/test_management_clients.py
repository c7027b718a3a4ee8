"""/api/broker, /api/ha, /api/connections and /api/subscriptions over real HTTP, with
real STOMP (TCP and WebSocket) and MQTT 3.1.1/5 clients: what is listed, and closing a
connection or deleting a durable subscription for an operator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pytest

from meshmq import __version__
from meshmq.config.model import UsageConfig
from meshmq.protocol.mqtt.packets import Disconnect
from meshmq.protocol.mqtt.reason_codes import ReasonCode
from tests.interop.mqtt_helpers import MqttEnv, poll, uid
from tests.interop.stomp_helpers import ClosedError, RawClient
from tests.management.http import call, get


@pytest.fixture
def env(tmp_path: Path) -> Iterator[MqttEnv]:
    e = MqttEnv(tmp_path / "data", usage=UsageConfig(memory_limit=10_000_000))
    try:
        yield e
    finally:
        e.close()


def port_of(env: MqttEnv) -> int:
    return env.broker.management_port


def connections(env: MqttEnv) -> list[dict[str, object]]:
    return get(port_of(env), "/api/connections")["connections"]  # type: ignore[no-any-return]


def wait_connections(env: MqttEnv, count: int) -> list[dict[str, object]]:
    """The connection list once it has ``count`` entries."""
    found: list[list[dict[str, object]]] = []

    def listed() -> bool:
        found[:] = [connections(env)]
        return len(found[0]) == count

    poll(listed, what=f"{count} connections listed")
    return found[0]


def test_broker_document(env: MqttEnv) -> None:
    stomp = env.stomp()
    stomp.send("/queue/held", "x" * 1000)
    poll(lambda: get(port_of(env), "/api/broker")["memory"]["bytes"] > 0,
         what="the queued message counted in memory")
    body = get(port_of(env), "/api/broker")
    assert body["name"] == "test" and body["version"] == __version__
    assert body["role"] == "standalone"
    assert body["connections"] == 1 and body["destinations"] == 1
    assert body["memory"]["limit_bytes"] == 10_000_000
    assert body["memory"]["percent"] == round(100 * body["memory"]["bytes"] / 10_000_000, 1)
    assert body["store"]["kind"] == "journal" and body["store"]["bytes"] > 0
    assert body["store"]["limit_bytes"] == 0 and body["store"]["percent"] == 0.0
    started = datetime.fromisoformat(body["started_at"])
    assert started.tzinfo is not None
    assert 0 <= body["uptime_ms"] < 600_000
    assert body["limits"]["max_connections"] == {"stomp": 1000, "mqtt": 1000, "ws": 1000}
    assert body["limits"]["memory_bytes"] == 10_000_000


def test_ha_of_a_standalone_broker(env: MqttEnv) -> None:
    body = get(port_of(env), "/api/ha")
    assert body == {"mode": "none", "role": "standalone", "epoch": 0, "broker": "test",
                    "serving": True}


def test_connections_list_every_client_protocol(env: MqttEnv) -> None:
    stomp = RawClient(env.broker)
    stomp.connect(extra=[("client-id", "stomp-1"), ("login", "someone"),
                         ("passcode", "x")])
    stomp.send_frame("SUBSCRIBE", [("destination", "/queue/orders"), ("id", "s1"),
                                   ("ack", "client-individual"),
                                   ("selector", "prio > 3")])
    stomp.send_frame("SEND", [("destination", "/queue/other"), ("receipt", "r1")], b"hi")
    assert stomp.read_frame().command == "RECEIPT"
    mqtt = env.raw_connected(level=5, client_id="mqtt-1")
    mqtt.subscribe("sensors/+", qos=1)
    ws = env.ws_stomp()
    try:
        conns = wait_connections(env, 3)
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
    finally:
        stomp.close()
        ws.close()
    wait_connections(env, 1)  # the closed clients are gone from the list


def test_closing_a_stomp_connection_sends_an_error_frame(env: MqttEnv) -> None:
    stomp = RawClient(env.broker)
    stomp.connect()
    bystander = env.raw_connected(level=4)
    (conn,) = [c for c in wait_connections(env, 2) if c["protocol"] == "stomp"]
    status, body = call(port_of(env), "DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert (status, body) == (200, {"closed": conn["id"]})
    frame = stomp.read_frame()
    assert frame.command == "ERROR"
    assert frame["message"] == "connection closed by an administrator"
    with pytest.raises(ClosedError):
        stomp.read_frame()
    assert [c["protocol"] for c in wait_connections(env, 1)] == ["mqtt"]
    assert bystander.ping() == []  # nobody else affected
    status, body = call(port_of(env), "DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert status == 404 and "GET /api/connections" in body["error"]
    stomp.close()


@pytest.mark.parametrize("level", [4, 5])
def test_closing_an_mqtt_connection(env: MqttEnv, level: int) -> None:
    client = env.raw_connected(level=level, client_id=uid("admin-close"))
    (conn,) = wait_connections(env, 1)
    status, _ = call(port_of(env), "DELETE", f"/api/connections/{quote(str(conn['id']))}")
    assert status == 200
    packets = client.until_closed()
    if level == 5:
        assert len(packets) == 1 and isinstance(packets[0], Disconnect)
        assert packets[0].reason_code == ReasonCode.ADMINISTRATIVE_ACTION
        assert packets[0].properties.reason_string == "connection closed by an administrator"
    else:
        assert packets == []  # MQTT 3.1.1 has no server DISCONNECT: just closed
    poll(lambda: connections(env) == [], what="the connection gone")


def test_closing_an_unknown_connection_is_404(env: MqttEnv) -> None:
    status, body = call(port_of(env), "DELETE", "/api/connections/no-such-id")
    assert status == 404 and "no-such-id" in body["error"]


def test_subscriptions_and_deleting_a_durable_one(env: MqttEnv) -> None:
    stomp = RawClient(env.broker)
    stomp.connect(extra=[("client-id", "dur-client")])
    stomp.send_frame("SUBSCRIBE", [("destination", "/topic/prices"), ("id", "d1"),
                                   ("activemq.subscriptionName", "watch"),
                                   ("receipt", "r1")])
    assert stomp.read_frame().command == "RECEIPT"
    stomp.send_frame("SUBSCRIBE", [("destination", "/queue/work"), ("id", "q1"),
                                   ("receipt", "r2")])
    assert stomp.read_frame().command == "RECEIPT"
    port = port_of(env)
    subs = get(port, "/api/subscriptions")["subscriptions"]
    kinds = {s["kind"]: s for s in subs}
    assert set(kinds) == {"durable", "queue"}
    assert kinds["durable"]["client_id"] == "dur-client"
    assert kinds["durable"]["name"] == "watch" and kinds["durable"]["active"] is True
    assert kinds["durable"]["destination"] == "topic://prices"
    assert kinds["queue"]["destination"] == "queue://work"
    path = "/api/subscriptions/durable/dur-client/watch"
    status, body = call(port, "DELETE", path)
    assert status == 409 and "active" in body["error"]
    stomp.send_frame("DISCONNECT", [("receipt", "bye")])
    assert stomp.read_frame().command == "RECEIPT"
    stomp.close()
    poll(lambda: not get(port, "/api/subscriptions")["subscriptions"][0]["active"],
         what="the durable subscription offline")
    offline = get(port, "/api/subscriptions")["subscriptions"]
    assert offline == [{"kind": "durable", "connection": None, "client_id": "dur-client",
                        "name": "watch", "destination": "topic://prices", "selector": None,
                        "pending": 0, "dispatched": 0, "active": False}]
    # Messages published while it is offline are kept for it, then dropped with it.
    sender = env.stomp()
    sender.send("/topic/prices", "42")
    poll(lambda: get(port, "/api/subscriptions")["subscriptions"][0]["pending"] == 1,
         what="a message kept for the offline subscription")
    status, body = call(port, "DELETE", path)
    assert (status, body) == (200, {"deleted": {"client_id": "dur-client", "name": "watch",
                                                "messages_dropped": 1}})
    assert env.durables("dur-client") == []
    assert call(port, "DELETE", path)[0] == 404
