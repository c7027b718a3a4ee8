"""The node's figures from its shards' answers: sums, merges, and shards that are down."""

from __future__ import annotations

from typing import Any

from meshmq.node.aggregate import (
    CpuMeter,
    ShardAnswer,
    ShardRow,
    node_broker,
    node_ha,
    node_stat,
    shard_rows,
    shard_totals,
)


def _dest(name: str, **figures: int) -> dict[str, Any]:
    return {"name": name, "type": "queue", "depth": 0, "enqueued": 0, "dequeued": 0,
            "consumers": 0, "producers": 0, "inflight": 0, **figures}


def _stat(shard: int, *, connections: int, dests: list[dict[str, Any]],
          used: int = 0, **extra: Any) -> dict[str, Any]:
    return {"broker": "node", "uptime_ms": 1000 * (shard + 1), "connections": connections,
            "destinations": dests,
            "durable_subscriptions": [{"clientId": f"c{shard}", "name": "d",
                                       "destination": "/topic/t", "pending": shard,
                                       "active": True}],
            "duplicates_dropped": 1, "denied_publishes": 0,
            "denied": {"total": shard, "by_user": {"bob": shard} if shard else {}},
            "failed_logins": 2, "login_slowed_addresses": 0,
            "memory": {"used": used, "limit": 1000, "peak": used, "percent": 99.0},
            "store": {"kind": "journal", "disk_bytes": 100, "syncs": 3},
            "persistent_refused": None, "ha": {"mode": "none", "role": "standalone"},
            "network": {"bridges": [f"from {shard}"]}, "build": "python", **extra}


def test_counters_are_summed_and_destinations_merged_by_name() -> None:
    answers = [
        ShardAnswer(0, _stat(0, connections=3, used=100, dests=[
            _dest("a", depth=2, enqueued=5), _dest("b", consumers=1)])),
        ShardAnswer(1, _stat(1, connections=4, used=300, dests=[
            _dest("a", depth=1, enqueued=7, consumers=2)])),
    ]
    stat = node_stat("node", answers)
    assert stat["broker"] == "node" and stat["connections"] == 7
    assert stat["uptime_ms"] == 2000  # the longest-running shard
    assert stat["destinations"] == [
        _dest("a", depth=3, enqueued=12, consumers=2), _dest("b", consumers=1)]
    assert stat["memory"] == {"used": 400, "limit": 2000, "peak": 400, "percent": 20.0}
    assert stat["store"] == {"kind": "journal", "disk_bytes": 200, "syncs": 6}
    assert stat["denied"] == {"total": 1, "by_user": {"bob": 1}}
    assert stat["failed_logins"] == 4 and stat["duplicates_dropped"] == 2
    assert [(s["clientId"], s["shard"]) for s in stat["durable_subscriptions"]] == [
        ("c0", 0), ("c1", 1)]
    assert stat["network"] == {"bridges": ["from 0"]}  # the front shard's links
    assert stat["shards"] == [{"shard": 0, "state": "up"}, {"shard": 1, "state": "up"}]


def test_a_shard_that_does_not_answer_is_shown_down_not_failed() -> None:
    answers = [ShardAnswer(0, error="connection refused"),
               ShardAnswer(1, _stat(1, connections=4, used=10, dests=[_dest("a")]))]
    stat = node_stat("node", answers)
    assert stat["connections"] == 4 and [d["name"] for d in stat["destinations"]] == ["a"]
    assert stat["shards"] == [{"shard": 0, "state": "down", "error": "connection refused"},
                              {"shard": 1, "state": "up"}]
    assert stat["network"] == {"bridges": ["from 1"]}  # the first shard up stands in


def test_no_shard_up_is_still_a_document_meshmq_stat_can_print() -> None:
    stat = node_stat("node", [ShardAnswer(0, error="x"), ShardAnswer(1, error="y")])
    assert stat["connections"] == 0 and stat["destinations"] == []
    assert stat["memory"]["percent"] == 0.0 and stat["ha"]["role"] == "standalone"
    assert [s["state"] for s in stat["shards"]] == ["down", "down"]


def _broker(connections: int, store: int, dests: int) -> dict[str, Any]:
    return {"name": "node", "uptime_ms": 5, "role": "standalone", "connections": connections,
            "destinations": dests,
            "store": {"kind": "journal", "bytes": store, "limit_bytes": 1000, "percent": 1.0},
            "memory": {"bytes": 10, "limit_bytes": 100, "percent": 10.0},
            "limits": {"memory_bytes": 100}}


def test_the_broker_document_sums_usage_and_keeps_the_limits() -> None:
    doc = node_broker("node", [ShardAnswer(0, _broker(2, 100, 3)),
                               ShardAnswer(1, _broker(5, 300, 4)),
                               ShardAnswer(2, error="timeout")],
                      uptime_ms=99, started_at="then")
    assert doc["connections"] == 7 and doc["destinations"] == 7
    assert doc["store"] == {"kind": "journal", "bytes": 400, "limit_bytes": 2000,
                            "percent": 20.0}
    assert doc["memory"]["bytes"] == 20 and doc["memory"]["percent"] == 10.0
    assert doc["limits"] == {"memory_bytes": 100}
    assert doc["uptime_ms"] == 99 and doc["started_at"] == "then"
    assert [s["state"] for s in doc["shards"]] == ["up", "up", "down"]


