"""Loops in a ring of real brokers linked in memory (no sockets): A -> B -> C -> D -> A.
Broker paths keep every message and every consumer's interest from going round the
ring again, whatever the TTL, and the TTL bounds how far round they go."""

from __future__ import annotations

from collections import Counter

import pytest
from tests.support.memory_network import (
    MemoryNetwork,
    NetworkBroker,
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

RING = "ABCD"


def ring(net: MemoryNetwork, ttl: int) -> dict[str, NetworkBroker]:
    nodes = {n: net.add(n, connector(RING[(i + 1) % len(RING)], network_ttl=ttl))
             for i, n in enumerate(RING)}
    net.start()
    for node in nodes.values():
        node.wait_forwarding()
    return nodes


def settled(nodes: dict[str, NetworkBroker]) -> bool:
    return all(b["inflight"] == 0 for n in nodes.values() for b in n.bridges())


def test_topic_messages_go_once_round_an_unlimited_ring_and_never_back() -> None:
    with memory_network() as net:
        nodes = ring(net, ttl=-1)
        subs = {n: client(node) for n, node in nodes.items()}
        for sub in subs.values():
            subscribe(sub, "/topic/round")
        a = nodes["A"]
        # D's subscriber is three hops from A; its interest reaches A the long way.
        a.wait_for(lambda: all(node.outbound()[0]["demand"] == 1 for n, node in
                               nodes.items() if n != "D"), what="demand round the ring")
        producer = client(a)
        for i in range(20):
            send(producer, "/topic/round", str(i))
        a.wait_for(lambda: all(len(s.bodies()) >= 20 for s in subs.values())
                   and settled(nodes), what="every subscriber served")
        a.turn(50)
        for sub in subs.values():
            assert Counter(sub.bodies()) == Counter(str(i) for i in range(20))
        forwarded = {n: node.outbound()[0]["forwarded"] for n, node in nodes.items()}
        assert forwarded == {"A": 20, "B": 20, "C": 20, "D": 0}  # D -> A: A is on the path
        # D holds demand for A's subscriber (a message published on D goes there), but
        # nothing A published went back to it.
        assert nodes["D"].outbound()[0]["demand"] == 1
        (from_d,) = [b for b in nodes["A"].bridges() if b["direction"] == "inbound"]
        assert from_d["remote_broker"] == "D" and from_d["received"] == 0


def test_queue_messages_cross_the_ring_to_the_one_consumer_once() -> None:
    with memory_network() as net:
        nodes = ring(net, ttl=-1)
        consumer = client(nodes["D"])
        subscribe(consumer, "/queue/far")
        a = nodes["A"]
        a.wait_for(lambda: a.consumers_on("far") == 1, what="D's demand on A")
        assert nodes["D"].consumers_on("far") == 1  # the consumer itself, no loop demand
        producer = client(a)
        for i in range(30):
            send(producer, "/queue/far", str(i))
        a.wait_for(lambda: len(consumer.bodies()) == 30 and settled(nodes),
                   what="all thirty on D")
        a.turn(30)
        assert sorted(consumer.bodies(), key=int) == [str(i) for i in range(30)]
        assert all(node.queue_depth("far") == 0 for node in nodes.values())


@pytest.mark.parametrize(("ttl", "reaches"), [(2, False), (3, True)])
def test_the_ttl_bounds_how_far_round_the_ring_a_message_goes(ttl: int,
                                                              reaches: bool) -> None:
    """D is three hops from A."""
    with memory_network() as net:
        nodes = ring(net, ttl=ttl)
        near, far = client(nodes["C"]), client(nodes["D"])
        subscribe(near, "/topic/hops")
        subscribe(far, "/topic/hops")
        a = nodes["A"]
        a.wait_for(lambda: nodes["B"].outbound()[0]["demand"] == 1, what="C's demand on B")
        a.turn(50)
        send(client(a), "/topic/hops", "x")
        a.wait_for(lambda: near.bodies() == ["x"], what="C, two hops away")
        if reaches:
            a.wait_for(lambda: far.bodies() == ["x"], what="D, three hops away")
        else:
            a.turn(50)
            assert far.bodies() == []
