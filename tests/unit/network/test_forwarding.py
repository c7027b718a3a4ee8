"""Forwarding across bridges, between real brokers linked in memory (no sockets):
demand, filters, static bridges, draining demand, TTLs and loops in a mesh, and the
receiving side's durability rule. tests/network/ keeps what needs sockets or processes.
"""

from __future__ import annotations

import pytest
from tests.support.memory_broker import StompClient
from tests.support.memory_network import (
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

from meshmq.store.memory import MemoryStore


def bodies(c: StompClient) -> list[str]:
    return [f.body.decode() for f in c.received() if f.command == "MESSAGE"]


def test_queue_messages_follow_a_remote_consumer() -> None:
    with memory_network() as net:
        a, b = net.linked()
        consumer = client(b)
        subscribe(consumer, "/queue/fw")
        a.wait_for(lambda: a.consumers_on("fw") == 1, what="demand on A")
        producer = client(a)
        for i in range(20):
            send(producer, "/queue/fw", str(i))
        a.wait_for(lambda: len(bodies(consumer)) == 20, what="20 forwarded messages")
        assert bodies(consumer) == [str(i) for i in range(20)]
        status = a.outbound()[0]
        assert status["remote_broker"] == "B" and status["forwarded"] == 20
        a.wait_for(lambda: a.outbound()[0]["acknowledged"] == 20, what="acks")
        assert a.queue_depth("fw") == 0


def test_one_batch_for_two_demands_is_settled_for_each() -> None:
    """Sends to two queues in one turn cross in one MESSAGES frame and come back in one
    ACKS frame; A settles each demand's share (persistent or not) and keeps nothing."""
    with memory_network() as net:
        a, b = net.linked()
        consumers = {name: client(b) for name in ("left", "right")}
        for name, consumer in consumers.items():
            subscribe(consumer, f"/queue/{name}")
        a.wait_for(lambda: a.consumers_on("left") == 1 and a.consumers_on("right") == 1,
                   what="demand for both queues on A")
        producer = client(a)
        frames = b"".join(
            f"SEND\ndestination:/queue/{('left', 'right')[i % 2]}\npersistent:"
            f"{'true' if i % 3 else 'false'}\n\n{i}\x00".encode() for i in range(40))
        producer.send_raw(frames)  # one read: one pump, one flush on A
        a.wait_for(lambda: all(len(bodies(c)) == 20 for c in consumers.values()),
                   what="every message on B")
        assert bodies(consumers["left"]) == [str(i) for i in range(0, 40, 2)]
        assert bodies(consumers["right"]) == [str(i) for i in range(1, 40, 2)]
        a.wait_for(lambda: a.outbound()[0]["acknowledged"] == 40, what="acks")
        status = a.outbound()[0]
        assert status["forwarded"] == 40 and status["inflight"] == 0
        assert a.queue_depth("left") == a.queue_depth("right") == 0


def test_without_sync_send_only_persistent_messages_wait_for_the_remote() -> None:
    """``always_sync_send = false``: a non-persistent message is settled on A once
    written to the link, a persistent one when B has stored it. Mixed in one stream,
    the persistent ones are held between settled ones, and B answers the
    non-persistent ones of a batch before the persistent ones (after its store's
    sync): every message arrives once and in order, and A holds nothing after."""
    with memory_network() as net:
        a, b = net.linked(always_sync_send=False)
        consumer = client(b)
        subscribe(consumer, "/queue/mixed")
        a.wait_for(lambda: a.consumers_on("mixed") == 1, what="demand on A")
        producer = client(a)
        persistent = [i % 3 == 0 or i % 7 == 0 for i in range(300)]
        frames = b"".join(
            f"SEND\ndestination:/queue/mixed\npersistent:{str(p).lower()}\n\n{i}\x00"
            .encode() for i, p in enumerate(persistent))
        for start in range(0, len(frames), 4096):  # reads of a few dozen messages
            producer.send_raw(frames[start:start + 4096])
        a.wait_for(lambda: len(bodies(consumer)) == 300, what="every message on B")
        assert bodies(consumer) == [str(i) for i in range(300)]
        a.wait_for(lambda: a.outbound()[0]["acknowledged"] == sum(persistent),
                   what="the persistent messages' acknowledgements")
        status = a.outbound()[0]
        assert status["forwarded"] == 300 and status["inflight"] == 0
        assert a.queue_depth("mixed") == 0


def test_consumer_leaving_mid_stream_neither_loses_nor_doubles() -> None:
    """The remote consumer goes while messages are on their way: the demand drains
    (the remote stores them, they are settled here) instead of bouncing them back."""
    with memory_network() as net:
        a, b = net.linked(redistribution=False)
        consumer = client(b)
        subscribe(consumer, "/queue/leave")
        a.wait_for(lambda: a.consumers_on("leave") == 1, what="demand")
        producer = client(a)
        for i in range(300):
            send(producer, "/queue/leave", str(i))
        b.wait_for(lambda: len(bodies(consumer)) > 0, what="the first message")
        consumer.send("UNSUBSCRIBE", {"id": "1"})
        a.wait_for(lambda: a.outbound()[0]["inflight"] == 0 and a.consumers_on("leave") == 0,
                   what="the bridge settled")
        got = bodies(consumer)
        assert len(got) == len(set(got)), "a message was delivered twice"
        assert len(got) + a.queue_depth("leave") + b.queue_depth("leave") == 300


def test_excluded_and_dynamically_included_destinations() -> None:
    with memory_network() as net:
        a, b = net.linked(dynamically_included_destinations=("queue://orders.>",),
                          excluded_destinations=("queue://orders.secret",))
        consumer = client(b)
        for i, name in enumerate(("orders.eu", "orders.secret", "billing")):
            subscribe(consumer, f"/queue/{name}", str(i))
        a.wait_for(lambda: a.consumers_on("orders.eu") == 1, what="included demand")
        assert a.consumers_on("orders.secret") == 0
        assert a.consumers_on("billing") == 0
        assert a.outbound()[0]["demand"] == 1
        producer = client(a)
        for name in ("orders.eu", "orders.secret", "billing"):
            send(producer, f"/queue/{name}", name)
        a.wait_for(lambda: bodies(consumer) == ["orders.eu"], what="only the included queue")
        assert a.queue_depth("orders.secret") == 1
        assert a.queue_depth("billing") == 1


def test_static_bridge_forwards_without_consumers() -> None:
    with memory_network() as net:
        a, b = net.linked(static_bridge=True,
                          statically_included_destinations=("queue://audit",))
        producer = client(a)
        for i in range(5):
            send(producer, "/queue/audit", str(i))
        a.wait_for(lambda: b.queue_depth("audit") == 5, what="stored on B")
        # ... and settled on A once B's acks arrive.
        a.wait_for(lambda: a.queue_depth("audit") == 0, what="acked on A")


def test_mesh_of_three_with_ttl_2_has_no_duplicates_or_loops() -> None:
    with memory_network() as net:
        nodes = list(net.mesh("ABC", network_ttl=2).values())
        a, b, c = nodes
        tb, tc, qb, qc = client(b), client(c), client(b), client(c)
        subscribe(tb, "/topic/mesh.t")
        subscribe(tc, "/topic/mesh.t")
        subscribe(qb, "/queue/mesh.q")
        subscribe(qc, "/queue/mesh.q")
        a.wait_for(lambda: a.consumers_on("mesh.q") >= 2, what="queue demand on A")
        # Topic demand from both brokers reaches A before anything is published.
        a.wait_for(lambda: all(br["demand"] >= 2 for br in a.outbound()),
                   what="topic and queue demand on both bridges of A")
        producer = client(a)
        for i in range(50):
            send(producer, "/topic/mesh.t", f"t{i}")
            send(producer, "/queue/mesh.q", f"q{i}")
        a.wait_for(lambda: len(bodies(tb)) >= 50 and len(bodies(tc)) >= 50
                   and len(bodies(qb)) + len(bodies(qc)) >= 50, what="every message")

        def quiet() -> bool:
            return all(br["inflight"] == 0 for n in nodes for br in n.bridges()) and \
                all(n.queue_depth("mesh.q") == 0 for n in nodes)
        a.wait_for(quiet, what="the mesh to settle")
        a.turn(50)  # anything still looping would show up now
        for sub in (tb, tc):
            assert sorted(bodies(sub)) == sorted(f"t{i}" for i in range(50))  # once each
        assert sorted(bodies(qb) + bodies(qc)) == sorted(f"q{i}" for i in range(50))
        # Loop prevention: a topic message crosses at most TTL hops, so no broker
        # forwards more than (messages x its bridges).
        forwarded = sum(br["forwarded"] for n in nodes for br in n.bridges())
        assert forwarded <= 50 * 2 * 3 + 50
        # ... and none goes back to a broker on its path (it would drop it).
        assert sum(br["dropped"] for n in nodes for br in n.bridges()) == 0


class FailingSyncStore(MemoryStore):
    """A memory store whose sync raises while ``failing`` (a disk gone bad)."""

    failing = False
    syncs_failed = 0

    async def sync(self) -> None:
        if self.failing:
            self.syncs_failed += 1
            raise OSError("disk I/O error")
        await super().sync()


def test_a_failed_sync_on_the_receiving_side_aborts_the_link_and_acks_nothing() -> None:
    """The receiver confirms a persistent message only once it is durable; when the
    store's sync fails it sends no ACK and aborts the link, so the message stays on the
    sender, which forwards it again once the link is back (the duplicate window on the
    receiver keeps it stored once)."""
    with memory_network() as net:
        store = FailingSyncStore()
        b = net.add("B", store=store, persistent=True)
        a = net.add("A", connector("B", static_bridge=True,
                                   statically_included_destinations=("queue://d",)))
        net.start()
        a.wait_forwarding()
        connects = a.outbound()[0]["connects"]
        store.failing = True
        send(client(a), "/queue/d", "precious")
        a.wait_for(lambda: store.syncs_failed > 0, what="a failed sync on B")
        a.wait_for(lambda: a.outbound()[0]["link_ended"] is not None, what="the link aborted")
        assert a.outbound()[0]["acknowledged"] == 0
        assert a.queue_depth("d") == 1  # still here, not confirmed by B
        store.failing = False
        a.wait_for(lambda: a.outbound()[0]["connects"] > connects
                   and a.queue_depth("d") == 0, what="forwarded again and acked")
        assert b.queue_depth("d") == 1
        assert a.outbound()[0]["duplicates"] + a.outbound()[0]["acknowledged"] >= 1


@pytest.mark.parametrize(("ttl", "reaches"), [(1, False), (2, True)])
def test_network_ttl_bounds_how_far_demand_and_messages_go(ttl: int, reaches: bool) -> None:
    """A -> B -> C: a consumer on C is two hops from A; ``network_ttl = 1`` keeps it
    out of A's reach, ``network_ttl = 2`` brings A's messages to it through B."""
    with memory_network() as net:
        c = net.add("C")
        b = net.add("B", connector("C", network_ttl=ttl))
        a = net.add("A", connector("B", network_ttl=ttl))
        net.start()
        a.wait_forwarding()
        b.wait_forwarding()
        consumer = client(c)
        subscribe(consumer, "/topic/far")
        b.wait_for(lambda: b.outbound()[0]["demand"] == 1, what="demand on B")
        a.turn(50)  # time for demand to travel on, if it may
        assert (a.outbound()[0]["demand"] == 1) is reaches
        send(client(a), "/topic/far", "hello")
        if reaches:
            a.wait_for(lambda: bodies(consumer) == ["hello"], what="the message on C")
        else:
            consumer.expect_none(50)
