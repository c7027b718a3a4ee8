"""A node's interest for its network links (network/node_interest.py) and a bridge's
demand relayed between shards: checked on bare cores of a 2-shard node, no sockets."""

from __future__ import annotations

import itertools
from typing import Any

from tests.unit.core.test_broker_core import connect, make_broker, sub

from meshmq.core import destinations as dst
from meshmq.core.consumer import ConsumerSpec
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.shard_relay import RelayOpen
from meshmq.core.shards import ShardIdentity, owner
from meshmq.network.interest import DestinationFilter, InterestItem
from meshmq.network.node_interest import NodeInterest, interest_of, shard_items
from meshmq.network.shards import _not_back_to

NODE = "n"


def owned_by(k: int, prefix: str, kind: str = "queue") -> str:
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"{kind}://{name}"), 2, node=NODE) == k:
            return name
    raise AssertionError("unreachable")


def shard(index: int) -> Any:
    broker, _, _ = make_broker()
    broker.use_shard(ShardIdentity(index=index, count=2, node=NODE, run_dir="/nowhere",
                                   token="t"))
    return broker


def test_a_bridges_demand_for_a_destination_owned_elsewhere_is_relayed_with_its_path(
        ) -> None:
    front = shard(0)
    conn = connect(front)
    name = owned_by(1, "q")
    front.subscribe(conn, "d", ConsumerSpec(destinations=(dst.queue(name),), priority=-5,
                                            network_path=("remote",)))
    [opened] = front.take_relay_decisions()
    assert isinstance(opened, RelayOpen)
    assert (opened.owner, opened.destination, opened.priority, opened.network_path) == (
        1, dst.queue(name), -5, ("remote",))
    # A wildcard's demand runs on the other shard too, with the same path.
    front.subscribe(conn, "w", ConsumerSpec(destinations=(dst.topic("news.>"),),
                                            network_path=("remote",)))
    [fanned] = front.take_relay_decisions()
    assert isinstance(fanned, RelayOpen)
    assert (fanned.owner, fanned.destinations, fanned.network_path) == (
        1, (dst.topic("news.>"),), ("remote",))


def test_the_owner_keeps_what_came_from_the_bridges_remote_off_its_demand() -> None:
    may_go = _not_back_to("remote")
    assert may_go(Message(message_id="a", destination=dst.queue("q"), body=b""))
    assert not may_go(Message(message_id="b", destination=dst.queue("q"), body=b"",
                              broker_path=("remote",)))
    assert may_go(Message(message_id="c", destination=dst.queue("q"), body=b"",
                          broker_path=("elsewhere",)))


def test_a_shard_reports_what_it_serves_not_what_it_relays_nor_bridges_demand() -> None:
    broker = shard(1)
    conn = connect(broker)
    here, there = owned_by(1, "here"), owned_by(0, "there")
    sub(broker, conn, "a", here, selector="x = 1")
    sub(broker, conn, "b", there)  # served by shard 0, which knows it
    broker.subscribe(conn, "c", ConsumerSpec(destinations=(dst.queue(here),),
                                             network_path=("remote",)))
    topic = owned_by(1, "t", "topic")
    sub(broker, conn, "d", f"topic:{topic}")
    items = shard_items(broker, 1)
    assert sorted((str(i.destination), i.selector) for i in items) == sorted([
        (f"queue://{here}", "x = 1"), (f"topic://{topic}", None)])
    assert all(i.id.startswith("s1:") and i.origins == (
        f"{broker.name}/{i.id.split('|')[0]}",) for i in items)


def test_the_front_advertises_other_shards_items_and_forgets_a_lost_shard() -> None:
    sent: list[dict[str, Any]] = []
    broker = shard(0)
    front = NodeInterest(broker, 0, front=True, send=sent.append)
    front.start()
    assert interest_of(broker) is front
    changes: list[int] = []
    front.listeners.append(lambda: changes.append(1))
    items = [InterestItem("s1:c1|queue://a", dst.queue("a")),
             InterestItem("s1:c2|queue://b", dst.queue("b")),
             InterestItem("s1:c3|queue://c", dst.queue("c"), path=("remote",))]
    front.received(1, {"op": "front-interest", "items": [i.to_json() for i in items]})
    front.received(1, {"op": "front-interest", "items": [i.to_json() for i in items]})
    assert changes == [1]  # the same list again changes nothing
    flt = DestinationFilter(excluded=(dst.queue("b"),))
    assert set(front.interest_for("remote", flt)) == {"s1:c1|queue://a"}
    assert set(front.interest_for("other", DestinationFilter())) == {
        i.id for i in items}
    front.shard_lost(1)
    assert front.interest_for("other", DestinationFilter()) == {} and changes == [1, 1]
    front.stop()
    assert interest_of(broker) is None and sent == []


def test_another_shard_sends_its_items_when_they_change_and_when_the_front_links() -> None:
    sent: list[dict[str, Any]] = []
    broker = shard(1)
    node = NodeInterest(broker, 1, front=False, send=sent.append)
    node.front_linked()
    assert sent == [{"op": "front-interest", "items": []}]
    conn = connect(broker)
    sub(broker, conn, "a", owned_by(1, "q"))
    node._update()
    node._update()  # nothing changed: nothing sent
    assert len(sent) == 2 and len(sent[1]["items"]) == 1
    node.front_linked()  # a new link: the front knows nothing yet
    assert len(sent) == 3 and sent[2] == sent[1]
