"""The console's own API over real HTTP: /api/peers (management URLs learnt in the link
handshake), /api/network/map (every broker reachable from the one asked, an unreachable
one as a node, never an error), the static console, and /api/events ending when the
broker stops."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from typing import Any

from tests.console.conftest import Network
from tests.support.brokers import ThreadBroker, poll


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(port: int, path: str) -> Any:
    status, _, body = get(port, path)
    assert status == 200, body
    return json.loads(body)


def url_of(broker: ThreadBroker) -> str:
    return f"http://127.0.0.1:{broker.management_port}"


def edge_states(port: int) -> dict[tuple[str, str], str]:
    """The map's edges as seen from the broker on ``port``. A broker slower than the
    map's fetch timeout shows as unreachable and its edges are absent for that look,
    so a poll reads a missing edge as "not yet", never as a failure."""
    return {(e["from"], e["to"]): e["state"] for e in get_json(port, "/api/network/map")["edges"]}


def test_peers_carry_the_management_urls_told_in_the_handshake(network3: Network) -> None:
    a, b, c = (network3.brokers[n] for n in "ABC")
    peers = get_json(b.management_port, "/api/peers")["peers"]
    by_broker = {p["broker"]: p for p in peers}
    assert by_broker["C"]["management_url"] == url_of(c)
    assert by_broker["C"]["direction"] == "outbound"
    assert by_broker["C"]["state"] == "forwarding"
    assert by_broker["A"]["management_url"] == url_of(a)
    assert by_broker["A"]["direction"] == "inbound"
    assert [p["broker"] for p in get_json(c.management_port, "/api/peers")["peers"]] == ["B"]


def test_the_map_reaches_every_broker_and_shows_a_stopped_one_as_unreachable(
        network3: Network) -> None:
    a = network3.brokers["A"]
    doc = get_json(a.management_port, "/api/network/map")
    assert doc["broker"] == "A"
    assert [(n["broker"], n["reachable"]) for n in doc["nodes"]] == [
        ("A", True), ("B", True), ("C", True)]
    assert {n["broker"]: n["management_url"] for n in doc["nodes"]}["C"] == \
        url_of(network3.brokers["C"])
    assert edge_states(a.management_port) == {("A", "B"): "forwarding",
                                              ("B", "C"): "forwarding"}

    network3.stop("C")
    poll(lambda: edge_states(a.management_port).get(("B", "C")) not in (None, "forwarding"),
         what="the bridge B->C to leave forwarding")
    doc = get_json(a.management_port, "/api/network/map")
    c_node = next(n for n in doc["nodes"] if n["broker"] == "C")
    assert c_node["reachable"] is False and c_node["error"]
    assert next(e for e in doc["edges"] if e["to"] == "C")["last_error_kind"]

    network3.restart("C")
    poll(lambda: edge_states(a.management_port).get(("B", "C")) == "forwarding",
         what="the bridge B->C forwarding again")
    assert all(n["reachable"] for n in get_json(a.management_port, "/api/network/map")["nodes"])


def test_the_console_is_served_and_the_root_redirects_to_it(broker: ThreadBroker) -> None:
    port = broker.management_port
    status, headers, _ = get(port, "/")
    assert (status, headers["location"]) == (302, "/console/")
    status, headers, body = get(port, "/console/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'<script type="module" src="app.js">' in body
    status, headers, _ = get(port, "/console/app.js")
    assert status == 200 and "javascript" in headers["content-type"]
    status, headers, body = get(port, "/console/../api.py")
    assert status == 404 and json.loads(body)["error"]
    status, _, body = get(port, "/console/nothing.js")
    assert status == 404 and json.loads(body)["error"].startswith("no such resource")


def test_the_event_feed_pushes_snapshots_and_ends_when_the_broker_stops(
        broker: ThreadBroker) -> None:
    port = broker.management_port
    resp = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/events", timeout=10)
    assert resp.headers["Content-Type"] == "text/event-stream"
    assert resp.readline() == b"event: snapshot\n"
    data = json.loads(resp.readline().removeprefix(b"data: "))
    assert data["stat"]["broker"] == "test"
    assert [n["broker"] for n in data["map"]["nodes"]] == ["test"]
    assert broker.runtime is not None
    t0 = time.monotonic()
    broker.call(broker.runtime.stop())
    assert time.monotonic() - t0 < 5
    # The feed ended its response properly (the last chunk was sent): a handler cut off
    # by the runner's shutdown timeout would leave the chunked body incomplete, and
    # http.client would raise IncompleteRead here.
    rest = resp.read()
    assert rest.count(b"event: snapshot") <= 2
    resp.close()
