"""Operating a node of two shards (real ``meshmq broker --shards 2`` processes): the
node's ``/metrics`` is every shard's, summed where the node's total is what counts and
per shard (label ``shard``) where a total would hide one; ``meshmq stat`` shows the
shards' processes and links, and ``--shard k`` (``GET /api/shards/{k}/stat``) one
shard's own figures."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.interop.stomp_helpers import RawClient
from tests.node.test_node_routing import owned_by
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.nodes import NodeProcess, plain_module_node, shard_api, stomp_on

pytestmark = pytest.mark.slow

SHARDS = (0, 1)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"))


@pytest.fixture(scope="module")
def traffic(node: NodeProcess) -> Iterator[dict[int, str]]:
    """On each shard a producer sends to a queue each shard owns (so both links carry
    sends) and the receipts are in: the counters no longer move."""
    queues = {k: owned_by(k, "ops") for k in SHARDS}
    producers = [stomp_on(node, k) for k in SHARDS]
    for k, producer in enumerate(producers):
        for owner_shard, queue in queues.items():
            for i in range(2 + k):
                producer.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                             ("persistent", "true"),
                                             ("receipt", f"r{k}-{owner_shard}-{i}")],
                                    b"m")
                producer.read_until_receipt(f"r{k}-{owner_shard}-{i}")
    try:
        yield queues  # both connections stay open: each shard has one to show
    finally:
        for producer in producers:
            producer.close()


def _scrape(node: NodeProcess, accept: str = "") -> str:
    url = f"http://127.0.0.1:{node.ports['management']}/metrics"
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return str(resp.read().decode())


def _shard_metrics(node: NodeProcess, shard: int) -> dict[str, Metric]:
    """Shard ``shard``'s own /metrics, through its management socket."""
    path = node.shards()[shard]["management_socket"]

    class _Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(path)

    conn = _Unix("shard")
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict[str, Metric], name: str, **labels: str) -> float:
    found = [s.value for s in families[name].samples
             if s.name in (name, f"{name}_total") and s.labels == labels]
    assert len(found) == 1, (name, labels, families[name].samples)
    return float(found[0])


