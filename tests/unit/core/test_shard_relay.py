"""core/shard_relay.py: a shard's decisions about destinations another shard owns --
sends become ShardSend, subscriptions relayed consumers whose settlements are
ShardSettle -- checked on bare cores, and end to end between two in-memory cores whose
decisions the test carries over as the shard links would."""

from __future__ import annotations

import itertools

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

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
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.queue import Delivery
from meshmq.core.shard_relay import (
    SETTLE_ACK,
    SETTLE_NACK,
    SETTLE_RETURNED,
    ProducerNote,
    RelayClose,
    RelayCredit,
    RelayDecision,
    RelayOpen,
    ShardSettle,
)
from meshmq.core.shards import ShardIdentity, owner
from meshmq.core.state import Connection
from meshmq.errors import AuthorizationError
from meshmq.network.shards import PeerStats, RelayWindow
from meshmq.store.memory import MemoryStore

NODE = "n"


def owned_by(k: int, prefix: str = "q", kind: str = "queue") -> str:
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"{kind}://{name}"), 2, node=NODE) == k:
            return name
    raise AssertionError("unreachable")


def shard(index: int) -> tuple[Broker, MemoryStore]:
    broker, _, store = make_broker()
    broker.use_shard(ShardIdentity(index=index, count=2, node=NODE, run_dir="/nowhere",
                                   token="t"))
    return broker, store


def test_a_send_owned_elsewhere_is_a_decision_and_one_owned_here_is_enqueued() -> None:
    broker, _ = shard(1)
    conn = connect(broker)
    elsewhere, here = owned_by(0), owned_by(1)
    send(broker, conn, elsewhere, "away", persistent=True)
    send(broker, conn, here, "home", persistent=True)
    [forwarded] = broker.take_shard_sends()
    assert (forwarded.owner, forwarded.message.body) == (0, b"away")
    assert dst.queue(elsewhere) not in broker.queues  # the owner's alone
    assert broker.queues[dst.queue(here)].depth == 1
    assert broker.take_shard_sends() == []
    # Message ids name the shard: two shards never mint the same one.
    assert forwarded.message.message_id.startswith("ID:unit-s1-")


def test_a_send_owned_elsewhere_is_confirmed_only_after_the_owner_even_non_persistent() -> None:
    broker, _ = shard(1)
    conn = connect(broker)
    msg = Message(message_id="m", destination=dst.queue(owned_by(0)), body=b"x")
    assert broker.send(conn, (msg.destination,), msg) is True


def test_a_whole_broker_makes_no_shard_decisions() -> None:
    broker, _, _ = make_broker()
    conn = connect(broker)
    send(broker, conn, owned_by(0), "x")
    c = sub(broker, conn, "c", owned_by(0, "other"))
    assert broker.take_shard_sends() == [] and broker.take_relay_decisions() == []
    assert c.sources and broker.queues[dst.queue(owned_by(0, "other"))] is c.sources[0]


def test_a_relayed_consumer_asks_the_owner_and_settles_there() -> None:
    broker, store = shard(1)
    conn = connect(broker)
    name = owned_by(0)
    c = sub(broker, conn, "s", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=7,
            priority=3, selector="color = 'red'")
    [opened] = broker.take_relay_decisions()
    assert isinstance(opened, RelayOpen)
    assert (opened.owner, opened.destination, opened.selector, opened.prefetch,
            opened.priority) == (0, dst.queue(name), "color = 'red'", 7, 3)
    assert dst.queue(name) not in broker.queues
    for tag in (41, 42, 43):
        broker.relay_deliver(0, opened.relay_id, tag, 1,
                             Message(message_id=f"m{tag}", destination=dst.queue(name),
                                     body=f"b{tag}".encode()))
    out = pump(broker, store)
    assert bodies(out) == ["b41", "b42", "b43"] and {d.consumer for d in out} == {c}
    broker.ack(conn, c, out[0].tag, cumulative=False)
    broker.nack(conn, c, out[1].tag, cumulative=False)
    broker.unsubscribe(conn, c)  # the third goes back, counted, then the consumer closes
    assert broker.take_relay_decisions() == [
        ShardSettle(0, opened.relay_id, 41, SETTLE_ACK),
        ShardSettle(0, opened.relay_id, 42, SETTLE_NACK),
        ShardSettle(0, opened.relay_id, 43, SETTLE_NACK),
        RelayClose(0, opened.relay_id)]
    # A delivery that crossed the close goes back uncounted.
    broker.relay_deliver(0, opened.relay_id, 44, 1,
                         Message(message_id="m44", destination=dst.queue(name), body=b""))
    assert broker.take_relay_decisions() == [
        ShardSettle(0, opened.relay_id, 44, SETTLE_RETURNED)]
    assert pump(broker, store) == []


