"""A node of shards in replicated mode (ha/replica_node.py): the node's vote over its
shards' streams, the shards' addresses, and a vote refused when a shard is silent.
Elections between supervisors: tests/ha/test_replica_node_election.py; real nodes:
tests/node/test_node_replicated.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.support.memory_replication import ManualClock

from meshmq.config.model import BrokerConfig, HaConfig
from meshmq.ha.replica_node import (
    NODE_STATE,
    NodeElection,
    decide_node_vote,
    shard_address,
    shard_ha,
)
from meshmq.ha.replication_policy import Position

LEASE = 1000


def node_vote(own: list[Position], theirs: list[Position], **kw: Any) -> tuple[bool, str]:
    args: dict[str, Any] = {"term": 4, "voted_for": None, "leader_seen_ms": None,
                            "amnesiac": False, "now_ms": 10_000}
    args.update(kw)
    d = decide_node_vote(args["term"], args["voted_for"], own, args["leader_seen_ms"],
                         args["amnesiac"], "c", 5, theirs, args["now_ms"], LEASE)
    return d.granted, d.reason


def test_a_node_votes_for_a_candidate_at_least_as_up_to_date_on_every_shard() -> None:
    assert node_vote([(4, 10), (4, 3)], [(4, 10), (4, 5)]) == (True, "granted")
    # Ahead on one stream does not make up for behind on another.
    assert node_vote([(4, 10), (4, 3)], [(4, 11), (4, 2)]) == \
        (False, "candidate log is behind")
    assert node_vote([(4, 10), (4, 3)], [(4, 10)])[1] == \
        "the candidate has 1 shards, this node 2"
    assert node_vote([(4, 10), (4, 3)], [(4, 10), (4, 3)],
                     leader_seen_ms=9_500) == (False, "a master is alive")
    assert node_vote([(4, 10), (4, 3)], [(4, 10), (4, 3)], voted_for="d", term=5) == \
        (False, "already voted for d")


def test_shard_k_streams_on_the_port_after_the_node_s_plus_k() -> None:
    config = BrokerConfig(broker_name="n", ha=HaConfig(
        mode="replicated", listen="10.0.0.1:7000", members=("10.0.0.2:7000", "h:9000")))
    assert shard_address("h:9000", 0) == "h:9001"
    ha = shard_ha(config, 1)
    assert (ha.listen, ha.members) == ("10.0.0.1:7002", ("10.0.0.2:7002", "h:9002"))
    assert ha.node_id == "n@10.0.0.1:7000/s1" and not ha.restart_when_deposed


def test_a_node_whose_shard_does_not_answer_refuses_its_vote(tmp_path: Path) -> None:
    async def ask(adopt: int | None) -> None:
        return None

    config = BrokerConfig(broker_name="x", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:1",
                                      members=("127.0.0.1:2",), node_id="x"))
    node = NodeElection(config, ask, on_lost=lambda why: None)
    node._load_state()

    async def main() -> dict[str, Any]:
        return await node._on_node_vote({"term": 1, "candidate": "y", "pre": False,
                                         "shards": [[0, 0], [0, 0]]})

    answer = asyncio.run(main())
    assert answer == {"term": 0, "granted": False,
                      "reason": "a shard of this node is not answering"}


def test_a_stop_while_the_election_listener_opens_ends_acquire_quietly(tmp_path: Path) -> None:
    """SIGTERM can reach a node as it restarts as a slave after losing the master role:
    the stop lands while ``acquire`` opens its listener, and acquire must then end
    (False) with the role stopped, not fire its slave event on a stopped role."""
    async def ask(adopt: int | None) -> None:
        return None

    config = BrokerConfig(broker_name="x", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:0",
                                      members=("127.0.0.1:2",), node_id="x"))
    node = NodeElection(config, ask, on_lost=lambda why: None)
    class Listener:  # unit tests open no sockets: a stand-in for the listening server
        closed = False

        def close(self) -> None:
            self.closed = True

        async def wait_closed(self) -> None:
            return None

    opened: list[Listener] = []

    async def listen_then_stop(host: str, port: int) -> Listener:
        await node.stop()  # the stop lands before the listener exists
        opened.append(Listener())
        return opened[0]

    node._listen = listen_then_stop  # type: ignore[method-assign]

    async def main() -> bool:
        return await node.acquire()

    assert asyncio.run(main()) is False
    assert node.role.value == "stopped"
    assert opened[0].closed


def test_a_stop_during_a_winning_campaign_ends_acquire_quietly(tmp_path: Path) -> None:
    """SIGTERM reaches a slave node while it stands (its master handed over): stop() ends
    the role, and the campaign, won meanwhile, must not make a stopping node master
    (before, the node exited with "event 'acquired' is not possible in role
    'stopped'")."""
    async def ask(adopt: int | None) -> list[dict[str, Any]]:
        return [{"term": 1, "last": [1, 5], "durable": [1, 5], "seen_ago_ms": 5,
                 "amnesiac": False, "leader": None, "resigned": 1}] * 2

    config = BrokerConfig(broker_name="x", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:0",
                                      members=("127.0.0.1:2",), node_id="x"))
    (tmp_path / "replication").mkdir()
    (tmp_path / NODE_STATE).write_text('{"term": 1, "voted_for": "m@h:1"}')
    node = NodeElection(config, ask, on_lost=lambda why: None)

    class Listener:  # unit tests open no sockets
        def close(self) -> None:
            return None

        async def wait_closed(self) -> None:
            return None

    async def listen(host: str, port: int) -> Listener:
        return Listener()

    async def campaign_stopped_midway(states: Any, resigned: int | None) -> bool:
        assert resigned == 1  # stood at once: the master handed over
        await node.stop()
        return True

    node._listen = listen  # type: ignore[method-assign]
    node._node_campaign = campaign_stopped_midway  # type: ignore[method-assign]

    async def main() -> bool:
        return await node.acquire()

    assert asyncio.run(main()) is False
    assert node.role.value == "stopped" and node.kind.value != "leader"


