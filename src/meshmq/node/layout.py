"""A node's data directory: which shard count its stores were made for, where each
shard's store lives, and the private directory for the shards' Unix sockets.

::

    <data>/shards.json    {"shards": N, "hash": "jump-blake2b-1", "node": name}
    <data>/shard-<k>/     shard k's data directory: a complete store as a broker's
    <data>/run/           the shards' management (and link) sockets, mode 0700

When socket paths under ``<data>`` would be too long (or the two nodes of a master/slave
pair share ``<data>``), the sockets go in a private directory under the system's
temporary directory instead, ``meshmq-run-<hash of data>-<random>``, holding
``owner.lock``, flock'ed by the supervisor while it runs. A supervisor killed with
SIGKILL cannot remove its directory, but its lock goes with it: the next start with the
same data directory removes every such directory whose lock nobody holds, and leaves
those of a live node (the other node of a pair) alone.

A store made with ``shards = 1`` has no ``shards.json`` and stays as it is. Which shard
owns a destination depends on the count and the placement scheme (``hash``, recorded
as its scheme's name, core/shards.py), so a start with another count or placement than
the stores were made with would leave messages on shards that no longer own them:
:func:`check_layout` refuses it with one line naming what to do, unless nothing is stored
yet (a fresh directory, or shard directories without a store). Telling whether stored
destinations would keep their owners needs reading every store, which the offline
``meshmq shards rebalance`` does (node/rebalance.py); its journal, ``rebalance.json``,
keeps any broker off the directory until it has finished.

A node on the PostgreSQL store keeps each shard's tables under ``<prefix>s<k>_`` and
its shard count in ``<prefix>node`` instead (store/postgres.py, ``check_node_layout``):
:class:`NodeDatabase` makes the same check there, and holds the store's session lock
for the supervisor's life, as ``node.lock`` does for a directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshmq.core.shards import HASH_NAME, SCHEMES, placement_word, unknown_scheme
from meshmq.errors import MeshmqError

__all__ = ["REBALANCE_FILE", "RUN_DIR", "SHARDS_FILE", "LayoutError", "NodeDatabase",
           "NodeLayout", "check_layout", "make_run_dir", "read_shards_file",
           "release_run_dir", "remove_shards_file", "shard_directory", "write_shards_file"]

SHARDS_FILE = "shards.json"
REBALANCE_FILE = "rebalance.json"
RUN_DIR = "run"
# sockaddr_un's sun_path is 108 bytes on Linux (104 on BSDs), with its NUL.
_MAX_SOCKET_PATH = 100
_LONGEST_SOCKET_NAME = "shard-255.mgmt.sock"
_RUN_LOCK = "owner.lock"
# The locks of the temporary run directories this process made, held until released.
_held: dict[Path, int] = {}


class LayoutError(MeshmqError):
    """The data directory does not fit the shard count asked for."""

    code = "store-layout"


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """What ``shards.json`` records."""

    shards: int
    hash: str
    node: str


def shard_directory(data: Path, index: int) -> Path:
    return data / f"shard-{index}"


def read_shards_file(data: Path) -> NodeLayout | None:
    """The layout recorded in ``data``, or None for a directory without one."""
    path = data / SHARDS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LayoutError(f"cannot use {data} as a node's data directory (reading {path}: "
                          f"{(exc.strerror or str(exc)).lower()}): change --data DIR, or "
                          "data_directory in the configuration") from None
    try:
        raw = json.loads(text)
        layout = NodeLayout(shards=raw["shards"], hash=raw["hash"], node=raw["node"])
    except (ValueError, KeyError, TypeError):
        raise LayoutError(f"{path} is not a shard layout ({{\"shards\", \"hash\", "
                          "\"node\"}): restore it from a backup, or remove it if no "
                          "shard-<k> directory beside it holds a store") from None
    if not isinstance(layout.shards, int) or layout.shards < 1 or not isinstance(
            layout.hash, str) or not isinstance(layout.node, str):
        raise LayoutError(f"{path} is not a shard layout ({text.strip()[:80]!r})")
    return layout


def _holds_data(path: Path) -> bool:
    """Whether ``path`` exists with anything in it (a store, a lock, a trace)."""
    try:
        return any(path.iterdir())
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return True
    except OSError as exc:
        raise LayoutError(f"cannot read {path}: {(exc.strerror or str(exc)).lower()}"
                          ) from None


def _shards_holding_data(data: Path) -> list[Path]:
    try:
        entries = sorted(data.glob("shard-*"))
    except OSError:
        return []
    return [p for p in entries if p.name[6:].isdigit() and _holds_data(p)]


def check_layout(data: Path, shards: int, node: str, plain_store: Path,
                 *, persistent: bool = True, placement: str = HASH_NAME) -> None:
    """Refuse a start of ``shards`` shards placed by scheme ``placement`` on ``data``
    whose stores were made for another count or scheme; record them on a node's first
    start. ``plain_store`` is where a store made with ``shards = 1`` keeps its files. A
    memory store (``persistent`` False) keeps nothing, so any layout fits."""
    if not persistent:
        return
    if (data / REBALANCE_FILE).exists():
        raise LayoutError(f"{data} holds an unfinished shard rebalance ({REBALANCE_FILE}): "
                          f"finish it with 'meshmq shards rebalance --data {data} --to N' "
                          "(N as in the interrupted run) before starting")
    if shards == 1 and not (data / SHARDS_FILE).is_file():
        return  # one broker process on its own store (or none yet): nothing changes
    recorded = read_shards_file(data)
    where = data / SHARDS_FILE
    if recorded is not None and recorded.hash not in SCHEMES:
        raise LayoutError(unknown_scheme(where, recorded.hash))
    if shards == 1:
        if recorded is not None and recorded.shards > 1 and _shards_holding_data(data):
            raise LayoutError(
                f"{data} holds the stores of a node of {recorded.shards} shards "
                f"({where}): start it with --shards {recorded.shards} (or [broker] shards "
                f"= {recorded.shards}), make them one process's store first with 'meshmq "
                f"shards rebalance --data {data} --to 1', or give this broker another data "
                "directory (--data)")
        return
    if recorded is None:
        if _holds_data(plain_store):
            raise LayoutError(
                f"{data} holds a one-process store ({plain_store}): start without "
                f"--shards (shards = 1), or split it first with 'meshmq shards rebalance "
                f"--data {data} --to {shards}' (broker stopped)")
    elif recorded.shards != shards:
        holding = _shards_holding_data(data)
        if holding:
            raise LayoutError(
                f"{data} holds the stores of a node of {recorded.shards} shards ({where}); "
                f"with {shards} shards stored destinations would change owner: start with "
                f"--shards {recorded.shards} (or [broker] shards = {recorded.shards}), or "
                f"move them first with 'meshmq shards rebalance --data {data} --to "
                f"{shards}' (node stopped)")
    elif recorded.hash != placement and _shards_holding_data(data):
        was, want = placement_word(recorded.hash), placement_word(placement)
        raise LayoutError(
            f"{data} holds the stores of a node placed by {was!r} ({where}); with "
            f"[shards] placement = {want!r} stored destinations would change owner: "
            f"set placement = {was!r}, or move them first with "
            f"'meshmq shards rebalance --data {data} --to {shards} --placement {want}' "
            "(node stopped)")
    if recorded is None or recorded.shards != shards or recorded.hash != placement:
        _write_shards_file(data, NodeLayout(shards, placement, node))


def remove_shards_file(data: Path) -> None:
    """Back to one broker process's layout (no ``shards.json``)."""
    with contextlib.suppress(FileNotFoundError):
        (data / SHARDS_FILE).unlink()


