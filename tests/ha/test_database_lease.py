"""Database-lease master/slave (ActiveMQ's JDBC ``lease-database-locker``) against a real
PostgreSQL server: the lease row, fencing of the store's write transactions, and broker
processes killed under load."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from meshmq.errors import StoreError
from meshmq.ha.lease import LeaseRecord
from meshmq.ha.pg_lease import PgLease
from meshmq.store.base import AddMessage
from meshmq.store.postgres import PostgresStore
from tests.ha.support import (
    FailoverProducer,
    HaProcess,
    accepts,
    connect,
    drain,
    write_config,
)
from tests.ha.test_shared_store_failover import check_delivery
from tests.store.helpers import msg
from tests.support.brokers import poll
from tests.support.ports import free_port


def expired(lease: PgLease) -> bool:
    return lease.look().expired is True


def test_lease_row_lifecycle(postgres_dsn: str) -> None:
    a = PgLease(postgres_dsn, "a", lease_ms=400)
    b = PgLease(postgres_dsn, "b", lease_ms=400)
    assert a.look().record is None
    assert a.try_acquire(None) == 1
    assert b.try_acquire(None) is None  # the row exists now: b's view was stale
    view = b.look()
    assert view.record == LeaseRecord(1, "a", 0)
    assert view.expired is False
    # Not expired by the database's clock: the conditional UPDATE refuses.
    assert b.try_acquire(view.record) is None
    assert a.renew()
    assert b.look().record == LeaseRecord(1, "a", 1)
    # a stops renewing; once the database says the lease ran out, b may take it.
    poll(lambda: expired(b), 10, "the lease to expire by the database clock")
    assert b.try_acquire(b.look().record) == 2
    assert not a.renew()
    assert not a.release()
    assert b.release()
    view = a.look()
    assert view.record == LeaseRecord(2, None, 1)
    assert a.try_acquire(view.record) == 3  # released: no need to wait for expiry
    a.close()
    b.close()


def test_a_dead_holder_is_noticed_without_waiting_for_the_lease(postgres_dsn: str) -> None:
    code = ("import sys; from meshmq.ha.pg_lease import PgLease; "
            f"l = PgLease({postgres_dsn!r}, 'gone', lease_ms=600000); "
            "assert l.try_acquire(None) == 1; print('held', flush=True); sys.stdin.read()")
    b = PgLease(postgres_dsn, "b", lease_ms=600000)
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"held\n"
            view = b.look()
            assert (view.holder_alive, view.expired) == (True, False)
            assert b.try_acquire(view.record) is None
        finally:
            proc.kill()
            proc.wait(10)
    # The database drops the dead session's advisory lock once it sees the socket close.
    poll(lambda: b.look().holder_alive is False, 10, "the holder's session to end")
    view = b.look()
    assert view.expired is False  # ten minutes of lease left, and yet:
    assert b.try_acquire(view.record) == 2
    b.close()


def test_two_slaves_racing_for_one_expired_lease_make_one_master(postgres_dsn: str) -> None:
    old = PgLease(postgres_dsn, "old", lease_ms=200)
    old.try_acquire(None)
    slaves = [PgLease(postgres_dsn, f"s{i}", lease_ms=200) for i in range(4)]
    poll(lambda: expired(slaves[0]), 10, "the lease to expire")
    seen = slaves[0].look().record
    results: list[int | None] = [None] * len(slaves)
    go = threading.Barrier(len(slaves))

    def race(i: int) -> None:
        go.wait()
        results[i] = slaves[i].try_acquire(seen)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(slaves))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r for r in results if r is not None) == [2]
    for lease in [old, *slaves]:
        lease.close()


def test_store_writes_are_fenced_by_the_lease_row(postgres_dsn: str) -> None:
    a = PgLease(postgres_dsn, "a", lease_ms=200)
    b = PgLease(postgres_dsn, "b", lease_ms=200)
    a.try_acquire(None)

    async def run() -> None:
        store = PostgresStore(postgres_dsn, fence=a)
        store.open()
        store.write([AddMessage(msg(1), (("queue://q", 1),))])
        await store.sync()
        poll(lambda: expired(b), 10, "a's lease to expire (a is 'paused')")
        assert b.try_acquire(b.look().record) == 2
        store.write([AddMessage(msg(2), (("queue://q", 2),))])
        with pytest.raises(StoreError, match="epoch 1"):
            await store.sync()
        with pytest.raises(StoreError):
            await store.close()
        newer = PostgresStore(postgres_dsn, fence=b)
        recovery = newer.open()
        assert recovery.keys["queue://q"].count == 1
        assert [e.message.message_id for e in newer.load("queue://q", 0, 9)] == ["ID:test-1"]
        await newer.close()

    asyncio.run(run())
    a.close()
    b.close()


def test_a_takeover_waits_for_a_write_transaction_in_progress(postgres_dsn: str) -> None:
    a = PgLease(postgres_dsn, "a", lease_ms=200)
    b = PgLease(postgres_dsn, "b", lease_ms=200)
    a.try_acquire(None)
    poll(lambda: expired(b), 10, "the lease to expire")
    seen = b.look().record
    # A store write transaction of a, between its fence check and its commit.
    with psycopg.connect(postgres_dsn) as writer:
        row = writer.execute("SELECT epoch FROM meshmq_lease WHERE id = 1 FOR SHARE").fetchone()
        assert row == (1,)
        result: list[int | None] = []
        t = threading.Thread(target=lambda: result.append(b.try_acquire(seen)))
        t.start()

        def takeover_blocked() -> bool:
            with psycopg.connect(postgres_dsn, autocommit=True) as watch:
                r = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                  "wait_event_type = 'Lock'").fetchone()
                return bool(r and r[0] >= 1)

        poll(takeover_blocked, 10, "the takeover to wait for the write's row lock")
        assert not result
        writer.commit()
    t.join(10)
    assert result == [2]
    a.close()
    b.close()


def test_the_master_holds_no_transaction_open(postgres_dsn: str, tmp_path: Path) -> None:
    from meshmq.config.model import HaConfig, StoreConfig
    from tests.support.brokers import ThreadBroker, make_config

    config = make_config(tmp_path, store=StoreConfig(kind="postgres", dsn=postgres_dsn),
                         ha=HaConfig(mode="database", lease_ms=1000, keepalive_ms=100))
    broker = ThreadBroker(config).start()
    try:
        from tests.ha.support import connect

        conn, rec = connect(broker.port)
        for i in range(20):
            conn.send("/queue/t", f"m{i}", headers={"persistent": "true"}, receipt=f"r{i}")
        poll(lambda: len(rec.receipts) == 20, 30, "20 receipts")
        conn.disconnect()
        with psycopg.connect(postgres_dsn, autocommit=True) as watch:
            stuck = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%'").fetchone()
        assert stuck == (0,)
        assert broker.run(lambda: broker.runtime.statistics()["ha"])["role"] == "master"  # type: ignore[union-attr]
    finally:
        broker.stop()


@pytest.mark.slow
def test_sigkill_master_under_load_with_database_lease(postgres_dsn: str,
                                                       tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    store = f'kind = "postgres"\ndsn = "{postgres_dsn}"'
    ha = 'mode = "database"\nlease_ms = 1500\nkeepalive_ms = 300\nacquire_interval_ms = 50'

    def make(i: int, name: str) -> HaProcess:
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=tmp_path / name,
                           store=store, ha=ha, stomp_port=ports[i])
        return HaProcess(cfg, tmp_path / f"{name}.log")

    a = make(0, "a").start().wait_master()
    b = make(1, "b").start().wait_slave()
    producer = FailoverProducer(lambda: ports, "/queue/db")
    producer.start()
    poll(lambda: len(producer.report.confirmed) >= 100 or producer.fatal, 60,
         "100 confirmed sends")
    a.kill9()
    killed = time.monotonic()
    poll(lambda: accepts(ports[1]), 30, "the slave to take over")
    took = time.monotonic() - killed
    assert "a@" in b.text() and "is gone)" in b.text()  # its database session ended
    before = len(producer.report.confirmed)
    poll(lambda: len(producer.report.confirmed) >= before + 100 or producer.fatal, 60,
         "100 more confirmed sends")
    a = make(0, "a").start().wait_slave()
    producer.stop.set()
    producer.join(30)
    assert producer.fatal is None
    assert b.terminate() == 0
    a.wait_master()
    assert "(it was free)" in a.text()
    check_delivery(drain(ports[0], "/queue/db"), producer)
    assert a.terminate() == 0
    print(f"database lease takeover after SIGKILL: {took:.3f}s")


@pytest.mark.slow
def test_paused_master_cannot_write_with_database_lease(postgres_dsn: str,
                                                         tmp_path: Path) -> None:
    """SIGSTOP keeps the master's database session (and its alive lock): the lease must
    run out by the database's clock; after SIGCONT the old master's write is refused."""
    ports = [free_port(), free_port()]
    store = f'kind = "postgres"\ndsn = "{postgres_dsn}"'
    ha = 'mode = "database"\nlease_ms = 1500\nkeepalive_ms = 300\nacquire_interval_ms = 50'

    def make(i: int, name: str) -> HaProcess:
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=tmp_path / name,
                           store=store, ha=ha, stomp_port=ports[i])
        return HaProcess(cfg, tmp_path / f"{name}.log")

    a = make(0, "a").start().wait_master()
    b = make(1, "b").start().wait_slave()
    old, old_rec = connect(ports[0])
    old.send("/queue/p", "before", headers={"persistent": "true"}, receipt="before")
    poll(lambda: "before" in old_rec.receipts, 30, "the receipt before the pause")
    a.signal(signal.SIGSTOP)
    try:
        b.wait_master()
        assert "let it expire" in b.text()
        old.send("/queue/p", "from-the-deposed", headers={"persistent": "true"},
                 receipt="deposed")
        new, new_rec = connect(ports[1])
        new.send("/queue/p", "on-new-master", headers={"persistent": "true"},
                 receipt="new")
        poll(lambda: "new" in new_rec.receipts, 30, "the new master's receipt")
    finally:
        a.signal(signal.SIGCONT)
    poll(lambda: old_rec.disconnected or bool(old_rec.errors), 30,
         "the deposed master to drop its client")
    assert "deposed" not in old_rec.receipts
    a.wait_slave()
    new.disconnect()
    assert drain(ports[1], "/queue/p") == ["before", "on-new-master"]
    assert b.terminate() == 0
    assert a.terminate() == 0


def test_a_deleted_lease_row_never_lets_the_old_master_write(postgres_dsn: str) -> None:
    a = PgLease(postgres_dsn, "a", lease_ms=1000)
    b = PgLease(postgres_dsn, "b", lease_ms=1000)
    a.try_acquire(None)

    async def run() -> None:
        store = PostgresStore(postgres_dsn, fence=a)
        store.open()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM meshmq_lease")
        assert b.try_acquire(None) == 1  # epochs start again, under b's name
        store.write([AddMessage(msg(1), (("queue://q", 1),))])
        with pytest.raises(StoreError, match="epoch 1 \\(b\\)"):
            await store.sync()
        with pytest.raises(StoreError):
            await store.close()

    asyncio.run(run())
    a.close()
    b.close()


@pytest.mark.slow
def test_database_outage_stops_the_master_and_a_broker_serves_again_after(
        tmp_path: Path) -> None:
    """PostgreSQL crashes under a master and its slave: the master stops serving (it can
    neither write nor renew), both wait; once the database is back one of them takes the
    lease over and serves every message confirmed before the outage."""
    from tests.support.postgres import PostgresCluster, _bindir

    bindir = _bindir()
    assert bindir is not None
    # Not the session's cluster (it must stay up for other tests), and one whose commits
    # survive a server crash.
    own = PostgresCluster(bindir, durable_commits=True).start()
    try:
        dsn = own.create_database()
        ports = [free_port(), free_port()]
        store = f'kind = "postgres"\ndsn = "{dsn}"'
        ha = 'mode = "database"\nlease_ms = 1500\nkeepalive_ms = 300\nacquire_interval_ms = 50'
        procs = []
        for i, name in enumerate("ab"):
            cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=tmp_path / name,
                               store=store, ha=ha, stomp_port=ports[i])
            procs.append(HaProcess(cfg, tmp_path / f"{name}.log"))
        a, b = procs
        a.start().wait_master()
        b.start().wait_slave()
        conn, rec = connect(ports[0])
        for i in range(20):
            conn.send("/queue/o", f"m{i:02d}", headers={"persistent": "true"}, receipt=f"r{i}")
        poll(lambda: len(rec.receipts) == 20, 30, "20 receipts")

        own.stop_server()
        poll(lambda: rec.disconnected, 30, "the master to stop serving")
        poll(lambda: not accepts(ports[0]) and not accepts(ports[1]), 30,
             "no broker accepting clients while the database is down")
        assert a.alive() and b.alive()  # both wait for the database, neither gave up

        own.start_server()

        def serving() -> int | None:
            return next((p for p in ports if accepts(p)), None)

        port = poll(serving, 60, "a broker to take over once the database is back")
        assert [p for p in ports if accepts(p)] == [port], "two brokers accept clients"
        assert drain(port, "/queue/o") == [f"m{i:02d}" for i in range(20)]
        assert a.terminate() == 0
        assert b.terminate() == 0
    finally:
        own.stop()
