"""Replicated master/slave with real subprocesses: two data nodes and a witness (and
three data nodes for the kill test).

* the master is SIGKILLed under a persistent load from failover clients: every confirmed
  message reaches the consumer, once; the old master comes back as a slave and catches up;
* a new slave whose history the master no longer keeps catches up from a snapshot, and
  can then take over with every message;
* the master is cut off from everyone (a black-hole proxy on each of its links): it
  stops accepting writes within its lease, the others elect a master, and at no sample
  do two brokers accept writes; after healing it follows again;
* a graceful stop hands over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from meshmq.client import FailoverClient, Message
from tests.client.test_client_features import run
from tests.support.brokers import poll
from tests.support.replicated import (
    LEASE_MS,
    Cluster,
    make_cluster,
    wait_caught_up,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _close(cluster: Cluster) -> None:
    cluster.close()


@pytest.mark.parametrize(("names", "witness"), [(("A", "B"), True), (("A", "B", "C"), False)],
                         ids=["two-brokers-and-a-witness", "three-brokers"])
def test_master_killed_under_load_loses_nothing_and_comes_back_as_a_slave(
        tmp_path: Path, names: tuple[str, ...], witness: bool) -> None:
    cluster = make_cluster(tmp_path, names, witness=witness).start()
    try:
        master = cluster.wait_master()
        # Every member follows before the kill: a member that starts after the master
        # was elected, and never heard from it, has no state and rightly votes for
        # nobody (a wiped node must not elect a stale one), so with the master killed
        # first no majority could form.
        for other in cluster.data:
            if other is not master:
                wait_caught_up(master, other)
        uri = cluster.failover_uri()
        total, kill_after = 300, 100
        took: list[float] = []

        async def main() -> None:
            received: list[str] = []
            consumer = FailoverClient(uri)
            await consumer.connect()

            def on_message(msg: Message) -> None:
                received.append(msg.text)
                asyncio.get_running_loop().create_task(consumer.ack(msg))

            await consumer.subscribe("/queue/repl.orders", ack="client-individual",
                                     callback=on_message)
            producer = FailoverClient(uri)
            await producer.connect()
            confirmed: list[str] = []
            for i in range(total):
                # send() returns once the broker's receipt came: a confirmed message.
                await producer.send("/queue/repl.orders", f"order {i}", persistent=True)
                confirmed.append(f"order {i}")
                if i + 1 == kill_after:
                    await asyncio.to_thread(master.kill9)
                    t0 = time.monotonic()
                    # A deadline, not a speed check (bench/takeover.py measures takeover
                    # time): on a loaded machine an election can take a while.
                    await asyncio.to_thread(cluster.wait_master, 60, (master.name,))
                    took.append(time.monotonic() - t0)
            async with asyncio.timeout(60):
                while not set(confirmed) <= set(received):
                    await asyncio.sleep(0.02)  # polled with a deadline
            assert len(received) == len(set(received)), "a duplicate reached the app"
            await producer.close()
            await consumer.close()

        run(main())
        assert took, "the master was never killed"
        successor = cluster.wait_master(exclude=(master.name,))
        ha = successor.ha()
        assert ha is not None and ha["role"] == "master" and ha["term"] >= 2
        assert ha["took_over_from"] == master.name  # the trace's took_over
        # The old master restarts, follows the new one and catches up.
        master.start()
        poll(lambda: (h := master.ha()) is not None and h["role"] == "slave"
             and h["leader"] == successor.name, 30, "the old master to follow the new one")
        for other in cluster.data:
            if other is not successor:
                wait_caught_up(successor, other)
        assert f"slave: following {successor.name}" in master.log()
        out = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                              f"127.0.0.1:{master.node.mgmt}"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        assert f"role slave  ha replicated  term {ha['term']}  master {successor.name}" in out
    finally:
        _close(cluster)


def test_a_new_slave_catches_up_from_a_snapshot_then_takes_over(tmp_path: Path) -> None:
    # A tiny retained log: the history is gone by the time B starts.
    cluster = make_cluster(tmp_path, log_retain_bytes=512)
    a, b = cluster.by_name("A"), cluster.by_name("B")
    a.start()
    cluster.by_name("W").start()
    try:
        assert cluster.wait_master() is a  # A and the witness are a majority of three

        async def send(n: int) -> None:
            producer = FailoverClient(cluster.failover_uri())
            await producer.connect()
            for i in range(n):
                await producer.send("/queue/repl.snap", f"s{i}", persistent=True)
            await producer.close()

        run(send(200))
        b.start()
        wait_caught_up(a, b)
        hb = b.ha()
        assert hb is not None and hb["snapshots_installed"] == 1
        run(send(20))  # then it follows live
        wait_caught_up(a, b)
        a.kill9()
        assert cluster.wait_master(exclude=("A",)) is b
        poll(lambda: b.node.destination("repl.snap")["depth"] == 220, 30,
             "all 220 messages on the new master")
    finally:
        _close(cluster)


def test_an_isolated_master_steps_down_and_two_masters_never_accept_writes(
        tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, proxied=True).start()
    try:
        master = cluster.wait_master()
        other = next(m for m in cluster.data if m is not master)
        wait_caught_up(master, other)
        samples: list[tuple[float, list[str]]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.monotonic(), cluster.writable()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        poll(lambda: len(samples) > 5, 10, "samples before the cut")
        cut_at = time.monotonic()
        cluster.isolate(master.name)
        poll(lambda: bool(samples) and samples[-1][1] == [other.name], 30,
             f"{other.name} to be the only broker accepting writes")
        poll(lambda: len(samples) > 0 and samples[-1][0] > time.monotonic() - 0.5, 5,
             "a fresh sample")
        stop.set()
        sampler.join(10)
        both = [s for s in samples if len(s[1]) > 1]
        assert not both, f"two brokers accepted writes at once: {both[:3]}"
        # The isolated master stopped accepting writes within its lease.
        last_old = max((t for t, w in samples if master.name in w), default=cut_at)
        assert last_old - cut_at < LEASE_MS / 1000 + 0.5, last_old - cut_at
        assert any(other.name in w for _, w in samples)
        assert "deposed: no majority answered" in master.log()
        # Healed, the old master follows the new one and catches up.
        cluster.heal()
        poll(lambda: (h := master.ha()) is not None and h["role"] == "slave"
             and h["leader"] == other.name, 30, "the old master to follow")
        wait_caught_up(other, master)
    finally:
        _close(cluster)


def test_the_master_slave_link_cut_leaves_one_master_that_goes_on_with_the_witness(
        tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, proxied=True).start()
    try:
        master = cluster.wait_master()
        other = next(m for m in cluster.data if m is not master)
        witness = cluster.by_name("W")
        wait_caught_up(master, other)
        samples: list[tuple[float, list[str]]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.monotonic(), cluster.writable()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for pair in ((master.name, other.name), (other.name, master.name)):
            cluster.proxies[pair].cut()
        # The cut-off slave asks the witness, which still hears the master: refused.
        poll(lambda: f"vote pre-check: refused for {other.name}" in witness.log(), 30,
             "the slave's vain pre-vote")

        async def send(n: int) -> None:  # writes still get confirmed: master + witness
            producer = FailoverClient(cluster.failover_uri())
            await producer.connect()
            for i in range(n):
                await producer.send("/queue/repl.cut", f"c{i}", persistent=True)
            assert producer.endpoint is not None
            assert producer.endpoint.port == master.node.stomp
            await producer.close()

        run(send(20))
        stop.set()
        sampler.join(10)
        # (A sample may miss the master when its management endpoint is slow to answer.)
        assert samples and not [w for _, w in samples if w and w != [master.name]]
        assert [master.name] in [w for _, w in samples]
        ha, mha = other.ha(), master.ha()
        assert ha is not None and mha is not None
        assert ha["role"] == "slave" and ha["term"] == mha["term"]  # no election happened
        # Healed: the slave gets what was confirmed without it.
        cluster.heal()
        wait_caught_up(master, other)
    finally:
        _close(cluster)


def test_a_paused_master_cannot_write_after_the_others_took_over(tmp_path: Path) -> None:
    import stomp

    cluster = make_cluster(tmp_path).start()
    try:
        master = cluster.wait_master()
        other = next(m for m in cluster.data if m is not master)
        assert "witness: voting" in cluster.by_name("W").log()  # started by `meshmq witness`
        conn = stomp.Connection12([("127.0.0.1", master.node.stomp)], timeout=2,
                                  reconnect_attempts_max=1)
        conn.connect(wait=True)
        wait_caught_up(master, other)
        master.signal(signal.SIGSTOP)
        try:
            assert cluster.wait_master(exclude=(master.name,)) is other
            # While it is stopped, this SEND waits in the paused master's socket.
            conn.send("/queue/repl.paused", "late", headers={"persistent": "true"},
                      receipt="late")
        finally:
            master.signal(signal.SIGCONT)
        poll(lambda: (h := master.ha()) is not None and h["role"] == "slave"
             and h["leader"] == other.name, 30, "the resumed master to follow")
        assert "deposed" in master.log()
        # The late SEND was refused, not stored anywhere.
        wait_caught_up(other, master)
        assert other.node.destination("repl.paused")["depth"] == 0
        assert master.ha()["term"] == other.ha()["term"]  # type: ignore[index]
        with contextlib.suppress(Exception):
            conn.disconnect()
    finally:
        _close(cluster)


def test_a_graceful_stop_hands_over_at_once(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, lease_ms=5000, keepalive_ms=200).start()
    try:
        master = cluster.wait_master(timeout=60)
        other = next(m for m in cluster.data if m is not master)
        wait_caught_up(master, other)
        t0 = time.monotonic()
        master.terminate()
        assert cluster.wait_master(exclude=(master.name,)) is other
        # Well before the 5 s lease would have run out.
        assert time.monotonic() - t0 < 4, time.monotonic() - t0
        assert "handed the replicated master role over" in master.log()
    finally:
        _close(cluster)
