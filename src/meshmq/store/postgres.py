"""``PostgresStore``: the store contract in PostgreSQL (ActiveMQ's JDBC persistence).

Threads, as in the journal. The event loop owns an in-memory index of every live
reference (key, seq -> message id, body size, delivery count) and makes every decision
there; ``write`` turns a batch into SQL statements and queues them. One writer thread
runs everything queued since its last turn in ONE transaction (group commit) and
resolves the ``sync`` futures when it commits. Bodies of messages not yet committed are
served from memory (``_pending``); committed ones are read back by ``load`` through a
second connection.

Tables (``<prefix>`` = ``store.table_prefix``)::

    <prefix>messages (id bigint primary key, body bytea)   -- codec-encoded message
    <prefix>refs     (key text, seq bigint, msg_id bigint, size int,
                      delivery_count int, primary key (key, seq))
    <prefix>keys     (key text primary key, last_seq bigint, dispatched bigint)
    <prefix>subs     (key text primary key, client_id, name, destination, selector,
                      no_local, created_ms)
    <prefix>lease    (the HA lease row, see meshmq.ha.pg_lease)
    <prefix>node     (id, shards, hash, node): the shard count of a node whose shards
                     keep their tables under ``<prefix>s<k>_`` (``shard_prefix``)
    <prefix>rebalance (id, body): the plan of a ``meshmq shards rebalance`` that has
                     not finished; no broker or node starts on the tables meanwhile

A node of N shards (docs/shards.md) keeps one complete set of these tables per shard in
the same database, shard k's under ``<prefix>s<k>_``, and records N in ``<prefix>node``
(``check_node_layout``), as a node's ``shards.json`` does for journal stores: which shard
owns a destination depends on N, so a start with another count on tables that hold
messages is refused. A shard of a database master/slave node checks the node's lease
row (``<prefix>lease``), not one under its own prefix: its fence names that prefix
(``lease_prefix``).

A message row lives while a reference points at it; message ids are allocated by the
writing broker (only one writes at a time: the lease, or an advisory lock without HA).

Fencing (HA mode "database"): every write transaction first reads the lease row
``FOR SHARE`` and compares the epoch and holder with the ones this broker was given. A takeover
updates that row, so it waits for a write transaction in progress, and every write
transaction after it sees the new epoch and rolls back. No transaction is held open
between writes, and none for the broker's lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from meshmq.core import message_codec as codec
from meshmq.core.message import Message
from meshmq.core.shards import HASH_NAME, SCHEMES, placement_word, unknown_scheme
from meshmq.errors import StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    KeyInfo,
    MarkDispatched,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    StoredEntry,
    StoreOp,
)
from meshmq.store.fence import FencedError, WriteFence
from meshmq.store.waiters import finished_within
from meshmq.store.waiters import notify as notify_waiters

log = logging.getLogger("meshmq.store")

# How long a closing store waits for its last commit, then for its writer thread, then
# for its connections to close, before it goes on without them: a row lock held by
# another session, or a database that stopped answering, must not hold a broker's stop
# (docs/design.md, "A stop that ends").
CLOSE_WAIT_S = 5.0

_OP_TYPES = (AddMessage, RemoveRef, SetDeliveryCount, PutDurableSubscription, DropKey,
             MarkDispatched)
Statement = tuple[str, tuple[Any, ...]]


def schema(prefix: str) -> list[str]:
    """The store's tables (idempotent); the lease table is shared with meshmq.ha.pg_lease."""
    return [
        f"CREATE TABLE IF NOT EXISTS {prefix}messages (id bigint PRIMARY KEY, "
        f"body bytea NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {prefix}refs (key text NOT NULL, seq bigint NOT NULL, "
        f"msg_id bigint NOT NULL, size integer NOT NULL, delivery_count integer NOT NULL "
        f"DEFAULT 0, PRIMARY KEY (key, seq))",
        f"CREATE TABLE IF NOT EXISTS {prefix}keys (key text PRIMARY KEY, "
        f"last_seq bigint NOT NULL)",
        # Added later (MarkDispatched); tables of older brokers gain it here.
        f"ALTER TABLE {prefix}keys ADD COLUMN IF NOT EXISTS dispatched bigint NOT NULL "
        f"DEFAULT 0",
        f"CREATE TABLE IF NOT EXISTS {prefix}subs (key text PRIMARY KEY, "
        f"client_id text NOT NULL, name text NOT NULL, destination text NOT NULL, "
        f"selector text, no_local boolean NOT NULL, created_ms bigint NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {prefix}lease (id integer PRIMARY KEY, "
        f"epoch bigint NOT NULL, holder text, counter bigint NOT NULL, "
        f"expires_at timestamptz NOT NULL)",
    ]


