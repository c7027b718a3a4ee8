"""A replicated node's inbound link, frame by frame: the handshake and its credentials,
votes, a master's APPENDs (heartbeats, batches, a log that does not match, a stale
master), snapshots, a witness's positions, and a master's handover. The node is real (its
journal, its state file); the link is in memory and time moves only when the test says
(tests/support/memory_replication.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.memory_replication import (
    Body,
    Link,
    MemoryNode,
    ReplicationNet,
    add,
    hello,
    until,
)

from meshmq.ha.replica_ops import encode_ops
from meshmq.ha.replica_peer import REPL_KEY
from meshmq.ha.replica_wire import encode_append, encode_mixed
from meshmq.ha.replication import STATE_FILE
from meshmq.ha.replication_policy import pack_position
from meshmq.protocol.wire.codec import FrameType, encode_json
from meshmq.store.base import StoreOp


def append(term: int, prev: tuple[int, int] | None,
           batches: list[tuple[tuple[int, int], list[StoreOp]]] = (),  # type: ignore[assignment]
           **extra: Any) -> bytes:
    head = {"term": term, "leader": "a", "sent_ms": 0, "commit": 0,
            "prev": list(prev) if prev is not None else None, **extra}
    return encode_append(head, [(pos, encode_ops(ops)) for pos, ops in batches])


def snapshot(term: int, at: tuple[int, int], part: int, final: bool,
             ops: list[StoreOp], marks: dict[str, int] | None = None) -> bytes:
    head = {"term": term, "leader": "a", "sent_ms": 0, "commit": 0, "prev": None,
            "position": list(at), "part": part, "final": final}
    return encode_mixed(FrameType.REPL_SNAPSHOT, head, encode_ops(ops, marks))


def vote_request(term: int, last: tuple[int, int] = (0, 0), *, pre: bool = False,
                 candidate: str = "c", resigned: int | None = None) -> bytes:
    return encode_json(FrameType.REPL_VOTE_REQUEST, {
        "term": term, "candidate": candidate, "last": list(last), "pre": pre,
        "resigned": resigned})


def run(tmp_path: Path, body: Body, *, start: tuple[str, ...] = ("b",), **ha: Any) -> None:
    """Nodes a, b and witness w; the ones in ``start`` run, the test plays the others."""
    async def main() -> None:
        net = ReplicationNet(tmp_path)
        nodes = net.cluster(("a", "b", "w"), witnesses=("w",), **ha)
        await net.start(*(nodes[n] for n in start))
        try:
            await body(net, nodes)
        finally:
            await net.stop()

    asyncio.run(main())


def state_file(node: MemoryNode) -> dict[str, Any]:
    path = node.generations.directory / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------ handshake


@pytest.mark.parametrize(("first", "reason"), [
    (vote_request(1), "expected HELLO first, got REPL_VOTE_REQUEST"),
    (encode_json(FrameType.HELLO, {"node": "x"}), "not a replication link"),
    (encode_json(FrameType.HELLO, {"replication": 2, "node": "x"}), "not a replication link"),
], ids=["no-hello", "broker-hello", "other-version"])
def test_a_link_that_does_not_open_with_a_replication_hello_is_refused(
        tmp_path: Path, first: bytes, reason: str) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello()[:4] + first, vote_request(1))
        assert (await link.json(FrameType.REFUSE))["reason"].startswith(reason)
        assert await link.frame() is None  # and the node closes it

    run(tmp_path, body)


def test_a_connection_without_the_magic_is_closed_unanswered(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(b"GET / HTTP/1.1\r\n\r\n")
        assert await link.frame() is None

    run(tmp_path, body)


@pytest.mark.parametrize("credentials", [
    {"user": "repl", "password": "wrong"},
    {"user": "other", "password": "sécret-密码"},
    {"user": "repl", "password": "sécret-密"},
    {},
], ids=["password", "user", "prefix", "none"])
def test_links_without_the_configured_credentials_are_refused(
        tmp_path: Path, credentials: dict[str, str]) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(**credentials), vote_request(1, pre=True))
        reason = (await link.json(FrameType.REFUSE))["reason"]
        assert reason == "bad replication credentials (ha.user / ha.password)"

    run(tmp_path, body, user="repl", password="sécret-密码")


def test_a_link_with_the_configured_credentials_is_served(tmp_path: Path) -> None:
    """Any password, non-ASCII included (compared as bytes)."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(user="repl", password="sécret-密码"), vote_request(1, pre=True))
        assert "granted" in await link.json(FrameType.REPL_VOTE)

    run(tmp_path, body, user="repl", password="sécret-密码")


# ------------------------------------------------------------------ votes