def test_a_node_votes_at_once_for_a_successor_of_a_master_that_resigned(
        tmp_path: Path) -> None:
    """The node follows the master of term 1 on both shards and heard from it just now;
    that master resigned (a graceful stop). A candidate told of it gets the vote at once,
    although voting moves the node's shards, and so the node, to term 2 before the
    positions are checked again; without the resignation the lease is waited out."""
    class Shards:
        term = 1

        async def ask(self, adopt: int | None) -> list[dict[str, Any]]:
            if adopt is not None and adopt > self.term:
                self.term = adopt
            return [{"term": self.term, "last": [1, 5], "durable": [1, 5],
                     "seen_ago_ms": 5, "amnesiac": False, "leader": "m@h:1/s0",
                     "resigned": 1}] * 2

    def node(name: str) -> NodeElection:
        config = BrokerConfig(broker_name=name, data_directory=tmp_path / name, shards=2,
                              ha=HaConfig(mode="replicated", listen="127.0.0.1:1",
                                          members=("127.0.0.1:2",), node_id=name,
                                          lease_ms=60_000))
        (tmp_path / name / "replication").mkdir(parents=True)
        (tmp_path / name / NODE_STATE).write_text('{"term": 1, "voted_for": "m@h:1"}')
        election = NodeElection(config, Shards().ask, on_lost=lambda why: None)
        election._load_state()
        return election

    def vote(election: NodeElection, resigned: int | None) -> dict[str, Any]:
        return asyncio.run(election._on_node_vote(
            {"term": 2, "candidate": "c@h:3", "pre": False, "resigned": resigned,
             "shards": [[1, 5], [1, 5]]}))

    handed = node("handed")
    assert vote(handed, 1) == {"term": 2, "granted": True, "reason": "granted"}
    assert (handed.term, handed.voted_for) == (2, "c@h:3")
    assert vote(node("alive"), None)["reason"] == "a master is alive"


