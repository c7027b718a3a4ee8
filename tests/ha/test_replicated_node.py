"""Replication nodes in one event loop (real sockets on loopback, real journals): a
plain journal's data elected and copied by snapshot, and the master's journal limit.
The link handshake and its credentials, what ``sync`` waits for in synchronous and
asynchronous mode and a master that loses its majority are checked without sockets in
tests/unit/ha/test_replication_link.py and test_replicated_cluster.py."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, HaConfig, StoreConfig
from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.ha.replication import ReplicatedHa
from meshmq.ha.roles import Role
from meshmq.store.base import AddMessage
from meshmq.store.journal import JournalStore
from tests.support.ports import free_port

pytestmark = [pytest.mark.timeout(60)]


def _configs(root: Path, **ha: object) -> dict[str, BrokerConfig]:
    names = ("a", "b", "w")
    ports = {n: free_port() for n in names}
    out = {}
    for n in names:
        table = HaConfig(mode="replicated", listen=f"127.0.0.1:{ports[n]}",
                         members=tuple(f"127.0.0.1:{ports[o]}" for o in names if o != n),
                         node_id=n, role="witness" if n == "w" else "broker",
                         lease_ms=1000, keepalive_ms=100)
        out[n] = BrokerConfig(broker_name=n, data_directory=root / n,
                              store=StoreConfig(fsync=False),
                              ha=dataclasses.replace(table, **ha))  # type: ignore[arg-type]
    return out


async def _elect(nodes: dict[str, ReplicatedHa]) -> tuple[ReplicatedHa, list[asyncio.Task[bool]]]:
    tasks = [asyncio.create_task(n.acquire()) for n in nodes.values()]
    done, _ = await asyncio.wait(tasks, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert done, "nobody was elected"
    leader = next(n for n in nodes.values() if n.role is Role.MASTER)
    return leader, tasks


async def _shutdown(nodes: dict[str, ReplicatedHa], tasks: list[asyncio.Task[bool]]) -> None:
    for n in nodes.values():
        await n.stop()
    await asyncio.gather(*tasks, return_exceptions=True)


def _msg(i: int) -> AddMessage:
    m = Message(message_id=f"m{i}", destination=dst.queue("q"), body=b"x" * 10,
                persistent=True)
    return AddMessage(m, (("queue://q", i),))


async def _a_with_data_elected(cfgs: dict[str, BrokerConfig]) -> tuple[
        dict[str, ReplicatedHa], ReplicatedHa, list[asyncio.Task[bool]]]:
    """Node a with two messages in a plain journal, elected with the witness (as
    docs/ha.md says: the broker with the data starts first); b not started yet."""
    plain = JournalStore(cfgs["a"].store_directory)
    plain.open()
    plain.write([_msg(1), _msg(2)])
    await plain.close()
    nodes = {n: ReplicatedHa(c, on_lost=lambda why: None) for n, c in cfgs.items()}
    leader, tasks = await _elect({n: nodes[n] for n in ("a", "w")})
    return nodes, leader, tasks


async def _b_follows_by_snapshot(nodes: dict[str, ReplicatedHa], leader: ReplicatedHa,
                                 tasks: list[asyncio.Task[bool]]) -> None:
    """Start b; it must install the leader's snapshot and hold both messages."""
    b = nodes["b"]
    tasks.append(asyncio.create_task(b.acquire()))
    async with asyncio.timeout(20):
        while b.snapshots_installed < 1 or b.durable != leader.last:
            await asyncio.sleep(0.01)
    assert b.journal is not None and b.journal.key_info("queue://q").count == 2


def test_a_broker_switched_to_replication_keeps_its_journal(tmp_path: Path) -> None:
    """Segments of a plain journal move into the first generation; that data wins the
    election over an empty node and reaches it by snapshot."""
    async def main() -> None:
        cfgs = _configs(tmp_path)
        nodes, leader, tasks = await _a_with_data_elected(cfgs)
        assert leader is nodes["a"]
        assert leader.store.open().keys["queue://q"].count == 2
        await _b_follows_by_snapshot(nodes, leader, tasks)
        assert (cfgs["a"].store_directory / "gen-1").is_dir()
        await _shutdown(nodes, tasks)

    asyncio.run(main())


def test_the_master_refuses_persistent_messages_at_its_journal_limit(tmp_path: Path) -> None:
    """store.max_disk_bytes holds in replicated mode: the master's store says so, and the
    broker refuses persistent sends (store.base.Store.persistent_refusal)."""
    async def main() -> None:
        cfgs = _configs(tmp_path)
        for n in ("a", "b"):
            cfgs[n] = dataclasses.replace(cfgs[n], store=StoreConfig(fsync=False,
                                                                      max_disk_bytes=4096))
        nodes = {n: ReplicatedHa(c, on_lost=lambda why: None) for n, c in cfgs.items()}
        leader, tasks = await _elect(nodes)
        try:
            store = leader.store
            assert store.persistent_refusal() is None
            for i in range(1, 60):
                store.write([_msg(i)])
            await store.sync()
            refusal = store.persistent_refusal()
            assert refusal is not None and "store.max_disk_bytes" in refusal, refusal
        finally:
            await _shutdown(nodes, tasks)

    asyncio.run(main())


def test_a_failed_snapshot_read_is_retried_not_the_end_of_the_members_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An error the link does not expect (here: the store read behind a snapshot) is
    logged and the member's stream starts again; before, it ended that member's stream
    until the next election, and a new slave never followed."""
    failures = []
    real = ReplicatedHa._snapshot_ops

    def failing_once(self: ReplicatedHa) -> object:
        if not failures:
            failures.append(1)
            raise RuntimeError("segment 3 unreadable")
        return real(self)

    monkeypatch.setattr(ReplicatedHa, "_snapshot_ops", failing_once)

    async def main() -> None:
        nodes, leader, tasks = await _a_with_data_elected(_configs(tmp_path))
        try:
            await _b_follows_by_snapshot(nodes, leader, tasks)
        finally:
            await _shutdown(nodes, tasks)

    with caplog.at_level("WARNING", logger="meshmq.ha"):
        asyncio.run(main())
    assert failures == [1]
    assert any("failed (segment 3 unreadable); retrying" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
