"""ActiveMQ advisories on a node of shards, as one broker's: the ownership rule (an
advisory topic about a destination is owned by that destination's owner; one about no
destination fans in from every shard) and, between two in-memory cores whose decisions
the test carries as the shard links would, each consumer, producer and connection
advisory raised once, by the shard that sees all of it, for a subscriber on either
shard."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.core.test_broker_core import connect, send, sub
from tests.unit.core.test_shard_relay import NODE, owned_by, shard
from tests.unit.core.test_shard_subscriptions import Carrier

from meshmq.core import destinations as dst
from meshmq.core.advisories import advisory_topic, kind_topic
from meshmq.core.consumer import AckMode
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.shard_relay import RelayOpen
from meshmq.core.shards import advisory_subject, fans_in, owner, temp_name

NAMES = st.text(alphabet="abcxyz0123456789_-.", min_size=1, max_size=20).filter(
    lambda n: not n.startswith(".") and not n.endswith(".") and ".." not in n)


@given(name=NAMES, count=st.integers(min_value=2, max_value=16),
       kind=st.sampled_from([DestKind.QUEUE, DestKind.TOPIC]),
       advisory=st.sampled_from(["Consumer", "Producer", "Expired", "MessageDLQd",
                                 "SlowConsumer"]))
def test_an_advisory_topic_is_owned_by_its_destinations_owner(
        name: str, count: int, kind: DestKind, advisory: str) -> None:
    dest = Destination(kind, name)
    topic = advisory_topic(advisory, dest)
    assert advisory_subject(topic) == dest
    assert owner(topic, count, node=NODE) == owner(dest, count, node=NODE)
    assert not fans_in(topic)


def test_a_temporary_destinations_advisories_live_on_its_creators_shard() -> None:
    temp = Destination(DestKind.TEMP_QUEUE, temp_name(NODE, 3, "b", "c1", 1))
    topic = advisory_topic("Consumer", temp)
    assert topic.name == f"ActiveMQ.Advisory.Consumer.TempQueue.{temp.name}"
    assert owner(topic, 4, node=NODE) == 3


def test_advisory_topics_about_no_destination_fan_in_from_every_shard() -> None:
    for topic in (dst.topic("ActiveMQ.Advisory.Connection"),
                  kind_topic(DestKind.TEMP_QUEUE), kind_topic(DestKind.TEMP_TOPIC),
                  dst.topic("ActiveMQ.Advisory.Queue"), dst.topic("ActiveMQ.Advisory.Topic"),
                  dst.topic("ActiveMQ.Advisory.NetworkBridge"),
                  dst.topic("ActiveMQ.Advisory.Consumer.Nothing.x")):
        assert advisory_subject(topic) is None and fans_in(topic), topic
    # Wildcards fan in as wildcards do; other topics are owned by their hash.
    assert not fans_in(dst.topic("ActiveMQ.Advisory.Consumer.Queue.>"))
    with pytest.raises(ValueError):
        owner(dst.topic("ActiveMQ.Advisory.Consumer.Queue.>"), 2)
    assert not fans_in(dst.topic("prices")) and advisory_subject(dst.topic("prices")) is None


def test_a_subscription_to_an_advisory_about_no_destination_runs_on_every_shard() -> None:
    broker, _ = shard(1)
    conn = connect(broker, client_id="watcher")
    connection_topic = dst.topic("ActiveMQ.Advisory.Connection")
    for sid, durable in (("plain", None), ("kept", "kept")):
        consumer = sub(broker, conn, sid, f"topic:{connection_topic.name}",
                       subscription_name=durable)
        assert consumer.topic_sub is not None  # this shard's connections: served here
        [opened] = broker.take_relay_decisions()
        assert isinstance(opened, RelayOpen)
        assert (opened.owner, opened.destinations, opened.durable) == (
            0, (connection_topic,), None if durable is None else ("watcher", durable))
    # One about a destination goes to that destination's owner alone, as a topic does.
    x = owned_by(0, "orders")
    sub(broker, conn, "one", "topic:" + advisory_topic("Consumer", dst.queue(x)).name)
    [single] = broker.take_relay_decisions()
    assert isinstance(single, RelayOpen) and (single.owner, single.destinations) == (0, ())
    assert single.origin is not None and single.origin.client_id == "watcher"


def advisories(carrier: Carrier, k: int) -> list[dict[str, object]]:
    """The advisories shard ``k``'s clients received since the last call."""
    out = [dict(d.message.properties) for d in carrier.delivered[k]]
    carrier.delivered[k] = []
    return out


