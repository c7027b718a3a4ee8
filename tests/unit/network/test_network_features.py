"""What a bridge between real brokers linked in memory (no sockets) does beyond plain
forwarding: the redelivered flag, network consumer priority, replay of stranded
messages, duplicate subscriptions in a mesh, named connectors, conduit subscriptions
and selectors, the link user's authorization, rate limits and bridge advisories."""

from __future__ import annotations

import json
import time

import pytest
from tests.support.memory_network import (
    LINK_USER,
    LoopStompClient,
    client,
    connector,
    memory_network,
    send,
    subscribe,
)

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
    User,
)
from meshmq.protocol.stomp.frames import Frame


def messages(c: LoopStompClient) -> list[Frame]:
    return [f for f in c.received() if f.command == "MESSAGE"]


def test_a_message_delivered_before_crosses_a_bridge_flagged_redelivered() -> None:
    """A message a consumer here received and never acknowledged, forwarded later to a
    consumer on the other broker, still says it may have been delivered before; a fresh
    one does not (the MESSAGES_AGAIN frame)."""
    with memory_network() as net:
        a, b = net.linked()
        local = client(a)
        subscribe(local, "/queue/again", ack="client-individual")
        producer = client(a)
        for i in range(3):
            send(producer, "/queue/again", f"seen-{i}")
        a.wait_for(lambda: len(local.bodies()) == 3, what="3 local deliveries")
        local.drop()  # never acknowledged: back on A's queue, delivered once
        remote = client(b)
        subscribe(remote, "/queue/again")
        a.wait_for(lambda: len(remote.bodies()) == 3, what="the 3 forwarded to B")
        send(producer, "/queue/again", "fresh")
        a.wait_for(lambda: len(remote.bodies()) == 4, what="a fresh one forwarded")
        flags = {m.body.decode(): m.get("redelivered") for m in messages(remote)}
        assert flags == {"seen-0": "true", "seen-1": "true", "seen-2": "true",
                         "fresh": None}, flags


def test_local_consumers_come_first_with_decreased_network_priority() -> None:
    with memory_network() as net:
        a, b = net.linked()
        remote, local = client(b), client(a)
        subscribe(remote, "/queue/prio")
        subscribe(local, "/queue/prio", ack="client-individual",
                  **{"activemq.prefetchSize": "50"})
        a.wait_for(lambda: a.consumers_on("prio") == 2, what="demand")
        producer = client(a)
        for i in range(60):
            send(producer, "/queue/prio", str(i), persistent="false")
        # The local consumer's window (50) fills first; only the overflow crosses.
        a.wait_for(lambda: len(local.bodies()) == 50 and len(remote.bodies()) == 10,
                   what="50 local, 10 remote")
        a.turn(20)
        assert len(local.bodies()) == 50 and len(remote.bodies()) == 10


@pytest.mark.parametrize("replay", [True, False])
def test_replay_when_no_consumers_or_stuck_without_it(replay: bool) -> None:
    """ActiveMQ's remedy (replay_when_no_consumers) with meshmq's redistribution off:
    with it, messages stranded on B go back to A where the consumer now is; without
    it (ActiveMQ's default) they stay stuck on B."""
    opts = {"redistribution": False, "replay_when_no_consumers": replay,
            "replay_delay_ms": 0}
    with memory_network() as net:
        a = net.add("A", connector("B", **opts))
        b = net.add("B", connector("A", **opts))
        net.start()
        a.wait_forwarding()
        b.wait_forwarding()
        on_b = client(b)
        subscribe(on_b, "/queue/stuck", ack="client-individual",
                  **{"activemq.prefetchSize": "1"})
        a.wait_for(lambda: a.consumers_on("stuck") == 1, what="demand on A")
        producer = client(a)
        for i in range(5):
            send(producer, "/queue/stuck", str(i))
        a.wait_for(lambda: b.queue_depth("stuck") == 5, what="all five on B")
        on_b.drop()
        on_a = client(a)
        subscribe(on_a, "/queue/stuck")
        a.wait_for(lambda: b.consumers_on("stuck") == 1, what="A's consumer known on B")
        send(client(b), "/queue/stuck", "marker")
        if replay:
            a.wait_for(lambda: len(on_a.bodies()) == 6, what="the stranded five and marker")
            assert sorted(on_a.bodies()) == ["0", "1", "2", "3", "4", "marker"]
        else:
            a.wait_for(lambda: on_a.bodies() == ["marker"], what="only the marker")
            # Stuck, as in ActiveMQ (depth 6 until B hears A's ack of the marker).
            a.wait_for(lambda: b.queue_depth("stuck") == 5, what="five stuck on B")
            a.turn(20)
            assert on_a.bodies() == ["marker"] and b.queue_depth("stuck") == 5


