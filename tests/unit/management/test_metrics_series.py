"""What ``GET /metrics`` promises a monitoring system: every family's name and type, the
configured limits, failed logins and authorization refusals counted, one HA series for a
standalone broker, and which destinations get series of their own
(``select_destinations``, the bound on cardinality)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from tests.management.http import basic
from tests.support.authorization_map import MAP, PASSWORDS, USERS
from tests.support.memory_broker import memory_config
from tests.support.memory_management import MemoryManagement, memory_management

from meshmq.config.model import AuthConfig, MetricsConfig, StoreConfig, UsageConfig
from meshmq.management.metrics import OTHER, select_destinations

GAUGES = {"meshmq_uptime_seconds", "meshmq_connections", "meshmq_memory_used_bytes",
          "meshmq_memory_limit_bytes", "meshmq_destination_messages",
          "meshmq_destination_consumers", "meshmq_destination_producers",
          "meshmq_destination_inflight_messages", "meshmq_destination_memory_bytes",
          "meshmq_bridge_state", "meshmq_bridge_inflight_messages",
          "meshmq_bridge_held_destinations",
          "meshmq_store_limit_bytes", "meshmq_store_refusing_persistent", "meshmq_ha_role",
          "meshmq_ha_epoch"}
COUNTERS = {"meshmq_messages_enqueued", "meshmq_messages_dequeued", "meshmq_denied",
            "meshmq_login_failures", "meshmq_destination_enqueued",
            "meshmq_destination_dequeued", "meshmq_destination_dispatched",
            "meshmq_destination_expired", "meshmq_destination_dead_lettered",
            "meshmq_bridge_forwarded", "meshmq_bridge_acknowledged", "meshmq_bridge_received",
            "meshmq_bridge_refused", "meshmq_bridge_connects", "meshmq_bridge_holds_sent",
            "meshmq_bridge_holds_received", "meshmq_trace_events_written",
            "meshmq_trace_events_dropped"}


def families(api: MemoryManagement, **headers: str) -> dict[str, Any]:
    reply = api.request("GET", "/metrics", headers=headers)
    assert reply.status == 200, reply.text
    return {f.name: f for f in text_string_to_metric_families(reply.text)}


def sample(api: MemoryManagement, name: str, **headers: str) -> float:
    (only,) = families(api, **headers)[name].samples
    return float(only.value)


@pytest.fixture
def api() -> Iterator[MemoryManagement]:
    config = memory_config(usage=UsageConfig(memory_limit=3_000_000),
                           store=StoreConfig(max_disk_bytes=9_000_000),
                           auth=AuthConfig(users=USERS, authorization=MAP))
    with memory_management(config) as api:
        yield api


def test_every_family_has_its_documented_name_and_type(api: MemoryManagement) -> None:
    reply = api.request("GET", "/metrics",
                        headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    found = {f.name: f for f in openmetrics_families(reply.text)}
    types = {name: f.type for name, f in found.items()}
    assert {n for n, t in types.items() if t == "gauge"} == GAUGES
    assert {n for n, t in types.items() if t == "counter"} == COUNTERS
    assert types["meshmq_store_sync_seconds"] == "histogram"
    assert types["meshmq_bridge_last_error"] == "info"
    assert all(f.documentation for f in found.values())


def test_the_configured_limits_are_exposed(api: MemoryManagement) -> None:
    assert sample(api, "meshmq_memory_limit_bytes") == 3_000_000
    assert sample(api, "meshmq_store_limit_bytes") == 9_000_000
    assert sample(api, "meshmq_store_refusing_persistent") == 0


def test_failed_logins_are_counted(api: MemoryManagement) -> None:
    assert sample(api, "meshmq_login_failures") == 0
    for password in ("guess", "guess-again"):
        assert api.request("GET", "/api/health", headers=basic("bob", password)).status == 401
    assert sample(api, "meshmq_login_failures") == 2


def test_authorization_refusals_are_counted(api: MemoryManagement) -> None:
    client = api.broker.stomp()
    client.connect(login="bob", passcode=PASSWORDS["bob"])
    client.send("SEND", {"destination": "/queue/orders.new", "receipt": "r"}, b"x")
    assert client.expect("ERROR").get("message") == ("User bob is not authorized to write "
                                                     "to: queue://orders.new")
    api.poll(lambda: sample(api, "meshmq_denied") == 1, what="the refusal counted")


def test_a_standalone_broker_has_one_ha_series(api: MemoryManagement) -> None:
    found = families(api)
    assert [(s.labels, s.value) for s in found["meshmq_ha_role"].samples] == [
        ({"mode": "none", "role": "standalone"}, 1.0)]
    assert [s.value for s in found["meshmq_ha_epoch"].samples] == [0.0]


def figures(name: str, kind: str = "queue", depth: int = 1) -> dict[str, Any]:
    return {"name": name, "type": kind, "depth": depth, "enqueued": depth * 2}


def test_without_patterns_destinations_get_series_in_name_order_up_to_the_limit() -> None:
    dests = [figures("c", depth=3), figures("a", depth=1), figures("b", "topic", 0),
             figures("d", depth=4)]
    kept, other = select_destinations(dests, MetricsConfig(max_destinations=2))
    assert [d["name"] for d in kept] == ["a", "b"]
    assert other == {"queue": {"depth": 7, "enqueued": 14, "dequeued": 0, "dispatched": 0,
                               "expired": 0, "dead_lettered": 0, "consumers": 0,
                               "producers": 0, "inflight": 0, "memory": 0}}


def test_destinations_no_pattern_names_are_summed_per_type() -> None:
    dests = [figures("orders.us"), figures("audit"), figures("audit", "topic", 5),
             figures("orders.eu", depth=2)]
    kept, other = select_destinations(dests, MetricsConfig(destinations=("orders.>",)))
    assert [(d["name"], d["type"]) for d in kept] == [("orders.eu", "queue"),
                                                      ("orders.us", "queue")]
    assert (other["queue"]["depth"], other["topic"]["depth"]) == (1, 5)


def test_everything_fits_nothing_is_other() -> None:
    kept, other = select_destinations([figures("a"), figures("a", "topic")], MetricsConfig())
    assert [(d["name"], d["type"]) for d in kept] == [("a", "queue"), ("a", "topic")]
    assert other == {} and OTHER == "_other"
