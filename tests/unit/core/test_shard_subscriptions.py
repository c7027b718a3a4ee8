"""Wildcard and durable subscriptions on a node of shards (core/subscriptions.py,
core/shard_relay.py ``SubscriptionRelay``): a wildcard runs here for what this shard
owns and on every other shard for what that one owns, relayed back; a durable topic
subscription lives on its topic's owner. Checked on bare cores, and end to end between
two in-memory cores whose decisions the test carries as the shard links would."""

from __future__ import annotations

import dataclasses

import pytest
from tests.support.core_restart import restart
from tests.unit.core.test_broker_core import connect, make_broker, pump, send, sub
from tests.unit.core.test_shard_relay import NODE, owned_by, shard

from meshmq.config.model import (
    AuthConfig,
    AuthorizationConfig,
    AuthorizationEntry,
    AuthorizationRights,
)
from meshmq.core import destinations as dst
from meshmq.core.auth import Principal
from meshmq.core.broker import Broker
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.core.shard_relay import (
    SETTLE_ACK,
    SETTLE_NACK,
    SETTLE_RETURNED,
    SHARD_RETAIN,
    DurableDrop,
    ProducerNote,
    RelayClose,
    RelayCredit,
    RelayDecision,
    RelayOpen,
    RetainedCopy,
    ShardSettle,
)
from meshmq.core.shards import ShardIdentity
from meshmq.core.state import Connection
from meshmq.errors import ProtocolError
from meshmq.network.shards import PeerStats, RelayWindow
from meshmq.store.memory import MemoryStore


class Carrier:
    """Two shard cores; their decisions carried as network/shards.py carries them: a
    relay's open subscribes on the owner (on a connection of its own holding the
    durable's client id and the subscriber's groups, for a subscription relay), the
    owner's deliveries are relayed, settlements and credit go back, drops drop."""

    def __init__(self, cores: list[tuple[Broker, MemoryStore]] | None = None) -> None:
        self.cores = cores or [shard(0), shard(1)]
        self.links = [b.open_connection(Principal("shard", frozenset({"network"}),
                                                  internal=True), protocol="shard")
                      for b, _ in self.cores]
        # Per owner: relay id -> (its connection there, the consumer there).
        self.relays: list[dict[int, tuple[Connection, Consumer]]] = [{}, {}]
        self.windows: list[dict[int, RelayWindow]] = [{}, {}]
        self.delivered: list[list[Delivery]] = [[], []]

    def run(self) -> None:
        moved = True
        while moved:
            moved = False
            for k, (broker, store) in enumerate(self.cores):
                out = pump(broker, store)
                for s in broker.take_shard_sends():
                    moved = True
                    # (as network/shards.py's ShardReceiver routes a forwarded send)
                    owner, message = self.cores[s.owner][0], s.message
                    retain = message.properties.pop(SHARD_RETAIN, None) is True
                    owner.send_from_shard(self.links[s.owner], message, s.redelivered)
                    if retain:  # (as ShardReceiver: routed, then retained)
                        owner.retain(message)
                for decision in broker.take_relay_decisions():
                    moved = True
                    self._carry(decision)
                for d in out:
                    moved = True
                    relay = next((r for r, (_, c) in self.relays[k].items()
                                  if c is d.consumer), None)
                    if relay is None:
                        self.delivered[k].append(d)
                    else:
                        self.cores[1 - k][0].relay_deliver(k, relay, d.tag,
                                                           d.delivery_count, d.message)

    def _carry(self, decision: RelayDecision) -> None:
        owner = self.cores[decision.owner][0]
        relays = self.relays[decision.owner]
        if isinstance(decision, DurableDrop):
            owner.drop_durable_relayed(decision.client_id, decision.name)
            return
        if isinstance(decision, ProducerNote):
            owner.producer_relayed(1 - decision.owner, decision.destination,
                                   decision.connection_id, decision.added)
            return
        if isinstance(decision, RetainedCopy):  # ("owner": the shard told)
            sender = 1 - decision.owner
            owner.retained_copied(sender, decision.destination, decision.message)
            return
        if isinstance(decision, RelayOpen):
            conn = self.links[decision.owner]
            spec = ConsumerSpec(
                destinations=decision.destinations or (decision.destination,),
                ack_mode=AckMode.AUTO if decision.auto else AckMode.CLIENT_INDIVIDUAL,
                prefetch=decision.prefetch, selector=decision.selector,
                subscription_name=decision.durable[1] if decision.durable else None,
                no_local=decision.no_local, origin=decision.origin)
            if decision.durable is not None or decision.reader is not None:
                principal = Principal("shard", frozenset(), internal=True)
                if decision.reader is not None:
                    principal = Principal(decision.reader[0], frozenset(decision.reader[1]))
                conn = owner.open_connection(principal, protocol="shard")
                conn.client_id = decision.durable[0] if decision.durable else None
            consumer = owner.subscribe(conn, f"r{decision.relay_id}", spec)
            relays[decision.relay_id] = (conn, consumer)
            if decision.auto:
                window = self.windows[decision.owner][decision.relay_id] = \
                    RelayWindow(consumer, PeerStats())
                if window.at_dispatch:
                    consumer.net_filter = window.admit
            return
        conn, consumer = relays[decision.relay_id]
        if isinstance(decision, RelayClose):
            owner.unsubscribe(conn, consumer)
            del relays[decision.relay_id]
            if conn is not self.links[decision.owner]:
                conn.client_id = None
                owner.close_connection(conn)
        elif isinstance(decision, RelayCredit):
            window = self.windows[decision.owner][decision.relay_id]
            window.inflight -= decision.count
            owner.pause_relayed(consumer, window.inflight >= window.size)
        elif isinstance(decision, ShardSettle):
            if decision.kind == SETTLE_ACK:
                owner.ack(conn, consumer, decision.tag, cumulative=False)
            else:
                owner.nack(conn, consumer, decision.tag, cumulative=False)

    def take(self, k: int) -> list[str]:
        out = [d.message.body.decode() for d in self.delivered[k]]
        self.delivered[k] = []
        return out


