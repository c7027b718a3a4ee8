"""``meshmq shards rebalance``: change a stopped node's shard count, moving every stored
key whose owner changes (rebalance_plan.py) to its new owner's store.

Crash safety: the plan is written to ``<data>/rebalance.json`` (synced) before any store
changes. Then every target store gets its copies (a whole key is dropped at the target
first, spread entries are removed by their planned seqs first, so writing them again
is harmless) and is synced; only then does the journal say ``remove``, and the moved
keys leave their sources. ``shards.json`` is written last and the journal removed. A run
killed at any point is **resumed** (rolled forward) by the next one from the plan in the
journal, and a node refuses to start while the journal exists (node/layout.py), so no
message is lost or delivered twice.

A node on PostgreSQL (``store.kind = "postgres"``) keeps each shard's tables under
``<prefix>s<k>_`` in one database: the same plan moves keys between those table sets,
the plan lives in ``<prefix>rebalance`` instead of the data directory (the nodes of a
``database`` pair share the database, not a directory), the count in ``<prefix>node``,
and the node's lock is the session lock on ``<prefix>store`` that every node and broker
on those tables holds while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from meshmq.core.message import Message
from meshmq.core.shards import (
    HASH_NAME,
    MAX_SHARDS,
    SCHEMES,
    placement_word,
    unknown_scheme,
)
from meshmq.errors import StoreError
from meshmq.ha.replica_node import NODE_STATE
from meshmq.node.layout import (
    REBALANCE_FILE,
    NodeLayout,
    read_shards_file,
    remove_shards_file,
    shard_directory,
    write_shards_file,
)
from meshmq.node.rebalance_plan import (
    PLAIN,
    SESSION_PREFIX,
    EntryMove,
    KeyMove,
    Plan,
    RebalanceError,
    RecordCopy,
    StoredKey,
    is_spread,
    location_name,
    plan,
    targets_of,
)
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    MarkDispatched,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    Store,
    StoredEntry,
    StoreOp,
)
from meshmq.store.journal import JournalStore

__all__ = ["Rebalance", "RebalanceReport", "rebalance"]

LOCK_FILE = "node.lock"
# Test hook: SIGKILL this process after this many steps (a key copied and synced, then
# a source store emptied and synced), to test the resumption.
KILL_AFTER_ENV = "MESHMQ_REBALANCE_KILL_AFTER"
_PAGE = 500
_PAGE_BYTES = 1 << 20


@dataclass(slots=True)
class RebalanceReport:
    old: int
    new: int
    resumed: bool
    # The placement schemes before and after, when the run changes it.
    placements: tuple[str, str] | None = None
    seconds: float = 0.0
    # (source, target) -> [keys, messages]
    moved: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    dropped_records: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for (src, dst), (keys, msgs) in sorted(self.moved.items()):
            out.append(f"{location_name(src)} -> {location_name(dst)}: {keys} "
                       f"destination(s), {msgs} message(s)")
        for key in self.dropped_records:
            out.append(f"kept the target's copy of {key}; the other was dropped")
        if self.old == self.new and not self.moved and self.placements is None:
            return [f"the stores are already laid out for {self.new} shard(s): nothing "
                    "to move"]
        total = sum(m for _, m in self.moved.values())
        keys = sum(k for k, _ in self.moved.values())
        verb = "resumed and finished" if self.resumed else "done"
        placed = "" if self.placements is None else (
            f", placement {placement_word(self.placements[0])} -> "
            f"{placement_word(self.placements[1])}")
        out.append(f"rebalance {self.old} -> {self.new} shard(s){placed} {verb}: {keys} "
                   f"destination(s), {total} message(s) moved in {self.seconds:.2f} s")
        return out


class _Locations(Protocol):
    """Where a node's stores, its recorded shard count and the rebalance's plan live."""

    def lock(self) -> None: ...
    def unlock(self) -> None: ...
    def where(self, loc: int) -> str: ...
    def exists(self, loc: int) -> bool: ...
    def make(self, loc: int) -> Store: ...
    # The count, the recorded node name and placement scheme.
    def layout(self) -> tuple[int, str | None, str]: ...
    def record(self, count: int, node: str, placement: str) -> None: ...
    def discard(self, loc: int) -> None: ...  # a store no shard uses any more
    def read_plan(self) -> dict[str, object] | None: ...
    def write_plan(self, body: dict[str, object] | None) -> None: ...


class _JournalLocations:
    """Journal stores in the node's data directory (or a configured store directory);
    ``shards.json`` and ``rebalance.json`` beside them; the data directory's lock file."""

    def __init__(self, data: Path, store_directory: Path | None) -> None:
        self.data = data
        self._store_dir = store_directory  # a configured [store] directory, or None
        self._lock: BinaryIO | None = None

    def lock(self) -> None:
        if not self.data.is_dir():
            raise RebalanceError(f"{self.data} is not a directory: give the node's data "
                                 "directory (--data DIR or --config FILE)")
        lock = (self.data / LOCK_FILE).open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RebalanceError(f"a node runs on {self.data}: stop it first, then run "
                                 "the rebalance again") from None
        self._lock = lock
        if self._replicated():
            self.unlock()
            raise RebalanceError(
                f"{self.data} is a node of a replicated cluster ([ha] mode = "
                "\"replicated\"): each shard's stream has a copy on the other nodes, "
                "and moving messages here would make them differ. Start a cluster with "
                "the new shard count and let a network connector from this one drain "
                "its queues into it (docs/operations.md, \"Changing a node's shard count\")")

    def _replicated(self) -> bool:
        """Whether a replicated node ran on these stores: its supervisor's vote file, or
        a shard journal's replication state."""
        journals = self._store_dir.glob("shard-*/repl-state.json") \
            if self._store_dir is not None else iter(())
        return (self.data / NODE_STATE).exists() \
            or any(self.data.glob("shard-*/journal/repl-state.json")) or any(journals)

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def path(self, loc: int) -> Path:
        if loc == PLAIN:
            return self._store_dir or self.data / "journal"
        if self._store_dir is not None:
            return self._store_dir / f"shard-{loc}"
        return shard_directory(self.data, loc) / "journal"

    def where(self, loc: int) -> str:
        return str(self.path(loc))

    def exists(self, loc: int) -> bool:
        return self.path(loc).exists()

    def make(self, loc: int) -> Store:
        return JournalStore(self.path(loc))

    def layout(self) -> tuple[int, str | None, str]:
        layout = read_shards_file(self.data)
        if layout is None:
            return 1, None, HASH_NAME
        if layout.hash not in SCHEMES:
            raise RebalanceError(unknown_scheme(self.data / "shards.json", layout.hash))
        return layout.shards, layout.node, layout.hash

    def record(self, count: int, node: str, placement: str) -> None:
        if count == 1:
            remove_shards_file(self.data)
        else:
            write_shards_file(self.data, NodeLayout(count, placement, node))

    def discard(self, loc: int) -> None:
        shutil.rmtree(self.path(loc), ignore_errors=True)
        if loc != PLAIN:
            with contextlib.suppress(OSError):
                shard_directory(self.data, loc).rmdir()

    def read_plan(self) -> dict[str, object] | None:
        path = self.data / REBALANCE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValueError:
            raise RebalanceError(f"{path} is damaged: restore the data directory from a "
                                 "backup") from None
        if not isinstance(raw, dict):
            raise RebalanceError(f"{path} is not a rebalance journal")
        return raw

    def write_plan(self, body: dict[str, object] | None) -> None:
        if body is not None:
            _write_synced(self.data / REBALANCE_FILE, json.dumps(body))
            return
        with contextlib.suppress(FileNotFoundError):
            (self.data / REBALANCE_FILE).unlink()
        _sync_dir(self.data)


