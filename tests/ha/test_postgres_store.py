"""The PostgreSQL store beyond the contract suite: a Hypothesis state machine against the
MemoryStore model, one broker per store without HA, and clear errors."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.errors import StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    PutDurableSubscription,
    RemoveRef,
    SetDeliveryCount,
    StoreOp,
)
from meshmq.store.memory import MemoryStore
from meshmq.store.postgres import PostgresStore
from tests.ha.support import HaProcess, connect, drain, write_config
from tests.store.helpers import entry_view, msg, sub
from tests.support.brokers import poll
from tests.support.ports import free_port
from tests.support.postgres import cluster

KEYS = ("queue://a", "queue://b", "durable://c:x", "durable://c:y")
SUB_KEYS = KEYS[2:]
_machines = itertools.count(1)


class PostgresMatchesMemory(RuleBasedStateMachine):
    """Writes are applied to both stores; reads, key figures and what a reopen recovers
    must agree at every step (bodies come from memory before the commit, from the table
    after it)."""

    def __init__(self) -> None:
        super().__init__()
        self.dsn = cluster().dsn()
        self.prefix = f"sm{os.getpid()}_{next(_machines)}_"
        self.loop = asyncio.new_event_loop()
        self.store = self._open()
        self.model = MemoryStore()
        self.model.open()
        self.next_seq = dict.fromkeys(KEYS, 0)
        self.live: dict[str, list[int]] = {k: [] for k in KEYS}
        self.n = 0

    def _open(self) -> PostgresStore:
        store = PostgresStore(self.dsn, table_prefix=self.prefix)
        self.recovery = store.open()
        return store

    def both(self, ops: list[StoreOp]) -> None:
        self.store.write(ops)
        self.model.write(ops)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
          size=st.integers(0, 300), count=st.integers(1, 4))
    def add(self, keys: list[str], size: int, count: int) -> None:
        ops: list[StoreOp] = []
        for _ in range(count):
            self.n += 1
            refs = []
            for k in keys:
                self.next_seq[k] += 1
                refs.append((k, self.next_seq[k]))
                self.live[k].append(self.next_seq[k])
            ops.append(AddMessage(msg(self.n, bytes([self.n % 251]) * size), tuple(refs)))
        self.both(ops)

    @precondition(lambda self: any(self.live.values()))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from([k for k in KEYS if self.live[k]]))
        seqs = data.draw(st.lists(st.sampled_from(self.live[key]), min_size=1, unique=True))
        for s in seqs:
            self.live[key].remove(s)
        self.both([RemoveRef(key, s) for s in seqs] + [RemoveRef(key, 10**9)])

    @precondition(lambda self: any(self.live.values()))
    @rule(data=st.data(), count=st.integers(0, 20))
    def deliver(self, data: st.DataObject, count: int) -> None:
        key = data.draw(st.sampled_from([k for k in KEYS if self.live[k]]))
        seq = data.draw(st.sampled_from(self.live[key]))
        self.both([SetDeliveryCount(key, seq, count)])

    @rule(key=st.sampled_from(SUB_KEYS), selector=st.none() | st.sampled_from(["a > 1", "b"]))
    def put_sub(self, key: str, selector: str | None) -> None:
        self.both([PutDurableSubscription(sub(key, key[-1], selector))])

    @rule(key=st.sampled_from(KEYS))
    def drop(self, key: str) -> None:
        self.live[key] = []
        self.both([DropKey(key)])

    @rule()
    def sync(self) -> None:
        self.loop.run_until_complete(self.store.sync())

    @rule()
    def reopen(self) -> None:
        self.loop.run_until_complete(self.store.close())
        self.store = self._open()
        expect = {k: i for k, i in self.model.keys().items() if i.count or i.last_seq}
        assert self.recovery.keys == expect
        key = lambda s: s.key  # noqa: E731
        assert sorted(self.recovery.durable_subscriptions, key=key) == \
            sorted(self.model.durable_subscriptions(), key=key)

    @invariant()
    def same_contents(self) -> None:
        for k in KEYS:
            assert self.store.key_info(k) == self.model.key_info(k), k
            got: Any = entry_view(self.store.load(k, 0, 1 << 30))
            assert got == entry_view(self.model.load(k, 0, 1 << 30)), k

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.store.close())
            # No message row may outlive its last reference.
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute(
                    f"SELECT count(*) FROM {self.prefix}messages m WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {self.prefix}refs r WHERE r.msg_id = m.id)").fetchone()
                assert row == (0,), f"{row} orphaned message rows"
        finally:
            self.loop.close()


PostgresMatchesMemory.TestCase.settings = settings(
    max_examples=int(os.environ.get("MESHMQ_STATEFUL_EXAMPLES", "25")), stateful_step_count=30,
    derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_postgres_matches_memory = PostgresMatchesMemory.TestCase


def test_one_broker_per_store_without_ha(postgres_dsn: str) -> None:
    async def run() -> None:
        first = PostgresStore(postgres_dsn)
        first.open()
        second = PostgresStore(postgres_dsn)
        with pytest.raises(StoreError, match="locked by another broker"):
            second.open()
        await first.close()
        third = PostgresStore(postgres_dsn)  # the session lock went with the connection
        third.open()
        await third.close()

    asyncio.run(run())


def test_bad_settings_are_named() -> None:
    with pytest.raises(StoreError, match="table_prefix"):
        PostgresStore("host=x", table_prefix="1; drop table")
    store = PostgresStore("host=127.0.0.1 port=1 dbname=x password=hunter2 "
                          "connect_timeout=1")
    with pytest.raises(StoreError, match="cannot connect to PostgreSQL") as info:
        store.open()
    assert "hunter2" not in str(info.value)
    assert "port=1" in str(info.value)


def test_a_broker_without_ha_cannot_share_an_ha_store(postgres_dsn: str) -> None:
    from meshmq.ha.pg_lease import PgLease

    lease = PgLease(postgres_dsn, "a", lease_ms=1000)
    lease.try_acquire(None)

    async def run() -> None:
        ha_master = PostgresStore(postgres_dsn, fence=lease)
        ha_master.open()
        with pytest.raises(StoreError, match="locked by another broker"):
            PostgresStore(postgres_dsn).open()
        other_ha = PostgresStore(postgres_dsn, fence=lease)  # e.g. a paused old master
        other_ha.open()
        await other_ha.close()
        await ha_master.close()
        alone = PostgresStore(postgres_dsn)
        alone.open()
        with pytest.raises(StoreError, match="running without HA"):
            PostgresStore(postgres_dsn, fence=lease).open()
        await alone.close()

    asyncio.run(run())
    lease.close()


def _lock_waits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as watch:
        row = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                            "datname = current_database() AND wait_event_type = 'Lock'"
                            ).fetchone()
    return int(row[0]) if row else 0


def test_a_close_ends_while_another_session_holds_a_row_its_commit_needs(
        postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's last commit waits for a row lock another session holds (an operator's
    open transaction): the close gives up after CLOSE_WAIT_S, cancels the commit, says
    so, and closes; what the commit carried is not stored, and the store opens again."""
    from meshmq.store import postgres as module

    monkeypatch.setattr(module, "CLOSE_WAIT_S", 0.5)

    async def run() -> None:
        store = PostgresStore(postgres_dsn)
        store.open()
        store.write([AddMessage(msg(1), (("queue://q", 1),))])
        await store.sync()
        with psycopg.connect(postgres_dsn) as other:
            other.execute("SELECT 1 FROM meshmq_keys WHERE key = 'queue://q' FOR UPDATE")
            store.write([AddMessage(msg(2), (("queue://q", 2),))])
            await asyncio.to_thread(poll, lambda: _lock_waits(postgres_dsn) == 1, 10,
                                    "the writer to wait for the row lock")
            with pytest.raises(StoreError, match=r"did not finish within 0\.5 s"):
                await asyncio.wait_for(store.close(), 20)  # hung for ever before
            other.rollback()
        again = PostgresStore(postgres_dsn)
        assert again.open().keys["queue://q"].count == 1
        assert [e.message.message_id for e in again.load("queue://q", 0, 9)] == ["ID:test-1"]
        await again.close()

    asyncio.run(run())


