"""``GET /metrics`` of real brokers linked by a real bridge, scraped over real HTTP and
parsed with prometheus_client's own parser: the bridge series, and every metric the
Grafana dashboard uses. Names, labels and values after STOMP traffic, the OpenMetrics
variant, ``_other`` and the login rules are tested without a socket in
tests/unit/management/test_metrics.py."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError
from tests.network.helpers import connector, consumers_on, net_config, tcp_uri, wait_forwarding
from tests.support.brokers import ThreadBroker, poll

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fetch(port: int, *, accept: str | None = None, user: str | None = None,
          password: str = "") -> tuple[int, str, str]:
    headers = {}
    if accept is not None:
        headers["Accept"] = accept
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read().decode()
    finally:
        conn.close()


def scrape(broker: ThreadBroker) -> Samples:
    status, _, text = fetch(broker.management_port)
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def current(broker: ThreadBroker, name: str, **labels: str) -> float | None:
    """One sample of a fresh scrape (None while the series does not exist)."""
    return scrape(broker).get((name, frozenset(labels.items())))


def series(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(lbls)[label] for n, lbls in samples if n == name}


def test_a_bad_destination_pattern_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        loads_toml('[management.metrics]\ndestinations = ["orders.>", "a..b"]\n',
                   file="b.toml")
    assert str(info.value) == ("b.toml:2, option 'management.metrics.destinations[1]': "
                               "destination 'a..b' has an empty segment")


def test_a_bridge_is_seen_forwarding_then_failing(tmp_path: Path) -> None:
    remote = ThreadBroker(net_config(tmp_path / "b", "remote")).start()
    local = None
    remote_stopped = False
    try:
        local = ThreadBroker(net_config(tmp_path / "a", "local",
                                        connector(f"static:({tcp_uri(remote)})",
                                                  name="NC"))).start()
        wait_forwarding(local)
        key = {"connector": "NC", "peer": "remote", "direction": "outbound"}
        samples = scrape(local)
        assert value(samples, "meshmq_bridge_state", state="forwarding", **key) == 1
        assert value(samples, "meshmq_bridge_state", state="backing-off", **key) == 0
        assert value(samples, "meshmq_bridge_forwarded_total", **key) == 0
        with SimpleStompClient("127.0.0.1", remote.port) as consumer:
            consumer.subscribe("/queue/bridged")
            poll(lambda: consumers_on(local, "queue://bridged") >= 1, what="network demand")
            with SimpleStompClient("127.0.0.1", local.port) as producer:
                for i in range(2):
                    producer.send("/queue/bridged", f"m{i}".encode(), {"persistent": "true"})
            for _ in range(2):
                assert consumer.receive(timeout=10) is not None
        poll(lambda: current(local, "meshmq_bridge_acknowledged_total", **key) == 2,
             what="2 forwarded messages acknowledged")
        assert value(scrape(local), "meshmq_bridge_forwarded_total", **key) == 2
        inbound = scrape(remote)
        assert value(inbound, "meshmq_bridge_received_total", connector="NC", peer="local",
                     direction="inbound") == 2
        remote.stop()
        remote_stopped = True
        poll(lambda: current(local, "meshmq_bridge_state", state="forwarding", **key) == 0,
             what="the bridge to leave forwarding")
        failed = scrape(local)
        assert sum(v for (n, lbls), v in failed.items()
                   if n == "meshmq_bridge_state" and dict(lbls)["connector"] == "NC") == 1
        poll(lambda: any(n == "meshmq_bridge_last_error_info" for n, _ in scrape(local)),
             what="the bridge's last error")
    finally:
        if local is not None:
            local.stop()
        if not remote_stopped:
            remote.stop()


DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana" / "meshmq.json"


def dashboard_metric_names() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash["templating"]["list"]]
    return {name for e in exprs for name in re.findall(r"\bmeshmq_[a-z_]+", e)}


def test_every_metric_of_the_grafana_dashboard_is_exposed(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on: the bridge keeps failing
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    broker = ThreadBroker(net_config(tmp_path / "a", "dash", connector(
        f"static:(tcp://127.0.0.1:{dead_port})", name="NC"))).start()
    try:
        with SimpleStompClient("127.0.0.1", broker.port) as client:
            client.send("/queue/orders", b"x")
        names = dashboard_metric_names()
        assert len(names) >= 15  # the parser found the expressions
        exposed = {name for name, _ in scrape(broker)}
        assert sorted(names - exposed) == []
    finally:
        broker.stop()
