"""``meshmq stat``'s high-availability line for each kind of status the brokers report,
and its line per bridge."""

from __future__ import annotations

from meshmq.cli.main import bridge_line, ha_line


def test_no_high_availability_prints_no_line() -> None:
    assert ha_line({}) is None
    assert ha_line({"mode": "none", "role": "master"}) is None


def test_a_lease_shows_its_holder() -> None:
    line = ha_line({"mode": "shared", "role": "master", "epoch": 4, "lease_holder": "a",
                    "lease_epoch": 4})
    assert line == "role master  ha shared  epoch 4  lease held by a (epoch 4)"


def test_a_replicated_broker_shows_its_log_and_commit() -> None:
    line = ha_line({"mode": "replicated", "role": "slave", "term": 3, "leader": "b@x",
                    "last": [3, 120], "commit": 118})
    assert line == "role slave  ha replicated  term 3  master b@x  log [3, 120]  commit 118"


def test_a_replicated_node_of_shards_shows_each_shards_log() -> None:
    """A node's supervisor has no log of its own (ReplicaNode.status): no ``log None``."""
    ha = {"mode": "replicated", "role": "master", "term": 5, "leader": "a@x",
          "shards": [{"term": 5, "last": [5, 40], "durable": [5, 40], "seen_ago_ms": 3},
                     {"term": 5, "last": [4, 7], "durable": [4, 7], "seen_ago_ms": 2}]}
    line = ha_line(ha)
    assert line == "role master  ha replicated  term 5  master a@x  shards 2  logs " \
        "s0 [5, 40], s1 [4, 7]"
    assert ha_line({**ha, "shards": []}) == \
        "role master  ha replicated  term 5  master a@x  shards 0  logs not known yet"


def test_the_shards_own_positions_come_with_their_commit() -> None:
    """What the node's /api/stat gives (node.aggregate.node_ha): each shard's own
    replication, or the supervisor's last view of a shard that did not answer."""
    ha = {"mode": "replicated", "role": "master", "term": 2, "leader": "a@x",
          "shards": [{"up": True, "term": 2, "last": [2, 9], "commit": 9},
                     {"up": False, "term": 2, "last": [2, 4]}]}
    assert ha_line(ha) == "role master  ha replicated  term 2  master a@x  shards 2  logs " \
        "s0 [2, 9] commit 9, s1 [2, 4] (not answering)"


def test_a_bridge_line_names_what_the_remote_holds() -> None:
    bridge = {"name": "out@b", "direction": "outbound", "state": "forwarding",
              "remote_broker": "b", "forwarded": 10, "received": 0, "forward_rate": 1.5,
              "demand": 1, "refused": 0, "held": [], "last_error": None}
    assert bridge_line(bridge) == ("bridge out@b (outbound) forwarding remote b forwarded "
                                   "10 received 0 rate 1.5/s demand 1")
    bridge["held"] = ["queue://orders", "topic://prices"]
    assert bridge_line(bridge).endswith(
        " demand 1 held queue://orders,topic://prices (its consumers on b are behind)")
