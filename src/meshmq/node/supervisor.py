"""``meshmq broker --shards N``: the supervisor of a node's N shard processes.

It checks the data directory's layout (node/layout.py), binds the node's client ports
(node/ports.py) and serves the node's management endpoint (node/management.py), then
starts one process per shard and keeps it running:

* Processes, not ``multiprocessing``: each shard is ``python -m meshmq.cli.shard`` (the
  command the CLI gives), with a pipe on its standard input that carries its spec once
  and then tells it when the supervisor is gone (node/shard.py). A plain child process
  imports only what a broker imports (``multiprocessing``'s spawn re-runs the parent's
  ``__main__`` and adds its resource-tracker process), shows what it is in ``ps``, and
  its exit status or signal comes straight from ``waitpid``.
* ``$SYS`` topics: each shard reports its figures on its standard output; the
  supervisor sends their sums to the front shard, which publishes them for the node.
* A shard that dies is started again after 0.1 s, doubling up to 5 s while it keeps
  dying; a shard that ran ``STABLE_AFTER_S`` starts from 0.1 s again. Each exit is
  logged with its status or signal, and counted (``/api/shards``).
* A shard whose first start fails on a setting (it reports ``error ...``) fails the
  node's start with that one line; later, the same is retried with the backoff.
* SIGTERM or SIGINT: every shard gets SIGTERM and ``STOP_GRACE_S`` to stop as a broker
  stops (sessions closed, store synced), then SIGKILL; the supervisor exits 0.
  SIGHUP is passed to every shard (TLS certificates are reloaded).
* ``ha.mode = "shared"``: the whole node is the master or the slave of a pair on one
  data directory. The supervisor waits for the lease (ha/controller.py, the lease file
  in the node's data directory) before it binds any client port or starts any shard,
  and serves only its management endpoint meanwhile (``role slave``). Each shard's
  journal checks that lease on every write (node/fence.py). A supervisor that loses
  the lease kills its shards at once (their writes are refused anyway) and starts
  again as a slave (``ha.restart_when_deposed``) or exits with ``EXIT_DEPOSED``.
* ``ha.mode = "database"``: the same with the lease row of the PostgreSQL store
  (ha/pg_lease.py); the nodes need not share a data directory. Each shard keeps its
  tables under ``<prefix>s<k>_`` and its store checks the node's lease row in every
  write transaction (node/fence.py); the shard count is recorded in ``<prefix>node``
  (node/layout.py, ``NodeDatabase``).
* ``ha.mode = "replicated"``: every node has its own data directory and its shards run
  from the start, as followers of the master's streams (shard k of the master ships
  its journal to shard k of every node). The supervisor holds the node's elections
  (ha/replica_node.py) and, once elected, restarts its shards as the masters of their
  streams in the new term; a master whose shard exits (deposed, or a crash) stops all
  of them and starts again as a follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import secrets
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from meshmq.config.model import BrokerConfig, HaConfig
from meshmq.core.shards import PLACEMENTS, ShardIdentity
from meshmq.errors import ConfigError, MeshmqError
from meshmq.ha.controller import HaController
from meshmq.ha.replica_node import NodeElection, shard_ha
from meshmq.ha.replica_peer import DrivenRole
from meshmq.management.sys_topics import node_figures
from meshmq.node.aggregate import ShardRow
from meshmq.node.fence import STARTS_PER_EPOCH, ShardLease
from meshmq.node.layout import (
    LayoutError,
    NodeDatabase,
    check_layout,
    make_run_dir,
    release_run_dir,
    shard_directory,
)
from meshmq.node.ports import NodePorts, bind_ports
from meshmq.node.shard import REPLICA_REPORT, SYS_REPORT, ShardSpec, encode_spec

__all__ = ["EXIT_DEPOSED", "RESTART_MAX_S", "RESTART_MIN_S", "STABLE_AFTER_S", "STOP_GRACE_S",
           "NodeStartError", "RestartBackoff", "Supervisor", "describe_exit", "run_node",
           "shard_config"]

log = logging.getLogger("meshmq.node")

RESTART_MIN_S = 0.1
RESTART_MAX_S = 5.0
STABLE_AFTER_S = 30.0  # a shard that ran this long starts its backoff from the minimum
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL at the node's stop
STACK_DUMP_S = 0.5  # from the stack-dump signal to SIGKILL, for a shard that overran
LOCK_FILE = "node.lock"
EXIT_DEPOSED = 3  # as one broker's (transport/runtime.py): the lease was lost


class NodeStartError(MeshmqError):
    """A shard could not start on the node's settings (its one line)."""

    code = "node-start-failed"