class _PostgresLocations:
    """A node's table sets in one PostgreSQL database: ``<prefix>`` for one process,
    ``<prefix>s<k>_`` for shard k (store/postgres.py); the count in ``<prefix>node``, the
    plan in ``<prefix>rebalance``, each committed before the next step; the lock is the
    session lock on ``<prefix>store`` that a running node or broker holds."""

    def __init__(self, dsn: str, prefix: str) -> None:
        from meshmq.store.postgres import check_prefix

        self.dsn = dsn
        self.prefix = check_prefix(prefix)
        self._conn: Any = None

    def _where(self) -> str:
        from meshmq.store.postgres import dsn_for_messages

        return dsn_for_messages(self.dsn)

    def lock(self) -> None:
        import psycopg

        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise RebalanceError(f"cannot reach the node's PostgreSQL store "
                                 f"({self._where()}): {first}") from None
        row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                           (self.prefix + "store",)).fetchone()
        if not row or not row[0]:
            conn.close()
            raise RebalanceError(f"a node or broker runs on the PostgreSQL store "
                                 f"{self.prefix!r} ({self._where()}): stop it first, then "
                                 "run the rebalance again")
        self._conn = conn

    def unlock(self) -> None:
        from meshmq.store.postgres import unlock_and_close

        unlock_and_close(self._conn)
        self._conn = None

    def table_prefix(self, loc: int) -> str:
        from meshmq.store.postgres import shard_prefix

        return self.prefix if loc == PLAIN else shard_prefix(self.prefix, loc)

    def where(self, loc: int) -> str:
        return f"tables {self.table_prefix(loc)}* ({self._where()})"

    def exists(self, loc: int) -> bool:
        from meshmq.store.postgres import tables_hold_data

        return bool(tables_hold_data(self._conn, self.table_prefix(loc)))

    def make(self, loc: int) -> Store:
        from meshmq.store.postgres import PostgresStore

        return PostgresStore(self.dsn, table_prefix=self.table_prefix(loc), rebalancing=True)

    def layout(self) -> tuple[int, str | None, str]:
        from meshmq.store.postgres import recorded_layout

        recorded = recorded_layout(self._conn, self.prefix)
        if recorded is None:
            return 1, None, HASH_NAME
        shards, hash_name, node = recorded
        if hash_name not in SCHEMES:
            raise RebalanceError(unknown_scheme(f"{self.prefix}node", hash_name))
        return shards, node, hash_name

    def record(self, count: int, node: str, placement: str) -> None:
        from meshmq.store.postgres import record_layout

        record_layout(self._conn, self.prefix, count, node, placement)

    def discard(self, loc: int) -> None:
        """Nothing to delete: every key of a store no shard uses has left it (its
        empty tables are reused if the count grows again)."""

    def read_plan(self) -> dict[str, object] | None:
        from meshmq.store.postgres import read_rebalance

        try:
            return read_rebalance(self._conn, self.prefix)
        except StoreError as exc:
            raise RebalanceError(exc.message) from None

    def write_plan(self, body: dict[str, object] | None) -> None:
        from meshmq.store.postgres import write_rebalance

        write_rebalance(self._conn, self.prefix, body)