def test_a_wildcard_subscription_is_opened_on_every_other_shard_with_its_patterns() -> None:
    broker, _ = shard(1)
    conn = connect(broker, client_id="cid")
    sub(broker, conn, "w", "topic:orders.>", selector="x > 1", prefetch=5)
    [opened] = broker.take_relay_decisions()
    assert isinstance(opened, RelayOpen)
    assert (opened.owner, opened.destinations, opened.selector, opened.prefetch,
            opened.durable) == (0, (dst.topic("orders.>"),), "x > 1", 5, None)
    # A plain subscription owned here decides nothing; one owned elsewhere is the
    # single-destination relay of before (no patterns).
    sub(broker, conn, "p", f"topic:{owned_by(1, 'orders', 'topic')}")
    assert broker.take_relay_decisions() == []
    sub(broker, conn, "q", f"topic:{owned_by(0, 'orders', 'topic')}")
    [single] = broker.take_relay_decisions()
    assert isinstance(single, RelayOpen) and single.destinations == ()


def test_a_shared_subscription_joins_its_group_on_the_topics_owner_and_every_shard(
        ) -> None:
    broker, _ = shard(1)
    conn = connect(broker)
    elsewhere = owned_by(0, "jobs", "topic")
    sub(broker, conn, "s", f"topic:{elsewhere}", shared_group="g")
    [single] = broker.take_relay_decisions()
    assert isinstance(single, RelayOpen)
    assert (single.owner, single.destination, single.shared) == (0, dst.topic(elsewhere), "g")
    sub(broker, conn, "w", "topic:jobs.>", shared_group="g")
    [wild] = broker.take_relay_decisions()
    assert isinstance(wild, RelayOpen)
    assert (wild.owner, wild.destinations, wild.shared) == (0, (dst.topic("jobs.>"),), "g")
    # One owned here is served by this shard's group alone.
    sub(broker, conn, "h", f"topic:{owned_by(1, 'jobs', 'topic')}", shared_group="g")
    assert broker.take_relay_decisions() == []