@pytest.mark.parametrize("suppress", [True, False])
def test_suppress_duplicate_queue_subscriptions_in_a_mesh(suppress: bool) -> None:
    with memory_network() as net:
        nodes = net.mesh("ABC", network_ttl=2, suppress_duplicate_queue_subscriptions=suppress)
        a = nodes["A"]
        subscribe(client(nodes["C"]), "/queue/sup")

        def demand_by_remote() -> dict[str, int]:
            return {s["remote_broker"]: s["demand"] for s in a.outbound()}
        # Direct route A -> C always; the two-hop route A -> B -> C only when not
        # suppressed.
        expected = {"B": 0, "C": 1} if suppress else {"B": 1, "C": 1}
        a.wait_for(lambda: demand_by_remote() == expected, what=f"demand {expected}")
        a.turn(50)
        assert demand_by_remote() == expected


def test_two_named_connectors_between_the_same_brokers() -> None:
    with memory_network() as net:
        b = net.add("B", auth=AuthConfig(anonymous_access=True,
                                         users=(User("bridge", "secret"),)))
        a = net.add("A",
                    connector("B", name="orders", username="bridge", password="secret",
                              dynamically_included_destinations=("queue://orders.>",)),
                    connector("B", name="billing", username="bridge", password="secret",
                              dynamically_included_destinations=("queue://billing.>",)))
        net.start()
        a.wait_forwarding(2)
        consumer = client(b)
        subscribe(consumer, "/queue/orders.1", "1")
        subscribe(consumer, "/queue/billing.1", "2")
        a.wait_for(lambda: sorted(s["demand"] for s in a.outbound()) == [1, 1],
                   what="demand split")
        producer = client(a)
        send(producer, "/queue/orders.1", "o")
        send(producer, "/queue/billing.1", "b")
        a.wait_for(lambda: sorted(consumer.bodies()) == ["b", "o"],
                   what="both connectors forwarding")
        by_name = {s["connector"]: s["forwarded"] for s in a.outbound()}
        assert by_name == {"orders": 1, "billing": 1}


def test_bridge_advisories_and_status_in_api_stat() -> None:
    with memory_network() as net:
        a = net.add("A", connector("B"))
        net.start()
        watcher = client(a)
        subscribe(watcher, "/topic/ActiveMQ.Advisory.NetworkBridge")
        a.wait_for(lambda: (a.outbound()[0]["last_error"] or {}).get("kind")
                   == "connection-refused", what="the refused connection in the status")
        b = net.add("B")
        b.start()
        a.wait_forwarding()

        def states() -> list[str]:
            return [json.loads(body)["state"] for body in watcher.bodies()]
        a.wait_for(lambda: "forwarding" in states(), what="a forwarding advisory")
        # Each retry after the refusal went connecting -> backing-off; the last one
        # made it through the handshake.
        assert states()[-4:] == ["connecting", "handshaking", "syncing-demand", "forwarding"]
        api = a.call(a.runtime.statistics)
        entry = api["network"]["bridges"][0]
        assert entry["state"] == "forwarding" and entry["remote_broker"] == "B"
        assert entry["direction"] == "outbound" and entry["connects"] == 1
        assert entry["attempts"] >= 2


@pytest.mark.parametrize(("conduit", "expected"), [(True, [15, 15]), (False, [10, 10, 10])])
def test_conduit_subscriptions_split_30_messages(conduit: bool, expected: list[int]) -> None:
    """A and B bridged A->B; one consumer on A, two on B, equal priority
    (decrease_network_consumer_priority off); 30 messages produced on A."""
    with memory_network() as net:
        a, b = net.linked(conduit_subscriptions=conduit,
                          decrease_network_consumer_priority=False)
        ca, cb1, cb2 = client(a), client(b), client(b)
        for c in (ca, cb1, cb2):
            subscribe(c, "/queue/Q.TEST")
        a.wait_for(lambda: a.consumers_on("Q.TEST") == (2 if conduit else 3),
                   what="local and network demand")
        producer = client(a)
        for i in range(30):
            send(producer, "/queue/Q.TEST", str(i))
        a.wait_for(lambda: sum(len(c.bodies()) for c in (ca, cb1, cb2)) == 30,
                   what="30 messages consumed")
        counts = [len(c.bodies()) for c in (ca, cb1, cb2)]
        if conduit:
            assert [counts[0], counts[1] + counts[2]] == expected, counts
        else:
            assert counts == expected, counts
        got = sorted(int(x) for c in (ca, cb1, cb2) for x in c.bodies())
        assert got == list(range(30))  # each exactly once