def create_schema(conn: psycopg.Connection[Any], prefix: str) -> None:
    """Create the tables once, even when several brokers start together."""
    with conn.transaction():
        # CREATE TABLE IF NOT EXISTS is not safe against a concurrent twin.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (prefix + "schema",))
        for stmt in schema(prefix):
            conn.execute(stmt)


def check_prefix(prefix: str) -> str:
    if not prefix or not all(c.isalnum() or c == "_" for c in prefix) \
            or prefix[0].isdigit():
        raise StoreError(f"table_prefix {prefix!r} must be letters, digits and '_', "
                         "not starting with a digit")
    return prefix.lower()


def shard_prefix(prefix: str, index: int) -> str:
    """The table prefix of shard ``index`` of a node whose configured prefix is
    ``prefix``: ``<prefix>s<k>_``."""
    return f"{check_prefix(prefix)}s{index}_"


def _table_exists(conn: psycopg.Connection[Any], table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    return bool(row and row[0])


def tables_hold_data(conn: psycopg.Connection[Any], prefix: str) -> bool:
    """Whether the store under ``prefix`` holds a message or a durable subscription
    (what would change owner under another shard count)."""
    if not _table_exists(conn, f"{prefix}refs"):
        return False
    row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {prefix}refs) OR EXISTS "
                       f"(SELECT 1 FROM {prefix}subs)").fetchone()
    return bool(row and row[0])


def check_node_layout(conn: psycopg.Connection[Any], prefix: str, shards: int,
                      node: str, placement: str = HASH_NAME) -> str | None:
    """Refuse ``shards`` shards (1: one broker process on ``prefix``'s own tables) on a
    database whose tables were made for another count: the refusal's one line, or None
    once the count is recorded in ``<prefix>node`` (removed again for one process).
    ``conn`` is in autocommit mode; the check and the record are one transaction, under
    a lock, so two nodes starting together agree."""
    p = check_prefix(prefix)
    interrupted = read_rebalance(conn, p)
    if interrupted is not None:
        to = interrupted.get("to")
        return (f"a rebalance of the PostgreSQL store {p!r} to {to} shard(s) was "
                f"interrupted: run 'meshmq shards rebalance --config FILE --to {to}' to "
                "finish it first")
    if shards == 1 and not _table_exists(conn, f"{p}node"):
        return None
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (p + "node",))
        conn.execute(f"CREATE TABLE IF NOT EXISTS {p}node (id integer PRIMARY KEY, "
                     f"shards integer NOT NULL, hash text NOT NULL, node text NOT NULL)")
        row = conn.execute(f"SELECT shards, hash FROM {p}node WHERE id = 1").fetchone()
        recorded, hash_name = (int(row[0]), str(row[1])) if row else (None, placement)
        where = f"the PostgreSQL store {p!r} ({p}node)"
        if hash_name not in SCHEMES:
            return unknown_scheme(where, hash_name)
        rebalance = "or move them with 'meshmq shards rebalance --config FILE --to N'"
        holding = recorded is not None and any(
            tables_hold_data(conn, shard_prefix(p, k)) for k in range(recorded))
        if recorded is not None and recorded != shards and holding:
            return (f"{where} holds the tables of a node of {recorded} shards; with "
                    f"{shards} shard{'s' if shards > 1 else ''} stored destinations would "
                    f"change owner: start with --shards {recorded} (or [broker] shards = "
                    f"{recorded}), give this broker another store.table_prefix, "
                    f"{rebalance}")
        if shards > 1 and hash_name != placement and holding:
            was, want = placement_word(hash_name), placement_word(placement)
            return (f"{where} holds the tables of a node placed by {was!r}; with [shards] "
                    f"placement = {want!r} stored destinations would change owner: set "
                    f"placement = {was!r}, or move them with 'meshmq shards rebalance "
                    f"--config FILE --to {shards} --placement {want}'")
        if recorded is None and shards > 1 and tables_hold_data(conn, p):
            return (f"the PostgreSQL store {p!r} holds a one-process store: start without "
                    f"--shards (shards = 1), give the node another store.table_prefix, "
                    f"{rebalance}")
        if shards == 1:
            conn.execute(f"DELETE FROM {p}node")
        elif recorded != shards or hash_name != placement:
            conn.execute(f"INSERT INTO {p}node (id, shards, hash, node) VALUES (1, %s, %s, "
                         f"%s) ON CONFLICT (id) DO UPDATE SET shards = EXCLUDED.shards, "
                         f"hash = EXCLUDED.hash, node = EXCLUDED.node",
                         (shards, placement, node))
    return None


