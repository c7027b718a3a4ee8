"""A bridge to a real shared-store master/slave pair (masterslave:), rebuilt when the
master is killed; nothing persistent is lost on the way."""

from __future__ import annotations

from pathlib import Path

from tests.ha.support import HaProcess
from tests.interop.stomp_helpers import uid
from tests.support.brokers import poll
from tests.support.network import Node

HA = {"mode": "shared", "lease_ms": 1500, "keepalive_ms": 300, "acquire_interval_ms": 50}


def test_bridge_follows_a_shared_store_pair_through_a_kill(tmp_path: Path, client) -> None:
    shared = tmp_path / "pair-data"
    m = Node("M", tmp_path / "m", data_dir=shared, ha=HA)
    s = Node("S", tmp_path / "s", data_dir=shared, ha=HA)
    master = HaProcess(m.write_config(), m.root / "broker.log").start().wait_master()
    slave = HaProcess(s.write_config(), s.root / "broker.log").start().wait_slave()
    a = Node("A", tmp_path / "a").connect_to(f"masterslave:({m.uri},{s.uri})").start()
    try:
        a.wait_forwarding()
        assert a.bridges()[0]["remote_broker"] == "M"
        q = uid("pair")
        before = client(on=m)
        before.subscribe(f"/queue/{q}", ack="client-individual",
                         headers={"activemq.prefetchSize": "1"})
        a.wait_consumers(q, 1)
        producer = client(on=a)
        for i in range(50):
            producer.send(f"/queue/{q}", str(i), {"persistent": "true"})
        poll(lambda: a.bridges()[0]["acknowledged"] == 50, what="50 stored on the master")
        got = [msg.body for msg in before.listener.messages]  # 1: prefetch, never acked
        master.kill9()
        slave.wait_master()
        poll(lambda: a.bridges()[0]["state"] == "forwarding"
             and a.bridges()[0]["remote_broker"] == "S", what="the bridge rebuilt to S")
        after = client(on=s)
        after.subscribe(f"/queue/{q}")
        a.wait_consumers(q, 1)
        for i in range(50, 100):
            producer.send(f"/queue/{q}", str(i), {"persistent": "true"})
        expected = {str(i) for i in range(100)}
        poll(lambda: set(got) | {msg.body for msg in after.listener.messages} == expected,
             timeout=30, what="all 100 messages from the pair")
        # The one message held unacknowledged by the first consumer comes again.
        bodies = [msg.body for msg in after.listener.messages]
        assert len(bodies) - len(set(bodies)) == 0
        assert len(got) + len(bodies) <= 101
    finally:
        a.stop()
        for proc in (master, slave):
            if proc.alive():
                proc.terminate()