class Rebalance:
    def __init__(self, data: Path, count: int, *, store_directory: Path | None = None,
                 node: str = "meshmq", postgres: tuple[str, str] | None = None,
                 placement: str | None = None) -> None:
        if not 1 <= count <= MAX_SHARDS:
            raise RebalanceError(f"--to must be between 1 and {MAX_SHARDS}, not {count}")
        if placement is not None and placement not in SCHEMES:
            raise RebalanceError(f"unknown placement scheme {placement!r}")
        self.data = data
        self.count = count
        self.node = node
        # The scheme to lay the stores out by; None: the one they have (hash for one
        # process's store).
        self._asked_placement = placement
        self.placement = placement or HASH_NAME
        self._where: _Locations = (_JournalLocations(data, store_directory)
                                   if postgres is None else _PostgresLocations(*postgres))
        self._stores: dict[int, Store] = {}
        self._recoveries: dict[int, Recovery] = {}
        self._killer = int(os.environ.get(KILL_AFTER_ENV, "0") or 0)
        self._steps = 0  # keys copied, then sources emptied (for the crash hook)

    # ------------------------------------------------------------ locations
    def _open(self, loc: int) -> Store:
        store = self._stores.get(loc)
        if store is None:
            store = self._where.make(loc)
            try:
                self._recoveries[loc] = store.open()
            except StoreError as exc:
                raise RebalanceError(f"cannot open {location_name(loc)}'s store "
                                     f"({self._where.where(loc)}): {exc}") from None
            self._stores[loc] = store
        return store

    async def _close_all(self) -> None:
        stores, self._stores = self._stores, {}
        for store in stores.values():
            await store.close()

    # ------------------------------------------------------------ the run
    async def run(self) -> RebalanceReport:
        started = time.monotonic()
        self._where.lock()
        try:
            journal = self._where.read_plan()
            if journal is not None:
                report = await self._resume(journal)
            else:
                report = await self._start()
        finally:
            try:
                await self._close_all()
            finally:
                self._where.unlock()
        report.seconds = time.monotonic() - started
        return report

    def _old_layout(self) -> tuple[int, str]:
        count, node, placement = self._where.layout()
        self.node = node or self.node
        self.placement = self._asked_placement or placement
        return count, placement

    async def _start(self) -> RebalanceReport:
        old, was = self._old_layout()
        report = RebalanceReport(old, self.count, resumed=False)
        # One shard owns everything, whatever the scheme.
        changes_placement = was != self.placement and old > 1 and self.count > 1
        if changes_placement:
            report.placements = (was, self.placement)
        if old == self.count and not changes_placement:
            return report  # nothing changes owner; nothing is written
        sources = [loc for loc in targets_of(old) if self._where.exists(loc)]
        locations = sorted(set(sources) | set(targets_of(self.count)))
        stored: dict[int, list[StoredKey]] = {}
        for loc in locations:
            if loc in sources or self._where.exists(loc):
                stored[loc] = self._describe(loc)
        the_plan = plan(stored, self.count, self.node, self.placement)
        self._write_journal({"from": old, "to": self.count, "node": self.node,
                             "placement": self.placement, "phase": "copy",
                             "plan": _encode(the_plan), "sources": sources})
        await self._finish(the_plan, old, sources, report)
        return report

    async def _resume(self, journal: dict[str, object]) -> RebalanceReport:
        to = journal.get("to")
        if to != self.count:
            raise RebalanceError(f"a rebalance to {to} shard(s) was interrupted: run "
                                 f"'meshmq shards rebalance --to {to}' to finish it first")
        old = int(str(journal["from"]))
        self.node = str(journal.get("node", self.node))
        placement = str(journal.get("placement", HASH_NAME))
        if self._asked_placement is not None and placement != self._asked_placement:
            raise RebalanceError(
                f"a rebalance to placement {placement_word(placement)!r} was interrupted: "
                f"run 'meshmq shards rebalance --to {to} --placement "
                f"{placement_word(placement)}' to finish it first")
        self.placement = placement
        the_plan = _decode(journal["plan"])
        sources = [int(s) for s in journal["sources"]]  # type: ignore[attr-defined]
        report = RebalanceReport(old, self.count, resumed=True)
        if journal.get("phase") == "remove":
            self._count_moved(the_plan, report)
            await self._remove(the_plan)
            await self._commit(old, sources)
        else:
            await self._finish(the_plan, old, sources, report)
        return report

    async def _finish(self, the_plan: Plan, old: int, sources: list[int],
                      report: RebalanceReport) -> None:
        await self._copy(the_plan, report)
        self._write_journal_phase("remove")
        await self._remove(the_plan)
        await self._commit(old, sources)
        report.dropped_records = [m.key for m in the_plan.dropped_records]

    def _describe(self, loc: int) -> list[StoredKey]:
        store = self._open(loc)
        recovery = self._recoveries[loc]
        durables = {d.key: d for d in recovery.durable_subscriptions}
        out = []
        for key, info in recovery.keys.items():
            record = durables.pop(key, None)
            entries: tuple[tuple[int, str], ...] = ()
            if record is not None and is_spread(record):
                entries = tuple((e.seq, str(e.message.destination))
                                for e in self._entries(store, key))
            out.append(StoredKey(key, info.last_seq, record, entries))
        out.extend(StoredKey(key, 0, record) for key, record in durables.items())
        return out

    @staticmethod
    def _entries(store: Store, key: str) -> Iterator[StoredEntry]:
        after = 0
        while True:
            page = store.load(key, after, _PAGE, _PAGE_BYTES)
            yield from page
            if len(page) < _PAGE:
                return
            after = page[-1].seq

    # ------------------------------------------------------------ copying
    async def _copy(self, the_plan: Plan, report: RebalanceReport) -> None:
        for copy in the_plan.record_copies:
            self._put_record(copy)
        for move in the_plan.moves:
            n = self._copy_key(move)
            if self._killer:  # durable before the hook kills: a real crash's worst case
                await self._open(move.target).sync()
            _add(report, move.source, move.target, n)
            self._steps += 1
            self._maybe_die()
        for em in the_plan.entry_moves:
            self._copy_entries(em)
            if self._killer:
                await self._open(em.target).sync()
            if em.seqs:
                _add(report, em.source, em.target, len(em.seqs))
            self._steps += 1
            self._maybe_die()
        for store in list(self._stores.values()):  # every copy durable before any removal
            await store.sync()

    def _maybe_die(self) -> None:
        if self._killer and self._steps >= self._killer:
            os.kill(os.getpid(), signal.SIGKILL)

    def _record(self, loc: int, key: str) -> DurableSubscription | None:
        self._open(loc)
        return next((d for d in self._recoveries[loc].durable_subscriptions
                     if d.key == key), None)

    def _put_record(self, copy: RecordCopy) -> None:
        record = self._record(copy.source, copy.key)
        if record is not None:
            self._open(copy.target).write([PutDurableSubscription(record)])

    def _copy_key(self, move: KeyMove) -> int:
        source, target = self._open(move.source), self._open(move.target)
        ops: list[StoreOp] = [DropKey(move.key)]
        record = self._record(move.source, move.key)
        if record is not None:
            ops.append(PutDurableSubscription(record))
        count = 0
        for entry in self._entries(source, move.key):
            message = entry.message
            if move.key.startswith(SESSION_PREFIX):
                message = self._session_with_subscriptions(move.key, message)
            ops.append(AddMessage(message, ((move.key, entry.seq),)))
            if entry.delivery_count:
                ops.append(SetDeliveryCount(move.key, entry.seq, entry.delivery_count))
            count += 1
            if len(ops) >= _PAGE:
                target.write(ops)
                ops = []
        mark = source.key_info(move.key).dispatched
        if mark:
            ops.append(MarkDispatched(move.key, mark))
        if ops:
            target.write(ops)
        return count

    def _session_with_subscriptions(self, key: str, message: Message) -> Message:
        """An MQTT session record as a node needs it: one written by one broker process
        does not list its subscriptions (their durables, found on that broker, now go
        to their topics' owners), so the shard a client resumes through would not find
        them; they are listed from the stored durable subscriptions of its client id."""
        try:
            record = json.loads(message.body)
        except ValueError:
            return message
        if not isinstance(record, dict) or "subs" in record:
            return message
        client_id = key[len(SESSION_PREFIX):]
        record["subs"] = sorted({
            d.subscription_name for recovery in self._recoveries.values()
            for d in recovery.durable_subscriptions
            if d.client_id == client_id and d.subscription_name.startswith("mqtt")
            and ":" in d.subscription_name})
        # copy_to, not copy.copy: a compiled Message cannot be copied by copy.copy, and
        # the new body must not reuse the old one's encoded form.
        return message.copy_to(message.destination, body=json.dumps(record).encode())

    def _copy_entries(self, em: EntryMove) -> None:
        if not em.seqs:
            return
        source, target = self._open(em.source), self._open(em.target)
        wanted = dict(em.seqs)
        mark = source.key_info(em.key).dispatched
        ops: list[StoreOp] = [RemoveRef(em.key, t) for _, t in em.seqs]
        for entry in self._entries(source, em.key):
            to = wanted.get(entry.seq)
            if to is None:
                continue
            ops.append(AddMessage(entry.message, ((em.key, to),)))
            # One that may have been handed out keeps its redelivered flag.
            count = entry.delivery_count or (1 if entry.seq <= mark else 0)
            if count:
                ops.append(SetDeliveryCount(em.key, to, count))
        target.write(ops)

    # ------------------------------------------------------------ removing
    async def _remove(self, the_plan: Plan) -> None:
        by_source: dict[int, list[StoreOp]] = {}
        for move in [*the_plan.moves, *the_plan.dropped_records]:
            by_source.setdefault(move.source, []).append(DropKey(move.key))
        for em in the_plan.entry_moves:
            if em.drop_source:
                by_source.setdefault(em.source, []).append(DropKey(em.key))
            elif em.seqs:
                by_source.setdefault(em.source, []).extend(
                    RemoveRef(em.key, s) for s, _ in em.seqs)
        # One source at a time, synced: a crash here leaves some sources done, which
        # the next run removes again (a no-op for what is gone).
        for loc, ops in sorted(by_source.items()):
            store = self._open(loc)
            store.write(ops)
            await store.sync()
            self._steps += 1
            self._maybe_die()

    async def _commit(self, old: int, sources: list[int]) -> None:
        """Record the new count, delete the stores no shard uses any more, and end the
        journal."""
        self._where.record(self.count, self.node, self.placement)
        keep = set(targets_of(self.count))
        gone = [loc for loc in sources if loc not in keep]
        for loc in gone:
            store = self._stores.pop(loc, None)
            if store is not None:
                await store.close()
        for loc in gone:
            self._where.discard(loc)
        self._where.write_plan(None)

    def _count_moved(self, the_plan: Plan, report: RebalanceReport) -> None:
        for move in the_plan.moves:
            _add(report, move.source, move.target, 0)
        for em in the_plan.entry_moves:
            if em.seqs:
                _add(report, em.source, em.target, len(em.seqs))

    # ------------------------------------------------------------ the journal
    def _read_journal(self) -> dict[str, object] | None:
        return self._where.read_plan()

    def _write_journal(self, body: dict[str, object]) -> None:
        self._where.write_plan(body)

    def _write_journal_phase(self, phase: str) -> None:
        body = self._read_journal() or {}
        body["phase"] = phase
        self._write_journal(body)


