"""One shard process: a ``BrokerRuntime`` with its shard identity, started by the node's
supervisor and bound to it by a pipe.

The supervisor starts ``python -m meshmq.cli.shard`` with a pipe on its standard input
and writes the shard's ``ShardSpec`` there (a length, then the pickled spec); it then
keeps its end open, and writes only the node's ``$SYS`` figures to the front shard
(``sys <json>`` lines, below). The shard watches that pipe: end of file
means the supervisor is gone (even SIGKILLed, the kernel closes its end), and the shard
stops, so no shard outlives its node and writes to a store that a new node may open.
A pipe works on every Unix, unlike Linux's ``PR_SET_PDEATHSIG``.

The shard tells the supervisor how its start went on its standard output, one line:
``ready``, or ``error <code> <message>`` for a start that failed on the operator's
setting (the supervisor reports that line as its own error and fails the node's start).

``$SYS`` topics carry the node's figures: every ``[mqtt] sys_interval_ms`` each shard
writes its own as a ``sys <json>`` line on standard output instead of publishing them;
the supervisor sums every shard's latest and, on each report of the front shard, sends
it the sums on its pipe, which it publishes (management/sys_topics.py). The pipes are
already there, private to the node, and need no login, unlike the management sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshmq.config.model import BrokerConfig
from meshmq.core.shards import ShardIdentity
from meshmq.errors import MeshmqError
from meshmq.ha.replica_peer import DrivenRole
from meshmq.node.fence import DatabaseShardFence, ShardLease, shard_fence

if TYPE_CHECKING:
    from meshmq.management.sys_topics import SysTopics

__all__ = ["EXIT_START_FAILED", "REPLICA_REPORT", "SYS_REPORT", "ShardSpec", "encode_spec",
           "read_spec", "serve_shard"]

log = logging.getLogger("meshmq.node")

PARENT_FD = 0  # the supervisor's pipe (standard input)
STATUS_FD = 1  # start report to the supervisor (standard output)
EXIT_START_FAILED = 2  # the start failed on a setting: restarting would not help
_LENGTH = struct.Struct(">I")
SYS_REPORT = "sys"  # a line of $SYS figures, either way on the pipes
# ``replicated`` mode: a question of the supervisor and the shard's answer, as JSON
# (ha/replica_node.py; ``ReplicatedHa.control``).
REPLICA_REPORT = "repl"


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What a shard process is told: its configuration (its own data directory, the
    node's concrete ports), who it is, and the command line's log level."""

    config: BrokerConfig
    identity: ShardIdentity
    log_level: str | None = None
    # The node's lease when it is the master of a pair: the store's write fence.
    lease: ShardLease | None = None
    # ``replicated`` mode: the term and whether this shard leads its stream.
    replica: DrivenRole | None = None


def encode_spec(spec: ShardSpec) -> bytes:
    body = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def _read_exactly(fd: int, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            raise EOFError("the supervisor closed the pipe before the shard's spec was read")
        chunks += chunk
    return bytes(chunks)


def read_spec(fd: int = PARENT_FD) -> ShardSpec:
    """The spec the supervisor wrote on ``fd``. Only the supervisor, our parent, holds
    the pipe's other end, so unpickling it trusts no one new."""
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    spec = pickle.loads(_read_exactly(fd, size))
    if not isinstance(spec, ShardSpec):
        raise TypeError(f"expected a ShardSpec, got {type(spec).__name__}")
    return spec


def _report(line: str) -> None:
    with contextlib.suppress(OSError):  # a supervisor that is gone reads nothing
        os.write(STATUS_FD, (line.replace("\n", " ") + "\n").encode("utf-8"))


def _node_line(sys_topics: SysTopics, line: bytes,
               replica: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    """A line from the supervisor after the spec: ``sys <json>``, the node's ``$SYS``
    figures for the front shard to publish; ``repl <json>``, a question for the
    shard's replication (answered on standard output)."""
    word, _, rest = line.decode("utf-8", "replace").partition(" ")
    if word == REPLICA_REPORT and replica is not None:
        with contextlib.suppress(ValueError, TypeError):
            request = json.loads(rest)
            if isinstance(request, dict):
                _report(f"{REPLICA_REPORT} {json.dumps(replica(request))}")
        return
    if word != SYS_REPORT:
        return
    try:
        figures = json.loads(rest)
    except ValueError:
        return
    if isinstance(figures, dict):
        sys_topics.publish_node(figures)


async def serve_shard(spec: ShardSpec, parent_fd: int = PARENT_FD) -> int:
    """Run the shard until SIGTERM/SIGINT or its supervisor is gone; the exit status."""
    from meshmq.transport.runtime import BrokerRuntime, tune_gc

    tune_gc()
    fence = shard_fence(spec.lease) if spec.lease is not None else None
    try:
        runtime = BrokerRuntime(spec.config, shard=spec.identity, fence=fence)
    except MeshmqError as exc:
        _report(f"error {exc.code} {exc}")
        return EXIT_START_FAILED
    runtime.install_signal_handlers()
    loop = asyncio.get_running_loop()
    replica = None
    if spec.replica is not None:
        from meshmq.ha.replication import ReplicatedHa

        if isinstance(runtime.ha, ReplicatedHa):
            # The supervisor runs the elections; a follower is started once it follows.
            runtime.ha.driven = spec.replica
            runtime.ha.on_following = lambda: _report("ready")
            replica = runtime.ha.control
    stop_deposed = runtime.engine.on_write_refused
    if isinstance(fence, DatabaseShardFence) and stop_deposed is not None:
        def refused(why: str) -> None:  # the store's writer thread
            loop.call_soon_threadsafe(stop_deposed, why)

        # Another node took the lease: stop now, even with no write to come.
        fence.on_refused = refused
    stopping: set[asyncio.Task[None]] = set()
    # $SYS: the node's figures, not this shard's (management/sys_topics.py).
    runtime.sys_topics.report = lambda figures: _report(
        f"{SYS_REPORT} {json.dumps(figures)}")
    runtime.sys_topics.own = False
    pending = bytearray()

    def parent_readable() -> None:
        try:
            data = os.read(parent_fd, 4096)
        except OSError:
            data = b""
        if data:
            pending.extend(data)
            while b"\n" in pending:
                line, _, rest = bytes(pending).partition(b"\n")
                pending[:] = rest
                _node_line(runtime.sys_topics, line, replica)
            return
        loop.remove_reader(parent_fd)
        log.warning("shard %d: the node's supervisor is gone; stopping", spec.identity.index)
        runtime.shutdown_requested = True
        # Stopped whether started or not, as a signal stops it: a replicated follower's
        # start lasts until its node is elected, so waiting for the start to end would
        # leave it following (and its ports held) with no supervisor.
        runtime.stop_deadline.arm()
        stopping.add(loop.create_task(runtime.stop()))

    loop.add_reader(parent_fd, parent_readable)
    try:
        await runtime.start()
    except MeshmqError as exc:
        _report(f"error {exc.code} {exc}")
        return EXIT_START_FAILED
    if runtime.shutdown_requested:  # SIGTERM, or the supervisor gone, while starting
        await runtime.stop()
        return 0
    _report("ready")
    await runtime.wait_stopped()
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(parent_fd)
    return 0