def test_an_auto_ack_relayed_consumer_is_settled_by_the_owner_so_only_credit_goes_back(
) -> None:
    broker, store = shard(0)
    conn = connect(broker)
    c = sub(broker, conn, "s", owned_by(1))
    [opened] = broker.take_relay_decisions()
    assert isinstance(opened, RelayOpen) and opened.auto
    broker.relay_deliver(1, opened.relay_id, 9, 2,
                         Message(message_id="m", destination=dst.queue(owned_by(1)), body=b"x"))
    [d] = pump(broker, store)
    assert d.consumer is c and d.redelivered and c.dispatched == {}
    assert broker.take_relay_decisions() == [RelayCredit(1, opened.relay_id, 1)]
    # A client-acknowledged one is not: the owner keeps each message until its SETTLE.
    sub(broker, conn, "t", owned_by(1), ack_mode=AckMode.CLIENT)
    [opened] = broker.take_relay_decisions()
    assert isinstance(opened, RelayOpen) and not opened.auto


def test_a_lost_link_voids_the_window_and_the_relay_is_opened_again() -> None:
    broker, store = shard(1)
    conn = connect(broker)
    c = sub(broker, conn, "s", owned_by(0), ack_mode=AckMode.CLIENT)
    [opened] = broker.take_relay_decisions()
    broker.relay_deliver(0, opened.relay_id, 1, 1,
                         Message(message_id="m", destination=dst.queue(owned_by(0)), body=b"x"))
    [d] = pump(broker, store)
    broker.relay_link_lost(0)
    broker.ack(conn, c, d.tag, cumulative=True)  # the owner took it back: nothing to say
    assert broker.take_relay_decisions() == []
    assert broker.relay_opens(0) == [opened] and broker.relay_opens(1) == []


