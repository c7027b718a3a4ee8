"""``GET /metrics`` through the real management application without a socket, on a
broker driven in memory with STOMP traffic, parsed with prometheus_client's own parser:
names, labels and values, the OpenMetrics variant, destinations summed into ``_other``
and the login rules every GET follows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.management.http import basic
from tests.support.memory_broker import StompClient, memory_config
from tests.support.memory_management import MemoryManagement, Reply, memory_management

from meshmq.config.model import AuthConfig, ManagementConfig, MetricsConfig, User
from meshmq.store.journal import JournalStore

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fetch(api: MemoryManagement, **headers: str) -> Reply:
    return api.request("GET", "/metrics", headers=headers)


def scrape(api: MemoryManagement) -> Samples:
    reply = fetch(api)
    assert reply.status == 200, reply.text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(reply.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def current(api: MemoryManagement, name: str, **labels: str) -> float | None:
    return scrape(api).get((name, frozenset(labels.items())))


def series(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(lbls)[label] for n, lbls in samples if n == name}


def stomp(api: MemoryManagement, listener: str | None = None) -> StompClient:
    client = api.broker.stomp(listener)
    assert client.connect().command == "CONNECTED"
    return client


def send(client: StompClient, destination: str, body: bytes, **headers: str) -> None:
    client.send("SEND", {"destination": destination, "receipt": "r", **headers}, body)
    client.expect("RECEIPT")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[MemoryManagement]:
    with memory_management(memory_config(persistent=True),
                           store=JournalStore(tmp_path / "journal", fsync=False)) as api:
        yield api


def test_scrape_follows_stomp_traffic_on_a_queue(api: MemoryManagement) -> None:
    reply = fetch(api)
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    before = scrape(api)
    assert value(before, "meshmq_ha_role", mode="none", role="standalone") == 1
    client = stomp(api, "stomp")
    for i in range(3):
        send(client, "/queue/orders", f"order {i}".encode(), persistent="true")
    sent = scrape(api)
    # One series per listener; its protocol label comes from the listener's config,
    # which a memory broker does not have.
    assert series(before, "meshmq_connections", "listener") == set()
    assert value(sent, "meshmq_connections", listener="stomp", protocol="") == 1
    assert value(sent, "meshmq_destination_messages", destination="orders", type="queue") == 3
    assert value(sent, "meshmq_destination_enqueued_total", destination="orders",
                 type="queue") == 3
    assert (value(sent, "meshmq_messages_enqueued_total")
            - value(before, "meshmq_messages_enqueued_total")) == 3
    assert value(sent, "meshmq_store_disk_bytes") > 0
    client.send("SUBSCRIBE", {"destination": "/queue/orders", "id": "s",
                              "ack": "client-individual"})
    for _ in range(3):
        frame = client.expect("MESSAGE")
        client.send("ACK", {"id": frame.get("ack") or ""})
    api.poll(lambda: current(api, "meshmq_destination_dequeued_total",
                             destination="orders", type="queue") == 3, what="3 acks counted")
    after = scrape(api)
    assert value(after, "meshmq_destination_messages", destination="orders", type="queue") == 0
    assert value(after, "meshmq_destination_consumers", destination="orders",
                 type="queue") == 1
    # Persistent deliveries waited for a durable sync: the histogram saw them.
    assert value(after, "meshmq_store_sync_seconds_count") > value(
        before, "meshmq_store_sync_seconds_count")
    assert value(after, "meshmq_uptime_seconds") >= value(before, "meshmq_uptime_seconds")


def test_openmetrics_is_served_to_a_scraper_that_asks_for_it(api: MemoryManagement) -> None:
    reply = fetch(api, Accept="application/openmetrics-text; version=1.0.0")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    assert reply.text.endswith("# EOF\n")
    assert "meshmq_messages_enqueued_total 0" in reply.text


def test_destinations_beyond_the_patterns_and_the_limit_are_summed_into_other() -> None:
    metrics = MetricsConfig(destinations=("orders.>",), max_destinations=2)
    with memory_management(memory_config(management=ManagementConfig(
            enabled=False, metrics=metrics))) as api:
        client = stomp(api)
        for name, count in (("orders.a", 1), ("orders.b", 2), ("orders.c", 3),
                            ("audit", 4)):
            for _ in range(count):
                send(client, f"/queue/{name}", b"x")
        send(client, "/topic/prices", b"x")
        samples = scrape(api)
    assert series(samples, "meshmq_destination_messages", "destination") == {
        "orders.a", "orders.b", "_other"}
    assert value(samples, "meshmq_destination_messages", destination="_other",
                 type="queue") == 3 + 4
    assert value(samples, "meshmq_destination_enqueued_total", destination="_other",
                 type="topic") == 1
    # The broker-wide totals still count every destination.
    assert value(samples, "meshmq_messages_enqueued_total") == 1 + 2 + 3 + 4 + 1
    assert not any(d.startswith("ActiveMQ.") for d in
                   series(samples, "meshmq_destination_enqueued_total", "destination"))


def test_metrics_follow_the_login_rules_of_every_get() -> None:
    users = AuthConfig(users=(User("bob", "bobpw", ("users",)),))
    with memory_management(memory_config(auth=users, management=ManagementConfig(
            enabled=False, host="0.0.0.0"))) as api:
        reply = fetch(api)
        assert reply.status == 401 and reply.content_type == "application/json"
        assert "authentication required" in reply.text
        assert fetch(api, **basic("bob", "wrong")).status == 401
        reply = fetch(api, **basic("bob", "bobpw"))
        assert reply.status == 200 and "meshmq_uptime_seconds" in reply.text
