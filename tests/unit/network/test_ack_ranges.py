"""Settlements as ranges (ACK_RANGES, the ``ack-ranges`` feature) between real brokers
linked in memory: used only when both ends list the feature, so a broker of an older
version, which neither offers nor reads it, still links and gets ACKS; and whatever the
frame, every status (STORED, DUPLICATE after a lost link, REFUSED) settles as before."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from tests.support.memory_network import (
    LINK_USER,
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
from meshmq.network import bridge as bridge_module
from meshmq.network import endpoint as endpoint_module
from meshmq.network import responder as responder_module
from meshmq.protocol.wire import FEATURE_ACK_RANGES, FEATURES

OLD_FEATURES = tuple(f for f in FEATURES if f != FEATURE_ACK_RANGES)

# (initiator lists ack-ranges, responder lists it): the other combinations stand for a
# broker of a version before the feature on either side.
SIDES = [(True, True), (True, False), (False, True), (False, False)]


def offer(monkeypatch: pytest.MonkeyPatch, initiator: bool, responder: bool) -> Counter[str]:
    """Make each end list ``ack-ranges`` or not; count the settlement frames read."""
    monkeypatch.setattr(bridge_module, "FEATURES", FEATURES if initiator else OLD_FEATURES)
    monkeypatch.setattr(responder_module, "FEATURES", FEATURES if responder else OLD_FEATURES)
    seen: Counter[str] = Counter()

    def counting(name: str, decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapper(frame: Any) -> Any:
            seen[name] += 1
            return decode(frame)
        return wrapper
    monkeypatch.setattr(endpoint_module, "decode_acks",
                        counting("ACKS", endpoint_module.decode_acks))
    monkeypatch.setattr(endpoint_module, "decode_ack_ranges",
                        counting("ACK_RANGES", endpoint_module.decode_ack_ranges))
    return seen


@pytest.mark.parametrize(("initiator", "responder"), SIDES)
def test_both_directions_settle_in_the_frame_both_ends_know(
        monkeypatch: pytest.MonkeyPatch, initiator: bool, responder: bool) -> None:
    seen = offer(monkeypatch, initiator, responder)
    with memory_network() as net:
        a, b = net.linked(duplex=True)
        on_a, on_b = client(a), client(b)
        subscribe(on_b, "/queue/east")
        subscribe(on_a, "/queue/west")
        a.wait_for(lambda: a.consumers_on("east") == 1 and b.consumers_on("west") == 1,
                   what="demand both ways")
        from_a, from_b = client(a), client(b)
        for i in range(300):
            send(from_a, "/queue/east", f"e{i}", persistent=str(i % 3 == 0).lower())
            send(from_b, "/queue/west", f"w{i}", persistent=str(i % 3 == 0).lower())
        want_east, want_west = [f"e{i}" for i in range(300)], [f"w{i}" for i in range(300)]
        a.wait_for(lambda: on_b.bodies() == want_east and on_a.bodies() == want_west,
                   what="every message across, in order, once")
        # A's bridge and B's side of it (duplex: B forwards over the same link).
        a.wait_for(lambda: a.bridges()[0]["inflight"] == 0 and
                   b.bridges()[0]["inflight"] == 0, what="everything settled")
        for broker in (a, b):
            (link,) = broker.bridges()
            assert link["acknowledged"] == link["forwarded"] == 300
            assert broker.queue_depth("east") == broker.queue_depth("west") == 0
    both = initiator and responder
    assert seen["ACK_RANGES" if both else "ACKS"] > 0
    assert seen["ACKS" if both else "ACK_RANGES"] == 0


@pytest.mark.parametrize(("initiator", "responder"), [(True, True), (False, True)])
def test_messages_forwarded_again_after_a_lost_link_settle_as_duplicates(
        monkeypatch: pytest.MonkeyPatch, initiator: bool, responder: bool) -> None:
    """The link breaks with acknowledgements on the wire: what B had stored comes again,
    B answers DUPLICATE (in a run of its own among the STORED), each delivered once."""
    offer(monkeypatch, initiator, responder)
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
        a.wait_for(lambda: a.outbound()[0]["connects"] == 2, what="the bridge reconnected")
        a.wait_for(lambda: a.queue_depth("cut") == 0 and b.queue_depth("cut") == 0
                   and a.outbound()[0]["inflight"] == 0 and len(consumer.bodies()) >= total,
                   timeout=30, what="both queues drained")
        a.turn(50)
        assert sorted(consumer.bodies(), key=int) == [str(i) for i in range(total)]


B_AUTH = AuthConfig(
    anonymous_access=False,
    users=(User(LINK_USER.name, LINK_USER.password, ("network",)),
           User("app", "app-pw", ("apps",))),
    authorization=AuthorizationConfig(
        entries=(AuthorizationEntry(queue="orders.>", read=("apps",),
                                    write=("network", "apps"), admin=("network", "apps")),),
        default=AuthorizationRights(read=("apps",), write=("apps",), admin=("apps",))))


@pytest.mark.parametrize(("initiator", "responder"), [(True, True), (True, False)])
def test_refusals_inside_a_run_of_stored_stay_and_the_rest_crosses(
        monkeypatch: pytest.MonkeyPatch, initiator: bool, responder: bool) -> None:
    """One batch answered STORED, REFUSED, STORED, ...: the refused go back to A's
    queue uncounted, the others are settled."""
    offer(monkeypatch, initiator, responder)
    with memory_network() as net:
        b = net.add("B", auth=B_AUTH)
        a = net.add("A", connector("B"))
        net.start()
        a.wait_forwarding()
        app = client(b, login="app", passcode="app-pw")
        subscribe(app, "/queue/>")
        a.wait_for(lambda: a.outbound()[0]["demand"] >= 1, what="the wildcard demand on A")
        producer = client(a)
        send(producer, "/queue/secret", "s0")  # the queue exists before the batch
        a.wait_for(lambda: a.outbound()[0]["refused"] >= 1, what="B refusing secret")
        for i in range(1, 6):
            send(producer, "/queue/orders.r", f"o{i}")
            send(producer, "/queue/secret", f"s{i}")
        a.wait_for(lambda: app.bodies() == [f"o{i}" for i in range(1, 6)],
                   what="the orders on B")
        a.wait_for(lambda: a.queue_depth("secret") == 6 and
                   a.outbound()[0]["inflight"] == 0, what="the secrets kept on A")
        assert not any(x.startswith("s") for x in app.bodies())