# ---------------------------------------------------------------- two cores, carried
class Carrier:
    """Moves the shard decisions of two cores the way network/shards.py does: sends
    are routed on the owner, relay opens subscribe there, the owner's deliveries are
    relayed, settlements ack, nack or return there, and an auto-ack relay's owner stops
    once ``prefetch`` of its deliveries are in flight, until credit comes back."""

    def __init__(self) -> None:
        self.cores = [shard(0), shard(1)]
        self.links = [self._link_conn(k) for k in range(2)]  # each owner's relay session
        self.relays: list[dict[int, Consumer]] = [{}, {}]
        self.delivered: list[list[Delivery]] = [[], []]
        self.windows: list[dict[int, RelayWindow]] = [{}, {}]

    def _link_conn(self, k: int) -> Connection:
        return self.cores[k][0].open_connection(
            Principal("shard", frozenset({"network"}), internal=True), protocol="shard")

    def run(self) -> None:
        """Until nothing moves: every decision carried, every delivery handed out."""
        moved = True
        while moved:
            moved = False
            for k, (broker, store) in enumerate(self.cores):
                out = pump(broker, store)  # first: dispatching may decide (a resume)
                for s in broker.take_shard_sends():
                    moved = True
                    owner_broker = self.cores[s.owner][0]
                    owner_broker.send(self.links[s.owner], (s.message.destination,),
                                      s.message)
                for decision in broker.take_relay_decisions():
                    moved = True
                    self._carry(k, decision)
                for d in out:
                    moved = True
                    if d.consumer.connection_id == self.links[k].id:
                        relay = next(r for r, c in self.relays[k].items() if c is d.consumer)
                        self.cores[1 - k][0].relay_deliver(k, relay, d.tag,
                                                           d.delivery_count, d.message)
                    else:
                        self.delivered[k].append(d)

    def _carry(self, k: int, decision: RelayDecision) -> None:
        if isinstance(decision, ProducerNote):  # (advisories: test_shard_advisories.py)
            return
        owner_broker = self.cores[decision.owner][0]
        conn = self.links[decision.owner]
        relays = self.relays[decision.owner]
        if isinstance(decision, RelayOpen):
            ack_mode = AckMode.AUTO if decision.auto else AckMode.CLIENT_INDIVIDUAL
            relays[decision.relay_id] = owner_broker.subscribe(conn, f"r{decision.relay_id}",
                ConsumerSpec(destinations=(decision.destination,),
                             ack_mode=ack_mode, prefetch=decision.prefetch,
                             selector=decision.selector, priority=decision.priority,
                             exclusive=decision.exclusive))
            if decision.auto:  # as RelayOut: counted as the owner's queue hands it over
                window = RelayWindow(relays[decision.relay_id], PeerStats())
                self.windows[decision.owner][decision.relay_id] = window
                relays[decision.relay_id].net_filter = window.admit
        elif isinstance(decision, RelayClose):
            owner_broker.unsubscribe(conn, relays.pop(decision.relay_id))
        elif isinstance(decision, RelayCredit):
            window = self.windows[decision.owner][decision.relay_id]
            window.inflight -= decision.count
            owner_broker.pause_relayed(relays[decision.relay_id],
                                       window.inflight >= window.size)
        elif decision.kind == SETTLE_ACK:
            owner_broker.ack(conn, relays[decision.relay_id], decision.tag, cumulative=False)
        else:
            owner_broker.nack(conn, relays[decision.relay_id], decision.tag, cumulative=False)


def test_two_cores_one_queue_producers_and_consumers_on_both() -> None:
    carrier = Carrier()
    (o, _), (a, _) = carrier.cores
    name = owned_by(0)
    oc, ac = connect(o), connect(a)
    local = sub(o, oc, "l", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2)
    relayed = sub(a, ac, "r", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=2)
    carrier.run()
    for i in range(8):
        send(a if i % 2 else o, ac if i % 2 else oc, name, f"m{i}", persistent=True)
    carrier.run()
    assert len(carrier.delivered[0]) == 2 and len(carrier.delivered[1]) == 2  # prefetch 2
    seen: list[str] = []
    while carrier.delivered[0] or carrier.delivered[1]:
        for k, (broker, conn, consumer) in enumerate(((o, oc, local), (a, ac, relayed))):
            for d in carrier.delivered[k]:
                seen.append(d.message.body.decode())
                broker.ack(conn, consumer, d.tag, cumulative=False)
            carrier.delivered[k] = []
        carrier.run()
    assert sorted(seen) == [f"m{i}" for i in range(8)]  # each once, shared by both
    assert o.queues[dst.queue(name)].depth == 0
    assert dst.queue(name) not in a.queues
    # The relayed consumer's NACK redelivers on the owner, counted.
    o.unsubscribe(oc, local)
    send(o, oc, name, "again")
    carrier.run()
    [d] = carrier.delivered[1]
    assert d.delivery_count == 1, d
    a.nack(ac, relayed, d.tag, cumulative=False)
    carrier.delivered[1] = []
    carrier.run()
    [d2] = carrier.delivered[1]
    assert d2.message.body == b"again" and d2.delivery_count == 2 and d2.redelivered