def test_a_queue_wildcard_consumes_the_matching_queues_of_both_shards_in_order() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    ac, bc = connect(a), connect(b)
    here, there = owned_by(0, "jobs"), owned_by(1, "jobs")
    send(a, ac, there, "early", persistent=True)  # before the subscription: kept there
    carrier.run()
    w = sub(a, ac, "w", "jobs.>", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=100)
    carrier.run()
    for i in range(5):
        send(b, bc, there, f"t{i}", persistent=True)
        send(b, bc, here, f"h{i}", persistent=True)
    late = owned_by(1, "jobs.late")  # a queue created on the owner after subscribing
    send(a, ac, late, "late", persistent=True)
    carrier.run()
    got = carrier.delivered[0]
    bodies = [d.message.body.decode() for d in got]
    assert [x for x in bodies if x.startswith("t") or x == "early"] == \
        ["early"] + [f"t{i}" for i in range(5)]  # each queue's order holds
    assert [x for x in bodies if x.startswith("h")] == [f"h{i}" for i in range(5)]
    assert "late" in bodies and len(bodies) == 12
    for d in got:
        a.ack(ac, w, d.tag, cumulative=False)
    carrier.delivered[0] = []
    carrier.run()
    assert b.queues[dst.queue(there)].depth == 0 and a.queues[dst.queue(here)].depth == 0
    # Unsubscribing closes the relay on the owner: what is sent later stays there.
    a.unsubscribe(ac, w)
    carrier.run()
    send(b, bc, there, "after", persistent=True)
    carrier.run()
    assert carrier.delivered[0] == [] and b.queues[dst.queue(there)].depth == 1
    assert not b.queues[dst.queue(there)].consumers


def test_a_topic_wildcard_gets_every_owners_topics_and_selectors_apply_there() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    ac, bc = connect(a), connect(b)
    t0, t1 = owned_by(0, "px", "topic"), owned_by(1, "px", "topic")
    sub(a, ac, "w", "topic:px.>", selector="n < 3")
    carrier.run()
    for i in range(5):
        for t in (t0, t1):
            dest = dst.topic(t)
            msg = Message(message_id=b.new_message_id(bc.id), destination=dest,
                          body=f"{t}:{i}".encode(), properties={"n": i})
            b.send(bc, (dest,), msg)
    carrier.run()
    bodies = carrier.take(0)
    assert [x for x in bodies if x.startswith(t0)] == [f"{t0}:{i}" for i in range(3)]
    assert [x for x in bodies if x.startswith(t1)] == [f"{t1}:{i}" for i in range(3)]
    assert len(bodies) == 6  # each once: the owner runs it, nobody else


def test_a_wildcard_relay_is_opened_again_after_the_link_comes_back() -> None:
    broker, _ = shard(0)
    conn = connect(broker)
    sub(broker, conn, "w", "a.*", ack_mode=AckMode.CLIENT)
    [opened] = broker.take_relay_decisions()
    broker.relay_link_lost(1)
    assert broker.relay_opens(1) == [opened]
    assert opened.destinations == (dst.queue("a.*"),)


def test_a_wildcard_relay_carries_only_what_the_user_may_read_on_the_owner() -> None:
    authorization = AuthorizationConfig(
        entries=(AuthorizationEntry(topic="pub.>", read=("users",), write=("admins",)),
                 AuthorizationEntry(topic=">", read=("admins",), write=("admins",))),
        default=AuthorizationRights(admin=("admins",)))
    cores = []
    for k in range(2):
        broker, _, store = make_broker(auth=AuthConfig(authorization=authorization))
        broker.use_shard(ShardIdentity(index=k, count=2, node=NODE, run_dir="/nowhere",
                                       token="t"))
        cores.append((broker, store))
    carrier = Carrier(cores)
    (a, _), (b, _) = carrier.cores
    user = a.open_connection(Principal("u", frozenset({"users"})))
    sub(a, user, "w", "topic:>")
    carrier.run()
    [opened_conn] = [c for c, _ in carrier.relays[1].values()]
    assert opened_conn.principal.groups == frozenset({"users"})
    admin = b.open_connection(Principal("root", frozenset({"admins"})))
    for name in (owned_by(1, "pub", "topic"), owned_by(1, "secret", "topic")):
        send(b, admin, f"topic:{name}", name)
    carrier.run()
    assert [x.split(".")[0] for x in carrier.take(0)] == ["pub"]