def _cancel(conn: psycopg.Connection[Any]) -> None:
    """Cancel the statement ``conn`` runs (from another thread)."""
    cancel_safe = getattr(conn, "cancel_safe", None)  # psycopg 3.2 and later
    if cancel_safe is not None:
        cancel_safe(timeout=CLOSE_WAIT_S)
    else:
        conn.cancel()


def dsn_for_messages(dsn: str) -> str:
    """``dsn`` without its password, to name the database in a message."""
    return " ".join(p for p in dsn.split() if not p.startswith("password"))


def unlock_and_close(conn: psycopg.Connection[Any] | None) -> None:
    """Release a session's advisory locks explicitly, then close it: the server drops
    a closed session's locks only once its backend has noticed, and whoever takes the
    lock next (a broker reopening the store, a node after a rebalance) would find it
    still held."""
    if conn is None:
        return
    with contextlib.suppress(Exception):
        conn.execute("SELECT pg_advisory_unlock_all()")
    with contextlib.suppress(Exception):
        conn.close()


def recorded_layout(conn: psycopg.Connection[Any], prefix: str
                    ) -> tuple[int, str, str] | None:
    """The node layout recorded in ``<prefix>node`` (shards, hash, node name), or None
    for one broker process's tables."""
    p = check_prefix(prefix)
    if not _table_exists(conn, f"{p}node"):
        return None
    row = conn.execute(f"SELECT shards, hash, node FROM {p}node WHERE id = 1").fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def record_layout(conn: psycopg.Connection[Any], prefix: str, shards: int,
                  node: str, placement: str = HASH_NAME) -> None:
    """Record ``shards`` (placed by scheme ``placement``) as the layout of the tables
    (1: none recorded)."""
    p = check_prefix(prefix)
    if shards == 1:
        if _table_exists(conn, f"{p}node"):
            conn.execute(f"DELETE FROM {p}node")
        return
    conn.execute(f"CREATE TABLE IF NOT EXISTS {p}node (id integer PRIMARY KEY, "
                 f"shards integer NOT NULL, hash text NOT NULL, node text NOT NULL)")
    conn.execute(f"INSERT INTO {p}node (id, shards, hash, node) VALUES (1, %s, %s, %s) "
                 f"ON CONFLICT (id) DO UPDATE SET shards = EXCLUDED.shards, "
                 f"hash = EXCLUDED.hash, node = EXCLUDED.node", (shards, placement, node))


def read_rebalance(conn: psycopg.Connection[Any], prefix: str) -> dict[str, Any] | None:
    """The plan of a ``meshmq shards rebalance`` of these tables that has not finished
    (``<prefix>rebalance``), or None."""
    p = check_prefix(prefix)
    if not _table_exists(conn, f"{p}rebalance"):
        return None
    row = conn.execute(f"SELECT body FROM {p}rebalance WHERE id = 1").fetchone()
    if row is None:
        return None
    try:
        body = json.loads(row[0])
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise StoreError(f"{p}rebalance is damaged: restore the database from a backup")
    return body


def write_rebalance(conn: psycopg.Connection[Any], prefix: str,
                    body: dict[str, Any] | None) -> None:
    """Write (None: end) the rebalance plan of these tables, committed before return."""
    p = check_prefix(prefix)
    if body is None:
        if _table_exists(conn, f"{p}rebalance"):
            conn.execute(f"DELETE FROM {p}rebalance")
        return
    conn.execute(f"CREATE TABLE IF NOT EXISTS {p}rebalance (id integer PRIMARY KEY, "
                 f"body text NOT NULL)")
    conn.execute(f"INSERT INTO {p}rebalance (id, body) VALUES (1, %s) ON CONFLICT (id) "
                 f"DO UPDATE SET body = EXCLUDED.body", (json.dumps(body),))


@dataclass(slots=True)
class _Ref:
    msg_id: int
    size: int
    delivery_count: int = 0