def test_a_node_that_just_started_refuses_votes_for_a_lease(tmp_path: Path) -> None:
    """It may have acknowledged a master just before it restarted."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(), vote_request(1))
        answer = await link.json(FrameType.REPL_VOTE)
        assert answer == {"term": 0, "granted": False, "reason": "a master is alive"}
        net.clock.advance(1000)
        link.send(vote_request(1))
        assert (await link.json(FrameType.REPL_VOTE))["granted"] is True

    run(tmp_path, body)


def test_a_granted_vote_is_on_disk_before_the_answer_leaves(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        net.clock.advance(1000)
        link = net.link("b")
        link.send(hello(), vote_request(3, candidate="a"))
        assert await link.json(FrameType.REPL_VOTE) == {
            "term": 3, "granted": True, "reason": "granted"}
        assert state_file(nodes["b"]) == {"term": 3, "voted_for": "a", "amnesiac": True}
        link.send(vote_request(3, candidate="c"))
        assert await link.json(FrameType.REPL_VOTE) == {
            "term": 3, "granted": False, "reason": "already voted for a"}

    run(tmp_path, body)


def test_a_pre_vote_changes_neither_term_nor_vote(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        net.clock.advance(1000)
        link = net.link("b")
        link.send(hello(), vote_request(3, pre=True))
        answer = await link.json(FrameType.REPL_VOTE)
        assert answer["granted"] is True and answer["term"] == 0
        assert (nodes["b"].term, nodes["b"].voted_for) == (0, None)
        assert "voted_for" not in state_file(nodes["b"]) or \
            state_file(nodes["b"])["voted_for"] is None

    run(tmp_path, body)


def test_a_node_without_state_refuses_a_candidate_with_data(tmp_path: Path) -> None:
    """Its directory may have been wiped: it cannot know what it confirmed before."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        net.clock.advance(1000)
        link = net.link("b")
        link.send(hello(), vote_request(2, last=(1, 5)))
        answer = await link.json(FrameType.REPL_VOTE)
        assert answer["granted"] is False and "no state of its own" in answer["reason"]

    run(tmp_path, body)


# ------------------------------------------------------------------ a master's APPENDs


def test_a_heartbeat_makes_the_sender_this_node_s_master(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = net.link("b")
        link.send(hello(), append(2, None))
        ack = await link.json(FrameType.REPL_ACK)
        assert ack == {"term": 2, "ok": True, "accepted": True, "last": [0, 0],
                       "durable": [0, 0], "sent_ms": 0, "witness": False, "reason": ""}
        assert (b.leader_id, b.term) == ("a", 2)
        # Following a master brings the node up to date: it has state of its own again.
        assert state_file(b) == {"term": 2, "voted_for": None}
        assert b.status()["leader"] == "a"

    run(tmp_path, body)


def test_batches_are_acknowledged_once_on_disk_with_their_position(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = net.link("b")
        link.send(hello(), append(1, (0, 0), [((1, 1), [add(1)]), ((1, 2), [add(2)])]))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["last"], ack["durable"]) == (True, [1, 2], [1, 2])
        journal = b.journal
        assert journal is not None
        assert [e.message.message_id for e in journal.load("queue://q", 0, 10)] == \
            ["m1", "m2"]
        assert journal.key_info(REPL_KEY).last_seq == pack_position((1, 2))

    run(tmp_path, body)


def test_batches_that_do_not_continue_this_log_are_refused(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(), append(1, (0, 0), [((1, 1), [add(1)])]))
        assert (await link.json(FrameType.REPL_ACK))["ok"] is True
        link.send(append(1, (1, 3), [((1, 4), [add(4)])]))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["accepted"], ack["reason"], ack["last"]) == (
            False, True, "log ends at (1, 1), not (1, 3)", [1, 1])
        assert nodes["b"].journal.key_info("queue://q").count == 1  # type: ignore[union-attr]

    run(tmp_path, body)


def test_a_master_of_an_older_term_is_refused_and_not_followed(tmp_path: Path) -> None:
    """A deposed master that still sends: its batches never reach this journal, and
    its answer does not extend its lease (accepted false)."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(), append(3, None))
        await link.json(FrameType.REPL_ACK)
        old = net.link("b")
        old.send(hello(), append(2, (0, 0), [((2, 1), [add(1)])], leader="old"))
        ack = await old.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["accepted"], ack["reason"], ack["term"]) == (
            False, False, "stale term", 3)
        assert nodes["b"].last == (0, 0) and nodes["b"].leader_id == "a"

    run(tmp_path, body)


def test_a_damaged_batch_closes_the_link_and_writes_nothing(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        damaged = encode_append({"term": 1, "leader": "a", "sent_ms": 0, "prev": [0, 0]},
                                [((1, 1), encode_ops([add(1)])[:-3])])
        link.send(hello(), damaged)
        assert await link.frame() is None
        assert nodes["b"].last == (0, 0)
        again = net.link("b")  # the node still serves other links
        again.send(hello(), append(1, None))
        assert (await again.json(FrameType.REPL_ACK))["ok"] is True

    run(tmp_path, body)


def test_a_witness_keeps_positions_only(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        w = nodes["w"]
        link = net.link("w")
        link.send(hello(), append(1, (0, 0), [((1, 1), []), ((1, 2), [])]))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["witness"], ack["durable"]) == (True, True, [1, 2])
        assert w.journal is None
        assert state_file(w)["last"] == [1, 2]

    run(tmp_path, body, start=("w",))


async def following_a(net: ReplicationNet) -> Link:
    """b, up for 5 s, follows master a of term 1: a's link to it."""
    net.clock.advance(5000)
    link = net.link("b")
    link.send(hello(), append(1, None))
    await link.json(FrameType.REPL_ACK)
    return link