def test_each_consumer_of_a_queue_is_advised_once_by_its_owner_to_subscribers_on_either_shard(
        ) -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores  # shards 0 and 1
    x = owned_by(1, "orders")
    topic = f"topic:{advisory_topic('Consumer', dst.queue(x)).name}"
    watchers = [sub(core, connect(core), "adv", topic) for core in (a, b)]
    carrier.run()
    advisories(carrier, 0), advisories(carrier, 1)

    client = connect(a, client_id="app")  # on shard 0: relayed to the owner, shard 1
    relayed = sub(a, client, "s1", x, ack_mode=AckMode.CLIENT, prefetch=7,
                  selector="p > 1")
    carrier.run()
    local = sub(b, connect(b), "s2", x)  # on the owner itself
    carrier.run()
    for k in (0, 1):
        got = advisories(carrier, k)
        assert [(m["advisoryType"], m["consumerCount"]) for m in got] == [
            ("ConsumerAdded", 1), ("ConsumerAdded", 2)], k
        first = got[0]  # the relayed consumer, as its client's shard names it
        assert (first["consumerId"], first["connectionId"], first["clientId"],
                first["ackMode"], first["prefetchSize"], first["selector"]) == (
            f"s0-{relayed.id}", f"s0-{client.id}", "app", "client", 7, "p > 1")
        assert got[1]["consumerId"] == f"s1-{local.id}"
        assert "originBrokerName" in first

    a.unsubscribe(client, relayed)
    carrier.run()
    for k in (0, 1):
        assert [(m["advisoryType"], m["consumerId"], m["consumerCount"])
                for m in advisories(carrier, k)] == [
            ("ConsumerRemoved", f"s0-{relayed.id}", 1)]
    assert watchers


def test_a_queue_wildcard_consumer_is_advised_once_by_its_clients_shard() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    topic = "topic:" + advisory_topic("Consumer", dst.queue("jobs.>")).name
    sub(a, connect(a), "adv", topic)
    carrier.run()
    advisories(carrier, 0)
    wild = sub(b, connect(b), "w", "jobs.>")  # runs on both shards
    carrier.run()
    got = advisories(carrier, 0)
    assert [(m["advisoryType"], m["consumerCount"], m["consumerId"]) for m in got] == [
        ("ConsumerAdded", 1, f"s1-{wild.id}")]


def test_producers_on_either_shard_are_advised_once_by_the_owner_with_the_nodes_count(
        ) -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    x = owned_by(0, "orders")
    topic = "topic:" + advisory_topic("Producer", dst.queue(x)).name
    for core in (a, b):
        sub(core, connect(core), "adv", topic)
    carrier.run()
    producers = [(core, connect(core)) for core in (a, b, b)]
    for i, (core, conn) in enumerate(producers):
        send(core, conn, x, f"m{i}")
        send(core, conn, x, f"again{i}")  # a second send is no new producer
        carrier.run()
    expected = [("ProducerAdded", f"s{s}-{conn.id}", n)
                for (s, (_, conn), n) in zip((0, 1, 1), producers, (1, 2, 3), strict=True)]
    for k in (0, 1):
        assert [(m["advisoryType"], m["connectionId"], m["producerCount"])
                for m in advisories(carrier, k)] == expected, k
    core, conn = producers[2]
    core.close_connection(conn)
    carrier.run()
    for k in (0, 1):
        assert [(m["advisoryType"], m["connectionId"]) for m in advisories(carrier, k)] == [
            ("ProducerRemoved", f"s1-{conn.id}")]


def test_the_owner_forgets_a_lost_shards_producers_and_learns_them_again() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    x = owned_by(0, "orders")
    sub(a, connect(a), "adv", "topic:" + advisory_topic("Producer", dst.queue(x)).name)
    conn = connect(b)
    send(b, conn, x, "m")
    carrier.run()
    advisories(carrier, 0)
    a.relay_link_lost(1)
    carrier.run()
    assert [(m["advisoryType"], m["connectionId"]) for m in advisories(carrier, 0)] == [
        ("ProducerRemoved", f"s1-{conn.id}")]
    notes = b.producer_notes(0)
    assert [(n.destination, n.connection_id, n.added) for n in notes] == [
        (dst.queue(x), f"s1-{conn.id}", True)]
    for note in notes:  # what the link coming back carries
        a.producer_relayed(1, note.destination, note.connection_id, note.added)
    a.producer_relayed(1, notes[0].destination, notes[0].connection_id, True)  # twice
    carrier.run()
    assert [(m["advisoryType"], m["producerCount"]) for m in advisories(carrier, 0)] == [
        ("ProducerAdded", 1)]


def test_connection_advisories_reach_a_subscriber_on_either_shard_once() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    for core in (a, b):
        sub(core, connect(core), "adv", "topic:ActiveMQ.Advisory.Connection")
    carrier.run()
    advisories(carrier, 0), advisories(carrier, 1)
    opened = [connect(core, client_id=f"c{i}")
              for i, core in zip(itertools.count(), (a, b), strict=False)]
    carrier.run()
    for k in (0, 1):
        got = advisories(carrier, k)
        assert sorted((m["advisoryType"], m["connectionId"], m["clientId"]) for m in got) == [
            ("ConnectionAdded", f"s0-{opened[0].id}", "c0"),
            ("ConnectionAdded", f"s1-{opened[1].id}", "c1")], k
    # The node's own links between its shards are not its clients' connections.
    assert all(m.get("protocol") != "shard" for m in got)