def test_an_auto_ack_relay_earns_credit_per_pump_for_what_its_client_was_given() -> None:
    broker, store = shard(0)
    conn = connect(broker)
    name = owned_by(1)
    sub(broker, conn, "s", name, prefetch=10)
    [opened] = broker.take_relay_decisions()
    assert isinstance(opened, RelayOpen) and opened.auto and opened.prefetch == 10
    relay = broker.state.relays[opened.relay_id]
    tags = itertools.count(1)

    def arrive(*names: str) -> None:
        for body in names:
            broker.relay_deliver(1, opened.relay_id, next(tags), 1,
                                 Message(message_id=body, destination=dst.queue(name),
                                         body=body.encode()))

    arrive("m1", "m2", "m3")
    assert bodies(pump(broker, store)) == ["m1", "m2", "m3"]
    # One credit for the pump, however many deliveries it covers; none when idle.
    assert broker.take_relay_decisions() == [RelayCredit(1, opened.relay_id, 3)]
    pump(broker, store)
    assert broker.take_relay_decisions() == []
    broker.set_paused(conn, True)  # its client's socket is full
    arrive("m4", "m5")
    assert pump(broker, store) == [] and relay.held == 2  # waiting here, uncredited
    assert broker.take_relay_decisions() == []
    broker.set_paused(conn, False)
    arrive("m6")  # behind those that waited: the owner's order holds
    assert bodies(pump(broker, store)) == ["m4", "m5", "m6"] and relay.held == 0
    assert broker.take_relay_decisions() == [RelayCredit(1, opened.relay_id, 3)]


def test_deliveries_held_across_a_lost_link_earn_no_credit_on_the_next() -> None:
    broker, store = shard(0)
    conn = connect(broker)
    name = owned_by(1)
    sub(broker, conn, "s", name, prefetch=10)
    [opened] = broker.take_relay_decisions()
    broker.set_paused(conn, True)
    for tag in (1, 2):
        broker.relay_deliver(1, opened.relay_id, tag, 1,
                             Message(message_id=f"m{tag}", destination=dst.queue(name),
                                     body=b"x"))
    pump(broker, store)
    broker.relay_link_lost(1)  # the next link's owner starts with a fresh window
    broker.relay_deliver(1, opened.relay_id, 1, 1,
                         Message(message_id="m3", destination=dst.queue(name), body=b"y"))
    broker.set_paused(conn, False)
    assert [d.message.message_id for d in pump(broker, store)] == ["m1", "m2", "m3"]
    assert broker.take_relay_decisions() == [RelayCredit(1, opened.relay_id, 1)]


def test_rights_on_a_destination_owned_elsewhere_need_no_admin_to_create_it() -> None:
    """Its queue lives on the owner, so its absence here says nothing: write and read
    rights are checked as on one broker, and no admin right is asked for."""
    authorization = AuthorizationConfig(
        entries=(AuthorizationEntry(queue="q.>", read=("users",), write=("users",)),),
        default=AuthorizationRights(admin=("admins",)))
    broker, _, _ = make_broker(auth=AuthConfig(authorization=authorization))
    broker.use_shard(ShardIdentity(index=1, count=2, node=NODE, run_dir="/nowhere",
                                   token="t"))
    user = broker.open_connection(Principal("u", frozenset({"users"})))
    send(broker, user, owned_by(0), "x")
    assert len(broker.take_shard_sends()) == 1
    sub(broker, user, "s", owned_by(0))
    with pytest.raises(AuthorizationError):  # the queue it would create here: admin
        send(broker, user, owned_by(1), "y")


def _settle_all(carrier: Carrier, pairs: list[tuple[Broker, Connection, Consumer]]) -> None:
    for k, (broker, conn, consumer) in enumerate(pairs):
        for d in carrier.delivered[k]:
            broker.ack(conn, consumer, d.tag, cumulative=False)
        carrier.delivered[k] = []
    carrier.run()