def test_shard_rows_join_the_processes_with_their_answers() -> None:
    rows = [ShardRow(1, None, "restarting", 2, 0, "killed by SIGKILL"),
            ShardRow(0, 41, "running", 0, 1500)]
    links = [{"shard": 1, "up": False, "sent": 7}]
    handoffs = {"offered": 2, "handed": 2, "declined": 0, "lost": 0, "adopted": 1,
                "refused": 0}
    owned = {"destinations": [
        {"name": "a", "enqueued": 5, "dequeued": 3, "enqueue_rate": 1.5,
         "dequeue_rate": 0.25},
        {"name": "b", "enqueued": 2, "dequeued": 2, "enqueue_rate": 0.5,
         "dequeue_rate": 1.0}]}
    cpu = CpuMeter()
    cpu.sample(0, 41, 10.0, 2.0)
    cpu.sample(0, 41, 12.0, 3.0)
    table = shard_rows(rows, [ShardAnswer(0, _broker(3, 640, 0) | {"shard_links": links,
                                                                        "handoffs": handoffs}),
                              ShardAnswer(1, error="x")],
                       [ShardAnswer(0, owned), ShardAnswer(1, error="x")], cpu)
    assert table == [
        {"shard": 0, "pid": 41, "state": "running", "restarts": 0, "uptime_ms": 1500,
         "last_exit": None, "connections": 3, "answering": True,
         "destinations": 2, "messages_in": 7, "messages_out": 5, "in_rate": 2.0,
         "out_rate": 1.25, "cpu_seconds": 3.0, "cpu_percent": 50.0,
         "journal_bytes": 640, "links": links, "handoffs": handoffs},
        {"shard": 1, "pid": None, "state": "restarting", "restarts": 2, "uptime_ms": 0,
         "last_exit": "killed by SIGKILL", "connections": None, "answering": False,
         "destinations": None, "messages_in": None, "messages_out": None,
         "in_rate": None, "out_rate": None, "cpu_seconds": None, "cpu_percent": None,
         "journal_bytes": None, "links": None, "handoffs": None},
    ]
    # The node's sums are over the shards that answered.
    assert shard_totals(table) == {
        "connections": 3, "destinations": 2, "messages_in": 7, "messages_out": 5,
        "in_rate": 2.0, "out_rate": 1.25, "cpu_seconds": 3.0, "cpu_percent": 50.0,
        "journal_bytes": 640}


def test_a_cpu_share_needs_two_readings_of_the_same_process() -> None:
    cpu = CpuMeter()
    assert cpu.figures(0, 7) == (None, None)
    cpu.sample(0, 7, 1.0, 0.5)
    assert cpu.figures(0, 7) == (0.5, None)
    cpu.sample(0, 7, 1.5, 0.75)
    assert cpu.figures(0, 7) == (0.75, 50.0)
    cpu.sample(0, 8, 2.0, 0.1)  # restarted: a new process starts afresh
    assert cpu.figures(0, 8) == (0.1, None)
    assert cpu.figures(0, 7) == (None, None)
    cpu.forget(0)
    assert cpu.figures(0, 8) == (None, None)


def test_producers_sending_from_other_shards_are_added_to_the_owners_row() -> None:
    answers = [
        ShardAnswer(0, _stat(0, connections=2, dests=[_dest("a", producers=1)],
                             producers_elsewhere=[
                                 {"type": "queue", "name": "b", "producers": 2},
                                 {"type": "queue", "name": "gone", "producers": 1}])),
        ShardAnswer(1, _stat(1, connections=1, dests=[_dest("b", producers=1)],
                             producers_elsewhere=[
                                 {"type": "queue", "name": "a", "producers": 1}])),
    ]
    stat = node_stat("node", answers)
    assert {d["name"]: d["producers"] for d in stat["destinations"]} == {"a": 2, "b": 3}
    assert "producers_elsewhere" not in stat


def test_a_replicated_nodes_shards_report_their_own_log_positions() -> None:
    """The supervisor's view of its shards dates from its last election; the node's
    stat takes each answering shard's own replication status instead."""
    supervisor = {"mode": "replicated", "role": "master", "term": 3, "leader": "a@x",
                  "shards": [{"term": 3, "last": [0, 0], "durable": [0, 0]},
                             {"term": 3, "last": [2, 5], "durable": [2, 5]}]}
    shard0 = {"mode": "replicated", "role": "master", "term": 3, "leader": "a/s0@x",
              "last": [3, 120], "durable": [3, 120], "commit": 118, "members": {}}
    answers = [ShardAnswer(0, {"ha": shard0}), ShardAnswer(1, error="refused")]
    ha = node_ha(supervisor, answers)
    assert ha["term"] == 3 and ha["leader"] == "a@x"
    assert ha["shards"] == [
        {"up": True, "role": "master", "term": 3, "leader": "a/s0@x", "last": [3, 120],
         "durable": [3, 120], "commit": 118},
        {"term": 3, "last": [2, 5], "durable": [2, 5], "up": False}]
    assert supervisor["shards"][0]["last"] == [0, 0]  # not changed in place
    # Without replication (or a single broker) there is nothing to merge.
    plain = {"mode": "shared", "role": "master", "epoch": 1}
    assert node_ha(plain, answers) == plain
