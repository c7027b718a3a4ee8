"""The node's ``/metrics`` from its shards' OpenMetrics texts (node/metrics.py's merge):
what is summed, what keeps one series per shard, what is the front shard's alone."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshmq.node.aggregate import ShardRow
from meshmq.node.metrics import FixedCollector, ShardMetrics, merge, node_figures


def _shard(enqueued: int, connections: int, *, role: str = "standalone",
           sync_sum: float = 0.5, created: float = 100.0, bridge: bool = False) -> str:
    lines = [
        "# TYPE meshmq_messages_enqueued counter",
        f"meshmq_messages_enqueued_total {enqueued}",
        "# TYPE meshmq_uptime_seconds gauge",
        "meshmq_uptime_seconds 99",
        "# TYPE meshmq_connections gauge",
        f'meshmq_connections{{listener="stomp",protocol="stomp"}} {connections}',
        "# TYPE meshmq_ha_role gauge",
        f'meshmq_ha_role{{mode="none",role="{role}"}} 1',
        "# TYPE meshmq_shard_link_sent counter",
        f'meshmq_shard_link_sent_total{{peer="x"}} {enqueued + 1}',
        "# TYPE meshmq_store_sync_seconds histogram",
        'meshmq_store_sync_seconds_bucket{le="0.1"} 1',
        'meshmq_store_sync_seconds_bucket{le="+Inf"} 2',
        "meshmq_store_sync_seconds_count 2",
        f"meshmq_store_sync_seconds_sum {sync_sum}",
        f"meshmq_store_sync_seconds_created {created}",
    ]
    if bridge:
        lines += ["# TYPE meshmq_bridge_last_error info",
                  'meshmq_bridge_last_error_info{connector="c",kind="refused"} 1']
    return "\n".join([*lines, "# EOF", ""])


def _samples(answers: list[ShardMetrics]) -> dict[str, list[tuple[dict[str, str], float]]]:
    families, _ = merge(answers)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FixedCollector(families))
    text = generate_latest(registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_node_totals_are_summed_and_the_rest_labelled_by_shard() -> None:
    found = _samples([ShardMetrics(0, _shard(3, 1, sync_sum=0.25, created=50, bridge=True)),
                      ShardMetrics(1, _shard(4, 2, role="other", created=70))])
    assert found["meshmq_messages_enqueued_total"] == [({}, 7.0)]
    assert found["meshmq_connections"] == [
        ({"listener": "stomp", "protocol": "stomp", "shard": "0"}, 1.0),
        ({"listener": "stomp", "protocol": "stomp", "shard": "1"}, 2.0)]
    assert found["meshmq_shard_link_sent_total"] == [({"peer": "x", "shard": "0"}, 4.0),
                                                     ({"peer": "x", "shard": "1"}, 5.0)]
    assert dict((s["le"], v) for s, v in found["meshmq_store_sync_seconds_bucket"]) == {
        "0.1": 2.0, "+Inf": 4.0}
    assert found["meshmq_store_sync_seconds_count"] == [({}, 4.0)]
    assert found["meshmq_store_sync_seconds_sum"] == [({}, 0.75)]
    assert found["meshmq_store_sync_seconds_created"] == [({}, 50.0)]  # the earliest
    # The front shard's role stands for the node's; the node's uptime is its own.
    assert found["meshmq_ha_role"] == [({"mode": "none", "role": "standalone"}, 1.0)]
    assert "meshmq_uptime_seconds" not in found
    assert found["meshmq_bridge_last_error_info"] == [
        ({"connector": "c", "kind": "refused"}, 1.0)]


def test_an_info_both_shards_have_stays_one() -> None:
    found = _samples([ShardMetrics(k, _shard(1, 1, bridge=True)) for k in (0, 1)])
    assert found["meshmq_bridge_last_error_info"] == [
        ({"connector": "c", "kind": "refused"}, 1.0)]


def test_a_shard_without_an_answer_is_down_and_the_next_one_is_the_front() -> None:
    answers = [ShardMetrics(0, error="refused"), ShardMetrics(1, _shard(4, 2, role="r1")),
               ShardMetrics(2, "garbage")]
    families, up = merge(answers)
    assert up == {0: False, 1: True, 2: False}
    assert _samples(answers)["meshmq_ha_role"] == [({"mode": "none", "role": "r1"}, 1.0)]
    own = node_figures([ShardRow(k, 10 + k, "running", k, 1) for k in range(3)], up, 5.0)
    by_name = {f.name: [(s.labels, s.value) for s in f.samples] for f in own}
    assert by_name["meshmq_shard_up"] == [({"shard": "0"}, 0), ({"shard": "1"}, 1),
                                          ({"shard": "2"}, 0)]
    assert by_name["meshmq_shard_restarts"] == [({"shard": str(k)}, k) for k in range(3)]
    assert by_name["meshmq_uptime_seconds"] == [({}, 5.0)]
    assert families  # shard 1's