def test_a_durable_subscription_lives_on_the_topics_owner_and_keeps_messages() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    topic = owned_by(1, "news", "topic")
    first = connect(a, client_id="cid")
    d = sub(a, first, "d", f"topic:{topic}", subscription_name="s",
            ack_mode=AckMode.CLIENT_INDIVIDUAL)
    carrier.run()
    assert ("cid", "s") in b.durables and ("cid", "s") not in a.durables
    assert "cid" not in b.state.client_ids  # the owner holds no claim on the client id
    a.unsubscribe(first, d)
    a.close_connection(first)
    carrier.run()
    assert b.durables[("cid", "s")].consumer is None
    producer = connect(b)
    for i in range(3):
        send(b, producer, f"topic:{topic}", f"m{i}", persistent=True)
    carrier.run()
    assert carrier.delivered == [[], []]
    # Back through the owner itself: the stored subscription, attached locally.
    again = connect(b, client_id="cid")
    d2 = sub(b, again, "d", f"topic:{topic}", subscription_name="s",
             ack_mode=AckMode.CLIENT_INDIVIDUAL)
    carrier.run()
    assert carrier.take(1) == ["m0", "m1", "m2"]
    b.unsubscribe(again, d2)
    b.close_connection(again)
    carrier.run()
    send(b, producer, f"topic:{topic}", "m3", persistent=True)
    carrier.run()
    # And through the other shard again: relayed, what waited comes, in order.
    third = connect(a, client_id="cid")
    sub(a, third, "d", f"topic:{topic}", subscription_name="s",
        ack_mode=AckMode.CLIENT_INDIVIDUAL)
    carrier.run()
    assert carrier.take(0) == ["m0", "m1", "m2", "m3"]  # never acknowledged: again


def test_removing_a_durable_subscription_by_name_drops_it_on_its_owner() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    topic = owned_by(1, "news", "topic")
    conn = connect(a, client_id="cid")
    d = sub(a, conn, "d", f"topic:{topic}", subscription_name="s")
    carrier.run()
    a.unsubscribe(conn, d)
    a.remove_durable(conn, "s")  # not here: asked of every other shard
    assert ("cid", "s") in b.durables
    carrier.run()
    assert ("cid", "s") not in b.durables
    # On one broker an unknown name is an error; on a shard it is the owners' to know.
    a.remove_durable(conn, "unknown")
    assert a.take_relay_decisions() == [DurableDrop(1, "cid", "unknown")]


def test_a_durable_wildcard_is_durable_on_every_owner() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    conn = connect(a, client_id="cid")
    d = sub(a, conn, "d", "topic:ev.>", subscription_name="all")
    carrier.run()
    assert ("cid", "all") in a.durables and ("cid", "all") in b.durables
    a.unsubscribe(conn, d)
    a.close_connection(conn)
    carrier.run()
    producer = connect(b)
    t0, t1 = owned_by(0, "ev", "topic"), owned_by(1, "ev", "topic")
    send(b, producer, f"topic:{t0}", "zero", persistent=True)
    send(b, producer, f"topic:{t1}", "one", persistent=True)
    carrier.run()
    back = connect(b, client_id="cid")  # reconnecting through the other shard
    sub(b, back, "d", "topic:ev.>", subscription_name="all")
    carrier.run()
    assert sorted(carrier.take(1)) == ["one", "zero"]


def test_an_mqtt_sessions_durables_elsewhere_go_with_a_clean_start() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    topic = owned_by(1, "s", "topic")
    conn = connect(a, client_id="dev")
    d = sub(a, conn, "f", f"topic:{topic}", subscription_name="mqtt1:s/x")
    sub(a, conn, "g", f"topic:{owned_by(1, 'o', 'topic')}", subscription_name="stomp-sub")
    carrier.run()
    a.close_connection(conn)
    del d
    carrier.run()
    a.drop_durables_elsewhere("dev")
    carrier.run()
    assert ("dev", "mqtt1:s/x") not in b.durables and ("dev", "stomp-sub") in b.durables


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_wildcard_subscription_on_a_whole_broker_decides_nothing(kind: str) -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    name = "x.>" if kind == "queue" else "topic:x.>"
    c = sub(broker, conn, "w", name)
    assert broker.take_relay_decisions() == []
    assert dataclasses.replace(c.spec).destinations[0].is_wildcard
    assert pump(broker, store) == []


