"""Network connector options between real brokers linked in memory (no sockets), each
as an operator relies on it: messageTTL apart from consumerTTL, dynamicOnly,
bridgeTempDestinations, prefetchSize with a slow remote store, alwaysSyncSend, duplex
and statically included destinations, excluded topics, suppressed duplicate topic
routes in a mesh, and the rate limit's topic exemption."""

from __future__ import annotations

import asyncio

import pytest
from tests.support.memory_network import (
    LoopStompClient,
    NetworkBroker,
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

from meshmq.core.destinations import queue
from meshmq.store.memory import MemoryStore


def demand(broker: NetworkBroker) -> int:
    return sum(b["demand"] for b in broker.outbound())


class HeldSyncStore(MemoryStore):
    """A memory store whose sync waits while ``held`` (a slow disk on the remote)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False
        self.released: asyncio.Event | None = None

    async def sync(self) -> None:
        if self.held:
            if self.released is None:
                self.released = asyncio.Event()
            await self.released.wait()
        await super().sync()

    def release(self) -> None:
        self.held = False
        if self.released is not None:
            self.released.set()


# ---------------------------------------------------------------- TTLs
@pytest.mark.parametrize(("message_ttl", "reaches"), [(1, False), (2, True)])
def test_message_ttl_stops_messages_where_consumer_ttl_let_demand_through(
        message_ttl: int, reaches: bool) -> None:
    """A -> B -> C, consumer on C, consumer_ttl 2 everywhere: A holds demand for C's
    consumer either way; message_ttl 1 stops A's messages on B."""
    with memory_network() as net:
        c = net.add("C")
        b = net.add("B", connector("C", consumer_ttl=2, message_ttl=message_ttl))
        a = net.add("A", connector("B", consumer_ttl=2, message_ttl=message_ttl))
        net.start()
        a.wait_forwarding()
        b.wait_forwarding()
        consumer = client(c)
        subscribe(consumer, "/queue/far")
        a.wait_for(lambda: a.consumers_on("far") == 1, what="C's demand on A via B")
        send(client(a), "/queue/far", "hop")
        if reaches:
            a.wait_for(lambda: consumer.bodies() == ["hop"], what="the message on C")
        else:
            a.wait_for(lambda: b.queue_depth("far") == 1, what="the message kept on B")
            a.turn(30)
            assert consumer.bodies() == [] and b.queue_depth("far") == 1


# ---------------------------------------------------------------- which consumers count
@pytest.mark.parametrize("dynamic_only", [False, True])
def test_dynamic_only_decides_whether_an_offline_durable_subscriber_keeps_its_demand(
        dynamic_only: bool) -> None:
    with memory_network() as net:
        a, b = net.linked(dynamic_only=dynamic_only)
        sub = client(b, **{"client-id": "reader"})
        subscribe(sub, "/topic/news", "d", **{"activemq.subscriptionName": "news"})
        a.wait_for(lambda: demand(a) == 1, what="the durable's demand on A")
        sub.send("DISCONNECT")
        sub.wait_closed()
        if dynamic_only:
            a.wait_for(lambda: demand(a) == 0, what="the offline durable's demand gone")
        else:
            a.turn(30)
            assert demand(a) == 1
        send(client(a), "/topic/news", "while-away")
        back = client(b, **{"client-id": "reader"})
        subscribe(back, "/topic/news", "d", **{"activemq.subscriptionName": "news"})
        if dynamic_only:
            a.wait_for(lambda: demand(a) == 1, what="the demand back")
            back.expect_none(30)  # published while nobody on A kept it for B
        else:
            a.wait_for(lambda: back.bodies() == ["while-away"], what="the kept message")


@pytest.mark.parametrize("bridge_temp", [True, False])
def test_bridge_temp_destinations_decides_whether_temporary_consumers_are_advertised(
        bridge_temp: bool) -> None:
    with memory_network() as net:
        a, b = net.linked(bridge_temp_destinations=bridge_temp)
        c = client(b)
        subscribe(c, "/temp-queue/replies", "1")
        subscribe(c, "/queue/work", "2")
        a.wait_for(lambda: a.consumers_on("work") == 1, what="the plain queue's demand")
        a.wait_for(lambda: demand(a) == (2 if bridge_temp else 1), what="the demand")
        a.turn(20)
        assert demand(a) == (2 if bridge_temp else 1)


def test_advisory_topics_and_queue_browsers_create_no_demand() -> None:
    with memory_network() as net:
        a, b = net.linked()
        c = client(b)
        subscribe(c, "/topic/ActiveMQ.Advisory.Connection", "1")
        subscribe(c, "/queue/browsed", "2", browser="true")
        subscribe(c, "/queue/marker", "3")
        a.wait_for(lambda: a.consumers_on("marker") == 1, what="the marker's demand")
        a.turn(20)
        assert demand(a) == 1 and a.consumers_on("browsed") == 0


def test_a_composite_consumer_is_demand_on_each_of_its_destinations() -> None:
    with memory_network() as net:
        a, b = net.linked()
        c = client(b)
        subscribe(c, "/queue/left,/queue/right")
        a.wait_for(lambda: a.consumers_on("left") == 1 and a.consumers_on("right") == 1,
                   what="demand on both queues")
        producer = client(a)
        send(producer, "/queue/left", "l")
        send(producer, "/queue/right", "r")
        a.wait_for(lambda: sorted(c.bodies()) == ["l", "r"], what="both forwarded")


def test_a_wildcard_consumer_draws_every_queue_it_covers() -> None:
    with memory_network() as net:
        a, b = net.linked()
        c = client(b)
        subscribe(c, "/queue/orders.>")
        a.wait_for(lambda: demand(a) == 1, what="the wildcard demand")
        producer = client(a)
        for name in ("orders.eu", "orders.us.east", "billing"):
            send(producer, f"/queue/{name}", name)
        a.wait_for(lambda: sorted(c.bodies()) == ["orders.eu", "orders.us.east"],
                   what="the covered queues forwarded")
        assert a.queue_depth("billing") == 1


def test_an_excluded_topic_is_not_forwarded_while_the_others_are() -> None:
    with memory_network() as net:
        a, b = net.linked(excluded_destinations=("topic://internal.>",))
        c = client(b)
        subscribe(c, "/topic/internal.audit", "1")
        subscribe(c, "/topic/public", "2")
        a.wait_for(lambda: demand(a) == 1, what="demand for the public topic only")
        producer = client(a)
        send(producer, "/topic/internal.audit", "secret")
        send(producer, "/topic/public", "news")
        a.wait_for(lambda: c.bodies() == ["news"], what="the public message")
        a.turn(20)
        assert c.bodies() == ["news"]


# ---------------------------------------------------------------- flow and settlement
def test_prefetch_size_bounds_what_awaits_a_slow_remote_store() -> None:
    """Nothing is settled before the remote store synced it, and no more than
    prefetch_size messages are on their way meanwhile; once the store catches up,
    everything arrives, once."""
    with memory_network() as net:
        store = HeldSyncStore()
        b = net.add("B", store=store, persistent=True)
        a = net.add("A", connector("B", prefetch_size=5))
        net.start()
        a.wait_forwarding()
        consumer = client(b)
        subscribe(consumer, "/queue/slow")
        a.wait_for(lambda: a.consumers_on("slow") == 1, what="demand")
        store.held = True
        producer = client(a)
        for i in range(20):
            send(producer, "/queue/slow", str(i))
        a.wait_for(lambda: a.outbound()[0]["inflight"] == 5, what="a full window")
        a.turn(30)
        status = a.outbound()[0]
        assert (status["forwarded"], status["inflight"], status["acknowledged"]) == (5, 5, 0)
        assert a.queue_depth("slow") == 20  # none settled before B synced it
        store.release()
        a.wait_for(lambda: len(consumer.bodies()) == 20 and a.queue_depth("slow") == 0,
                   what="everything across and settled")
        assert sorted(consumer.bodies(), key=int) == [str(i) for i in range(20)]


@pytest.mark.parametrize("always_sync_send", [True, False])
def test_always_sync_send_decides_whether_non_persistent_messages_wait_for_the_remote(
        always_sync_send: bool) -> None:
    with memory_network() as net:
        a, b = net.linked(always_sync_send=always_sync_send)
        consumer = client(b)
        subscribe(consumer, "/queue/np")
        a.wait_for(lambda: a.consumers_on("np") == 1, what="demand")
        producer = client(a)
        for i in range(5):
            send(producer, "/queue/np", str(i), persistent="false")
        a.wait_for(lambda: len(consumer.bodies()) == 5 and a.queue_depth("np") == 0,
                   what="all five across and settled here")
        a.turn(10)
        status = a.outbound()[0]
        assert status["forwarded"] == 5
        # Settled by the remote's acknowledgement, or as soon as written to the link.
        assert status["acknowledged"] == (5 if always_sync_send else 0)


# ---------------------------------------------------------------- duplex and static
def test_a_duplex_link_forwards_back_to_the_broker_that_dialled() -> None:
    with memory_network() as net:
        b = net.add("B")  # no connector of its own
        a = net.add("A", connector("B", duplex=True))
        net.start()
        a.wait_forwarding()
        consumer = client(a)
        subscribe(consumer, "/queue/back")
        b.wait_for(lambda: b.consumers_on("back") == 1, what="A's demand on B")
        send(client(b), "/queue/back", "home")
        a.wait_for(lambda: consumer.bodies() == ["home"], what="B -> A over the duplex link")
        (inbound,) = [s for s in b.bridges() if s["direction"] == "inbound"]
        assert inbound["duplex"] and inbound["forwarded"] == 1 and inbound["demand"] == 1
        assert a.outbound()[0]["received"] == 1


def test_without_duplex_the_accepting_broker_forwards_nothing_back() -> None:
    with memory_network() as net:
        a, b = net.linked()
        consumer = client(a)
        subscribe(consumer, "/queue/back")
        send(client(b), "/queue/back", "stays")
        a.wait_for(lambda: b.queue_depth("back") == 1, what="the message on B")
        a.turn(30)
        assert b.consumers_on("back") == 0 and consumer.bodies() == []


def test_statically_included_destinations_are_forwarded_only_by_the_connectors_owner() -> None:
    with memory_network() as net:
        a, b = net.linked(duplex=True,
                          statically_included_destinations=("queue://audit",))
        send(client(a), "/queue/audit", "from-a")
        send(client(b), "/queue/audit", "from-b")
        a.wait_for(lambda: b.queue_depth("audit") == 2 and a.queue_depth("audit") == 0,
                   what="A's audit message moved to B")
        a.turn(30)
        assert b.queue_depth("audit") == 2  # B's stays: the duplex end has no static list


def test_topics_are_not_rate_limited_while_queues_are() -> None:
    with memory_network() as net:
        a, b = net.linked(rate_limit=1, rate_duration_ms=600_000)
        consumer = client(b)
        subscribe(consumer, "/topic/ticks", "1")
        subscribe(consumer, "/queue/jobs", "2")
        a.wait_for(lambda: demand(a) == 2, what="topic and queue demand")
        producer = client(a)
        for i in range(10):
            send(producer, "/topic/ticks", f"t{i}")
            send(producer, "/queue/jobs", f"j{i}")
        a.wait_for(lambda: sum(x.startswith("t") for x in consumer.bodies()) == 10,
                   what="every topic message")
        a.turn(30)
        # One queue message per ten minutes: the rest wait on A for local consumers.
        assert [x for x in consumer.bodies() if x.startswith("j")] == ["j0"]
        assert a.queue_depth("jobs") == 9


# ---------------------------------------------------------------- routes in a mesh
@pytest.mark.parametrize("suppress", [True, False])
def test_suppress_duplicate_topic_subscriptions_in_a_mesh(suppress: bool) -> None:
    with memory_network() as net:
        nodes = net.mesh("ABC", network_ttl=2, suppress_duplicate_topic_subscriptions=suppress)
        a = nodes["A"]
        sub = client(nodes["C"])
        subscribe(sub, "/topic/sup")

        def demand_by_remote() -> dict[str, int]:
            return {s["remote_broker"]: s["demand"] for s in a.outbound()}
        expected = {"B": 0, "C": 1} if suppress else {"B": 1, "C": 1}
        a.wait_for(lambda: demand_by_remote() == expected, what=f"demand {expected}")
        send(client(a), "/topic/sup", "once")
        a.wait_for(lambda: sub.bodies() == ["once"], what="the message on C")
        a.turn(30)
        assert sub.bodies() == ["once"]  # the duplicate window catches a second route


def messages_of(c: LoopStompClient) -> list[str]:
    return c.bodies()


def test_a_consumer_with_a_selector_behind_a_bridge_without_conduit_gets_only_matches() -> None:
    with memory_network() as net:
        a, b = net.linked(conduit_subscriptions=False)
        c = client(b)
        subscribe(c, "/queue/sel", selector="kind = 'wanted'")
        a.wait_for(lambda: a.consumers_on("sel") == 1, what="demand with the selector")
        producer = client(a)
        send(producer, "/queue/sel", "no", kind="other")
        send(producer, "/queue/sel", "yes", kind="wanted")
        a.wait_for(lambda: messages_of(c) == ["yes"], what="only the match")
        a.turn(20)
        assert a.queue_depth("sel") == 1 and b.queue_depth("sel") == 0
        spec = next(iter(a.broker.queues[queue("sel")].consumers)).spec
        assert spec.selector == "kind = 'wanted'" and spec.network_path == ("B",)