@pytest.mark.parametrize("conduit", [True, False])
def test_conduit_with_selectors_strands_and_conduit_off_fixes_it(conduit: bool) -> None:
    """A forwards to B and C; B's consumer wants red, C's wants blue. With conduit the
    selectors are dropped on A, so some blue messages go to B and strand there; with
    conduit off each colour reaches its consumer."""
    with memory_network() as net:
        b, c = net.add("B"), net.add("C")
        a = net.add("A", connector("", uri="static:(tcp://B:61616,tcp://C:61616)",
                                   conduit_subscriptions=conduit))
        net.start()
        a.wait_forwarding(2)
        red, blue = client(b), client(c)
        subscribe(red, "/queue/Q.SEL", selector="color = 'red'")
        subscribe(blue, "/queue/Q.SEL", selector="color = 'blue'")
        a.wait_for(lambda: a.consumers_on("Q.SEL") == 2, what="demand from B and C")
        producer = client(a)
        for i in range(10):
            # Five reds then five blues: round-robin over the two bridges cannot
            # line up with the colours, whichever bridge comes first.
            send(producer, "/queue/Q.SEL", str(i), color="red" if i < 5 else "blue")
        if not conduit:
            a.wait_for(lambda: len(red.bodies()) == 5 and len(blue.bodies()) == 5,
                       what="every message at its consumer")
            assert all(m.get("color") == "red" for m in messages(red))
            assert all(m.get("color") == "blue" for m in messages(blue))
            return

        def stranded() -> int:
            return b.queue_depth("Q.SEL") + c.queue_depth("Q.SEL")
        # Conduit: A round-robins between the two bridges whatever the colour, so some
        # messages land on the broker whose consumer does not want them.
        a.wait_for(lambda: stranded() > 0 and a.queue_depth("Q.SEL") == 0
                   and len(red.bodies()) + len(blue.bodies()) + stranded() == 10,
                   what="messages forwarded")
        assert len(red.bodies()) + len(blue.bodies()) == 10 - stranded()


# On broker B: the link's user may write orders.> only; the application reads everything.
B_AUTH = AuthConfig(
    anonymous_access=False,
    users=(User(LINK_USER.name, LINK_USER.password, ("network",)),
           User("app", "app-pw", ("apps",))),
    authorization=AuthorizationConfig(
        entries=(AuthorizationEntry(queue="orders.>", read=("apps",),
                                    write=("network", "apps"), admin=("network", "apps")),),
        default=AuthorizationRights(read=("apps",), write=("apps",), admin=("apps",))))


def test_only_demand_the_link_user_may_write_is_offered() -> None:
    """A bridge acts on the broker that accepted it as the user it logged in as: it is
    offered only the demand that user may write there."""
    with memory_network() as net:
        b = net.add("B", auth=B_AUTH)
        a = net.add("A", connector("B"))
        net.start()
        a.wait_forwarding()
        app = client(b, login="app", passcode="app-pw")
        subscribe(app, "/queue/orders.x", "1")
        subscribe(app, "/queue/secret", "2")
        a.wait_for(lambda: a.consumers_on("orders.x") == 1, what="demand for orders.x")
        producer = client(a)
        send(producer, "/queue/secret", "s1")
        send(producer, "/queue/orders.x", "o1")
        a.wait_for(lambda: app.bodies() == ["o1"], what="o1 on B")
        # No demand for secret was offered: it waits on A for a consumer there.
        a.turn(30)
        assert a.consumers_on("secret") == 0
        assert a.queue_depth("secret") == 1
        assert app.bodies() == ["o1"]


def test_a_wildcard_demand_forwards_what_it_may_and_keeps_the_rest() -> None:
    """A message the link user may not write is refused and stays where it was."""
    with memory_network() as net:
        b = net.add("B", auth=B_AUTH)
        a = net.add("A", connector("B"))
        net.start()
        a.wait_forwarding()
        app = client(b, login="app", passcode="app-pw")
        subscribe(app, "/queue/>")
        a.wait_for(lambda: a.outbound()[0]["demand"] >= 1, what="the wildcard demand on A")
        producer = client(a)
        send(producer, "/queue/secret", "s2")  # creates it on A: the wildcard covers it
        send(producer, "/queue/orders.y", "o2")
        a.wait_for(lambda: "o2" in app.bodies(), what="o2 on B")
        a.wait_for(lambda: a.outbound()[0]["refused"] >= 1, what="B refusing secret")
        assert "s2" not in app.bodies()
        a.wait_for(lambda: a.queue_depth("secret") == 1, what="s2 kept on A")
        stats = b.broker.statistics()
        assert stats["denied"]["by_user"].get(LINK_USER.name, 0) >= 1
        # Still forwarding what it may: a later order crosses.
        send(producer, "/queue/orders.z", "o3")
        a.wait_for(lambda: "o3" in app.bodies(), what="o3 on B")
        assert "s2" not in app.bodies()
        assert a.queue_depth("secret") == 1


def test_rate_limit_throttles_the_bridge() -> None:
    with memory_network() as net:
        a, b = net.linked(rate_limit=10, rate_duration_ms=500)
        consumer = client(b)
        subscribe(consumer, "/queue/slow")
        a.wait_for(lambda: a.consumers_on("slow") == 1, what="demand")
        producer = client(a)
        t0 = time.monotonic()
        for i in range(40):
            send(producer, "/queue/slow", str(i))
        a.wait_for(lambda: len(consumer.bodies()) >= 10, what="a first window")
        first = len(consumer.bodies())
        # 10 per 500 ms: the 11th waits for the window to roll over ...
        assert first == 10 or time.monotonic() - t0 >= 0.5 - 0.05, first
        a.wait_for(lambda: len(consumer.bodies()) == 40, timeout=30, what="all 40")
        # ... and 40 messages need at least three roll-overs.
        assert time.monotonic() - t0 >= 1.5 - 0.05
        assert sorted(int(x) for x in consumer.bodies()) == list(range(40))