def test_a_durable_with_no_local_keeps_its_backlog_when_resumed_through_another_shard(
) -> None:
    """The owner compares what a relay asks with the stored record (a change of topic,
    selector or no-local replaces it, as JMS says): the relay carries no-local too."""
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    topic = owned_by(1, "quiet", "topic")
    here = connect(b, client_id="cid")
    d = sub(b, here, "d", f"topic:{topic}", subscription_name="s", no_local=True)
    b.unsubscribe(here, d)
    b.close_connection(here)
    producer = connect(b)
    send(b, producer, f"topic:{topic}", "kept", persistent=True)
    carrier.run()
    there = connect(a, client_id="cid")
    sub(a, there, "d", f"topic:{topic}", subscription_name="s", no_local=True)
    carrier.run()
    assert carrier.take(0) == ["kept"]


def _retained(broker: Broker, conn: Connection, topic: str, body: str) -> None:
    """An MQTT retained publish: sent, then retained (as transport/mqtt_server.py)."""
    dest = dst.topic(topic)
    msg = Message(message_id=broker.new_message_id(conn.id), destination=dest,
                  body=body.encode(), persistent=True)
    broker.send(conn, (dest,), msg)
    broker.retain(msg)


def test_a_retained_message_is_kept_by_its_owner_and_copied_to_every_shard() -> None:
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    ac = connect(a)
    t0, t1 = owned_by(0, "rt", "topic"), owned_by(1, "rt", "topic")
    _retained(a, ac, t0, "zero")
    _retained(a, ac, t1, "one")  # published on shard 0, kept by shard 1
    [send] = [s for s in a.state.shard_sends]
    assert send.message.properties.get(SHARD_RETAIN) is True
    carrier.run()
    assert dst.topic(t1) not in a.retained and dst.topic(t1) in b.retained
    assert dst.topic(t0) in a.retained and dst.topic(t0) not in b.retained
    for broker in (a, b):  # a wildcard gets both, wherever it subscribes
        assert sorted(m.body.decode() for m in broker.retained_for([dst.topic("rt.>")])) \
            == ["one", "zero"]
    # A new retained message replaces it everywhere, an empty one clears it.
    _retained(a, ac, t1, "uno")
    carrier.run()
    assert [m.body for m in a.retained_for([dst.topic(t1)])] == [b"uno"]
    _retained(b, connect(b), t1, "")
    carrier.run()
    assert a.retained_for([dst.topic("rt.>")])[0].body == b"zero"
    assert len(a.retained_for([dst.topic("rt.>")])) == 1
    assert len(b.retained_for([dst.topic("rt.>")])) == 1


def test_a_shards_retained_copies_are_replaced_in_full_when_its_link_comes_up() -> None:
    broker, _ = shard(0)
    t1 = dst.topic(owned_by(1, "rt", "topic"))
    gone = dst.topic(owned_by(1, "gone", "topic"))
    for dest, body in ((t1, b"old"), (gone, b"cleared meanwhile")):
        broker.retained_copied(1, dest, Message(message_id=str(dest), destination=dest,
                                                body=body))
    broker.retained_synced(1, [Message(message_id="n", destination=t1, body=b"new")])
    assert [m.body for m in broker.retained_for([dst.topic(">")])] == [b"new"]
    # What it owns itself is what it sends a peer whose link comes up.
    conn = connect(broker)
    _retained(broker, conn, owned_by(0, "mine", "topic"), "mine")
    assert [m.body for m in broker.retained_owned()] == [b"mine"]
    assert [d for d in broker.take_relay_decisions() if isinstance(d, RetainedCopy)] == [
        RetainedCopy(1, dst.topic(owned_by(0, "mine", "topic")),
                     broker.retained[dst.topic(owned_by(0, "mine", "topic"))][1])]


