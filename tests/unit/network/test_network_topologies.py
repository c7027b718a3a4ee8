"""Topologies and failures between real brokers linked in memory (no sockets): a duplex
hub and spokes, request/reply over a temp queue, a durable subscriber across the
network and a restart, a consumer moving between brokers, and a link broken with
messages in flight."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.support.memory_network import (
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

from meshmq.store.journal import JournalStore


def test_duplex_hub_and_spokes() -> None:
    """Spokes connect to the hub with one duplex connector each; traffic flows
    spoke -> hub -> spoke both ways (two hops: network_ttl 2)."""
    with memory_network() as net:
        hub = net.add("HUB")
        s1 = net.add("S1", connector("HUB", duplex=True, network_ttl=2))
        s2 = net.add("S2", connector("HUB", duplex=True, network_ttl=2))
        net.start()
        s1.wait_forwarding()
        s2.wait_forwarding()
        hub.wait_for(lambda: sum(b["direction"] == "inbound" for b in hub.bridges()) == 2,
                     what="two inbound links on the hub")
        sub1, sub2 = client(s1), client(s2)
        subscribe(sub1, "/topic/events", "1")
        subscribe(sub2, "/topic/events", "1")
        subscribe(sub1, "/queue/work", "2")
        s2.wait_for(lambda: s2.consumers_on("work") == 1, what="queue demand S1 -> HUB -> S2")
        s2.wait_for(lambda: s1.outbound()[0]["demand"] >= 1 and s2.outbound()[0]["demand"] >= 2,
                    what="topic demand on both spokes")
        p1, p2 = client(s1), client(s2)
        for i in range(10):
            send(p2, "/topic/events", f"from-s2-{i}")
            send(p1, "/topic/events", f"from-s1-{i}")
            send(p2, "/queue/work", f"job-{i}")
        s1.wait_for(lambda: len(sub1.bodies()) == 30 and len(sub2.bodies()) == 20,
                    what="topic fan-out both ways and queue messages across two hops")
        s1.turn(50)  # a duplicate still on its way would show up now
        got1, got2 = Counter(sub1.bodies()), Counter(sub2.bodies())
        assert set(got1.values()) == {1} and set(got2.values()) == {1}  # no duplicates
        assert {b for b in got1 if b.startswith("job-")} == {f"job-{i}" for i in range(10)}
        assert set(got2) == {f"from-s{n}-{i}" for n in (1, 2) for i in range(10)}


def test_request_reply_over_a_temp_queue_across_brokers() -> None:
    with memory_network() as net:
        a, b = net.linked(duplex=True)
        responder = client(b)
        subscribe(responder, "/queue/svc")
        a.wait_for(lambda: a.consumers_on("svc") == 1, what="the service's demand on A")
        requester = client(a)
        subscribe(requester, "/temp-queue/replies")

        def temp_queue_known_on_b() -> bool:
            return any(d["type"] == "temp-queue" and d["consumers"] >= 1
                       for d in b.broker.statistics()["destinations"])
        # The temp queue's consumer is interest that must reach B first.
        a.wait_for(temp_queue_known_on_b, what="the temp queue known on B")
        send(requester, "/queue/svc", "ping", **{"reply-to": "/temp-queue/replies"})
        a.wait_for(lambda: len(responder.received()) == 1, what="the request on B")
        reply_to = responder.received()[0].get("reply-to")
        assert reply_to is not None
        send(responder, reply_to, "pong", persistent="false")
        a.wait_for(lambda: requester.bodies() == ["pong"], what="the reply back on A")


def test_durable_subscriber_across_the_network(tmp_path: Path) -> None:
    """A durable subscriber on B keeps receiving what is published on A while it is
    offline, while B is down, and after B restarts."""
    with memory_network() as net:
        b = net.add("B", store=JournalStore(tmp_path / "b", fsync=False), persistent=True)
        a = net.add("A", connector("B"))
        net.start()
        a.wait_forwarding()
        durable = {"activemq.subscriptionName": "news"}
        sub = client(b, **{"client-id": "reader"})
        subscribe(sub, "/topic/news", "d1", **durable)
        a.wait_for(lambda: a.outbound()[0]["demand"] == 1, what="durable demand on A")
        producer = client(a)
        send(producer, "/topic/news", "1")
        a.wait_for(lambda: sub.bodies() == ["1"], what="online delivery")
        sub.send("DISCONNECT")
        sub.wait_closed()
        send(producer, "/topic/news", "2")  # subscriber offline
        a.wait_for(lambda: a.outbound()[0]["acknowledged"] == 2,
                   what="stored on B for the durable")
        b.stop()
        a.wait_for(lambda: a.outbound()[0]["state"] != "forwarding", what="the bridge down")
        send(producer, "/topic/news", "3")  # B down: kept on A
        b = net.restart("B", JournalStore(tmp_path / "b", fsync=False))
        a.wait_for(lambda: a.outbound()[0]["state"] == "forwarding"
                   and a.outbound()[0]["connects"] == 2, what="the bridge back")
        back = client(b, **{"client-id": "reader"})
        subscribe(back, "/topic/news", "d1", **durable)
        a.wait_for(lambda: len(back.bodies()) == 2, what="messages kept while away")
        assert back.bodies() == ["2", "3"]


def test_messages_follow_a_consumer_that_moves_brokers() -> None:
    """Redistribution (on by default): messages forwarded to B for a consumer that then
    moves to A come back to A instead of being stuck on B."""
    with memory_network() as net:
        a = net.add("A", connector("B", redistribution_delay_ms=200))
        b = net.add("B", connector("A", redistribution_delay_ms=200))
        net.start()
        a.wait_forwarding()
        b.wait_forwarding()
        on_b = client(b)
        subscribe(on_b, "/queue/moving", ack="client-individual",
                  **{"activemq.prefetchSize": "5"})
        a.wait_for(lambda: a.consumers_on("moving") == 1, what="demand on A")
        producer = client(a)
        for i in range(100):
            send(producer, "/queue/moving", str(i))
        a.wait_for(lambda: len(on_b.bodies()) >= 5, what="the consumer on B busy")
        taken = [f for f in on_b.received() if f.command == "MESSAGE"][:5]
        for m in taken:
            on_b.send("ACK", {"id": m.get("ack") or ""})
        a.wait_for(lambda: b.queue_depth("moving") > 50, what="most messages forwarded to B")
        on_b.drop()  # moves: its unacknowledged messages go back to B's queue
        on_a = client(a)
        subscribe(on_a, "/queue/moving")
        a.wait_for(lambda: len(on_a.bodies()) + 5 >= 100, timeout=30,
                   what="the stranded messages to follow the consumer to A")
        got = [m.body.decode() for m in taken] + on_a.bodies()
        assert sorted(got, key=int) == [str(i) for i in range(100)]


def test_a_link_broken_mid_stream_reconnects_without_loss_or_duplicates() -> None:
    """The connection under a bridge breaks while messages and acks are on the wire:
    both ends see it lost, the bridge reconnects, forwards again what B had not
    confirmed, and B's duplicate window keeps each message delivered once."""
    total = 500
    with memory_network() as net:
        a, b = net.linked()
        consumer = client(b)
        subscribe(consumer, "/queue/cut")
        a.wait_for(lambda: a.consumers_on("cut") == 1, what="demand on A")
        producer = client(a)
        for i in range(total):
            send(producer, "/queue/cut", str(i))
        a.wait_for(lambda: a.outbound()[0]["acknowledged"] >= 50, what="some across")
        assert a.outbound()[0]["acknowledged"] < total, "nothing left in flight to lose"
        assert net.cut("A", "B") == 1
        a.wait_for(lambda: a.outbound()[0]["link_ended"] is not None, what="A sees it lost")
        assert a.outbound()[0]["link_ended"]["kind"] == "link-lost"
        a.wait_for(lambda: a.outbound()[0]["connects"] == 2, what="the bridge reconnected")
        a.wait_for(lambda: a.queue_depth("cut") == 0 and b.queue_depth("cut") == 0
                   and a.outbound()[0]["inflight"] == 0 and len(consumer.bodies()) >= total,
                   timeout=30, what="both queues drained")
        a.turn(50)
        got = consumer.bodies()
        assert sorted(got, key=int) == [str(i) for i in range(total)]  # once each