@dataclass(slots=True)
class _Key:
    refs: dict[int, _Ref] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)  # sorted; may hold dead seqs after head
    head: int = 0
    last_seq: int = 0
    dispatched: int = 0
    bytes: int = 0

    def add(self, seq: int, ref: _Ref) -> _Ref | None:
        old = self.refs.get(seq)
        if old is not None:
            self.bytes -= old.size
        else:
            seqs = self.seqs
            if len(seqs) == self.head or seq > seqs[-1]:
                seqs.append(seq)
            else:
                i = bisect_left(seqs, seq, self.head)
                if i == len(seqs) or seqs[i] != seq:
                    seqs.insert(i, seq)
        self.refs[seq] = ref
        self.bytes += ref.size
        self.last_seq = max(self.last_seq, seq)
        return old

    def remove(self, seq: int) -> _Ref | None:
        ref = self.refs.pop(seq, None)
        if ref is None:
            return None
        self.bytes -= ref.size
        seqs, refs = self.seqs, self.refs
        while self.head < len(seqs) and seqs[self.head] not in refs:
            self.head += 1
        if len(seqs) > 2 * len(refs) + 64:
            self.seqs = [s for s in seqs[self.head:] if s in refs]
            self.head = 0
        return ref

    def first_seq(self) -> int:
        return self.seqs[self.head] if self.refs else 0


@dataclass(slots=True)
class _Batch:
    number: int
    statements: list[Statement]
    pending_ids: list[int]  # message ids whose bodies are served from memory until commit