def test_the_node_it_elected_gets_the_vote_again_and_holds_other_campaigns_off(
        tmp_path: Path) -> None:
    """While the elected node's shards start (``NodeElection.hold``) it repeats its
    request: granted again, and the voter's lease of waiting starts over, so another
    candidate is refused; the repeat moves nothing (no shard is asked)."""
    asked: list[int | None] = []

    async def ask(adopt: int | None) -> list[dict[str, Any]]:
        asked.append(adopt)
        return [{"term": 2, "last": [1, 5], "durable": [1, 5], "seen_ago_ms": 10**6,
                 "amnesiac": False, "leader": None, "resigned": None}] * 2

    config = BrokerConfig(broker_name="v", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:1",
                                      members=("127.0.0.1:2",), node_id="v",
                                      lease_ms=60_000))
    (tmp_path / "replication").mkdir()
    (tmp_path / NODE_STATE).write_text('{"term": 2, "voted_for": "w@h:1"}')
    voter = NodeElection(config, ask, on_lost=lambda why: None)
    voter._load_state()

    def request(candidate: str, term: int) -> dict[str, Any]:
        return asyncio.run(voter._on_node_vote(
            {"term": term, "candidate": candidate, "pre": False, "resigned": None,
             "shards": [[1, 5], [1, 5]]}))

    assert voter._granted_ms < 0  # its vote was cast before a restart: not recent
    assert request("w@h:1", 2) == {"term": 2, "granted": True, "reason": "granted"}
    assert asked == [] and voter._granted_ms >= 0
    assert request("x@h:2", 3) == {"term": 2, "granted": False,
                                   "reason": "a master is alive"}


@pytest.mark.parametrize("resigned", [1, None], ids=["resigned", "still-master"])
def test_a_vote_for_a_master_that_resigned_holds_no_later_election_back(
        tmp_path: Path, resigned: int | None) -> None:
    """The node voted for the master of term 1, which then resigned (a graceful stop),
    and the node's own candidacy moved it to term 2 before another won: a split vote
    between the two nodes told at once. Its vote for the resigned master must not hold
    the next candidate off for a lease (it stands in for the winner's streams only
    until they arrive); while that master has not resigned, it does."""
    shards: dict[str, Any] = {"term": 1, "last": [1, 5], "durable": [1, 5],
                              "seen_ago_ms": 10**6, "amnesiac": False, "leader": None,
                              "resigned": None}

    async def ask(adopt: int | None) -> list[dict[str, Any]]:
        if adopt is not None and adopt > shards["term"]:
            shards["term"] = adopt
        return [dict(shards)] * 2

    config = BrokerConfig(broker_name="v", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:1",
                                      members=("127.0.0.1:2", "127.0.0.1:3"),
                                      node_id="v", lease_ms=60_000))
    (tmp_path / "replication").mkdir()
    (tmp_path / NODE_STATE).write_text('{"term": 0, "voted_for": null}')
    clock = ManualClock()
    voter = NodeElection(config, ask, on_lost=lambda why: None, clock=clock)
    voter._load_state()
    clock.advance(120_000)  # started two leases ago

    def request(candidate: str, term: int) -> dict[str, Any]:
        return asyncio.run(voter._on_node_vote(
            {"term": term, "candidate": candidate, "pre": False, "resigned": None,
             "shards": [[1, 5], [1, 5]]}))

    assert request("m@h:1", 1) == {"term": 1, "granted": True, "reason": "granted"}
    # Its shards followed m and were told it resigned (or still follow it, silent since
    # the vote); then the node stood in term 2 itself, and lost.
    shards.update(term=2, resigned=resigned)
    voter.term, voter.voted_for = 2, "v"
    answer = request("w@h:2", 3)
    if resigned is None:
        assert answer == {"term": 2, "granted": False, "reason": "a master is alive"}
    else:
        assert answer == {"term": 3, "granted": True, "reason": "granted"}


def test_a_new_node_whose_shards_followed_a_master_that_resigned_is_up_to_date(
        tmp_path: Path) -> None:
    """A new node's shards followed a master that then resigned, all between two looks
    of the supervisor: they follow nobody now, but each has state again, so the node
    votes for candidates with data (else two new nodes could never elect again)."""
    async def ask(adopt: int | None) -> list[dict[str, Any]]:
        return [{"term": 1, "last": [1, 5], "durable": [1, 5], "seen_ago_ms": 10**6,
                 "amnesiac": False, "leader": None, "resigned": 1}] * 2

    config = BrokerConfig(broker_name="n", data_directory=tmp_path, shards=2,
                          ha=HaConfig(mode="replicated", listen="127.0.0.1:1",
                                      members=("127.0.0.1:2",), node_id="n"))
    node = NodeElection(config, ask, on_lost=lambda why: None)
    node._load_state()
    assert node.amnesiac  # no state file: a new node
    assert asyncio.run(node._shards(None)) is not None
    assert not node.amnesiac and node.term == 1
