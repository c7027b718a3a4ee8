"""A private PostgreSQL cluster for the tests: ``initdb`` in a temporary directory,
``pg_ctl`` on a free loopback port, stopped at the end of the session.

Debian's ``postgresql`` package provides the binaries (dev/apt.d/postgresql). PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user
(``runuser -u postgres --``). Each test gets its own database (``fresh_database``), so
tests never see each other's tables.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from meshmq.store.base import Store
from tests.support.ports import free_port

_dbs = itertools.count(1)


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresCluster:
    def __init__(self, bindir: Path, *, durable_commits: bool = False) -> None:
        self.bindir = bindir
        # Off by default for speed. A test that crashes the server needs commits in the
        # OS before they are acknowledged (fsync stays off: the OS itself does not crash).
        self.durable_commits = durable_commits
        self.root = Path(tempfile.mkdtemp(prefix="meshmq-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)

    def start(self) -> PostgresCluster:
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        done = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                         "-A", "trust", "-E", "UTF8", "--no-sync")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        self._start()
        return self

    def _start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=off "
                   f"-c synchronous_commit={'on' if self.durable_commits else 'off'} "
                   f"-c full_page_writes=off "
                   f"-c max_connections=200")
        done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                         str(self.root / "server.log"), "-o", options, "-w", "-t", "60",
                         "start")
        if done.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace") \
                if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log}")

    def stop_server(self) -> None:
        """Stop the server abruptly (as a crash would), keeping its data."""
        done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                         "-w", "stop")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed:\n{done.stdout}\n{done.stderr}")

    def start_server(self) -> None:
        """Start it again on the same port with the same data."""
        self._start()

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def create_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(_dbs)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                  "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


_cluster: PostgresCluster | None = None


def cluster() -> PostgresCluster:
    """The session's cluster, started on first use (stopped by ``stop_cluster``)."""
    global _cluster
    if _cluster is None:
        bindir = _bindir()
        if bindir is None:
            pytest.fail("PostgreSQL is not installed: run dev/system-packages "
                        "(dev/apt.d/postgresql)")
        _cluster = PostgresCluster(bindir).start()
    return _cluster


def stop_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None


def contract_store(directory: Path) -> Store:
    """A PostgresStore for the contract suite: one table prefix per test directory, so a
    reopen in the same test finds its data and tests never share tables."""
    from meshmq.store.postgres import PostgresStore

    prefix = "c" + hashlib.sha1(str(directory).encode()).hexdigest()[:12] + "_"
    return PostgresStore(cluster().dsn(), table_prefix=prefix)