def test_a_recovered_durable_is_removed_by_another_shards_drop_and_others_stay() -> None:
    broker, store = shard(1)
    conn = connect(broker, client_id="cid")
    topic = f"topic:{owned_by(1, 'kept', 'topic')}"
    for name in ("mqtt1:a/b", "mqtt0:c", "stomp"):
        d = sub(broker, conn, name, topic, subscription_name=name)
        broker.unsubscribe(conn, d)
    other = connect(broker, client_id="other")
    broker.unsubscribe(other, sub(broker, other, "o", topic, subscription_name="mqtt1:x"))
    pump(broker, store)
    again = restart(broker.state.config, store)
    again.use_shard(ShardIdentity(index=1, count=2, node=NODE, run_dir="/nowhere", token="t"))
    assert again.drop_durable_relayed("cid", None) == 2  # the MQTT session's
    assert sorted(again.durables) == [("cid", "stomp"), ("other", "mqtt1:x")]
    assert again.drop_durable_relayed("cid", "stomp") == 1
    assert again.drop_durable_relayed("nobody", None) == 0
    assert sorted(again.durables) == [("other", "mqtt1:x")]
    assert again.state.durable_names == {"other": {"mqtt1:x"}}


def test_a_wildcard_fed_by_every_shard_holds_one_window_not_one_per_shard() -> None:
    """Each owner keeps its own window of the relay; the subscriber's shard holds what
    comes beyond the consumer's own until acknowledgements make room (an MQTT client's
    Receive Maximum is that window)."""
    carrier = Carrier()
    (a, _), (b, _) = carrier.cores
    ac, bc = connect(a), connect(b)
    here, there = owned_by(0, "win"), owned_by(1, "win")
    for i in range(4):
        send(b, bc, there, f"t{i}", persistent=True)
        send(a, ac, here, f"h{i}", persistent=True)
    w = sub(a, ac, "w", "win.>", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=3)
    carrier.run()
    seen: list[str] = []
    while len(seen) < 8:
        got = carrier.delivered[0]
        assert 0 < len(got) <= 3 and len(w.dispatched) <= 3
        carrier.delivered[0] = []
        for d in got:
            seen.append(d.message.body.decode())
            a.ack(ac, w, d.tag, cumulative=False)
        carrier.run()
    assert [x for x in seen if x[0] == "t"] == ["t0", "t1", "t2", "t3"]
    assert [x for x in seen if x[0] == "h"] == ["h0", "h1", "h2", "h3"]
    assert b.queues[dst.queue(there)].depth == 0 and a.queues[dst.queue(here)].depth == 0


def test_deliveries_waiting_for_the_window_go_back_uncounted_when_it_closes() -> None:
    broker, store = shard(0)
    conn = connect(broker)
    w = sub(broker, conn, "w", "topic:x.>", ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    [opened] = broker.take_relay_decisions()
    topic = dst.topic(owned_by(1, "x", "topic"))
    for tag in (1, 2):
        broker.relay_deliver(1, opened.relay_id, tag, 1,
                             Message(message_id=f"m{tag}", destination=topic, body=b""))
    assert [d.message.message_id for d in pump(broker, store)] == ["m1"]
    broker.unsubscribe(conn, w)
    assert broker.take_relay_decisions() == [
        ShardSettle(1, opened.relay_id, 1, SETTLE_NACK),  # given to the client
        ShardSettle(1, opened.relay_id, 2, SETTLE_RETURNED),  # never was
        RelayClose(1, opened.relay_id)]


def test_a_durable_kept_by_another_shard_is_refused_a_second_time_on_its_connection(
) -> None:
    broker, _ = shard(0)
    conn = connect(broker, client_id="cid")
    topic = f"topic:{owned_by(1, 'once', 'topic')}"
    first = sub(broker, conn, "a", topic, subscription_name="s")
    with pytest.raises(ProtocolError) as refused:
        sub(broker, conn, "b", topic, subscription_name="s")
    assert refused.value.code == "durable-in-use"
    broker.unsubscribe(conn, first)
    sub(broker, conn, "b", topic, subscription_name="s")  # once closed, it may come back
