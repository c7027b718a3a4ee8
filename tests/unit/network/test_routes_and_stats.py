"""What every link of a broker shares, without a broker: the duplicate-route rule
(suppressDuplicateQueue/TopicSubscriptions keeps the shortest route to one real
consumer), replanning the other bridges when a route changes, and the counters and
rates an operator reads in ``meshmq stat``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from meshmq.config.model import NetworkConnectorConfig
from meshmq.core.destinations import Destination
from meshmq.network import routes as routes_module
from meshmq.network.interest import Demand
from meshmq.network.routes import NetworkRoutes
from meshmq.network.stats import RATE_WINDOW_S, LinkCounters, RateMeter

Q = Destination.parse_uri("queue://orders")
T = Destination.parse_uri("topic://prices")


class FakeForwarder:
    def __init__(self, *demands: Demand, **config: Any) -> None:
        self.config = NetworkConnectorConfig(uri="tcp://x:1", **config)
        self.demands = {d.key: (d, object()) for d in demands}
        self.replans = 0

    def replan(self) -> None:
        self.replans += 1


def demand(dest: Destination, path: tuple[str, ...], *origins: str,
           key: str = "k") -> Demand:
    return Demand(key, dest, None, -5, path, None, frozenset(origins))


def routes(*forwarders: FakeForwarder) -> NetworkRoutes:
    return NetworkRoutes(SimpleNamespace(), lambda: list(forwarders))  # type: ignore[arg-type]


def kept(me: FakeForwarder, *others: FakeForwarder, plan: Demand) -> bool:
    return plan.key in routes(me, *others).suppress_duplicates(me, {plan.key: plan})  # type: ignore[arg-type]


# ---------------------------------------------------------------- arrival times
def test_arrival_times_keep_at_least_the_latest_half_of_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_module, "ARRIVALS_KEPT", 10)
    clock = iter(range(1000))
    host = SimpleNamespace(broker=SimpleNamespace(now_ms=lambda: next(clock)))
    r = NetworkRoutes(host, tuple)  # type: ignore[arg-type]
    for i in range(12):
        r.arrived([f"m{i}"])
    # At most ARRIVALS_KEPT are remembered, never fewer than the latest half of it.
    known = [i for i in range(12) if r.arrival(f"m{i}") is not None]
    assert known[-5:] == [7, 8, 9, 10, 11] and len(known) <= 10
    assert r.arrival("m11") == 11 and r.arrival("m0") is None
    r.arrived(["m3"])
    assert r.arrival("m3") == 12  # arrived again: its latest time
    r.arrived(["m20", "m21"])  # a batch: one time for all of it
    assert r.arrival("m20") == r.arrival("m21") == 13


# ---------------------------------------------------------------- duplicate routes
@pytest.mark.parametrize(("dest", "flags", "suppressed"), [
    (Q, {}, False),  # queues: off by default (ActiveMQ's default)
    (Q, {"suppress_duplicate_queue_subscriptions": True}, True),
    (T, {}, True),  # topics: on by default
    (T, {"suppress_duplicate_topic_subscriptions": False}, False),
    (T, {"suppress_duplicate_queue_subscriptions": True,
         "suppress_duplicate_topic_subscriptions": False}, False),
])
def test_a_longer_route_to_a_consumer_served_directly_is_dropped_per_kind(
        dest: Destination, flags: dict[str, bool], suppressed: bool) -> None:
    direct = FakeForwarder(demand(dest, ("C",), "C/1"))
    me = FakeForwarder(**flags)
    assert kept(me, direct, plan=demand(dest, ("C", "B"), "C/1")) is not suppressed


def test_a_route_as_short_as_another_is_kept() -> None:
    other = FakeForwarder(demand(Q, ("C", "D"), "C/1"))
    me = FakeForwarder(suppress_duplicate_queue_subscriptions=True)
    assert kept(me, other, plan=demand(Q, ("C", "B"), "C/1"))


def test_a_route_is_kept_while_any_consumer_behind_it_has_no_shorter_one() -> None:
    other = FakeForwarder(demand(Q, ("C",), "C/1"))
    me = FakeForwarder(suppress_duplicate_queue_subscriptions=True)
    assert kept(me, other, plan=demand(Q, ("C", "B"), "C/1", "C/2"))
    both = FakeForwarder(demand(Q, ("C",), "C/1", "C/2"))
    assert not kept(me, both, plan=demand(Q, ("C", "B"), "C/1", "C/2"))


def test_a_demand_without_known_consumers_is_never_suppressed() -> None:
    other = FakeForwarder(demand(Q, ("C",), "C/1"))
    me = FakeForwarder(suppress_duplicate_queue_subscriptions=True)
    assert kept(me, other, plan=demand(Q, ("C", "B")))


def test_a_bridge_does_not_compete_with_its_own_demand() -> None:
    me = FakeForwarder(demand(Q, ("C",), "C/1"), suppress_duplicate_queue_subscriptions=True)
    assert kept(me, plan=demand(Q, ("C", "B"), "C/1"))


def test_a_changed_route_replans_the_other_bridges_that_suppress_duplicates() -> None:
    origin = FakeForwarder(suppress_duplicate_queue_subscriptions=True)
    suppressing = FakeForwarder(suppress_duplicate_queue_subscriptions=True)
    indifferent = FakeForwarder(suppress_duplicate_topic_subscriptions=False)
    routes(origin, suppressing, indifferent).demand_changed(origin)  # type: ignore[arg-type]
    assert (origin.replans, suppressing.replans, indifferent.replans) == (0, 1, 0)


def test_replanning_that_changes_routes_again_does_not_recurse() -> None:
    class Echo(FakeForwarder):
        def replan(self) -> None:
            super().replan()
            shared.demand_changed(self)  # type: ignore[arg-type]

    a, b = Echo(), Echo()
    shared = routes(a, b)
    shared.demand_changed(a)  # type: ignore[arg-type]
    assert (a.replans, b.replans) == (0, 1)


# ---------------------------------------------------------------- counters and rates
def test_a_rate_is_the_events_of_the_last_ten_seconds_per_second() -> None:
    meter = RateMeter()
    meter.add(5, now=100.2)
    meter.add(15, now=105.7)
    assert meter.rate(now=106.0) == 2.0
    assert meter.rate(now=109.9) == 2.0
    assert meter.rate(now=110.0) == 1.5  # second 100 is out of the window
    assert meter.rate(now=114.99) == 1.5
    assert meter.rate(now=115.0) == 0.0


def test_events_of_one_second_share_a_bucket_and_old_buckets_are_dropped() -> None:
    meter = RateMeter()
    for t in (1.0, 1.5, 1.9, 2.0):
        meter.add(1, now=t)
    assert list(meter.buckets) == [(1, 3), (2, 1)]
    meter.add(1, now=2 + RATE_WINDOW_S)
    assert list(meter.buckets) == [(2 + int(RATE_WINDOW_S), 1)]


def test_a_rate_is_rounded_to_a_tenth() -> None:
    meter = RateMeter()
    meter.add(1, now=50.0)
    meter.add(2, now=51.0)
    assert meter.rate(now=52.0) == 0.3


def test_link_counters_show_every_field_meshmq_stat_reads() -> None:
    counters = LinkCounters(forwarded=7, acknowledged=6, duplicates=1, dropped=2, refused=3,
                            received=4, received_duplicates=1, holds_sent=5,
                            holds_received=6)
    shown = counters.as_dict()
    assert {k: v for k, v in shown.items() if not k.endswith("_rate")} == {
        "forwarded": 7, "acknowledged": 6, "duplicates": 1, "dropped": 2, "refused": 3,
        "received": 4, "received_duplicates": 1, "holds_sent": 5, "holds_received": 6}
    assert shown["forward_rate"] == 0.0 and shown["receive_rate"] == 0.0
