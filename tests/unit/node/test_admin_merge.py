"""node/admin_merge.py: how the node's admin API routes and merges its shards' answers
(destinations once with their owner, node-wide connection ids, Jolokia's Broker mbean
summed), without sockets."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.shards import NUMBERED_NAME, owner, temp_name
from meshmq.node.admin_merge import (
    NO_ATTRIBUTE,
    Answer,
    JolokiaPlan,
    NodeFigures,
    broker_mbean,
    connection_shard,
    destination_owner,
    jolokia_merge,
    jolokia_plan,
    merge_connections,
    merge_destinations,
    merge_subscriptions,
    node_connection_id,
    shard_states,
)

NODE = "node"
BROKER = "org.apache.activemq:type=Broker,brokerName=node"
FIGURES = NodeFigures(uptime_ms=1234, uptime_text="1.234 seconds", data_directory="/data")


def owned_by(shard: int, prefix: str, kind: str = "queue") -> str:
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"{kind}://{name}"), 2, node=NODE) == shard:
            return name
    raise AssertionError("unreachable")


def listing(shard: int, *rows: dict[str, Any]) -> Answer:
    return Answer(shard, 200, {"destinations": list(rows)})


def test_each_destination_is_listed_once_from_its_owner_sorted_with_its_shard() -> None:
    q1, q0, t0 = owned_by(1, "q"), owned_by(0, "q"), owned_by(0, "t", "topic")
    answers = [
        listing(0, {"type": "queue", "name": q0, "depth": 4},
                {"type": "queue", "name": q1, "depth": 99},  # a stale copy, not the owner
                {"type": "topic", "name": t0, "consumers": 2}),
        listing(1, {"type": "queue", "name": q1, "depth": 2}),
    ]
    rows = merge_destinations(answers, 2, NODE)
    assert [(r["type"], r["name"], r["shard"]) for r in rows] == sorted(
        [("queue", q0, 0), ("queue", q1, 1), ("topic", t0, 0)])
    assert next(r for r in rows if r["name"] == q1)["depth"] == 2
    # The owner down: what another shard has is still shown, marked as its.
    rows = merge_destinations([answers[0], Answer(1, error="refused")], 2, NODE)
    assert next(r for r in rows if r["name"] == q1) == {
        "type": "queue", "name": q1, "depth": 99, "shard": 0}


def test_producers_sending_from_other_shards_are_added_to_the_owners_count() -> None:
    q0 = owned_by(0, "sent")
    answers = [Answer(0, 200, {"destinations": [{"type": "queue", "name": q0, "producers": 1}]}),
               Answer(1, 200, {"destinations": [], "producers_elsewhere": [
                   {"type": "queue", "name": q0, "producers": 2}]})]
    rows = merge_destinations(answers, 2, NODE)
    assert [(r["name"], r["producers"], r["shard"]) for r in rows] == [(q0, 3, 0)]


def test_shard_states_say_which_shards_are_missing() -> None:
    states = shard_states([Answer(1, error="timed out"), Answer(0, 200, {})])
    assert states == [{"shard": 0, "state": "up"},
                      {"shard": 1, "state": "down", "error": "timed out"}]


def test_a_temporary_destination_belongs_to_the_shard_its_name_says() -> None:
    name = temp_name(NODE, 1, "b00t", "c7", 1)
    assert destination_owner("queue", name, 2, NODE) == 1
    assert destination_owner("queue", temp_name(NODE, 5, "b", "c1", 1), 2, NODE) == 0
    assert destination_owner("queue", owned_by(1, "x"), 2, NODE) == 1
    assert destination_owner("queues", "x", 2, NODE) is None  # refused as one broker
    assert destination_owner("queue", "a.*", 2, NODE) is None


def test_admin_requests_go_to_the_owner_under_the_node_s_placement() -> None:
    """Under numbered placement jobs.0 ... jobs.7 alternate between two shards; a
    request about one goes to its owner, which a hash of its name often is not."""
    numbered = [destination_owner("queue", f"jobs.{n}", 2, NODE, NUMBERED_NAME)
                for n in range(8)]
    assert numbered == [(numbered[0] + n) % 2 for n in range(8)]
    hashed = [destination_owner("queue", f"jobs.{n}", 2, NODE) for n in range(8)]
    assert hashed == [owner(Destination.parse_uri(f"queue://jobs.{n}"), 2) for n in range(8)]
    assert hashed != numbered
    bean = ("org.apache.activemq:type=Broker,brokerName=n,destinationType=Queue,"
            "destinationName=jobs.3")
    assert jolokia_plan({"type": "read", "mbean": bean}, 2, NODE, NUMBERED_NAME) == \
        JolokiaPlan(numbered[3])
    rows = [Answer(k, 200, {"destinations": [{"type": "queue", "name": "jobs.3",
                                              "depth": k}]}) for k in range(2)]
    merged = merge_destinations(rows, 2, NODE, NUMBERED_NAME)
    assert [(r["name"], r["shard"]) for r in merged] == [("jobs.3", numbered[3])]


@pytest.mark.parametrize("shard,local", [(0, "c1"), (1, "c42"), (12, "c3")])
def test_connection_ids_name_their_shard_and_come_back(shard: int, local: str) -> None:
    assert connection_shard(node_connection_id(shard, local), 16) == (shard, local)


@pytest.mark.parametrize("text", ["c3", "s2-c3", "s-c3", "x1-c3", "s1-"])
def test_an_id_that_names_no_shard_of_the_node_is_none(text: str) -> None:
    assert connection_shard(text, 2) is None


def test_connections_of_every_shard_are_merged_oldest_first_with_unique_ids() -> None:
    answers = [
        Answer(0, 200, {"connections": [
            {"id": "c1", "connected_at": "2026-01-01T00:00:02"}]}),
        Answer(1, 200, {"connections": [
            {"id": "c1", "connected_at": "2026-01-01T00:00:01"}]}),
        Answer(2),
    ]
    rows = merge_connections(answers)
    assert [(r["id"], r["shard"]) for r in rows] == [("s1-c1", 1), ("s0-c1", 0)]


def test_subscriptions_name_their_connection_node_wide_and_offline_ones_none() -> None:
    answers = [Answer(1, 200, {"subscriptions": [
        {"kind": "queue", "connection": "c3", "name": "s"},
        {"kind": "durable", "connection": None, "name": "d"}]})]
    assert merge_subscriptions(answers) == [
        {"kind": "queue", "connection": "s1-c3", "name": "s", "shard": 1},
        {"kind": "durable", "connection": None, "name": "d", "shard": 1}]


def test_jolokia_requests_go_to_the_owner_or_to_every_shard() -> None:
    q1 = owned_by(1, "j")
    queue_bean = f"{BROKER},destinationType=Queue,destinationName={q1}"
    assert jolokia_plan({"type": "read", "mbean": queue_bean}, 2, NODE) == JolokiaPlan(1)
    assert jolokia_plan({"type": "exec", "mbean": queue_bean, "operation": "purge"},
                        2, NODE) == JolokiaPlan(1)
    assert jolokia_plan({"type": "exec", "mbean": BROKER, "operation": "removeQueue",
                         "arguments": [q1]}, 2, NODE) == JolokiaPlan(1)
    assert jolokia_plan({"type": "exec", "mbean": BROKER, "operation": "gc"},
                        2, NODE) == JolokiaPlan(0)
    assert jolokia_plan({"type": "read", "mbean": BROKER}, 2, NODE) == \
        JolokiaPlan(None, "broker")
    assert jolokia_plan({"type": "read", "mbean": f"{BROKER},destinationType=Queue,"
                         "destinationName=*"}, 2, NODE) == JolokiaPlan(None, "read")
    assert jolokia_plan({"type": "search", "mbean": "org.apache.activemq:*"}, 2, NODE) == \
        JolokiaPlan(None, "search")
    assert jolokia_plan({"type": "list"}, 2, NODE) == JolokiaPlan(None, "list")
    assert jolokia_plan({"type": "version"}, 2, NODE) == JolokiaPlan(0)
    assert jolokia_plan({"type": "read", "mbean": "no-colon"}, 2, NODE) == JolokiaPlan(0)


def bean(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "BrokerName": "node", "TotalMessageCount": 1, "TotalEnqueueCount": 2,
        "TotalConsumerCount": 0, "CurrentConnectionsCount": 1, "MemoryLimit": 100,
        "MemoryPercentUsage": 10, "StoreLimit": 0, "StorePercentUsage": 0, "Slave": False,
        "UptimeMillis": 5, "Uptime": "0.005 seconds", "DataDirectory": "/data/shard-0",
        "Queues": [], "Topics": []}
    return {**base, **changes}


def test_the_broker_mbean_is_the_node_s_sums_and_every_shard_s_queues() -> None:
    a = {"objectName": "org.apache.activemq:brokerName=node,destinationName=a,"
                       "destinationType=Queue,type=Broker"}
    b = {"objectName": a["objectName"].replace("=a,", "=b,")}
    merged = broker_mbean([bean(Queues=[b]), bean(TotalMessageCount=3, MemoryLimit=300,
                                                  MemoryPercentUsage=50, Queues=[a])],
                          FIGURES)
    assert merged["TotalMessageCount"] == 4 and merged["TotalEnqueueCount"] == 4
    assert merged["CurrentConnectionsCount"] == 2 and merged["MemoryLimit"] == 400
    # 10 of 100 and 150 of 300 used: 160 of 400.
    assert merged["MemoryPercentUsage"] == 40
    assert merged["StorePercentUsage"] == 0 and merged["StoreLimit"] == 0
    assert merged["Queues"] == [a, b] and merged["Topics"] == []
    assert (merged["UptimeMillis"], merged["Uptime"], merged["DataDirectory"]) == (
        1234, "1.234 seconds", "/data")
    assert merged["BrokerName"] == "node" and merged["Slave"] is False


def read_answer(shard: int, value: Any) -> Answer:
    return Answer(shard, 200, {"status": 200, "value": value})


def merge(request: dict[str, Any], plan: JolokiaPlan, answers: list[Answer]
          ) -> dict[str, Any]:
    return jolokia_merge(request, plan, answers, count=2, node=NODE, figures=FIGURES,
                         timestamp=7)


def test_a_broker_read_of_one_attribute_is_its_summed_value() -> None:
    answers = [read_answer(0, bean()), read_answer(1, bean(TotalMessageCount=5))]
    request = {"type": "read", "mbean": BROKER, "attribute": "TotalMessageCount"}
    out = merge(request, JolokiaPlan(None, "broker"), answers)
    assert (out["status"], out["value"], out["request"]) == (200, 6, request)
    both = merge({**request, "attribute": ["TotalMessageCount", "MemoryLimit"]},
                 JolokiaPlan(None, "broker"), answers)
    assert both["value"] == {"TotalMessageCount": 6, "MemoryLimit": 200}
    missing = merge({**request, "attribute": "Nope"}, JolokiaPlan(None, "broker"), answers)
    assert (missing["status"], missing["error_type"]) == (404, NO_ATTRIBUTE)


def test_a_merged_jolokia_answer_says_which_shards_are_missing() -> None:
    out = merge({"type": "read", "mbean": BROKER}, JolokiaPlan(None, "broker"),
                [read_answer(0, bean()), Answer(1, error="refused")])
    assert out["status"] == 200 and out["value"]["TotalMessageCount"] == 1
    assert out["shards"][1] == {"shard": 1, "state": "down", "error": "refused"}
    nobody = merge({"type": "read", "mbean": BROKER}, JolokiaPlan(None, "broker"),
                   [Answer(0, error="x"), Answer(1, error="y")])
    assert nobody["status"] == 503


def test_a_refusal_every_shard_gives_is_the_answer() -> None:
    refusal = {"status": 404, "error_type": "javax.management.InstanceNotFoundException",
               "error": "not found", "request": {}}
    request = {"type": "read", "mbean": "org.apache.activemq:type=Broker,brokerName=other"}
    out = merge(request, JolokiaPlan(None, "broker"),
                [Answer(0, 200, refusal), Answer(1, 200, refusal)])
    assert (out["status"], out["error"], out["request"]) == (404, "not found", request)


def test_a_pattern_read_merges_each_shard_s_mbeans_and_sums_the_broker() -> None:
    q0, q1 = owned_by(0, "p"), owned_by(1, "p")

    def name(q: str) -> str:
        return (f"org.apache.activemq:brokerName=node,destinationName={q},"
                "destinationType=Queue,type=Broker")
    broker_name = "org.apache.activemq:brokerName=node,type=Broker"
    answers = [read_answer(0, {name(q0): {"QueueSize": 1}, broker_name: bean()}),
               read_answer(1, {name(q1): {"QueueSize": 2}, broker_name: bean()})]
    request = {"type": "read", "mbean": "org.apache.activemq:*",
               "attribute": "TotalMessageCount"}
    out = merge(request, JolokiaPlan(None, "read"), answers)
    assert out["status"] == 404  # a destination mbean has no TotalMessageCount, as on one
    out = merge({**request, "attribute": None}, JolokiaPlan(None, "read"), answers)
    assert out["value"][name(q0)] == {"QueueSize": 1}
    assert out["value"][name(q1)] == {"QueueSize": 2}
    assert out["value"][broker_name]["TotalMessageCount"] == 2


def test_searches_and_lists_are_merged() -> None:
    out = merge({"type": "search", "mbean": "org.apache.activemq:*"},
                JolokiaPlan(None, "search"),
                [read_answer(0, ["b", "a"]), read_answer(1, ["c", "a"])])
    assert out["value"] == ["a", "b", "c"]
    out = merge({"type": "list"}, JolokiaPlan(None, "list"),
                [read_answer(0, {"d": {"x": 1}}), read_answer(1, {"d": {"y": 2}, "e": 3})])
    assert out["value"] == {"d": {"x": 1, "y": 2}, "e": 3}