def shard_config(config: BrokerConfig, index: int, listeners: tuple[object, ...] | None = None,
                 ha: HaConfig | None = None) -> BrokerConfig:
    """Shard ``index``'s configuration: its own data directory under the node's (and its
    own store and trace directories under configured ones), the node's concrete ports;
    ``ha``: its replication (``replicated`` mode), else none of its own."""
    store = config.store
    if store.directory is not None:
        store = dataclasses.replace(store, directory=store.directory / f"shard-{index}")
    if store.kind == "postgres":
        from meshmq.store.postgres import shard_prefix

        store = dataclasses.replace(store, table_prefix=shard_prefix(store.table_prefix,
                                                                     index))
    trace = config.trace
    if trace.directory is not None:
        trace = dataclasses.replace(trace, directory=trace.directory / f"shard-{index}")
    changes: dict[str, object] = {
        "data_directory": shard_directory(config.data_directory, index),
        "store": store, "trace": trace,
        # The supervisor holds the node's lease; a shard only passes its fence.
        "ha": ha if ha is not None else dataclasses.replace(config.ha, mode="none")}
    if listeners is not None:
        changes["listeners"] = listeners
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


@dataclasses.dataclass
class RestartBackoff:
    """How long to wait before starting a dead shard again: ``minimum``, doubling while
    it keeps dying, at most ``maximum``; a shard that ran ``stable_after`` seconds
    starts from ``minimum`` again. Pure: the caller says how long the shard ran."""

    minimum: float = RESTART_MIN_S
    maximum: float = RESTART_MAX_S
    stable_after: float = STABLE_AFTER_S
    _next: float = dataclasses.field(default=-1.0, init=False)

    def after_exit(self, ran: float) -> float:
        if self._next < 0 or ran >= self.stable_after:
            self._next = self.minimum
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


@dataclasses.dataclass
class _Shard:
    index: int
    process: asyncio.subprocess.Process | None = None
    state: str = "starting"
    restarts: int = 0
    started: float = 0.0  # monotonic
    last_exit: str | None = None
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    start_error: str | None = None
    spawns: int = 0  # processes started, under this supervisor's lease epoch
    answers: dict[int, asyncio.Future[dict[str, Any]]] = dataclasses.field(
        default_factory=dict)  # replicated mode: questions asked, by id

    def row(self, now: float) -> ShardRow:
        running = self.process is not None and self.process.returncode is None
        return ShardRow(shard=self.index,
                        pid=self.process.pid if running and self.process else None,
                        state=self.state, restarts=self.restarts,
                        uptime_ms=int((now - self.started) * 1000) if running else 0,
                        last_exit=self.last_exit)


