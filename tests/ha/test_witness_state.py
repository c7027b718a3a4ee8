"""A member whose state was lost must not vote as if it had promised nothing.

Two brokers and a witness, real subprocesses: the slave is killed, the master confirms
more writes with the witness, then master and witness are killed and the witness's
directory is deleted. The stale slave and the wiped witness come back: they must not
elect the stale slave (it lacks confirmed messages). When the old master returns it is
elected (the stale slave votes for its newer log) and every confirmed message is there.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from meshmq.client import FailoverClient
from tests.client.test_client_features import run
from tests.support.brokers import poll
from tests.support.replicated import LEASE_MS, make_cluster, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_wiped_witness_does_not_elect_a_stale_slave(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path).start()
    try:
        a = cluster.wait_master()
        b = next(m for m in cluster.data if m is not a)
        w = cluster.by_name("W")
        wait_caught_up(a, b)
        b.kill9()

        async def send(n: int) -> None:
            producer = FailoverClient(f"failover:(stomp://127.0.0.1:{a.node.stomp})")
            await producer.connect()
            for i in range(n):
                await producer.send("/queue/repl.wiped", f"c{i}", persistent=True)
            await producer.close()

        run(send(40))  # confirmed by the master and the witness only
        a.kill9()
        w.kill9()
        shutil.rmtree(w.node.root / "data")
        w.start()
        b.start()
        poll(lambda: "no state of its own" in w.log(), 30,
             "the wiped witness to refuse the stale slave")
        # For several leases the stale slave never becomes master.
        deadline = time.monotonic() + 4 * LEASE_MS / 1000
        while time.monotonic() < deadline:
            assert cluster.masters() == [], "a stale slave was elected"
            time.sleep(0.05)
        a.start()
        assert cluster.wait_master() is a
        poll(lambda: a.node.destination("repl.wiped")["depth"] == 40, 30,
             "all 40 confirmed messages on the master")
    finally:
        cluster.close()