def test_after_a_handover_the_master_s_voters_vote_at_once(tmp_path: Path) -> None:
    """A master that resigned accepts no more writes: its lease need not be waited out."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = await following_a(net)
        candidate = net.link("b")
        candidate.send(hello(), vote_request(2, candidate="c"))
        assert (await candidate.json(FrameType.REPL_VOTE))["reason"] == "a master is alive"
        link.send(append(1, (0, 0), resign=True))
        await until(lambda: b.leader_id is None, "b to drop its master")
        candidate.send(vote_request(2, candidate="c", resigned=1))
        assert (await candidate.json(FrameType.REPL_VOTE))["granted"] is True

    run(tmp_path, body, can_be_master=False)


@pytest.mark.parametrize("sender", ["a", "x"], ids=["its-master", "another-node"])
def test_a_handover_told_after_a_newer_term_began_still_frees_the_votes(
        tmp_path: Path, sender: str) -> None:
    """A node's shard moved to term 2 (its supervisor stood as a candidate when another
    shard was told) before its own master's notice of term 1 came: the notice's appends
    are stale, but the master it followed still stopped, so its lease no longer holds
    votes back. The same notice from a node it never followed changes nothing."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = await following_a(net)
        b.control({"op": "adopt", "term": 2})
        link.send(append(1, (0, 0), resign=True, leader=sender))
        if sender == "a":
            await until(lambda: b.leader_id is None, "b to drop its master")
        else:  # refused as any stale master's append is
            assert (await link.json(FrameType.REPL_ACK))["reason"] == "stale term"
        candidate = net.link("b")
        candidate.send(hello(), vote_request(3, candidate="c"))
        answer = await candidate.json(FrameType.REPL_VOTE)
        if sender == "a":
            assert (answer["granted"], b.leader_id, b.control({})["resigned"]) == \
                (True, None, 1)
        else:
            assert (answer["reason"], b.leader_id) == ("a master is alive", "a")

    run(tmp_path, body, can_be_master=False)


def test_a_stop_during_a_winning_campaign_ends_acquire_quietly(tmp_path: Path) -> None:
    """SIGTERM reaches a slave while it stands: stop() ends the role, and the campaign,
    won meanwhile, must not make a stopping broker master (before, acquire raised
    "event 'acquired' is not possible in role 'stopped'")."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]

        async def campaign_stopped_midway() -> bool:
            await b.stop()
            return True

        b._campaign = campaign_stopped_midway  # type: ignore[method-assign]
        b._elect_now.set()
        assert await b.acquire() is False
        assert (b.role.value, b.kind.value) == ("stopped", "follower")

    run(tmp_path, body, start=())


# ------------------------------------------------------------------ snapshots


def test_a_snapshot_replaces_the_journal_with_a_new_generation(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = net.link("b")
        link.send(hello(), append(1, (0, 0), [((1, 1), [add(1)])]))
        await link.json(FrameType.REPL_ACK)
        # The master's history diverged: a copy of its store at (4, 30) replaces b's.
        link.send(snapshot(4, (4, 30), 0, True, [add(7), add(8)], {"queue://q": 8}))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["last"], ack["durable"]) == (True, [4, 30], [4, 30])
        assert b.snapshots_installed == 1
        assert (b.generations.directory / "CURRENT").read_text() == "gen-2"
        assert not (b.generations.directory / "gen-1").exists()
        journal = b.journal
        assert journal is not None
        assert [e.message.message_id for e in journal.load("queue://q", 0, 10)] == \
            ["m7", "m8"]
        assert journal.key_info(REPL_KEY).last_seq == pack_position((4, 30))

    run(tmp_path, body)


def test_a_snapshot_in_parts_is_acknowledged_once_complete(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        b = nodes["b"]
        link = net.link("b")
        link.send(hello(), snapshot(2, (2, 9), 0, False, [add(1)]),
                  snapshot(2, (2, 9), 1, True, [add(2)], {"queue://q": 2}))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["durable"]) == (True, [2, 9])
        assert b.journal is not None and b.journal.key_info("queue://q").count == 2
        link.send(append(2, None))  # the next answer is the heartbeat's: one ack only
        assert (await link.json(FrameType.REPL_ACK))["last"] == [2, 9]

    run(tmp_path, body)


def test_a_snapshot_part_without_its_beginning_is_refused(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        link = net.link("b")
        link.send(hello(), snapshot(2, (2, 9), 1, True, [add(1)]))
        ack = await link.json(FrameType.REPL_ACK)
        assert (ack["ok"], ack["reason"]) == (False, "snapshot part without its beginning")
        assert nodes["b"].last == (0, 0)

    run(tmp_path, body)