class Supervisor:
    """One node run. ``command`` starts a shard process (``[python, -m,
    meshmq.cli.shard]``); ``log_level`` is the command line's, passed to each shard."""

    def __init__(self, config: BrokerConfig, command: Sequence[str],
                 log_level: str | None = None) -> None:
        if config.shards < 2:
            raise ValueError("a node's supervisor runs two shards or more")
        self.config = config
        self.command = list(command)
        self.log_level = log_level
        self.count = config.shards
        self.token = secrets.token_hex(16)  # this boot's shard-link secret
        # The placement scheme the stores are laid out by (checked against the
        # recorded one before any shard starts).
        self.placement = PLACEMENTS[config.sharding.placement]
        self.shards = [_Shard(k) for k in range(self.count)]
        self.ports: NodePorts | None = None
        self.run_dir: Path | None = None
        self._temporary_run_dir = False
        self._lock: IO[bytes] | None = None
        self._stopping = asyncio.Event()
        self._node_started = False
        self._tasks: list[asyncio.Task[None]] = []
        self._started = time.monotonic()
        self._sys_figures: dict[int, dict[str, object]] = {}  # each shard's latest $SYS
        self.shutdown_requested = False  # SIGTERM/SIGINT: not to start again as a slave
        self.deposed = False  # lost the lease while master
        self.ha: HaController | NodeElection | None = None
        # Replicated mode: what the shards are told (follow, or lead a term).
        self._replica_role = DrivenRole(0, lead=False)
        self._questions = 0
        self._ha_stopped = False
        self._ha_stopping: asyncio.Task[None] | None = None
        if config.ha.mode == "shared":
            from meshmq.ha.file_lease import FileLease
            from meshmq.ha.setup import default_holder_id

            self.ha = HaController(
                FileLease(self.lease_directory, config.ha.holder_id
                          or default_holder_id(config)),
                config.ha, mode="shared", on_lost=self._on_deposed)
        elif config.ha.mode == "database":
            from meshmq.ha.setup import create_backend

            self.ha = HaController(create_backend(config), config.ha, mode="database",
                                   on_lost=self._on_deposed)
        elif config.ha.mode == "replicated":
            self.ha = NodeElection(config, self._ask_shards, on_lost=self._on_deposed)
        # The PostgreSQL store: the node's lock on its tables and their shard count.
        self.database: NodeDatabase | None = None
        self._quiet_stop = False  # the start failed: its error says why
        if config.persistent and config.store.kind == "postgres":
            if not config.store.dsn:
                raise ConfigError("store kind 'postgres' needs store.dsn",
                                  option="store.dsn")
            self.database = NodeDatabase(config.store.dsn, config.store.table_prefix,
                                         shared=self.ha is not None)
        from meshmq.node.management import NodeManagement

        self.management: NodeManagement | None = None
        if config.management.enabled:
            self.management = NodeManagement(
                config, self.count, self._management_socket, self.rows,
                ha_status=self.ha.status if self.ha is not None else None)

    @property
    def lease_directory(self) -> Path:
        """Where the node's lease file lives: beside the shards' stores."""
        return self.config.store.directory or self.config.data_directory

    # ------------------------------------------------------------ views
    def rows(self) -> list[ShardRow]:
        now = time.monotonic()
        return [s.row(now) for s in self.shards]

    def _management_socket(self, index: int) -> str:
        assert self.run_dir is not None
        return self.identity(index).management_socket(index)

    def identity(self, index: int) -> ShardIdentity:
        assert self.run_dir is not None
        return ShardIdentity(index=index, count=self.count, node=self.config.broker_name,
                             run_dir=str(self.run_dir), token=self.token,
                             placement=self.placement)

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        out = {}
        if self.ports is not None:
            out = {lst.name: (lst.host, lst.port) for lst in self.ports.listeners}
        if self.management is not None and self.management.address is not None:
            out["management"] = self.management.address
        return out

    # ------------------------------------------------------------ run
    async def run(self) -> int:
        """Start the node, serve until SIGTERM/SIGINT, stop it; the exit status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        try:
            await self.start()
            await self._stopping.wait()
        except LayoutError:
            # Refused before anything started (the stores' layout, a lock): its
            # one-line error is all the operator needs, not a "stopped" line before it.
            self._quiet_stop = True
            raise
        finally:
            await self.stop()
        return EXIT_DEPOSED if self.deposed else 0

    def _check_layout(self) -> None:
        """The stores fit this shard count (in the data directory or the database). The
        database's lock is taken here: a slave waits for the lease, not for it."""
        if self.database is not None:
            self.database.open()
            self.database.check(self.count, self.config.broker_name, self.placement)
            return
        check_layout(self.config.data_directory, self.count, self.config.broker_name,
                     self.config.store_directory, persistent=self.config.persistent,
                     placement=self.placement)

    async def start(self) -> None:
        if isinstance(self.ha, NodeElection):
            await self._start_replicated(self.ha)
            return
        data = self.config.data_directory
        self._take_lock(data, shared=self.ha is not None)
        if self.ha is None:
            await asyncio.to_thread(self._check_layout)
        # Two nodes of a pair share the data directory but not their sockets.
        self.run_dir, self._temporary_run_dir = make_run_dir(
            data, private=self.ha is not None)
        if self.ha is not None:
            if self.management is not None:  # first, so a slave's role can be seen
                await self.management.start()
            if not await self.ha.acquire():
                return  # stopped while a slave
            log.info("master: starting the node's %d shards on the %s stores",
                     self.count, "shared" if self.database is None else "database")
            await asyncio.to_thread(self._check_layout)
        self.ports = bind_ports(self.config)
        if self.management is not None and self.ha is None:
            await self.management.start()
        await self._start_shards()
        self._node_started = True
        self._log_started()

    def _log_started(self) -> None:
        assert self.ports is not None
        log.info("meshmq node %r started: %d shards on %s (placement %s)",
                 self.config.broker_name, self.count,
                 ", ".join(f"{lst.protocol}://{lst.host}:{lst.port}"
                           for lst in self.ports.listeners),
                 self.config.sharding.placement)

    async def _start_shards(self, *, raise_failure: bool = True) -> bool:
        """Start every shard and wait for their first start; a failure raises its
        line (or, ``raise_failure`` False, is logged and gives False)."""
        for shard in self.shards:
            self._tasks.append(asyncio.get_running_loop().create_task(self._keep(shard)))
        await asyncio.gather(*(self._first_start(s) for s in self.shards))
        failed = next((s for s in self.shards if s.start_error), None)
        if failed is None:
            return True
        code, _, message = (failed.start_error or "").partition(" ")
        if not raise_failure:
            log.error("shard %d could not start: %s", failed.index, message)
            return False
        if code == ConfigError.code:  # as one broker reports it
            raise ConfigError(message)
        raise NodeStartError(message)

    async def _start_replicated(self, election: NodeElection) -> None:
        """Replicated mode: the shards follow the master's streams while the node is a
        slave; once elected, the node restarts them as the masters of their streams."""
        data = self.config.data_directory
        self._take_lock(data)  # each node of a replicated cluster has its own directory
        await asyncio.to_thread(self._check_layout)
        self.run_dir, self._temporary_run_dir = make_run_dir(data)
        if self.management is not None:
            await self.management.start()
        await self._start_shards()
        self._node_started = True
        if self._stopping.is_set():
            return
        log.info("node %r: its %d shards follow the master's streams", self.config.broker_name,
                 self.count)
        if not await election.acquire() or self._stopping.is_set():
            return
        # The others wait for this node's shards while they start (NodeElection.hold).
        hold = asyncio.get_running_loop().create_task(election.hold())
        try:
            await self._retire_shards()
            if self._stopping.is_set():
                return
            self._replica_role = DrivenRole(election.term, lead=True)
            self.ports = bind_ports(self.config)
            self._node_started = False
            log.info("master: starting the node's %d shards as the masters of their "
                     "streams in term %d", self.count, election.term)
            started = await self._start_shards(raise_failure=False)
        finally:
            hold.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hold
        if self._stopping.is_set():  # SIGTERM while its shards started: a plain stop
            return
        if not started:
            election.lose("a shard could not take its stream over")
            return
        self._node_started = True
        self._log_started()

    async def _retire_shards(self) -> None:
        """Stop the follower shards (their journals close) before they start again as
        masters."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._stop_processes()
        for shard in self.shards:
            if shard.process is not None and shard.process.stdin is not None:
                shard.process.stdin.close()
            shard.ready = asyncio.Event()
            shard.start_error = None
            shard.state = "starting"

    async def _ask_shards(self, adopt: int | None) -> list[dict[str, Any]] | None:
        """Replicated mode: every shard's replication state, after moving it to term
        ``adopt`` when given (ha/replica_node.py); None when one is down or silent."""
        self._questions += 1
        ident = self._questions
        question = {"id": ident, "op": "adopt" if adopt else "status", "term": adopt}
        line = f"{REPLICA_REPORT} {json.dumps(question)}\n".encode()
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[dict[str, Any]]] = []
        try:
            for shard in self.shards:
                proc = shard.process
                if proc is None or proc.returncode is not None or proc.stdin is None \
                        or proc.stdin.is_closing() or shard.state != "running":
                    return None
                fut: asyncio.Future[dict[str, Any]] = loop.create_future()
                shard.answers[ident] = fut
                waits.append(fut)
                proc.stdin.write(line)
            async with asyncio.timeout(self.config.ha.lease_ms / 2000):
                return list(await asyncio.gather(*waits))
        except (TimeoutError, ConnectionError):
            return None
        finally:
            for shard in self.shards:
                shard.answers.pop(ident, None)

    def _replica_answer(self, shard: _Shard, text: str) -> None:
        try:
            body = json.loads(text)
            fut = shard.answers.get(int(body["id"]))
        except (ValueError, TypeError, KeyError):
            return
        if fut is not None and not fut.done():
            fut.set_result(body)

    async def _first_start(self, shard: _Shard) -> None:
        """Wait until the shard is ready, or its start failed (which fails the node's)."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        ready = asyncio.ensure_future(shard.ready.wait())
        try:
            await asyncio.wait((stopping, ready), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            ready.cancel()

    def _take_lock(self, data: Path, *, shared: bool = False) -> None:
        """Exclusive for a node alone on its directory; shared by the nodes of a
        master/slave pair (the lease decides between them), which keeps a node without
        HA off their directory."""
        data.mkdir(parents=True, exist_ok=True)
        lock = (data / LOCK_FILE).open("ab")
        try:
            fcntl.flock(lock.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                        | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            if shared:
                raise LayoutError(f"a node without master/slave runs on {data}: stop it, "
                                  "or give this node another data directory (--data DIR)"
                                  ) from None
            raise LayoutError(f"another node runs on {data}: give each node its own data "
                              "directory (--data DIR, or data_directory in the "
                              "configuration)") from None
        self._lock = lock

    # ------------------------------------------------------------ one shard
    async def _spawn(self, shard: _Shard) -> asyncio.subprocess.Process:
        lease = None
        replica = None
        ha: HaConfig | None = None
        if isinstance(self.ha, NodeElection):
            replica = self._replica_role
            ha = shard_ha(self.config, shard.index)
        elif self.ha is not None:
            lease = ShardLease(
                str(self.lease_directory), self.ha.backend.holder, self.ha.backend.epoch,
                shard.spawns, table_prefix=None if self.ha.mode == "shared"
                else self.config.store.table_prefix)
        shard.spawns += 1
        # A follower shard serves no client: the node's ports are bound once it leads.
        listeners = self.ports.listeners if self.ports is not None else None
        spec = ShardSpec(shard_config(self.config, shard.index, listeners, ha),
                         self.identity(shard.index), self.log_level, lease, replica)
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(encode_spec(spec))
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        # The pipe stays open: its end of file tells the shard the supervisor is gone.
        shard.process = proc
        shard.started = time.monotonic()
        shard.state = "starting"
        log.info("shard %d started (pid %d)", shard.index, proc.pid)
        return proc

    async def _watch_start(self, shard: _Shard, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        # Its start report, and its $SYS figures (the first may come before "ready"),
        # read until it exits: a full pipe would block the shard.
        while raw := await proc.stdout.readline():
            line = raw.decode("utf-8", "replace").strip()
            word, _, rest = line.partition(" ")
            if word == SYS_REPORT:
                self._sys_report(shard, proc, rest)
            elif word == REPLICA_REPORT:
                self._replica_answer(shard, rest)
            elif line == "ready":
                if shard.process is proc and proc.returncode is None \
                        and not self._stopping.is_set():
                    shard.state = "running"
                shard.ready.set()
            elif word == "error":
                shard.start_error = rest  # "<code> <message>"
                if self._node_started:
                    log.error("shard %d could not start: %s", shard.index,
                              shard.start_error.partition(" ")[2])

    def _sys_report(self, shard: _Shard, proc: asyncio.subprocess.Process, text: str
                    ) -> None:
        """Keep a shard's latest ``$SYS`` figures; on the front shard's, send it the
        node's sums to publish (node/shard.py)."""
        try:
            figures = json.loads(text)
        except ValueError:
            return
        if not isinstance(figures, dict):
            return
        self._sys_figures[shard.index] = figures
        if shard.index != 0 or proc.stdin is None or proc.stdin.is_closing():
            return
        uptime_ms = int((time.monotonic() - self._started) * 1000)
        node = node_figures(self._sys_figures.values(), uptime_ms)
        proc.stdin.write(f"{SYS_REPORT} {json.dumps(node)}\n".encode())

    async def _keep(self, shard: _Shard) -> None:
        """Run the shard, and again whenever it dies, until the node stops."""
        backoff = RestartBackoff()
        while not self._stopping.is_set():
            if shard.spawns >= STARTS_PER_EPOCH:
                log.error("shard %d started %d times; not starting it again", shard.index,
                          shard.spawns)
                break
            proc = await self._spawn(shard)
            watch = asyncio.ensure_future(self._watch_start(shard, proc))
            code = await proc.wait()
            self._sys_figures.pop(shard.index, None)  # its clients are gone with it
            shard.state = "stopped" if self._stopping.is_set() else "restarting"
            with contextlib.suppress(TimeoutError):  # its report, read to the end
                await asyncio.wait_for(watch, 2.0)
            if proc.stdin is not None:
                proc.stdin.close()
            if self._stopping.is_set():
                shard.state = "stopped"
                break
            ran = time.monotonic() - shard.started
            if isinstance(self.ha, NodeElection) and self._replica_role.lead \
                    and self._node_started:
                # A master's stream without its shard: the node stops being master.
                shard.last_exit = describe_exit(code)
                self.ha.lose(f"shard {shard.index} {shard.last_exit}")
                break
            if not self._node_started:
                # The first start fails the node's: restarting would fail the same way.
                if shard.start_error is None:
                    shard.start_error = (f"{NodeStartError.code} shard {shard.index} "
                                         f"{describe_exit(code)} while starting (its log "
                                         "above says why)")
                shard.state = "stopped"
                shard.ready.set()
                break
            delay = backoff.after_exit(ran)
            shard.restarts += 1
            shard.state = "restarting"
            shard.last_exit = describe_exit(code)
            log.warning("shard %d (pid %d) %s after %.1fs; restart %d in %.1fs",
                        shard.index, proc.pid, shard.last_exit, ran, shard.restarts, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    # ------------------------------------------------------------ stop
    def _on_signal(self, sig: int) -> None:
        log.info("received %s, stopping the node's %d shards", signal.Signals(sig).name,
                 self.count)
        self.shutdown_requested = True
        self._stopping.set()
        if self.ha is not None and (not self._node_started or (
                isinstance(self.ha, NodeElection) and not self._replica_role.lead)):
            # A slave (or a node still starting): stop waiting for the lease.
            self._ha_stopping = asyncio.get_running_loop().create_task(self._stop_ha())

    def _on_deposed(self, why: str) -> None:
        """Another node holds the lease: the shards' writes are refused already; kill
        them at once rather than let them drain clients they can no longer serve."""
        self.deposed = True
        for shard in self.shards:
            proc = shard.process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        self._stopping.set()

    async def _stop_ha(self) -> None:
        """After the shards stopped (their stores are closed): hand the lease over."""
        if self.ha is not None and not self._ha_stopped:
            self._ha_stopped = True
            await self.ha.stop()

    def _on_hangup(self) -> None:
        """SIGHUP: every shard reloads its TLS certificates, and so does the election
        listener of a replicated node."""
        if isinstance(self.ha, NodeElection):
            self.ha.tls.reload()
        self._forward(signal.SIGHUP)

    def _forward(self, sig: int) -> None:
        for shard in self.shards:
            proc = shard.process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    async def stop(self) -> None:
        """Stop every shard (SIGTERM, then SIGKILL after ``STOP_GRACE_S``), then the
        management endpoint and the ports."""
        self._stopping.set()
        await self._stop_processes()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._ha_stopping is not None:
            await self._ha_stopping
        await self._stop_ha()
        if self.management is not None:
            await self.management.stop()
        if self.ports is not None:
            self.ports.close()
        if self._temporary_run_dir and self.run_dir is not None:
            release_run_dir(self.run_dir)
        if self.database is not None:
            self.database.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if not self._quiet_stop:
            log.info("meshmq node %r stopped", self.config.broker_name)

    async def _stop_processes(self) -> None:
        """SIGTERM to every shard, SIGKILL to those still there after ``STOP_GRACE_S``."""
        self._forward(signal.SIGTERM)
        procs = [s.process for s in self.shards
                 if s.process is not None and s.process.returncode is None]
        if procs:
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in procs], timeout=STOP_GRACE_S)
            if pending:
                for proc in procs:
                    if proc.returncode is None:
                        log.warning("shard pid %d did not stop in %.0fs; its stacks go to "
                                    "its log, then it is killed", proc.pid, STOP_GRACE_S)
                        # SIGUSR1: the shard's faulthandler writes every thread's stack,
                        # the one record of what it was stuck on.
                        with contextlib.suppress(ProcessLookupError):
                            proc.send_signal(signal.SIGUSR1)
                await asyncio.wait(pending, timeout=STACK_DUMP_S)
                for proc in procs:
                    if proc.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                await asyncio.wait(pending)


async def run_node(config: BrokerConfig, command: Sequence[str],
                   log_level: str | None = None) -> int:
    """Run a node until SIGTERM/SIGINT (``meshmq broker`` with ``shards > 1``). A node
    deposed as master starts again as a slave when ``ha.restart_when_deposed``, else
    exits with ``EXIT_DEPOSED``."""
    while True:
        supervisor = Supervisor(config, command, log_level)
        code = await supervisor.run()
        if not supervisor.deposed or supervisor.shutdown_requested:
            return code
        if not config.ha.restart_when_deposed:
            return EXIT_DEPOSED
        log.info("restarting the node as a slave after losing the master role")
