"""Elections between three supervisors' ``NodeElection``s (ha/replica_node.py) on
loopback, with stand-in shards that answer as ``ReplicatedHa.control`` does: the node's
votes over its shards' streams. Real nodes: tests/node/test_node_replicated.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import BrokerConfig, HaConfig, StoreConfig
from meshmq.ha.replica_node import NODE_STATE, NodeElection, ShardState
from meshmq.ha.replication_policy import Position
from meshmq.ha.roles import Role
from tests.support.ports import free_port

pytestmark = [pytest.mark.timeout(60)]

LEASE = 1000


class StandInShard:
    """Answers its supervisor as ``ReplicatedHa.control`` does; never hears a master."""

    def __init__(self, last: Position) -> None:
        self.term = 0
        self.last = last

    def control(self, adopt: int | None) -> dict[str, Any]:
        if adopt is not None and adopt > self.term:
            self.term = adopt
        return {"term": self.term, "last": list(self.last), "durable": list(self.last),
                "seen_ago_ms": 10 * LEASE, "amnesiac": False, "leader": None,
                "resigned": None}


def _election(tmp_path: Path, name: str, ports: dict[str, int],
              shards: dict[str, list[StandInShard]]) -> NodeElection:
    """Node ``name``'s supervisor election, its shards the stand-ins in ``shards``."""
    async def ask(adopt: int | None) -> list[dict[str, Any]]:
        return [s.control(adopt) for s in shards[name]]

    config = BrokerConfig(
        broker_name=name, data_directory=tmp_path / name, shards=2,
        store=StoreConfig(fsync=False),
        ha=HaConfig(mode="replicated", listen=f"127.0.0.1:{ports[name]}",
                    members=tuple(f"127.0.0.1:{ports[o]}" for o in ports if o != name),
                    node_id=name, lease_ms=LEASE, keepalive_ms=100))
    return NodeElection(config, ask, on_lost=lambda why: None)


async def _elect(nodes: dict[str, NodeElection]) -> list[str]:
    """Run every node's campaign until one is elected; stop them all; the masters."""
    tasks = [asyncio.create_task(e.acquire()) for e in nodes.values()]
    done, _ = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert done, "nobody was elected"
    winners = [n for n, e in nodes.items() if e.role is Role.MASTER]
    for e in nodes.values():
        await e.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    return winners


def test_only_a_node_up_to_date_on_every_shard_is_elected(tmp_path: Path) -> None:
    """b is ahead on shard 0 and behind on shard 1: a and c refuse it, it refuses them
    (a master needs every stream's confirmed batches); a or c wins with the other's
    vote, and every shard that voted or campaigned was moved to the new term first."""
    logs = {"a": [(1, 5), (1, 9)], "b": [(1, 6), (1, 7)], "c": [(1, 5), (1, 9)]}
    ports = {n: free_port() for n in logs}
    shards = {n: [StandInShard(p) for p in pos] for n, pos in logs.items()}

    def election(name: str) -> NodeElection:
        return _election(tmp_path, name, ports, shards)

    for n in logs:  # nodes with state of their own (a node without votes only once
        # a master brought it up to date)
        (tmp_path / n / "replication").mkdir(parents=True)
        (tmp_path / n / NODE_STATE).write_text('{"term": 1, "voted_for": null}')

    async def main() -> None:
        nodes = {n: election(n) for n in logs}
        winners = await _elect(nodes)
        assert len(winners) == 1 and winners[0] in ("a", "c"), winners
        term = nodes[winners[0]].term
        assert all(s.term == term for s in shards[winners[0]])
        # The state survives: a restarted supervisor never votes twice in a term.
        again = election(winners[0])
        again._load_state()
        assert (again.term, again.voted_for) == (term, winners[0])

    asyncio.run(asyncio.wait_for(main(), 40))


def test_a_new_node_once_elected_votes_for_candidates_with_data(tmp_path: Path) -> None:
    """New nodes (no state file) vote only in a cluster that never wrote; the one
    elected is up to date by definition. If it then loses the role before its shards
    followed another master, it must still vote for a candidate with data, or two nodes
    left of three could never elect again."""
    names = ("a", "b", "c")
    ports = {n: free_port() for n in names}
    shards = {n: [StandInShard((0, 0)), StandInShard((0, 0))] for n in names}

    def election(name: str) -> NodeElection:
        return _election(tmp_path, name, ports, shards)

    async def main() -> None:
        nodes = {n: election(n) for n in names}
        winners = await _elect(nodes)
        losers = [n for n in names if n not in winners]
        assert len(winners) == 1, winners
        winner, loser = nodes[winners[0]], nodes[losers[0]]
        assert not winner.amnesiac and loser.amnesiac
        # Restarted (as after a lost master role): still up to date, so a candidate
        # whose shards hold data gets its vote; a node never brought up to date refuses.
        again = election(winners[0])
        again._load_state()
        assert not again.amnesiac
        states = [s.control(None) for s in shards[winners[0]]]
        parsed = [ShardState.parse(s) for s in states]
        with_data = [(again.term, 3), (again.term, 4)]
        vote = again._decide(parsed, 10 * LEASE, "x@127.0.0.1:1", again.term + 1,
                             with_data, None)
        assert vote.granted, vote.reason
        refused = nodes[losers[0]]._decide(parsed, 10 * LEASE, "x@127.0.0.1:1",
                                           again.term + 1, with_data, None)
        assert not refused.granted and "no state of its own" in refused.reason

    asyncio.run(asyncio.wait_for(main(), 40))