class PostgresStore:
    # Dispatch marks (store.base.MarkDispatched) survive a restart here, so the broker
    # writes them (the runtime checks this attribute; stores without it get none).
    keeps_dispatch_marks = True

    def __init__(self, dsn: str, *, table_prefix: str = "meshmq_",
                 fence: WriteFence | None = None, rebalancing: bool = False) -> None:
        self.dsn = dsn
        self.prefix = check_prefix(table_prefix)
        self._fence = fence
        # ``meshmq shards rebalance`` (node/rebalance.py): it holds the node's lock
        # itself and reads the layout it changes, so this store takes no lock and runs
        # no layout check.
        self._rebalancing = rebalancing
        # A shard's fence names its node's lease table (node/fence.py); a broker's is ours.
        lease_prefix = getattr(fence, "lease_prefix", None)
        self._lease_table = f"{check_prefix(lease_prefix) if lease_prefix else self.prefix}lease"
        self._keys: dict[str, _Key] = {}
        self._subs: dict[str, DurableSubscription] = {}
        self._msg_refs: dict[int, int] = {}  # message id -> live references
        self._next_id = 1
        self._pending: dict[int, Message] = {}  # written, not yet committed
        self._read: psycopg.Connection[Any] | None = None
        self._lock_conn: psycopg.Connection[Any] | None = None
        self._opened = False
        self._closed = False
        self._batch_no = 0
        # shared with the writer thread (under _cond)
        self._cond = threading.Condition()
        self._queue: list[_Batch] = []
        self._durable_no = 0
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._failed: StoreError | None = None
        self._stopping = False
        self._commits = 0
        self._statements = 0
        self._thread: threading.Thread | None = None
        # The writer thread's connection while it is open: a close that cannot wait for
        # its last commit cancels the statement in progress through it.
        self._writer_conn: psycopg.Connection[Any] | None = None

    # ------------------------------------------------------------------ open

    def _connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.dsn, connect_timeout=10, **kwargs)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL ({self._where()}): {exc}",
                             retriable=True) from exc

    def _where(self) -> str:
        # The DSN minus any password, for messages.
        return dsn_for_messages(self.dsn)

    def open(self) -> Recovery:
        if self._opened:
            raise StoreError("store already opened")
        self._opened = True
        p = self.prefix
        read = self._read = self._connect(autocommit=True)
        try:
            create_schema(read, p)
            if not self._rebalancing:
                # A session lock (not a transaction): exclusive without HA, one broker per
                # store; shared among HA brokers, whom the lease orders, which keeps a broker
                # without HA out of their store.
                lock = self._lock_conn = self._connect(autocommit=True)
                how = "pg_try_advisory_lock_shared" if self._fence else "pg_try_advisory_lock"
                row = lock.execute(f"SELECT {how}(hashtext(%s))", (p + "store",)).fetchone()
                if not row or not row[0]:
                    raise StoreError(
                        f"the PostgreSQL store {p!r} ({self._where()}) is locked by "
                        + ("a broker running without HA" if self._fence else "another broker"),
                        retriable=True)
                # One broker process on the tables of a node of shards (or on its shards'
                # tables, whose own prefix records no node): refused as a node's would be.
                refusal = check_node_layout(read, p, 1, "")
                if refusal is not None:
                    raise StoreError(refusal)
            recovery = self._recover(read)
        except psycopg.Error as exc:
            self._close_connections()
            raise StoreError(f"PostgreSQL store recovery failed: {exc}") from exc
        except BaseException:
            self._close_connections()
            raise
        self._thread = threading.Thread(target=self._writer_main, name="meshmq-pg-writer",
                                        daemon=True)
        self._thread.start()
        return recovery

    def _recover(self, conn: psycopg.Connection[Any]) -> Recovery:
        p = self.prefix
        with conn.cursor() as cur:
            cur.execute(f"SELECT key, seq, msg_id, size, delivery_count FROM {p}refs "
                        f"ORDER BY key, seq")
            for key, seq, msg_id, size, dc in cur:
                k = self._keys.get(key)
                if k is None:
                    k = self._keys[key] = _Key()
                k.add(seq, _Ref(msg_id, size, dc))
                self._msg_refs[msg_id] = self._msg_refs.get(msg_id, 0) + 1
            cur.execute(f"SELECT key, last_seq, dispatched FROM {p}keys")
            for key, last_seq, dispatched in cur:
                k = self._keys.get(key)
                if k is None:
                    k = self._keys[key] = _Key()
                k.last_seq = max(k.last_seq, last_seq)
                k.dispatched = max(k.dispatched, dispatched)
            cur.execute(f"SELECT key, client_id, name, destination, selector, no_local, "
                        f"created_ms FROM {p}subs ORDER BY key")
            for key, cid, name, dest, sel, no_local, created in cur:
                self._subs[key] = DurableSubscription(key, cid, name, dest, sel, no_local,
                                                      created)
            cur.execute(f"SELECT coalesce(max(id), 0) FROM {p}messages")
            row = cur.fetchone()
            self._next_id = (row[0] if row else 0) + 1
        keys = {key: self.key_info(key) for key, k in self._keys.items()
                if k.refs or k.last_seq}
        return Recovery(keys, list(self._subs.values()))

    # ------------------------------------------------------------------ write path

    def _check_writable(self) -> None:
        if not self._opened or self._closed:
            raise StoreError("PostgreSQL store is not open")
        if self._failed is not None:
            raise StoreError(f"PostgreSQL store refuses writes after a failure: "
                             f"{self._failed.message}")

    def write(self, ops: Sequence[StoreOp]) -> None:
        self._check_writable()
        for op in ops:  # reject a bad batch before applying any of it
            if not isinstance(op, _OP_TYPES):
                raise StoreError(f"unknown store operation {op!r}")
        if not ops:
            return
        p = self.prefix
        out: list[Statement] = []
        pending: list[int] = []
        # Encode first: an unencodable message must leave the store untouched.
        encoded = [codec.encode_message(op.message) if isinstance(op, AddMessage) else b""
                   for op in ops]
        for op, body in zip(ops, encoded, strict=True):
            if isinstance(op, AddMessage):
                if not op.refs:
                    continue
                msg_id = self._next_id
                self._next_id += 1
                self._pending[msg_id] = op.message
                pending.append(msg_id)
                out.append((f"INSERT INTO {p}messages (id, body) VALUES (%s, %s)",
                            (msg_id, body)))
                size = len(op.message.body)
                for key, seq in op.refs:
                    k = self._keys.get(key)
                    if k is None:
                        k = self._keys[key] = _Key()
                    old = k.add(seq, _Ref(msg_id, size))
                    self._msg_refs[msg_id] = self._msg_refs.get(msg_id, 0) + 1
                    if old is not None:
                        self._unref(old.msg_id, out)
                    out.append((f"INSERT INTO {p}refs (key, seq, msg_id, size, delivery_count)"
                                f" VALUES (%s, %s, %s, %s, 0) ON CONFLICT (key, seq) DO UPDATE"
                                f" SET msg_id = EXCLUDED.msg_id, size = EXCLUDED.size,"
                                f" delivery_count = 0", (key, seq, msg_id, size)))
                    out.append((f"INSERT INTO {p}keys (key, last_seq) VALUES (%s, %s) "
                                f"ON CONFLICT (key) DO UPDATE SET last_seq = "
                                f"GREATEST({p}keys.last_seq, EXCLUDED.last_seq)", (key, seq)))
            elif isinstance(op, RemoveRef):
                k = self._keys.get(op.key)
                ref = k.remove(op.seq) if k is not None else None
                if ref is not None:
                    out.append((f"DELETE FROM {p}refs WHERE key = %s AND seq = %s",
                                (op.key, op.seq)))
                    self._unref(ref.msg_id, out)
            elif isinstance(op, SetDeliveryCount):
                k = self._keys.get(op.key)
                ref = k.refs.get(op.seq) if k is not None else None
                if ref is not None:
                    ref.delivery_count = op.count
                    out.append((f"UPDATE {p}refs SET delivery_count = %s WHERE key = %s "
                                f"AND seq = %s", (op.count, op.key, op.seq)))
            elif isinstance(op, PutDurableSubscription):
                s = op.subscription
                self._subs[s.key] = s
                out.append((f"INSERT INTO {p}subs (key, client_id, name, destination, "
                            f"selector, no_local, created_ms) VALUES (%s, %s, %s, %s, %s, %s,"
                            f" %s) ON CONFLICT (key) DO UPDATE SET client_id = "
                            f"EXCLUDED.client_id, name = EXCLUDED.name, destination = "
                            f"EXCLUDED.destination, selector = EXCLUDED.selector, no_local = "
                            f"EXCLUDED.no_local, created_ms = EXCLUDED.created_ms",
                            (s.key, s.client_id, s.subscription_name, s.destination,
                             s.selector, s.no_local, s.created_ms)))
            elif isinstance(op, MarkDispatched):
                k = self._keys.get(op.key)
                if k is None:
                    k = self._keys[op.key] = _Key()
                if op.seq > k.dispatched:
                    k.dispatched = op.seq
                    out.append((f"INSERT INTO {p}keys (key, last_seq, dispatched) VALUES "
                                f"(%s, 0, %s) ON CONFLICT (key) DO UPDATE SET dispatched = "
                                f"GREATEST({p}keys.dispatched, EXCLUDED.dispatched)",
                                (op.key, op.seq)))
            else:
                k = self._keys.pop(op.key, None)
                self._subs.pop(op.key, None)
                out.append((f"DELETE FROM {p}refs WHERE key = %s", (op.key,)))
                if k is not None:
                    for ref in k.refs.values():
                        self._unref(ref.msg_id, out)
                out.append((f"DELETE FROM {p}keys WHERE key = %s", (op.key,)))
                out.append((f"DELETE FROM {p}subs WHERE key = %s", (op.key,)))
        if not out:
            return
        self._batch_no += 1
        with self._cond:
            self._queue.append(_Batch(self._batch_no, out, pending))
            self._cond.notify()

    def _unref(self, msg_id: int, out: list[Statement]) -> None:
        left = self._msg_refs.get(msg_id, 0) - 1
        if left > 0:
            self._msg_refs[msg_id] = left
            return
        self._msg_refs.pop(msg_id, None)
        out.append((f"DELETE FROM {self.prefix}messages WHERE id = %s", (msg_id,)))

    async def sync(self) -> None:
        if self._closed:
            raise StoreError("PostgreSQL store is closed")
        if self._failed is not None:
            raise StoreError(self._failed.message)
        target = self._batch_no
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._failed is not None:
                raise StoreError(self._failed.message)
            if self._durable_no >= target:
                return
            self._waiters.append((target, loop, fut))
        await fut

    # ------------------------------------------------------------------ reads

    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        picked = self._pick(key, after_seq, max_count, max_bytes)
        out, missing = self._pending_bodies(picked)
        if missing:
            self._found_bodies(out, missing, self._select_bodies(missing))
        return [StoredEntry(seq, out[ref.msg_id], ref.delivery_count) for seq, ref in picked]

    async def load_async(self, key: str, after_seq: int,
                         max_count: int) -> list[StoredEntry]:
        """``load`` with the SELECT on a worker thread (store.base.LoadsAsync): the index
        and the pending bodies are read on the loop, where they are kept."""
        picked = self._pick(key, after_seq, max_count, 1 << 62)
        out, missing = self._pending_bodies(picked)
        if missing:
            rows = await asyncio.to_thread(self._select_bodies, missing)
            self._found_bodies(out, missing, rows)
        return [StoredEntry(seq, out[ref.msg_id], ref.delivery_count) for seq, ref in picked]

    def _pick(self, key: str, after_seq: int, max_count: int,
              max_bytes: int) -> list[tuple[int, _Ref]]:
        k = self._keys.get(key)
        if k is None or max_count <= 0:
            return []
        picked: list[tuple[int, _Ref]] = []
        total = 0
        seqs, refs = k.seqs, k.refs
        for i in range(bisect_right(seqs, after_seq, k.head), len(seqs)):
            ref = refs.get(seqs[i])
            if ref is None:
                continue
            picked.append((seqs[i], ref))
            total += ref.size
            if len(picked) >= max_count or total >= max_bytes:
                break
        return picked

    def _pending_bodies(self, picked: list[tuple[int, _Ref]]
                        ) -> tuple[dict[int, Message], list[int]]:
        out: dict[int, Message] = {}
        missing: list[int] = []
        for _, ref in picked:
            msg = self._pending.get(ref.msg_id)
            if msg is not None:
                out[ref.msg_id] = msg
            else:
                missing.append(ref.msg_id)
        return out, missing

    def _select_bodies(self, missing: list[int]) -> list[tuple[int, bytes]]:
        if self._read is None:
            raise StoreError("PostgreSQL store is not open")
        try:
            rows = self._read.execute(
                f"SELECT id, body FROM {self.prefix}messages WHERE id = ANY(%s)",
                (missing,)).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL read failed: {exc}", retriable=True) from exc
        return [(msg_id, bytes(body)) for msg_id, body in rows]

    def _found_bodies(self, out: dict[int, Message], missing: list[int],
                      rows: list[tuple[int, bytes]]) -> None:
        for msg_id, body in rows:
            out[msg_id] = codec.decode_message(body)
        for msg_id in missing:
            if msg_id not in out:
                # Committed between our two looks: the pending copy was just dropped.
                msg = self._pending.get(msg_id)
                if msg is None:
                    raise StoreError(f"message {msg_id} is referenced but missing from "
                                     f"{self.prefix}messages")
                out[msg_id] = msg

    def key_info(self, key: str) -> KeyInfo:
        k = self._keys.get(key)
        if k is None:
            return KeyInfo()
        return KeyInfo(len(k.refs), k.bytes, k.first_seq(), k.last_seq, k.dispatched)

    # ------------------------------------------------------------------ writer thread

    def _writer_main(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._writer_conn = self._connect()
            while True:
                with self._cond:
                    while not self._queue and not self._stopping:
                        self._cond.wait()
                    if not self._queue:
                        return
                    batches, self._queue = self._queue, []
                self._commit(conn, batches)
        except BaseException as exc:
            self._fail(exc)
        finally:
            self._writer_conn = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _commit(self, conn: psycopg.Connection[Any], batches: list[_Batch]) -> None:
        count = 0
        # Pipeline mode: the statements of a group commit go out without waiting for each
        # result, so a commit costs about one round trip, not one per statement.
        with conn.pipeline(), conn.transaction(), conn.cursor() as cur:
            if self._fence is not None:
                self._check_fence(cur)
            # Consecutive statements of one shape go as one executemany (pipelined).
            run: list[tuple[Any, ...]] = []
            run_sql = ""
            for batch in batches:
                for sql, params in batch.statements:
                    if sql != run_sql and run:
                        cur.executemany(run_sql, run)
                        run = []
                    run_sql = sql
                    run.append(params)
                    count += 1
            if run:
                cur.executemany(run_sql, run)
        # Committed: reads find the bodies in the table now.
        for batch in batches:
            for msg_id in batch.pending_ids:
                self._pending.pop(msg_id, None)
        with self._cond:
            self._durable_no = batches[-1].number
            self._commits += 1
            self._statements += count
            ready = [w for w in self._waiters if w[0] <= self._durable_no]
            if ready:
                self._waiters = [w for w in self._waiters if w[0] > self._durable_no]
        notify_waiters(ready, None)

    def _check_fence(self, cur: psycopg.Cursor[Any]) -> None:
        assert self._fence is not None
        epoch = self._fence.epoch
        cur.execute(f"SELECT epoch, holder FROM {self._lease_table} WHERE id = 1 FOR SHARE")
        row = cur.fetchone()
        holder = getattr(self._fence, "holder", None)
        # The holder too: a deleted lease row would restart epochs at 1, never for us.
        if epoch == 0 or row is None or row[0] != epoch \
                or (holder is not None and row[1] != holder):
            raise FencedError(
                f"store write refused: this broker wrote under lease epoch {epoch}, the "
                f"lease is now at epoch {row[0] if row else 0} ({row[1] if row else None}); "
                f"another broker is master")

    def _fail(self, exc: BaseException) -> None:
        if self._closed:  # the close cancelled it (and says so)
            log.debug("postgres store: the write in progress at close failed: %r", exc)
        else:
            log.error("postgres store: write failed, store now refuses writes: %r", exc)
        error = exc if isinstance(exc, StoreError) else StoreError(f"write failed: {exc!r}")
        with self._cond:
            self._failed = error
            waiters, self._waiters = self._waiters, []
            self._queue.clear()
        notify_waiters(waiters, error)
        # A fence that wants to hear of a refusal (a shard's, node/fence.py) is told at
        # once, from this thread: the broker need not wait for its next write to stop.
        refused = getattr(self._fence, "refused", None)
        if isinstance(error, FencedError) and callable(refused):
            refused(error.message)

    # ------------------------------------------------------------------ close / stats

    async def close(self) -> None:
        """Commit what was written, stop the writer, close the connections; each step
        waits at most ``CLOSE_WAIT_S``. A last commit that does not finish in time (a
        lock held elsewhere, a database that stopped answering) is cancelled and the
        close raises: what it carried was never confirmed to anyone."""
        if self._closed:
            return
        error: StoreError | None = None
        if self._opened and self._failed is None:
            try:
                await asyncio.wait_for(self.sync(), CLOSE_WAIT_S)
            except StoreError as exc:
                error = exc
            except TimeoutError:
                error = StoreError(
                    f"the last commit to PostgreSQL ({self._where()}) did not finish "
                    f"within {CLOSE_WAIT_S:g} s (a lock held by another session, or a "
                    "database that does not answer); it was cancelled, and the messages "
                    "and acknowledgements it carried were never confirmed",
                    retriable=True)
        self._closed = True
        if self._thread is not None:
            with self._cond:
                self._stopping = True
                self._cond.notify()
            writer, thread = self._writer_conn, self._thread
            if error is not None and writer is not None:
                # Blocked in a statement: ask the server to cancel it, so the writer
                # fails and ends instead of waiting for the lock for ever.
                await finished_within(lambda: _cancel(writer), CLOSE_WAIT_S,
                                      "meshmq-pg-cancel")
            if not await finished_within(thread.join, CLOSE_WAIT_S, "meshmq-pg-join"):
                log.warning("postgres store: the writer thread did not end within %g s "
                            "of the close; left behind", CLOSE_WAIT_S)
        if not await finished_within(self._close_connections, CLOSE_WAIT_S,
                                     "meshmq-pg-close"):
            log.warning("postgres store: closing the connections took more than %g s; "
                        "left to the server to end", CLOSE_WAIT_S)
        if error is not None:
            raise error
        if self._failed is not None:
            raise StoreError(f"PostgreSQL store failed: {self._failed.message}")

    def _close_connections(self) -> None:
        unlock_and_close(self._lock_conn)
        read = self._read
        if read is not None:
            # Under its lock: a page read on a worker thread may be using it still, and
            # closing frees what that read is waiting on.
            with contextlib.suppress(Exception), read.lock:
                read.close()
        self._read = self._lock_conn = None

    # The database manages its own space; nothing is reclaimed here (store.base.Store).
    space_listener: Callable[[], None] | None = None

    def compact_step(self) -> bool:
        return False

    def persistent_refusal(self) -> str | None:
        return None

    def stats(self) -> dict[str, int | float | str]:
        with self._cond:
            commits, statements, durable = self._commits, self._statements, self._durable_no
        return {
            "kind": "postgres",
            "database": self._where(),
            "table_prefix": self.prefix,
            "keys": len(self._keys),
            "live_refs": sum(len(k.refs) for k in self._keys.values()),
            "messages": len(self._msg_refs),
            "commits": commits,
            "statements": statements,
            "mean_batches_per_commit": durable / commits if commits else 0.0,
            "pending_batches": self._batch_no - durable,
        }
