"""The database lease (ActiveMQ's ``lease-database-locker``): one row in
``<prefix>lease`` next to the PostgreSQL store, renewed by the master.

Every statement is one short autocommit UPDATE or SELECT; no transaction stays open
(ActiveMQ's default JDBC locker holds ``SELECT ... FOR UPDATE`` for the broker's whole
life, so a dead master is only noticed when the database drops its session). Expiry is
judged by the database's clock (``now()``) in the same statement that takes the lease,
so the brokers' clocks never need to agree (ActiveMQ's ``maxAllowableDiffFromDBTime``
has nothing to correct). The row's ``epoch`` is the fencing token the store's write
transactions check (``meshmq.store.postgres``).

A crashed master is noticed without waiting for the lease to run out: each broker holds a
session-level advisory lock named after its holder id on its lease connection (a lock,
not a transaction). When the master's process dies, PostgreSQL sees its connection close
and drops the lock; a slave that can take that lock knows the holder is gone. A paused
or partitioned master keeps its session, so then the lease's expiry decides; the epoch
check in the store keeps the data safe either way.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import psycopg

from meshmq.errors import StoreError
from meshmq.ha.lease import LeaseRecord, LeaseView
from meshmq.store.postgres import check_prefix, create_schema

log = logging.getLogger("meshmq.ha")


class PgLease:
    def __init__(self, dsn: str, holder: str, *, lease_ms: int,
                 table_prefix: str = "meshmq_") -> None:
        self.dsn = dsn
        self.holder = holder
        self.lease_ms = lease_ms
        self.prefix = check_prefix(table_prefix)
        self._epoch = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._mutex = threading.Lock()
        self._schema = False

    @property
    def epoch(self) -> int:
        return self._epoch

    # The store's write transactions check the epoch themselves (FOR SHARE on the row);
    # nothing to do around them here.
    def begin_write(self) -> None:
        pass

    def end_write(self) -> None:
        pass

    def _db(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            except psycopg.Error as exc:
                raise StoreError(f"cannot reach the lease database: {exc}",
                                 retriable=True) from exc
            if not self._schema:
                create_schema(self._conn, self.prefix)
                self._schema = True
            # Before this broker can name itself in the lease (see the module docs).
            self._conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                               (_alive_key(self.holder),))
        return self._conn

    def _execute(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._mutex:
            try:
                row: tuple[Any, ...] | None = self._db().execute(
                    sql, params).fetchone()
            except psycopg.Error as exc:
                # Drop the connection; the next call reconnects.
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                self._conn = None
                raise StoreError(f"lease database statement failed: {exc}",
                                 retriable=True) from exc
            return row

    def look(self) -> LeaseView:
        row = self._execute(
            f"SELECT epoch, holder, counter, expires_at < now() FROM {self.prefix}lease "
            f"WHERE id = 1", ())
        if row is None:
            return LeaseView(None)
        epoch, holder, counter, expired = row
        alive = None
        if holder is not None and holder != self.holder and not expired:
            alive = self._holder_alive(holder)
        return LeaseView(LeaseRecord(epoch, holder, counter), holder_alive=alive,
                         expired=bool(expired))

    def _holder_alive(self, holder: str) -> bool:
        key = _alive_key(holder)
        row = self._execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,))
        if row is not None and row[0]:
            self._execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
            return False
        return True

    def try_acquire(self, seen: LeaseRecord | None) -> int | None:
        p = self.prefix
        if seen is None:
            row = self._execute(
                f"INSERT INTO {p}lease (id, epoch, holder, counter, expires_at) VALUES "
                f"(1, 1, %s, 0, now() + %s * interval '1 millisecond') "
                f"ON CONFLICT (id) DO NOTHING RETURNING epoch", (self.holder, self.lease_ms))
        else:
            # Conditional on the row being exactly what the decision saw AND free or
            # expired by the database's clock right now: two slaves never both win.
            row = self._execute(
                f"UPDATE {p}lease SET epoch = epoch + 1, holder = %s, counter = 0, "
                f"expires_at = now() + %s * interval '1 millisecond' WHERE id = 1 "
                f"AND epoch = %s AND holder IS NOT DISTINCT FROM %s AND counter = %s "
                f"AND (holder IS NULL OR expires_at < now()) RETURNING epoch",
                (self.holder, self.lease_ms, seen.epoch, seen.holder, seen.counter))
        if row is None and seen is not None and seen.holder is not None \
                and not self._holder_alive(seen.holder):
            # The holder's session is gone (its process died): no need to wait for the
            # database clock. Still conditional on the row being exactly as judged.
            row = self._execute(
                f"UPDATE {p}lease SET epoch = epoch + 1, holder = %s, counter = 0, "
                f"expires_at = now() + %s * interval '1 millisecond' WHERE id = 1 "
                f"AND epoch = %s AND holder = %s AND counter = %s RETURNING epoch",
                (self.holder, self.lease_ms, seen.epoch, seen.holder, seen.counter))
        if row is None:
            return None
        self._epoch = int(row[0])
        return self._epoch

    def renew(self) -> bool:
        row = self._execute(
            f"UPDATE {self.prefix}lease SET counter = counter + 1, "
            f"expires_at = now() + %s * interval '1 millisecond' "
            f"WHERE id = 1 AND epoch = %s AND holder = %s RETURNING 1",
            (self.lease_ms, self._epoch, self.holder))
        return row is not None

    def release(self) -> bool:
        row = self._execute(
            f"UPDATE {self.prefix}lease SET holder = NULL, counter = counter + 1, "
            f"expires_at = now() WHERE id = 1 AND epoch = %s AND holder = %s RETURNING 1",
            (self._epoch, self.holder))
        return row is not None

    def close(self) -> None:
        # Closing the connection releases the alive lock too.
        with self._mutex:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    # At once, rather than when the server notices the closed session.
                    self._conn.execute("SELECT pg_advisory_unlock_all()")
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def _alive_key(holder: str) -> str:
    return "meshmq-alive:" + holder