def _stat(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                           f"127.0.0.1:{node.ports['management']}", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_the_nodes_metrics_sum_the_shards_and_label_what_a_sum_would_hide(
        node: NodeProcess, traffic: dict[int, str]) -> None:
    shards = [_shard_metrics(node, k) for k in SHARDS]
    merged = {f.name: f for f in text_string_to_metric_families(_scrape(node))}
    # Node totals: the sum of the shards' own.
    for name in ("meshmq_messages_enqueued", "meshmq_messages_dequeued",
                 "meshmq_store_written_bytes"):
        parts = [_value(s, name) for s in shards]
        assert _value(merged, name) == sum(parts), (name, parts)
    assert _value(merged, "meshmq_messages_enqueued") >= 2 * (2 + 3)
    # Each queue has one owner: its series is the owner's.
    for k, queue in traffic.items():
        assert _value(merged, "meshmq_destination_enqueued", destination=queue,
                      type="queue") == _value(shards[k], "meshmq_destination_enqueued",
                                              destination=queue, type="queue") == 5
    # Per shard: connections, memory, links (with the peer), CPU; every shard up.
    for k in SHARDS:
        shard = str(k)
        assert _value(merged, "meshmq_shard_up", shard=shard) == 1
        assert _value(merged, "meshmq_connections", listener="stomp", protocol="stomp",
                      shard=shard) == _value(shards[k], "meshmq_connections",
                                             listener="stomp", protocol="stomp") >= 1
        assert _value(merged, "meshmq_memory_limit_bytes", shard=shard) > 0
        peer = str(1 - k)
        sent = _value(merged, "meshmq_shard_link_sent", shard=shard, peer=peer)
        assert sent == _value(shards[k], "meshmq_shard_link_sent", peer=peer) >= 2 + k
        assert _value(merged, "meshmq_shard_link_up", shard=shard, peer=peer) == 1
        assert _value(merged, "meshmq_shard_cpu_seconds", shard=shard) > 0
        assert _value(merged, "meshmq_shard_resident_memory_bytes", shard=shard) > 0
        assert _value(merged, "meshmq_shard_restarts", shard=shard) == 0
    # One HA role for the node, not one per shard.
    assert _value(merged, "meshmq_ha_role", mode="none", role="standalone") == 1
    # OpenMetrics, when the scraper asks for it, parses with every family's type.
    strict = {f.name: f for f in openmetrics_families(
        _scrape(node, "application/openmetrics-text; version=1.0.0"))}
    assert strict["meshmq_shard_link_sent"].type == "counter"
    assert strict["meshmq_store_sync_seconds"].type == "histogram"


def test_stat_shows_the_shards_processes_and_links(node: NodeProcess,
                                                   traffic: dict[int, str]) -> None:
    rows = node.shards()
    shown = _stat(node)
    assert shown.returncode == 0, shown.stderr
    lines = [ln.split() for ln in shown.stdout.splitlines()]
    assert ["SHARD", "PID", "STATE", "RESTARTS", "UPTIME", "CONNECTIONS"] in [
        line[:6] for line in lines], shown.stdout
    for row in rows:
        assert [str(row["shard"]), str(row["pid"]), "running", "0"] in [
            line[:4] for line in lines], shown.stdout
        (line,) = [ln for ln in lines if ln[:2] == [str(row["shard"]), str(row["pid"])]]
        assert line[5] == str(row["connections"]), line
    assert ["LINK", "UP", "SENT", "DELIVERED", "OUT", "PARKED"] in lines, shown.stdout
    for row in rows:
        (link,) = row["links"]
        assert [f"{row['shard']}->{link['shard']}", "yes", str(link["sent"]),
                str(link["delivered_out"]), str(link["parked"])] in lines, shown.stdout
        assert link["sent"] >= 2 + row["shard"]
    as_json: dict[str, Any] = json.loads(_stat(node, "--json").stdout)
    assert [p["pid"] for p in as_json["shard_processes"]] == [r["pid"] for r in rows]


def test_stat_of_one_shard_shows_its_own_figures(node: NodeProcess,
                                                 traffic: dict[int, str]) -> None:
    for k, queue in traffic.items():
        own = node.api(f"/api/shards/{k}/stat")
        assert own["shard"] == k and "shards" not in own
        direct = shard_api(node, k, "/api/stat")
        assert own["connections"] == direct["connections"] >= 1
        names = {d["name"] for d in own["destinations"]}
        assert queue in names and traffic[1 - k] not in names  # only what it owns
        shown = _stat(node, "--shard", str(k))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"broker shard {k} of node  connections "), \
            shown.stdout
        assert f" {queue} " in shown.stdout and f" {traffic[1 - k]} " not in shown.stdout
        assert "SHARD  PID" not in shown.stdout


@pytest.mark.parametrize("shard", ["2", "x", "-1"])
def test_a_shard_the_node_does_not_have_is_a_404_in_json(node: NodeProcess,
                                                         shard: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        node.api(f"/api/shards/{shard}/stat")
    assert err.value.code == 404
    body = json.loads(err.value.read())
    assert "0 to 1" in body["error"], body


def test_stat_of_a_shard_the_node_does_not_have_is_one_line(node: NodeProcess) -> None:
    shown = _stat(node, "--shard", "5")
    assert shown.returncode == 1
    assert "no shard '5'" in shown.stderr and shown.stderr.count("\n") == 1, shown.stderr


def test_metrics_are_read_without_disturbing_a_client(node: NodeProcess,
                                                      traffic: dict[int, str]) -> None:
    client: RawClient = stomp_on(node, 0)
    try:
        _scrape(node)
        client.send_frame("SEND", [("destination", f"/queue/{traffic[0]}"),
                                   ("receipt", "after")], b"after")
        client.read_until_receipt("after")
    finally:
        client.close()
    poll(lambda: _value({f.name: f for f in text_string_to_metric_families(_scrape(node))},
                        "meshmq_destination_enqueued", destination=traffic[0],
                        type="queue") == 6, 10, "the new send counted")


def test_stat_of_a_shard_on_one_broker_says_it_is_for_a_node(tmp_path: Path) -> None:
    broker = ThreadBroker(make_config(tmp_path / "data")).start()
    try:
        shown = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                                f"127.0.0.1:{broker.management_port}", "--shard", "0"],
                               check=False, capture_output=True, text=True, timeout=60)
    finally:
        broker.stop()
    assert shown.returncode == 2
    assert "not a node of shards" in shown.stderr and shown.stderr.count("\n") == 1, \
        shown.stderr
