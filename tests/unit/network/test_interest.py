"""Demand planning from remote interest (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.model import NetworkConnectorConfig
from meshmq.core.destinations import Destination
from meshmq.network.interest import DestinationFilter, InterestItem, plan_demand

Q = Destination.parse_uri("queue://orders")
T = Destination.parse_uri("topic://prices")


def items(*specs: InterestItem) -> dict[str, InterestItem]:
    return {i.id: i for i in specs}


def cfg(**kw: object) -> NetworkConnectorConfig:
    return NetworkConnectorConfig(uri="tcp://x:1", **kw)  # type: ignore[arg-type]


def test_conduit_merges_queue_consumers_and_drops_selectors() -> None:
    plan = plan_demand(items(InterestItem("c1", Q, "a = 1"), InterestItem("c2", Q, "b = 2")),
                       cfg(), local="A", remote="B")
    assert len(plan) == 1
    (demand,) = plan.values()
    assert demand.selector is None and demand.path == ("B",) and demand.priority == -5


def test_without_conduit_one_demand_per_consumer_with_its_selector() -> None:
    plan = plan_demand(items(InterestItem("c1", Q, "a = 1"), InterestItem("c2", Q, "b = 2")),
                       cfg(conduit_subscriptions=False), local="A", remote="B")
    assert sorted(d.selector or "" for d in plan.values()) == ["a = 1", "b = 2"]


def test_topics_always_merge_and_or_their_selectors() -> None:
    plan = plan_demand(items(InterestItem("c1", T, "a = 1"), InterestItem("c2", T, "b = 2")),
                       cfg(conduit_subscriptions=False), local="A", remote="B")
    assert [d.selector for d in plan.values()] == ["(a = 1) OR (b = 2)"]
    plan = plan_demand(items(InterestItem("c1", T, "a = 1"), InterestItem("c2", T, None)),
                       cfg(), local="A", remote="B")
    assert [d.selector for d in plan.values()] == [None]


def test_consumer_ttl_and_loops() -> None:
    far = InterestItem("c1", Q, None, path=("C",))
    assert plan_demand(items(far), cfg(), local="A", remote="B") == {}  # TTL 1
    assert len(plan_demand(items(far), cfg(network_ttl=2), local="A", remote="B")) == 1
    assert len(plan_demand(items(far), cfg(network_ttl=-1), local="A", remote="B")) == 1
    back = InterestItem("c1", Q, None, path=("A",))
    assert plan_demand(items(back), cfg(network_ttl=5), local="A", remote="B") == {}


def test_priority_prefers_local_consumers_unless_disabled() -> None:
    near = InterestItem("c1", Q, None)
    assert next(iter(plan_demand(items(near), cfg(network_ttl=3), local="A",
                                 remote="B").values())).priority == -5
    two = InterestItem("c2", Q, None, path=("C",))
    assert next(iter(plan_demand(items(two), cfg(network_ttl=3, conduit_subscriptions=False),
                                 local="A", remote="B").values())).priority == -6
    assert next(iter(plan_demand(items(near), cfg(decrease_network_consumer_priority=False),
                                 local="A", remote="B").values())).priority == 0


def test_durable_topic_demand_has_a_stable_name_and_static_destinations() -> None:
    plan = plan_demand(items(InterestItem("d", T, None, durable=True)), cfg(),
                       local="A", remote="B", static=(Q,))
    names = {d.destination: d.durable_name for d in plan.values()}
    assert names == {T: "NC-DS_B_prices", Q: None}


def test_filter_excludes_first_then_includes() -> None:
    flt = DestinationFilter(excluded=(Destination.parse_uri("queue://orders.secret"),),
                            dynamically_included=(Destination.parse_uri("queue://orders.>"),))
    assert flt.permits(Destination.parse_uri("queue://orders.eu"))
    assert not flt.permits(Destination.parse_uri("queue://orders.secret"))
    assert not flt.permits(Destination.parse_uri("queue://billing"))
    assert not flt.permits(Destination.parse_uri("topic://ActiveMQ.Advisory.Consumer.Queue.x"))
    assert flt.permits(Destination.parse_uri("queue://orders.>"))  # a wildcard consumer
    assert DestinationFilter.from_json(flt.to_json()) == flt


@given(st.lists(st.tuples(st.sampled_from([Q, T]), st.sampled_from([None, "x = 1"]),
                          st.lists(st.sampled_from("ABCD"), max_size=3)), max_size=12),
       st.booleans(), st.integers(-1, 3).filter(lambda n: n != 0))
def test_plan_never_routes_interest_through_a_loop(specs, conduit, ttl) -> None:
    its = items(*(InterestItem(f"c{i}", d, s, tuple(p)) for i, (d, s, p) in enumerate(specs)))
    plan = plan_demand(its, cfg(conduit_subscriptions=conduit, network_ttl=ttl),
                       local="A", remote="B")
    for demand in plan.values():
        assert "A" not in demand.path and demand.path[-1] == "B"
        assert demand.path.count("B") == 1
        if ttl >= 0:
            assert len(demand.path) - 1 < ttl
