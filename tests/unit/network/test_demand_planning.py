"""From a remote broker's interest to the demand subscriptions a bridge holds (pure):
consumerTTL against networkTTL, priorities by hops, conduit merging, durable network
subscriptions, static destinations; the include/exclude filter a connector applies to
what it advertises; and the interest items and filters as they travel in frames."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.model import NetworkConnectorConfig
from meshmq.core.destinations import Destination
from meshmq.errors import RemoteProtocolError
from meshmq.network.interest import Demand, DestinationFilter, InterestItem, plan_demand

Q = Destination.parse_uri("queue://orders")
T = Destination.parse_uri("topic://prices")


def d(uri: str) -> Destination:
    return Destination.parse_uri(uri)


def cfg(**kw: object) -> NetworkConnectorConfig:
    return NetworkConnectorConfig(uri="tcp://x:1", **kw)  # type: ignore[arg-type]


def plan(*items: InterestItem, static: tuple[Destination, ...] = (),
         **kw: object) -> dict[str, Demand]:
    return plan_demand({i.id: i for i in items}, cfg(**kw), local="A", remote="B",
                       static=static)


def only(demands: dict[str, Demand]) -> Demand:
    (demand,) = demands.values()
    return demand


# ---------------------------------------------------------------- TTLs and loops
@pytest.mark.parametrize(("network_ttl", "consumer_ttl", "hops", "planned"), [
    (1, None, 0, True), (1, None, 1, False),  # consumerTTL follows networkTTL
    (1, 3, 2, True), (1, 3, 3, False),  # a larger consumerTTL lets interest travel on
    (3, 1, 1, False),  # a smaller one stops it, whatever networkTTL says
    (3, -1, 7, True),  # -1: unlimited
])
def test_consumer_ttl_bounds_the_hops_interest_may_have_crossed(
        network_ttl: int, consumer_ttl: int | None, hops: int, planned: bool) -> None:
    path = tuple(f"X{i}" for i in range(hops))
    demands = plan(InterestItem("c", Q, path=path), network_ttl=network_ttl,
                   consumer_ttl=consumer_ttl)
    assert bool(demands) is planned


def test_interest_that_passed_through_the_remote_itself_is_a_loop() -> None:
    assert plan(InterestItem("c", Q, path=("C", "B")), network_ttl=-1) == {}


def test_a_demand_path_is_the_interest_path_followed_by_the_remote() -> None:
    demand = only(plan(InterestItem("c", Q, path=("D", "C")), network_ttl=3))
    assert demand.path == ("D", "C", "B")


# ---------------------------------------------------------------- priorities
def test_the_priority_base_is_configurable_and_falls_with_each_hop() -> None:
    near = only(plan(InterestItem("c", Q), consumer_priority_base=-10))
    far = only(plan(InterestItem("c", Q, path=("C", "D")), consumer_priority_base=-10,
                    network_ttl=3))
    assert (near.priority, far.priority) == (-10, -12)


def test_a_merged_demand_takes_the_route_and_priority_of_its_nearest_consumer() -> None:
    demand = only(plan(InterestItem("far", Q, path=("C",)), InterestItem("near", Q),
                       network_ttl=2))
    assert (demand.priority, demand.path) == (-5, ("B",))


def test_without_decreasing_priority_every_demand_is_equal_to_local_consumers() -> None:
    demands = plan(InterestItem("c1", Q, path=("C",)), InterestItem("c2", T),
                   static=(d("queue://audit"),), network_ttl=2,
                   decrease_network_consumer_priority=False)
    assert {x.priority for x in demands.values()} == {0}


# ---------------------------------------------------------------- merging
def test_a_conduit_demand_stands_for_every_consumer_behind_it() -> None:
    demand = only(plan(InterestItem("c1", Q, origins=("B/1",)),
                       InterestItem("c2", Q, origins=("B/2", "C/9"))))
    assert demand.origins == frozenset({"B/1", "B/2", "C/9"})


def test_without_conduit_queue_demands_are_per_consumer_and_per_destination() -> None:
    other = d("queue://billing")
    demands = plan(InterestItem("c1", Q, "x = 1"), InterestItem("c2", Q),
                   InterestItem("c3", other), conduit_subscriptions=False)
    assert sorted((str(x.destination), x.selector or "") for x in demands.values()) == [
        ("queue://billing", ""), ("queue://orders", ""), ("queue://orders", "x = 1")]


def test_equal_topic_selectors_are_not_repeated_in_the_merged_selector() -> None:
    demand = only(plan(InterestItem("c1", T, "a = 1"), InterestItem("c2", T, "a = 1"),
                       InterestItem("c3", T, "b = 2")))
    assert demand.selector == "(a = 1) OR (b = 2)"


def test_one_topic_selector_is_kept_as_written() -> None:
    assert only(plan(InterestItem("c1", T, "region = 'eu'"))).selector == "region = 'eu'"


@pytest.mark.parametrize(("durables", "name"), [((False, False), None),
                                                ((False, True), "NC-DS_B_prices"),
                                                ((True, True), "NC-DS_B_prices")])
def test_a_topic_demand_is_a_durable_subscription_when_any_subscriber_behind_it_is(
        durables: tuple[bool, bool], name: str | None) -> None:
    demand = only(plan(*(InterestItem(f"c{i}", T, durable=x)
                         for i, x in enumerate(durables))))
    assert demand.durable_name == name


def test_a_durable_queue_interest_makes_no_durable_subscription() -> None:
    assert only(plan(InterestItem("c", Q, durable=True))).durable_name is None


def test_same_subscription_ignores_only_who_is_behind_a_demand() -> None:
    base = Demand("k", Q, None, -5, ("B",), None, frozenset({"B/1"}))
    assert base.same_subscription(Demand("k", Q, None, -5, ("B",), None,
                                         frozenset({"B/1", "B/2"})))
    for changed in (Demand("k", Q, "x = 1", -5, ("B",), None),
                    Demand("k", Q, None, -6, ("B",), None),
                    Demand("k", Q, None, -5, ("C", "B"), None),
                    Demand("k", T, None, -5, ("B",), None),
                    Demand("k", Q, None, -5, ("B",), "NC-DS_B_orders")):
        assert not base.same_subscription(changed)


# ---------------------------------------------------------------- static destinations
def test_static_destinations_are_planned_without_any_interest() -> None:
    demands = plan(static=(d("queue://audit"), d("topic://events")))
    assert {(str(x.destination), x.selector, x.path, x.priority)
            for x in demands.values()} == {("queue://audit", None, ("B",), -5),
                                           ("topic://events", None, ("B",), -5)}


# ---------------------------------------------------------------- any interest
interest = st.lists(st.tuples(
    st.sampled_from([Q, T, d("queue://billing")]), st.sampled_from([None, "x = 1", "y = 2"]),
    st.lists(st.sampled_from("CDE"), max_size=2, unique=True), st.booleans()), max_size=10)


@given(interest, st.booleans())
def test_queues_get_one_demand_per_destination_with_conduit_and_topics_always(
        specs: list[tuple[Destination, str | None, list[str], bool]], conduit: bool) -> None:
    items = [InterestItem(f"c{i}", dest, sel, tuple(path), durable)
             for i, (dest, sel, path, durable) in enumerate(specs)]
    demands = plan(*items, conduit_subscriptions=conduit, network_ttl=3)
    per_dest: dict[Destination, int] = {}
    for demand in demands.values():
        per_dest[demand.destination] = per_dest.get(demand.destination, 0) + 1
    for dest, count in per_dest.items():
        if dest.is_topic or conduit:
            assert count == 1
        else:
            assert count == sum(1 for i in items if i.destination == dest)
    assert set(per_dest) == {i.destination for i in items}
    for demand in demands.values():
        if demand.destination.is_topic:
            behind = [i for i in items if i.destination == demand.destination]
            assert (demand.selector is None) == any(i.selector is None for i in behind)
            assert (demand.durable_name is not None) == any(i.durable for i in behind)


# ---------------------------------------------------------------- the connector's filter
@pytest.mark.parametrize(("dest", "permitted"), [
    ("queue://a.b", False),  # excluded: '*' is one segment
    ("queue://a.b.c", True),  # ... so a deeper name is not
    ("topic://a.b", True),  # a queue pattern never covers a topic
    ("queue://keep.x", True),
])
def test_an_exclusion_matches_by_kind_and_segments(dest: str, permitted: bool) -> None:
    flt = DestinationFilter(excluded=(d("queue://a.*"),))
    assert flt.permits(d(dest)) is permitted


@pytest.mark.parametrize(("dest", "permitted"), [
    ("topic://prices.eu", True), ("topic://prices", False), ("queue://prices.eu", False),
    ("topic://prices.>", True),  # a wildcard subscriber named by the pattern itself
])
def test_an_include_list_admits_only_what_it_covers(dest: str, permitted: bool) -> None:
    flt = DestinationFilter(dynamically_included=(d("topic://prices.>"),))
    assert flt.permits(d(dest)) is permitted


@pytest.mark.parametrize("bridge_temp", [True, False])
def test_temporary_destinations_follow_only_bridge_temp_destinations(bridge_temp: bool) -> None:
    flt = DestinationFilter(excluded=(d("queue://>"), d("topic://>")),
                            dynamically_included=(d("queue://only.this"),),
                            bridge_temp=bridge_temp)
    for temp in ("temp-queue://ID:x:1", "temp-topic://ID:x:2"):
        assert flt.permits(d(temp)) is bridge_temp


def test_advisory_topics_never_cross_even_when_included() -> None:
    flt = DestinationFilter(dynamically_included=(d("topic://>"),))
    assert not flt.permits(d("topic://ActiveMQ.Advisory.Consumer.Queue.orders"))


def test_a_connector_builds_its_filter_from_its_options() -> None:
    config = cfg(excluded_destinations=("queue://secret.>",),
                 dynamically_included_destinations=("queue://>", "topic://news.*"),
                 bridge_temp_destinations=False, dynamic_only=True)
    assert DestinationFilter.of(config) == DestinationFilter(
        excluded=(d("queue://secret.>"),),
        dynamically_included=(d("queue://>"), d("topic://news.*")),
        bridge_temp=False, dynamic_only=True)


# ---------------------------------------------------------------- in frames
items_ = st.builds(
    InterestItem, id=st.text(min_size=1, max_size=10),
    destination=st.sampled_from([Q, T, d("queue://a.*"), d("temp-queue://ID:x:1")]),
    selector=st.one_of(st.none(), st.text(max_size=20)),
    path=st.lists(st.text("ABC", min_size=1, max_size=3), max_size=3).map(tuple),
    durable=st.booleans(),
    origins=st.lists(st.text(max_size=8), max_size=3).map(tuple))


@given(items_)
def test_an_interest_item_travels_unchanged(item: InterestItem) -> None:
    assert InterestItem.from_json(item.to_json()) == item


@given(st.lists(st.sampled_from([Q, T, d("queue://a.>")]), max_size=3),
       st.lists(st.sampled_from([Q, d("topic://p.*")]), max_size=3),
       st.booleans(), st.booleans())
def test_a_filter_travels_unchanged(excluded: list[Destination], included: list[Destination],
                                    temp: bool, dynamic_only: bool) -> None:
    flt = DestinationFilter(tuple(excluded), tuple(included), temp, dynamic_only)
    assert DestinationFilter.from_json(flt.to_json()) == flt


def test_an_old_peers_item_without_optional_fields_gets_the_defaults() -> None:
    item = InterestItem.from_json({"id": "7", "dest": "queue://orders"})
    assert item == InterestItem("7", Q, None, (), False, ())


@pytest.mark.parametrize(("data", "fragment"), [
    (["not", "an", "object"], "interest item must be an object"),
    ({"dest": "queue://q"}, "'id'"),
    ({"id": "x"}, "'dest'"),
    ({"id": "x", "dest": "nowhere://q"}, "unknown destination kind"),
    ({"id": "x", "dest": "queue://q", "path": 5}, "not iterable"),
    ({"id": "x", "dest": "queue://q", "origins": 3}, "not iterable"),
])
def test_a_malformed_interest_item_is_the_peers_protocol_error(data: object,
                                                              fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match="interest item") as err:
        InterestItem.from_json(data)
    assert fragment in str(err.value)


@pytest.mark.parametrize(("data", "fragment"), [
    ("excluded", "interest filter must be an object"),
    ({"excluded": ["nowhere://x"]}, "unknown destination kind"),
    ({"included": 5}, "not iterable"),
])
def test_a_malformed_filter_is_the_peers_protocol_error(data: object, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match="interest filter") as err:
        DestinationFilter.from_json(data)
    assert fragment in str(err.value)


def test_a_filter_without_fields_permits_everything_but_advisories() -> None:
    flt = DestinationFilter.from_json({})
    assert flt == DestinationFilter()
    assert flt.permits(Q) and flt.permits(d("temp-topic://ID:x:1"))