def write_shards_file(data: Path, layout: NodeLayout) -> None:
    _write_shards_file(data, layout)


def _write_shards_file(data: Path, layout: NodeLayout) -> None:
    """Written whole and synced before any shard's store holds a byte, so a crash
    leaves the old file or the new one."""
    data.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"shards": layout.shards, "hash": layout.hash, "node": layout.node})
    fd, tmp = tempfile.mkstemp(prefix=".shards-", dir=data)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data / SHARDS_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename is durable once the directory is
        dir_fd = os.open(data, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def make_run_dir(data: Path, *, private: bool = False) -> tuple[Path, bool]:
    """The directory for the shards' Unix sockets, mode 0700 (only this user may reach
    them), and whether it is a temporary one to remove at exit: ``<data>/run`` unless
    socket paths under it would be too long for the OS, or ``private`` (the nodes of a
    master/slave pair share ``data``: the old master's shards may still be stopping
    while the new one's start), then a fresh one in the system's temporary directory."""
    run = data / RUN_DIR
    if private or len(os.fsencode(str(run.absolute() / _LONGEST_SOCKET_NAME))
                      ) > _MAX_SOCKET_PATH:
        return _temporary_run_dir(data), True
    run.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = run.stat()
    if st.st_uid != os.getuid():
        raise LayoutError(f"{run} belongs to another user: remove it, or give the node "
                          "another data directory (--data DIR)")
    os.chmod(run, 0o700)
    return run.absolute(), False


def release_run_dir(run: Path) -> None:
    """Remove temporary run directory ``run`` (made by ``make_run_dir``) and let its
    lock go."""
    fd = _held.pop(run, None)
    shutil.rmtree(run, ignore_errors=True)
    if fd is not None:
        os.close(fd)


def _temporary_run_dir(data: Path) -> Path:
    """A fresh private run directory for ``data``, locked, after removing the ones a
    killed supervisor of ``data`` left behind."""
    prefix = "meshmq-run-" + hashlib.blake2b(os.fsencode(str(data.absolute())),
                                             digest_size=6).hexdigest() + "-"
    base = Path(tempfile.gettempdir())
    _remove_stale(base, prefix)
    # Made under another name and renamed once locked, so a node starting meanwhile
    # never sees it unlocked.
    new = Path(tempfile.mkdtemp(prefix=".meshmq-run-new-", dir=base))
    fd = os.open(new / _RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    run = base / (prefix + new.name.rsplit("-", 1)[-1])
    os.rename(new, run)
    _held[run] = fd
    return run


def _remove_stale(base: Path, prefix: str) -> None:
    """Remove the run directories named ``prefix*`` under ``base`` whose lock nobody
    holds (their supervisor is gone); never one of another user or a live node."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    uid = os.getuid()
    for path in entries:
        if not path.name.startswith(prefix) or path in _held:
            continue
        try:
            if path.lstat().st_uid != uid or not path.is_dir() or path.is_symlink():
                continue
            fd = os.open(path / _RUN_LOCK, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not one of ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its node runs
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


class NodeDatabase:
    """A node's hold on its PostgreSQL store: the store's session lock on ``<prefix>``
    (exclusive for a node alone, shared by the nodes of a ``database`` master/slave
    pair, whose lease orders them), which keeps one broker process off the node's
    tables while it runs, and the shard-count check (``check``)."""

    def __init__(self, dsn: str, prefix: str, *, shared: bool) -> None:
        from meshmq.store.postgres import check_prefix

        self.dsn = dsn
        self.prefix = check_prefix(prefix)
        self.shared = shared
        self._conn: Any = None

    def _where(self) -> str:
        from meshmq.store.postgres import dsn_for_messages

        return dsn_for_messages(self.dsn)

    def open(self) -> None:
        import psycopg

        try:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
            how = "pg_try_advisory_lock_shared" if self.shared else "pg_try_advisory_lock"
            row = self._conn.execute(f"SELECT {how}(hashtext(%s))",
                                     (self.prefix + "store",)).fetchone()
        except psycopg.Error as exc:
            self.close()
            raise LayoutError(f"cannot reach the node's PostgreSQL store ({self._where()}): "
                              f"{str(exc).strip().splitlines()[0] if str(exc) else exc!r}"
                              ) from None
        if not row or not row[0]:
            self.close()
            raise LayoutError(
                f"the PostgreSQL store {self.prefix!r} ({self._where()}) is in use by "
                + ("a broker running without master/slave" if self.shared else
                   "another broker or node") + ": stop it, or give this node another "
                "store.table_prefix")

    def check(self, shards: int, node: str, placement: str = HASH_NAME) -> None:
        """Refuse ``shards`` (placed by scheme ``placement``) on tables made for another
        count or scheme; record them otherwise."""
        import psycopg

        from meshmq.store.postgres import check_node_layout

        assert self._conn is not None
        try:
            refusal = check_node_layout(self._conn, self.prefix, shards, node, placement)
        except psycopg.Error as exc:
            raise LayoutError(f"cannot check the node's PostgreSQL tables: {exc}") from None
        if refusal is not None:
            raise LayoutError(refusal)

    def close(self) -> None:
        from meshmq.store.postgres import unlock_and_close

        unlock_and_close(self._conn)
        self._conn = None
