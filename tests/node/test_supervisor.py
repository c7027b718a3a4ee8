"""The supervisor's keeping of shard processes, with stand-in shards (small Python
processes that read their spec, report, and exit as the test tells them): restarts are
counted with their cause and backed off, a crash during the first start fails it."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from meshmq.config.model import BrokerConfig, ListenerConfig, ManagementConfig
from meshmq.node.supervisor import NodeStartError, Supervisor
from tests.support.memory_failover import until

# argv[1]: a directory. Each start of shard k counts itself in <dir>/starts-<k>. The
# first start of shard 0 runs until <dir>/go exists, the next two exit with status 5 at
# once, later ones (and every other shard) run until SIGTERM or the pipe closes.
STAND_IN = """
import os, signal, sys, time
from pathlib import Path
from meshmq.node.shard import read_spec
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a shard's graceful stop
spec = read_spec()
where = Path(sys.argv[1])
starts = where / f"starts-{spec.identity.index}"
count = len(starts.read_text()) + 1 if starts.exists() else 1
starts.write_text("x" * count)
if sys.argv[2] == "crash":
    sys.exit(7)
print("ready", flush=True)
if spec.identity.index == 0 and count == 1:
    while not (where / "go").exists():
        time.sleep(0.01)
    sys.exit(5)
if spec.identity.index == 0 and count in (2, 3):
    sys.exit(5)
while os.read(0, 4096):
    pass
"""


def _config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(broker_name="node", data_directory=tmp_path / "data", shards=2,
                        persistent=False, management=ManagementConfig(enabled=False),
                        listeners=(ListenerConfig(port=0),))


def test_a_dying_shard_is_restarted_with_its_cause_counted(tmp_path: Path) -> None:
    command = [sys.executable, "-c", STAND_IN, str(tmp_path), "run"]

    async def main() -> None:
        sup = Supervisor(_config(tmp_path), command)
        await sup.start()
        try:
            assert [r.state for r in sup.rows()] == ["running", "running"]
            first = sup.rows()[0].pid
            (tmp_path / "go").touch()
            began = time.monotonic()
            await until(lambda: sup.rows()[0].restarts == 3
                        and sup.rows()[0].state == "running", timeout=20)
            # Backed off 0.1 s, then 0.2 s, then 0.4 s between the four starts.
            assert time.monotonic() - began >= 0.7
            row = sup.rows()[0]
            assert row.last_exit == "exited with status 5" and row.pid not in (first, None)
            assert sup.rows()[1].restarts == 0
            assert (tmp_path / "starts-0").read_text() == "xxxx"
        finally:
            await sup.stop()
        assert [r.state for r in sup.rows()] == ["stopped", "stopped"]
        assert all(s.process is not None and s.process.returncode == 0 for s in sup.shards)

    asyncio.run(main())


def test_a_shard_that_dies_while_starting_fails_the_start(tmp_path: Path) -> None:
    command = [sys.executable, "-c", STAND_IN, str(tmp_path), "crash"]

    async def main() -> None:
        sup = Supervisor(_config(tmp_path), command)
        try:
            with pytest.raises(NodeStartError, match="exited with status 7 while starting"):
                await sup.start()
        finally:
            await sup.stop()
        assert (tmp_path / "starts-0").read_text() == "x"  # not started again

    asyncio.run(main())
