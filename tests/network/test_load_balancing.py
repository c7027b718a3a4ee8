"""The seeds' load-balancing examples with real broker processes: conduit
subscriptions (15/15 vs 10/10/10) and conduit + selectors stranding a message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.stomp_helpers import uid
from tests.support.brokers import poll
from tests.support.network import Node


@pytest.mark.parametrize(("conduit", "expected"), [(True, [15, 15]), (False, [10, 10, 10])])
def test_seed_example_30_messages(tmp_path: Path, client, conduit: bool,
                                  expected: list[int]) -> None:
    """Seed 003: A and B bridged A->B; one consumer on A, two on B, equal priority
    (decreaseNetworkConsumerPriority=false, as in the seed's ActiveMQ version); 30
    messages produced on A."""
    b = Node("B", tmp_path / "b").start()
    a = Node("A", tmp_path / "a").connect_to(
        f"static:({b.uri})", conduit_subscriptions=conduit,
        decrease_network_consumer_priority=False).start()
    try:
        a.wait_forwarding()
        q = uid("Q.TEST")
        ca, cb1, cb2 = client(on=a), client(on=b), client(on=b)
        for c in (ca, cb1, cb2):
            c.subscribe(f"/queue/{q}")
        a.wait_consumers(q, 2 if conduit else 3)  # local + network demand
        producer = client(on=a)
        for i in range(30):
            producer.send(f"/queue/{q}", str(i), {"persistent": "true"})
        poll(lambda: sum(len(c.listener.messages) for c in (ca, cb1, cb2)) == 30,
             what="30 messages consumed")
        counts = [len(c.listener.messages) for c in (ca, cb1, cb2)]
        if conduit:
            assert [counts[0], counts[1] + counts[2]] == expected, counts
        else:
            assert counts == expected, counts
        bodies = sorted(int(m.body) for c in (ca, cb1, cb2) for m in c.listener.messages)
        assert bodies == list(range(30))  # each exactly once
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("conduit", [True, False])
def test_conduit_with_selectors_strands_and_conduit_off_fixes_it(
        tmp_path: Path, client, conduit: bool) -> None:
    """A forwards to B and C; B's consumer wants red, C's wants blue. With conduit the
    selectors are dropped on A, so some blue messages go to B and strand there; with
    conduit off each colour reaches its consumer."""
    b = Node("B", tmp_path / "b").start()
    c = Node("C", tmp_path / "c").start()
    a = Node("A", tmp_path / "a").connect_to(f"static:({b.uri},{c.uri})",
                                             conduit_subscriptions=conduit).start()
    try:
        a.wait_forwarding(2)
        q = uid("Q.SEL")
        red, blue = client(on=b), client(on=c)
        red.subscribe(f"/queue/{q}", headers={"selector": "color = 'red'"})
        blue.subscribe(f"/queue/{q}", headers={"selector": "color = 'blue'"})
        a.wait_consumers(q, 2)
        producer = client(on=a)
        for i in range(10):
            # Five reds then five blues: round-robin over the two bridges cannot
            # line up with the colours, whichever bridge comes first.
            producer.send(f"/queue/{q}", f"{i}", {"color": "red" if i < 5 else "blue",
                                                  "persistent": "true"})
        if not conduit:
            poll(lambda: len(red.listener.messages) == 5 and len(blue.listener.messages) == 5,
                 what="every message at its consumer")
            assert all(m.headers["color"] == "red" for m in red.listener.messages)
            return
        # Conduit: A round-robins between the two bridges whatever the colour, so half
        # the messages land on the broker whose consumer does not want them.
        poll(lambda: b.destination(q)["depth"] + c.destination(q)["depth"] > 0
             and a.destination(q)["depth"] == 0
             and len(red.listener.messages) + len(blue.listener.messages)
             + b.destination(q)["depth"] + c.destination(q)["depth"] == 10,
             what="messages forwarded")
        stranded = b.destination(q)["depth"] + c.destination(q)["depth"]
        assert stranded > 0
        assert len(red.listener.messages) + len(blue.listener.messages) == 10 - stranded
    finally:
        a.stop()
        b.stop()
        c.stop()
