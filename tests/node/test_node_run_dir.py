"""The private socket directory of a ``meshmq broker --shards 2`` node whose data
directory is too deep for Unix socket paths: a supervisor killed with SIGKILL leaves
it behind, and the next start of that node removes it; a stop removes its own."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import NodeProcess, pid_gone, write_node_toml

pytestmark = pytest.mark.slow


def _run_dirs(data: Path) -> set[Path]:
    """The temporary run directories made for ``data`` (named by its path's hash)."""
    prefix = "meshmq-run-" + hashlib.blake2b(os.fsencode(str(data.absolute())),
                                             digest_size=6).hexdigest() + "-"
    base = Path(tempfile.gettempdir())
    return {p for p in base.iterdir() if p.name.startswith(prefix)}


def test_a_killed_supervisors_socket_directory_goes_at_the_next_start(
        tmp_path: Path) -> None:
    data = tmp_path / ("d" * 110) / "data"
    config = write_node_toml(tmp_path / "node.toml", data=data)
    node = NodeProcess(config, tmp_path / "node.log").start()
    try:
        [first] = _run_dirs(data)
        assert any(first.glob("*.sock"))  # the shards' sockets are there
        pids = node.shard_pids()
        node.kill9()
        for pid in pids:  # the shards stop once their supervisor's pipe closes
            poll(lambda pid=pid: pid_gone(pid), 30, "the shards to stop")
        assert first.exists()  # left behind
        node = NodeProcess(config, tmp_path / "node.log").start()
        [second] = _run_dirs(data)
        assert second != first and not first.exists()
        assert node.terminate() == 0
        assert _run_dirs(data) == set()  # a stop removes its own
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.terminate()
        ProcessBroker.running.discard(node)
