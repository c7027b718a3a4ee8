"""A node of two shards is one broker to its admin API and Jolokia: a real ``meshmq
broker --shards 2`` subprocess, its management endpoint used over HTTP, destinations
named so that each shard owns some, clients picked on each shard."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.stomp_helpers import RawClient
from tests.node.test_node_routing import owned_by
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import NodeProcess, shard_api, stomp_on, write_node_toml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    n = NodeProcess(write_node_toml(tmp / "node.toml", data=tmp / "data"),
                    tmp / "node.log").start()
    ProcessBroker.running.discard(n)  # the module's node: this fixture stops it
    try:
        yield n
    finally:
        n.terminate()


def call(node: NodeProcess, method: str, path: str, body: object = None
         ) -> tuple[int, Any]:
    """The node's answer (status, JSON body) to one admin request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{node.ports['management']}{path}", data=data, method=method,
        headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ok(node: NodeProcess, method: str, path: str, body: object = None) -> Any:
    status, answer = call(node, method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def send(client: RawClient, queue: str, *bodies: str) -> None:
    for n, text in enumerate(bodies):
        client.send_frame("SEND", [("destination", f"/queue/{queue}"),
                                   ("persistent", "true"), ("receipt", f"r{n}")],
                          text.encode())
        client.read_until_receipt(f"r{n}")


def test_destinations_of_both_shards_are_listed_once_with_their_owner(
        node: NodeProcess) -> None:
    q0, q1 = owned_by(0, "list"), owned_by(1, "list")
    producer = stomp_on(node, 0)
    try:
        send(producer, q0, "a")
        send(producer, q1, "b", "c")  # forwarded to shard 1, which stores them
    finally:
        producer.close()
    answer = ok(node, "GET", "/api/destinations?type=queue")
    rows = {d["name"]: d for d in answer["destinations"] if d["name"] in (q0, q1)}
    assert (rows[q0]["depth"], rows[q0]["shard"]) == (1, 0)
    assert (rows[q1]["depth"], rows[q1]["enqueued"], rows[q1]["shard"]) == (2, 2, 1)
    names = [(d["type"], d["name"]) for d in answer["destinations"]]
    assert len(names) == len(set(names)) and names == sorted(names)
    assert [s["state"] for s in answer["shards"]] == ["up", "up"]
    # One destination's view comes from its owner (shard 0 has no such queue).
    assert ok(node, "GET", f"/api/destinations/queue/{q1}")["depth"] == 2
    assert ok(node, "GET", f"/api/destinations?filter={q1}")["destinations"][0]["name"] == q1
    status, refused = call(node, "GET", "/api/destinations?type=queues")
    assert status == 400 and "type=queue" in refused["error"]


def test_a_queue_owned_by_shard_1_is_browsed_purged_and_deleted_through_the_node(
        node: NodeProcess) -> None:
    q1 = owned_by(1, "ops")
    created = ok(node, "POST", "/api/destinations", {"type": "queue", "name": q1})
    assert created["name"] == q1
    assert q1 in [d["name"] for d in shard_api(node, 1, "/api/destinations")["destinations"]]
    assert q1 not in [d["name"] for d in shard_api(node, 0, "/api/destinations")
                      ["destinations"]]
    for n in range(3):
        ok(node, "POST", f"/api/destinations/queue/{q1}/send", {"body": f"m{n}"})
    page = ok(node, "GET", f"/api/queues/{q1}/messages?limit=2")
    assert page["total"] == 3 and [m["body_preview"] for m in page["messages"]] == ["m0", "m1"]
    first = page["messages"][0]["message_id"]
    assert ok(node, "GET", f"/api/queues/{q1}/messages/{first}")["body"] == "m0"
    assert ok(node, "DELETE", f"/api/queues/{q1}/messages/{first}") == {"deleted": first}
    assert ok(node, "POST", f"/api/destinations/queue/{q1}/purge") == {"purged": 2}
    assert ok(node, "GET", f"/api/destinations/queue/{q1}")["depth"] == 0
    assert ok(node, "DELETE", f"/api/destinations/queue/{q1}")["deleted"] == q1
    status, missing = call(node, "GET", f"/api/destinations/queue/{q1}")
    assert status == 404 and q1 in missing["error"]


@pytest.mark.parametrize("target_shard", [0, 1])
def test_a_move_from_shard_1_reaches_a_target_either_shard_owns(
        node: NodeProcess, target_shard: int) -> None:
    source, target = owned_by(1, f"from{target_shard}"), owned_by(target_shard, "to")
    for n in range(3):
        ok(node, "POST", f"/api/destinations/queue/{source}/send", {"body": f"m{n}"})
    moved = ok(node, "POST", f"/api/queues/{source}/move",
               {"to": f"queue://{target}", "selector": "JMSPriority >= 0"})
    assert moved == {"moved": 3}
    assert ok(node, "GET", f"/api/destinations/queue/{source}")["depth"] == 0
    row = poll(lambda: next((d for d in ok(node, "GET", "/api/destinations")["destinations"]
                             if d["name"] == target and d["depth"] == 3), None),
               10, f"queue {target} to hold the 3 moved messages")
    assert row["shard"] == target_shard
    bodies = [m["body_preview"] for m in ok(node, "GET", f"/api/queues/{target}/messages")
              ["messages"]]
    assert bodies == ["m0", "m1", "m2"]


def test_connections_of_both_shards_are_listed_with_node_wide_ids_and_closed(
        node: NodeProcess) -> None:
    clients = {k: stomp_on(node, k) for k in (0, 1)}
    try:
        clients[1].send_frame("SUBSCRIBE", [("destination", f"/queue/{owned_by(0, 'c')}"),
                                            ("id", "sub-1"), ("receipt", "s")])
        clients[1].read_until_receipt("s")
        ports = {k: c.sock.getsockname()[1] for k, c in clients.items()}
        rows = ok(node, "GET", "/api/connections")["connections"]
        mine = {r["shard"]: r for r in rows
                if any(str(r["address"]).endswith(f":{p}") for p in ports.values())}
        assert sorted(mine) == [0, 1]
        ids = [r["id"] for r in rows]
        assert len(ids) == len(set(ids))
        assert all(mine[k]["id"].startswith(f"s{k}-") for k in mine)
        subs = ok(node, "GET", "/api/subscriptions")["subscriptions"]
        assert next(s for s in subs if s["name"] == "sub-1")["connection"] == mine[1]["id"]
        victim = mine[1]["id"]
        assert ok(node, "DELETE", f"/api/connections/{victim}") == {"closed": victim}
        clients[1].expect_closed(timeout=10)
        left = [r["id"] for r in ok(node, "GET", "/api/connections")["connections"]]
        assert victim not in left and mine[0]["id"] in left
        assert call(node, "DELETE", f"/api/connections/{victim}")[0] == 404
        status, refused = call(node, "DELETE", "/api/connections/c1")
        assert status == 404 and "s1-c3" in refused["error"]
    finally:
        for client in clients.values():
            client.close()


def canonical(queue: str) -> str:
    return (f"org.apache.activemq:brokerName=node,destinationName={queue},"
            "destinationType=Queue,type=Broker")


def test_jolokia_reads_a_shard_1_queue_and_the_node_s_broker_mbean(
        node: NodeProcess) -> None:
    q0, q1 = owned_by(0, "jmx"), owned_by(1, "jmx")
    producer = stomp_on(node, 0)
    try:
        send(producer, q0, "x")
        send(producer, q1, "y", "z")
    finally:
        producer.close()
    mbean = "org.apache.activemq:type=Broker,brokerName=node"
    size = ok(node, "GET", f"/api/jolokia/read/{mbean},destinationType=Queue,"
                           f"destinationName={q1}/QueueSize")
    assert (size["status"], size["value"]) == (200, 2)
    broker = ok(node, "GET", f"/api/jolokia/read/{mbean}")["value"]
    queues = [q["objectName"] for q in broker["Queues"]]
    assert canonical(q0) in queues and canonical(q1) in queues
    per_shard = [shard_api(node, k, "/api/stat") for k in (0, 1)]
    depth = sum(d["depth"] for s in per_shard for d in s["destinations"])
    assert broker["TotalMessageCount"] == depth >= 3
    assert broker["BrokerName"] == "node" and broker["DataDirectory"].endswith("data")
    bulk = ok(node, "POST", "/api/jolokia", [
        {"type": "read", "mbean": mbean, "attribute": "TotalMessageCount"},
        {"type": "read", "mbean": f"{mbean},destinationType=Queue,destinationName=*",
         "attribute": "QueueSize"}])
    assert bulk[0]["value"] == depth
    sizes = bulk[1]["value"]
    assert sizes[canonical(q1)] == {"QueueSize": 2}
    assert sizes[canonical(q0)] == {"QueueSize": 1}


def test_a_request_to_an_owner_that_is_killed_is_a_503_naming_it(
        node: NodeProcess, tmp_path: Path) -> None:
    q1 = owned_by(1, "down")
    ok(node, "POST", f"/api/destinations/queue/{q1}/send", {"body": "kept"})
    victim = node.shards()[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    seen: list[tuple[int, Any]] = []

    def refused() -> bool:
        status, answer = call(node, "POST", f"/api/destinations/queue/{q1}/purge")
        seen.append((status, answer))
        return status == 503

    # A tight poll: the node restarts the shard within a second.
    deadline = time.monotonic() + 10
    while not refused():
        assert time.monotonic() < deadline, seen[-3:]
    answer = seen[-1][1]
    assert answer["shard"] == 1 and f"shard 1, which owns queue://{q1}" in answer["error"]
    back = poll(lambda: call(node, "GET", f"/api/destinations/queue/{q1}")[0] == 200, 30,
                "shard 1 to answer again")
    assert back and ok(node, "GET", f"/api/destinations/queue/{q1}")["depth"] == 1
    assert node.shards()[1]["pid"] != victim
