"""Replicated master/slave as a whole, without sockets: two brokers and a witness
elect a master, confirm writes once a majority has them, catch a slave up by stream or
snapshot, step down when cut off, and hand over on a graceful stop. Real nodes and
journals; in-memory links; time moves only when the test says
(tests/support/memory_replication.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.support.memory_replication import Body, MemoryNode, ReplicationNet, add, until

from meshmq.ha.roles import Role
from meshmq.store.fence import FencedError

LEASE = 1000


def ids(node: MemoryNode) -> list[str]:
    assert node.journal is not None
    return [e.message.message_id for e in node.journal.load("queue://q", 0, 100)]


def run(tmp_path: Path, body: Body, **ha: Any) -> None:
    """a is elected (with the witness w's vote) before b starts, so the test knows who
    the master is; b then joins as a slave."""
    async def main() -> None:
        net = ReplicationNet(tmp_path)
        nodes = net.cluster(("a", "b", "w"), witnesses=("w",), lease_ms=LEASE, **ha)
        try:
            await net.start(nodes["a"], nodes["w"])
            net.clock.advance(LEASE + LEASE // 5 + 1)  # past any node's election timer
            await until(lambda: nodes["a"].role is Role.MASTER, "a to be elected")
            await net.start(nodes["b"])
            await until(lambda: nodes["b"].durable == nodes["a"].last, "b to follow a")
            await body(net, nodes)
        finally:
            await net.stop()

    asyncio.run(main())


def test_the_elected_master_leads_a_term_the_others_follow(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a, b, w = nodes["a"], nodes["b"], nodes["w"]
        assert (a.term, b.term, w.term) == (1, 1, 1)
        assert b.leader_id == w.leader_id == "a"
        assert (b.role, w.role) == (Role.SLAVE, Role.SLAVE)
        status = a.status()
        assert (status["raft"], status["writable"], status["commit"]) == ("leader", True, 1)
        assert a.elections == 1 and b.elections == 0

    run(tmp_path, body)


def test_a_confirmed_write_is_on_the_slave_s_disk(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a, b = nodes["a"], nodes["b"]
        a.store.open()
        a.store.write([add(1)])
        await a.store.sync()
        assert b.durable >= a.last
        assert ids(b) == ["m1"]

    run(tmp_path, body)


def test_writes_wait_for_a_slave_that_is_there_but_behind(tmp_path: Path) -> None:
    """Its lease has not run out, so the witness may not confirm ahead of it: the
    confirmation comes once the slave caught up after its link came back."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a, b = nodes["a"], nodes["b"]
        a.store.open()
        net.isolate("b")
        for i in (1, 2, 3):
            a.store.write([add(i)])
        sync = asyncio.ensure_future(a.store.sync())
        await asyncio.sleep(0.05)
        assert not sync.done()
        net.heal("b")
        await asyncio.wait_for(sync, 10)
        assert ids(b) == ["m1", "m2", "m3"]
        assert b.snapshots_installed == 0  # streamed from the retained batches

    run(tmp_path, body)


def test_a_slave_behind_the_retained_history_catches_up_by_snapshot(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a, b = nodes["a"], nodes["b"]
        a.store.open()
        net.isolate("b")
        for i in (1, 2, 3):
            a.store.write([add(i)])
        net.heal("b")
        await asyncio.wait_for(a.store.sync(), 10)
        assert (a.snapshots_sent, b.snapshots_installed) == (1, 1)
        assert ids(b) == ["m1", "m2", "m3"]
        assert b.durable == a.last

    run(tmp_path, body, log_retain_bytes=1)


@pytest.mark.parametrize("synchronous", [True, False])
def test_a_master_cut_off_from_the_others(tmp_path: Path, synchronous: bool) -> None:
    """Synchronous: nothing is confirmed without a majority, and once no majority has
    answered for its lease the master steps down and refuses writes. Asynchronous: its
    own disk confirms, for as long as its lease holds."""
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a = nodes["a"]
        a.store.open()
        net.isolate("b", "w")
        a.store.write([add(1)])
        sync = asyncio.ensure_future(a.store.sync())
        if synchronous:
            await asyncio.sleep(0.05)  # room for a confirmation that must not come
            assert not sync.done()
        else:
            await asyncio.wait_for(asyncio.shield(sync), 10)  # its own disk confirms
        net.clock.advance(LEASE)
        await until(lambda: a.role is Role.DEPOSED, "a to step down")
        assert a.lost and "no majority answered" in a.lost[0]
        if synchronous:
            with pytest.raises(FencedError):
                await asyncio.wait_for(sync, 10)
        with pytest.raises(FencedError):
            a.store.write([add(2)])
        assert a.status()["writable"] is False

    run(tmp_path, body, synchronous=synchronous)


def test_a_graceful_stop_hands_over_without_waiting_for_the_lease(tmp_path: Path) -> None:
    async def body(net: ReplicationNet, nodes: dict[str, MemoryNode]) -> None:
        a, b = nodes["a"], nodes["b"]
        a.store.open()
        a.store.write([add(1)])
        await a.store.sync()
        await a.stop()
        assert a.role is Role.STOPPED
        # The clock has not moved: no lease ran out, the handover elected b.
        await until(lambda: b.role is Role.MASTER, "b to take over")
        assert b.term == 2
        assert ids(b) == ["m1"]
        # b's own stop does not wait for a, which is down and cannot catch up.
        await asyncio.wait_for(b.stop(), 5)
        assert b.role is Role.STOPPED

    run(tmp_path, body)
