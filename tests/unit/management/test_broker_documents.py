"""The documents scripts read to learn a broker's state: ``/api/health``, ``/api/stat``,
``/api/broker`` (limits from the configuration, usage percentages), ``/api/network`` of a
broker without connectors, and one bridge's document from its status (outbound or
inbound, up or down), through the real application without a socket."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.memory_broker import memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq.config.model import MqttConfig, StompConfig, StoreConfig, UsageConfig
from meshmq.management.routes_broker import iso_ms, percent
from meshmq.management.routes_network import bridge_document


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    config = memory_config(
        broker_name="edge-7", usage=UsageConfig(memory_limit=2_000_000, on_limit="fail"),
        store=StoreConfig(max_disk_bytes=5_000_000, min_free_disk=1_000),
        stomp=StompConfig(max_frame_size=4096), mqtt=MqttConfig(max_packet_size=2048),
        max_subscriptions_per_connection=7)
    with memory_management(config) as api:
        yield api


def test_health_names_the_broker(api: MemoryManagement) -> None:
    assert api.get("/api/health") == {"status": "ok", "broker": "edge-7"}


def test_stat_follows_the_destinations_and_memory(api: MemoryManagement) -> None:
    before = api.get("/api/stat")
    assert (before["broker"], before["destinations"]) == ("edge-7", [])
    api.ok("POST", "/api/destinations/queue/orders/send",
           {"body": "x" * 100, "persistent": False}, 201)
    after = api.get("/api/stat")
    (orders,) = after["destinations"]
    assert (orders["type"], orders["name"], orders["depth"], orders["enqueued"]) == (
        "queue", "orders", 1, 1)
    assert after["memory"]["used"] > before["memory"]["used"] == 0
    assert after["memory"]["limit"] == 2_000_000


def test_the_broker_document_reports_the_configured_limits(api: MemoryManagement) -> None:
    body = api.get("/api/broker")
    assert body["name"] == "edge-7"
    assert body["limits"] == {
        "memory_bytes": 2_000_000, "memory_on_limit": "fail", "store_bytes": 5_000_000,
        "store_min_free_disk_bytes": 1_000, "max_connections": {},
        "max_subscriptions_per_connection": 7, "stomp_max_frame_bytes": 4096,
        "mqtt_max_packet_bytes": 2048}
    assert (body["store"]["kind"], body["store"]["limit_bytes"]) == ("memory", 5_000_000)
    assert (body["connections"], body["destinations"]) == (0, 0)


def test_memory_use_is_a_percentage_of_its_limit(api: MemoryManagement) -> None:
    api.ok("POST", "/api/destinations/queue/big/send",
           {"body": "x" * 50_000, "persistent": False}, 201)
    memory = api.get("/api/broker")["memory"]
    assert memory["bytes"] >= 50_000
    assert memory["percent"] == round(100 * memory["bytes"] / 2_000_000, 1) > 0


@pytest.mark.parametrize(("used", "limit", "expected"), [
    pytest.param(50, 200, 25.0, id="quarter"),
    pytest.param(1, 3, 33.3, id="rounded"),
    pytest.param(5, 0, 0.0, id="no-limit"),
    pytest.param(300, 200, 150.0, id="over"),
])
def test_percent_of_a_limit(used: int, limit: int, expected: float) -> None:
    assert percent(used, limit) == expected


def test_times_are_iso_8601_utc_to_the_millisecond() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000+00:00"
    assert iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123+00:00"


def test_a_broker_without_connectors_has_an_empty_network(api: MemoryManagement) -> None:
    assert api.get("/api/network") == {"broker": "edge-7", "connectors": [], "inbound": []}
    status, body = api.call("POST", "/api/network/connectors/hub/start")
    assert status == 404
    assert body == {"error": "no network connector named 'hub': this broker has none "
                             "configured (network_connectors in the configuration)",
                    "connectors": []}


def status(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "nc1@hub", "connector": "nc1", "remote_broker": "hub",
        "connected_to": "tcp://10.0.0.9:61616", "targets": ["tcp://10.0.0.9:61616"],
        "direction": "outbound", "state": "forwarding", "state_since": 1_700_000_000.5,
        "duplex": True, "last_error": None, "forwarded": 10, "acknowledged": 9,
        "inflight": 1, "received": 4, "attempts": 1, "refused": 0, "forward_rate": 2.5}
    base.update(changes)
    return base


def test_a_forwarding_bridge_document() -> None:
    assert bridge_document(status()) == {
        "id": "nc1@hub", "connector": "nc1", "peer": "hub", "uri": "tcp://10.0.0.9:61616",
        "direction": "outbound", "state": "forwarding",
        "state_since": "2023-11-14T22:13:20.500+00:00", "duplex": True, "last_error": None,
        "forwarded": 10, "acked": 9, "in_flight": 1, "received": 4, "reconnects": 0,
        "refused": 0, "forward_rate": 2.5, "held": [], "holds_sent": 0, "holds_received": 0}


def test_a_held_bridge_document_names_what_the_remote_holds() -> None:
    doc = bridge_document(status(held=["queue://orders"], holds_sent=2, holds_received=3))
    assert (doc["held"], doc["holds_sent"], doc["holds_received"]) == (
        ["queue://orders"], 2, 3)


def test_a_bridge_that_is_down_shows_its_targets_its_error_and_its_redials() -> None:
    doc = bridge_document(status(
        remote_broker=None, connected_to=None, targets=["tcp://a:1", "tcp://b:1"],
        state="connecting", attempts=4,
        last_error={"kind": "refused", "message": "connection refused",
                    "at": 1_700_000_000.25}))
    assert (doc["peer"], doc["uri"], doc["reconnects"]) == (None, "tcp://a:1,tcp://b:1", 3)
    assert doc["last_error"] == {"kind": "refused", "message": "connection refused",
                                 "at": "2023-11-14T22:13:20.250+00:00"}


def test_an_inbound_bridge_has_no_dial_uri_or_dial_error() -> None:
    doc = bridge_document(status(
        direction="inbound", connected_to=None, targets=None, attempts=0,
        last_error={"kind": "x", "message": "y", "at": 1.0}))
    assert (doc["uri"], doc["last_error"], doc["reconnects"]) == (None, None, 0)