def _add(report: RebalanceReport, src: int, dst: int, messages: int) -> None:
    slot = report.moved.setdefault((src, dst), [0, 0])
    slot[0] += 1
    slot[1] += messages


def _encode(p: Plan) -> dict[str, object]:
    return {
        "moves": [[m.key, m.source, m.target] for m in p.moves],
        "entries": [[e.key, e.source, e.target, [list(s) for s in e.seqs], e.drop_source]
                    for e in p.entry_moves],
        "records": [[r.key, r.source, r.target] for r in p.record_copies],
        "dropped": [[m.key, m.source, m.target] for m in p.dropped_records],
    }


def _decode(raw: object) -> Plan:
    if not isinstance(raw, dict):
        raise RebalanceError("the rebalance journal holds no plan: restore the data "
                             "directory from a backup")
    return Plan(
        moves=[KeyMove(k, s, t) for k, s, t in raw["moves"]],
        entry_moves=[EntryMove(k, s, t, tuple((a, b) for a, b in seqs), bool(d))
                     for k, s, t, seqs, d in raw["entries"]],
        record_copies=[RecordCopy(k, s, t) for k, s, t in raw["records"]],
        dropped_records=[KeyMove(k, s, t) for k, s, t in raw["dropped"]])


def _write_synced(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rebalance(data: Path, count: int, *, store_directory: Path | None = None,
              node: str = "meshmq", postgres: tuple[str, str] | None = None,
              placement: str | None = None) -> RebalanceReport:
    """Move ``data``'s node to ``count`` shards placed by scheme ``placement`` (None:
    the one the stores have); ``postgres``: the DSN and table prefix of a node on
    PostgreSQL, whose stores are there instead."""
    return asyncio.run(Rebalance(data, count, store_directory=store_directory,
                                 node=node, postgres=postgres, placement=placement).run())