def test_exclusivity_priority_and_groups_hold_across_shards() -> None:
    carrier = Carrier()
    (o, _), (a, _) = carrier.cores
    oc, ac = connect(o), connect(a)
    # An exclusive relayed consumer takes everything from a plain local one.
    name = owned_by(0, "excl")
    sub(o, oc, "l", name, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    sub(a, ac, "r", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, exclusive=True)
    carrier.run()
    for i in range(4):
        send(o, oc, name, f"e{i}")
    carrier.run()
    assert carrier.delivered[0] == [] and bodies(carrier.delivered[1]) == [
        f"e{i}" for i in range(4)]
    carrier.delivered = [[], []]
    # A higher-priority local consumer is served before the relayed one.
    name = owned_by(0, "prio")
    sub(o, oc, "hi", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, priority=9, prefetch=2)
    sub(a, ac, "lo", name, ack_mode=AckMode.CLIENT_INDIVIDUAL, prefetch=5)
    carrier.run()
    for i in range(3):
        send(o, oc, name, f"p{i}")
    carrier.run()
    assert bodies(carrier.delivered[0]) == ["p0", "p1"]  # its window of 2, then the next
    assert bodies(carrier.delivered[1]) == ["p2"]
    carrier.delivered = [[], []]
    # Message groups stick to one consumer, local or relayed.
    name = owned_by(0, "groups")
    local = sub(o, oc, "g", name, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    relayed = sub(a, ac, "g", name, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    carrier.run()
    for i in range(8):
        send(o, oc, name, f"{'AB'[i % 2]}{i}", group_id="AB"[i % 2])
    carrier.run()
    groups = [{d.message.group_id for d in carrier.delivered[k]} for k in range(2)]
    assert groups[0] | groups[1] == {"A", "B"} and not groups[0] & groups[1]
    _settle_all(carrier, [(o, oc, local), (a, ac, relayed)])


def test_a_relayed_consumers_nacks_count_towards_the_owners_dlq() -> None:
    carrier = Carrier()
    (o, _), (a, _) = carrier.cores
    oc, ac = connect(o), connect(a)
    name = owned_by(0, "poison")
    relayed = sub(a, ac, "r", name, ack_mode=AckMode.CLIENT_INDIVIDUAL)
    carrier.run()
    send(o, oc, name, "poison", persistent=True)
    carrier.run()
    counts = []
    while carrier.delivered[1]:
        [d] = carrier.delivered[1]
        counts.append(d.delivery_count)
        carrier.delivered[1] = []
        a.nack(ac, relayed, d.tag, cumulative=False)
        carrier.run()
    assert counts == list(range(1, 8))  # 1 + max_redeliveries (6), then the DLQ
    assert o.queues[dst.queue("ActiveMQ.DLQ")].depth == 1
    assert o.queues[dst.queue(name)].depth == 0


def test_an_auto_ack_relayed_consumer_empties_the_owner_and_its_window_stops_the_owner(
) -> None:
    carrier = Carrier()
    (o, _), (a, _) = carrier.cores
    name = owned_by(0)
    oc, ac = connect(o), connect(a)
    sub(a, ac, "r", name, prefetch=2)  # auto-ack
    carrier.run()
    for i in range(3):
        send(o, oc, name, f"m{i}", persistent=True)
    carrier.run()
    assert bodies(carrier.delivered[1]) == ["m0", "m1", "m2"]
    assert o.queues[dst.queue(name)].depth == 0  # settled as they left, nothing came back
    carrier.delivered[1] = []
    a.set_paused(ac, True)  # the client's socket is full
    for i in range(4):
        send(o, oc, name, f"held{i}")
    carrier.run()
    # A window (2) crossed and waits on the consumer's shard; the owner keeps the rest.
    assert carrier.delivered[1] == [] and a.state.relays[1].held == 2
    assert o.queues[dst.queue(name)].depth == 2
    a.set_paused(ac, False)
    carrier.run()
    assert bodies(carrier.delivered[1]) == [f"held{i}" for i in range(4)]
    assert o.queues[dst.queue(name)].depth == 0
