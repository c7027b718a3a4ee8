"""A bridge between two in-process brokers: demand forwarding end to end."""

from __future__ import annotations

from pathlib import Path

from tests.interop.stomp_helpers import uid
from tests.network.helpers import (
    bridges,
    connector,
    consumers_on,
    net_config,
    tcp_uri,
    wait_forwarding,
)
from tests.support.brokers import ThreadBroker, poll


def test_queue_messages_follow_a_remote_consumer(tmp_path: Path, client) -> None:
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(f"static:({tcp_uri(b)})"))).start()
    try:
        wait_forwarding(a)
        q = f"/queue/{uid('fw')}"
        consumer = client(on=b)
        consumer.subscribe(q)
        poll(lambda: consumers_on(a, q.replace("/queue/", "queue://")) == 1,
             what="demand on A")
        producer = client(on=a)
        for i in range(20):
            producer.send(q, str(i), {"persistent": "true"})
        poll(lambda: len(consumer.listener.messages) == 20, what="20 forwarded messages")
        assert consumer.bodies() == [str(i) for i in range(20)]
        status = bridges(a)[0]
        assert status["remote_broker"] == "B" and status["forwarded"] == 20
        assert status["remote_client_uris"] == [f"stomp://127.0.0.1:{b.port}"]
        inbound = [s for s in bridges(b) if s["direction"] == "inbound"]
        assert inbound[0]["remote_client_uris"] == [f"stomp://127.0.0.1:{a.port}"]
        poll(lambda: bridges(a)[0]["acknowledged"] == 20, what="acks")
    finally:
        a.stop()
        b.stop()


def test_consumer_leaving_mid_stream_neither_loses_nor_doubles(tmp_path: Path,
                                                               client) -> None:
    """The remote consumer goes while messages are on their way: the demand drains
    (the remote stores them, they are settled here) instead of bouncing them back."""
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:({tcp_uri(b)})", redistribution=False))).start()
    try:
        wait_forwarding(a)
        q = f"/queue/{uid('leave')}"
        consumer = client(on=b)
        sub = consumer.subscribe(q)
        poll(lambda: consumers_on(a, q.replace("/queue/", "queue://")) == 1, what="demand")
        producer = client(on=a)
        for i in range(300):
            producer.send(q, str(i), {"persistent": "true"}, receipt=(i == 299))
        consumer.unsubscribe(sub)
        name = q[len("/queue/"):]

        def settled() -> bool:
            return bridges(a)[0]["inflight"] == 0 and \
                consumers_on(a, q.replace("/queue/", "queue://")) == 0
        poll(settled, what="the bridge settled")
        got = len(consumer.listener.messages)
        left = a.destination_stats(name)["depth"] + b.destination_stats(name)["depth"]
        assert got + left == 300, (got, left)
    finally:
        a.stop()
        b.stop()


def test_clients_learn_the_network_from_connected(tmp_path: Path, client) -> None:
    """Topology push: a STOMP client of A is told where B's clients connect."""
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(f"static:({tcp_uri(b)})"))).start()
    try:
        wait_forwarding(a)
        c = client(on=a)
        peers = c.listener.connected[0].headers.get("meshmq-peers", "")
        assert f"stomp://127.0.0.1:{b.port}" in peers.split(",")
        c2 = client(on=b)  # the accepting side knows its peer too
        assert f"stomp://127.0.0.1:{a.port}" in \
            c2.listener.connected[0].headers.get("meshmq-peers", "").split(",")
    finally:
        a.stop()
        b.stop()
