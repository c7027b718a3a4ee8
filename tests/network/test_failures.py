"""Failures with real broker processes: a receiving broker killed mid-stream, and
failures that must show in the bridge status."""

from __future__ import annotations

import socket
import time
from collections import Counter
from pathlib import Path

from tests.interop.stomp_helpers import uid
from tests.support.brokers import poll
from tests.support.network import Node


def _stop(*nodes: Node) -> None:
    for n in nodes:
        n.stop()


def test_receiving_broker_killed_mid_stream_loses_nothing(tmp_path: Path, client) -> None:
    total = 600
    b = Node("B", tmp_path / "b").start()
    a = Node("A", tmp_path / "a").connect_to(f"static:({b.uri})").start()
    try:
        a.wait_forwarding()
        q = uid("sf")
        consumer = client(on=b)
        consumer.subscribe(f"/queue/{q}", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
        a.wait_consumers(q, 1)
        producer = client(on=a)
        for i in range(total):  # every send confirmed by A: these must all arrive
            producer.send(f"/queue/{q}", str(i), {"persistent": "true"})
        poll(lambda: a.bridges()[0]["acknowledged"] >= 50, what="some messages across")
        b.kill9()
        received: list[str] = [m.body for m in consumer.listener.messages]
        b.start()
        a.wait_forwarding()
        again = client(on=b)
        again.subscribe(f"/queue/{q}", ack="auto")
        poll(lambda: a.destination(q)["depth"] == 0 and b.destination(q)["depth"] == 0,
             timeout=30, what="both queues drained")
        poll(lambda: len(set(received) | {m.body for m in again.listener.messages}) == total,
             what="every message")
        got = received + [m.body for m in again.listener.messages]
        assert set(got) == {str(i) for i in range(total)}
        # The only repeats allowed: the one unacknowledged at the kill (client ack),
        # and it says it may have been delivered before.
        assert sum(n - 1 for n in Counter(got).values()) <= 1
        seen = set(received)
        assert all(m.headers.get("redelivered") == "true"
                   for m in again.listener.messages if m.body in seen)
    finally:
        _stop(a, b)


def test_every_repeat_after_the_receiving_broker_is_killed_says_redelivered(
        tmp_path: Path, client) -> None:
    """A consumer on B acknowledges as it goes; B is killed mid-stream and restarted.
    Whatever the consumer had received and then gets again (B had not made the ack
    durable, or A re-forwarded what B had already handed out) is flagged redelivered."""
    total = 1500
    b = Node("B", tmp_path / "b").start()
    a = Node("A", tmp_path / "a").connect_to(f"static:({b.uri})").start()
    try:
        a.wait_forwarding()
        q = uid("acking")
        consumer = client(on=b)
        consumer.subscribe(f"/queue/{q}", ack="client-individual",
                           headers={"activemq.prefetchSize": "50"})
        a.wait_consumers(q, 1)
        producer = client(on=a)
        for i in range(total):
            producer.send(f"/queue/{q}", str(i), {"persistent": "true"})
        acked = 0
        deadline = time.monotonic() + 60
        while acked < 400 and time.monotonic() < deadline:
            with consumer.listener.cond:
                consumer.listener.cond.wait_for(
                    lambda n=acked: len(consumer.listener.messages) > n, 1)
                fresh = consumer.listener.messages[acked:]
            for m in fresh:
                consumer.ack(m, receipt=False)
            acked += len(fresh)
        b.kill9()
        seen = {m.body for m in consumer.listener.messages}
        b.start()
        a.wait_forwarding()
        again = client(on=b)
        again.subscribe(f"/queue/{q}", ack="auto")
        poll(lambda: a.destination(q)["depth"] == 0 and b.destination(q)["depth"] == 0,
             timeout=60, what="both queues drained")
        poll(lambda: len(seen | {m.body for m in again.listener.messages}) == total,
             timeout=30, what="every message")
        unflagged = [m.body for m in again.listener.messages
                     if m.body in seen and m.headers.get("redelivered") != "true"]
        assert not unflagged, f"{len(unflagged)} repeats without the flag: {unflagged[:5]}"
        repeats = sum(1 for m in again.listener.messages if m.body in seen)
        print(f"{len(seen)} received before the kill, {repeats} of them again, all flagged")
    finally:
        _stop(a, b)


def test_a_stranger_on_the_broker_port_gets_a_clear_error(tmp_path: Path) -> None:
    b = Node("B", tmp_path / "b").start()
    try:
        with socket.create_connection(("127.0.0.1", b.tcp), timeout=10) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\n\n\x00")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        assert b"bad magic" in data and b"protocol-error" in data
        assert b.stat()["broker"] == "B"  # still serving
    finally:
        b.stop()


def test_bridge_survives_the_remote_restarting_many_times(tmp_path: Path, client) -> None:
    b = Node("B", tmp_path / "b").start()
    a = Node("A", tmp_path / "a").connect_to(f"static:({b.uri})").start()
    try:
        q = uid("flap")
        for round_ in range(3):
            a.wait_forwarding()
            consumer = client(on=b)
            consumer.subscribe(f"/queue/{q}")
            a.wait_consumers(q, 1)
            client(on=a).send(f"/queue/{q}", f"r{round_}", {"persistent": "true"})
            poll(lambda c=consumer: len(c.listener.messages) == 1, what="a delivery")
            poll(lambda r=round_: a.bridges()[0]["acknowledged"] == r + 1, what="B's ack")
            b.kill9()
            poll(lambda: a.bridges()[0]["state"] != "forwarding", what="the bridge down")
            b.start()
        a.wait_forwarding()
        assert a.bridges()[0]["connects"] >= 3
    finally:
        _stop(a, b)



def test_meshmq_stat_shows_a_failing_bridge_with_its_cause(tmp_path: Path) -> None:
    import subprocess
    import sys

    nobody = Node("X", tmp_path / "x")  # never started: its port refuses connections
    a = Node("A", tmp_path / "a").connect_to(f"static:({nobody.uri})").start()
    try:
        poll(lambda: (a.bridges()[0]["last_error"] or {}).get("kind") == "connection-refused",
             what="the refusal in the status")
        out = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                              f"127.0.0.1:{a.mgmt}"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("bridge "))
        assert nobody.uri in line and "(outbound)" in line
        assert "last error: connection-refused" in line
    finally:
        a.stop()


def test_sigterm_of_the_accepting_broker_is_a_clean_remote_shutdown(tmp_path: Path) -> None:
    """The accepting broker says BYE as it stops: the dialing side records that the peer
    shut down, not that the link was lost as in a crash."""
    b = Node("B", tmp_path / "b").start()
    a = Node("A", tmp_path / "a").connect_to(f"static:({b.uri})").start()
    try:
        a.wait_forwarding()
        b.stop()  # SIGTERM
        poll(lambda: a.bridges()[0]["link_ended"] is not None, what="the link ended")
        ended = a.bridges()[0]["link_ended"]
        assert ended["kind"] == "remote-shutdown", ended
        assert "said goodbye (broker stopping)" in ended["message"]
        assert "link-lost" not in a.log()
        assert "(remote-shutdown)" in a.log()
    finally:
        _stop(a, b)