@pytest.mark.slow
def test_a_broker_stops_while_another_session_holds_a_row_its_last_commit_needs(
        postgres_dsn: str, tmp_path: Path) -> None:
    """SIGTERM while the store's writer waits for a row lock another session holds: the
    broker stops anyway, within its bounded waits, names the cancelled commit in its
    log, and the unconfirmed message is not stored."""
    port = free_port()
    cfg = write_config(tmp_path / "a.toml", name="a", data_dir=tmp_path / "a",
                       store=f'kind = "postgres"\ndsn = "{postgres_dsn}"', stomp_port=port)
    a = HaProcess(cfg, tmp_path / "a.log").start().wait_master()
    conn, rec = connect(port)
    conn.send("/queue/q", "before", headers={"persistent": "true"}, receipt="before")
    poll(lambda: "before" in rec.receipts, 30, "the first receipt")
    with psycopg.connect(postgres_dsn) as other:
        other.execute("SELECT 1 FROM meshmq_keys WHERE key = 'queue://q' FOR UPDATE")
        conn.send("/queue/q", "blocked", headers={"persistent": "true"}, receipt="blocked")
        poll(lambda: _lock_waits(postgres_dsn) == 1, 30, "the writer to wait for the lock")
        started = time.monotonic()
        assert a.terminate(timeout=25) == 0  # before: it waited for the lock for ever
        took = time.monotonic() - started
        other.rollback()
    text = a.text()
    assert "the last commit to PostgreSQL" in text and "did not finish within 5 s" in text
    assert "did not stop within" not in text  # the bounded waits sufficed
    assert "blocked" not in rec.receipts
    a = HaProcess(cfg, tmp_path / "a.log").start().wait_master()
    assert drain(port, "/queue/q") == ["before"]
    assert a.terminate() == 0
    print(f"stop with the last commit blocked: {took:.1f}s")
