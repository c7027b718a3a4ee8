"""Wildcard and durable subscriptions between two shards of one node, over real links
with real STOMP and MQTT clients on each shard's own port: a wildcard subscription gets
what both shards own (and keeps getting it after the other shard restarts), a durable
subscription lives on its topic's owner and keeps what is published while its client
is away, whichever shard the client comes back through."""

from __future__ import annotations

import itertools
from pathlib import Path

from meshmq.core.destinations import Destination
from meshmq.core.shard_relay import RelayQueue
from meshmq.core.shards import owner
from meshmq.protocol.mqtt import Properties, Publish
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.raw_stomp import RawFrame
from tests.support.shard_pair import NODE, ShardBroker, ShardPair


def _client(shard: ShardBroker, client_id: str | None = None) -> RawClient:
    client = RawClient(shard)
    client.connect(extra=[("client-id", client_id)] if client_id else ())
    return client


def _send(client: RawClient, dest: str, body: str) -> None:
    rid = f"r-{body}"
    client.send_frame("SEND", [("destination", dest), ("receipt", rid),
                               ("persistent", "true")], body.encode())
    client.read_until_receipt(rid)


def _subscribe(client: RawClient, dest: str, sid: str, *extra: tuple[str, str],
               ack: str = "auto") -> list[RawFrame]:
    """SUBSCRIBE and wait for its RECEIPT; the MESSAGEs that came before it (a local
    delivery can overtake the receipt, which waits for the other shards)."""
    client.send_frame("SUBSCRIBE", [("destination", dest), ("id", sid), ("ack", ack),
                                    ("receipt", f"sub-{sid}"), *extra])
    return [f for f in client.read_until_receipt(f"sub-{sid}") if f.command == "MESSAGE"]


def _receive(client: RawClient, count: int, early: list[RawFrame] | None = None
             ) -> list[tuple[str, str, str]]:
    """``count`` MESSAGE frames (``early`` first) as (destination, body, ack id)."""
    frames = list(early or [])
    while len(frames) < count:
        frame, _ = client.read_until("MESSAGE")
        frames.append(frame)
    return [(f.get("destination") or "", f.body.decode(), f.get("ack") or "")
            for f in frames]


def _durable(shard: ShardBroker, client_id: str, name: str) -> str:
    """"absent", "idle" (kept, no consumer) or "active" on ``shard``."""
    assert shard.runtime is not None
    broker = shard.runtime.broker

    def look() -> str:
        sub = broker.durables.get((client_id, name))
        return "absent" if sub is None else "idle" if sub.consumer is None else "active"
    return shard.run(look)


def test_a_queue_wildcard_consumes_the_queues_of_both_shards(pair: ShardPair) -> None:
    here, there = pair.owned_by(1, "work"), pair.owned_by(0, "work")
    producer = pair[0].client()
    _send(producer, f"/queue/{there}", "waiting")  # before the subscription: kept
    consumer = pair[1].client()
    early = _subscribe(consumer, "/queue/work.>", "w", ("activemq.prefetchSize", "50"),
                       ack="client-individual")
    for i in range(10):
        _send(producer, f"/queue/{there}" if i % 2 else f"/queue/{here}", f"m{i}")
    got = _receive(consumer, 11, early)
    by_queue: dict[str, list[str]] = {}
    for dest, body, ack in got:
        by_queue.setdefault(dest, []).append(body)
        consumer.send_frame("ACK", [("id", ack)])
    assert by_queue == {f"/queue/{there}": ["waiting", "m1", "m3", "m5", "m7", "m9"],
                        f"/queue/{here}": ["m0", "m2", "m4", "m6", "m8"]}
    consumer.receipt_roundtrip()
    poll(lambda: pair[0].depth(there) == 0 and pair[1].depth(here) == 0,
         what="the acknowledgements settled on each owner")
    consumer.send_frame("UNSUBSCRIBE", [("id", "w"), ("receipt", "u")])
    consumer.read_until_receipt("u")
    poll(lambda: pair[0].consumers(there) == 0, what="the owner's consumer closed")
    _send(producer, f"/queue/{there}", "after")
    assert pair[0].depth(there) == 1
    for client in (producer, consumer):
        client.close()


def test_a_topic_wildcard_is_opened_again_when_the_other_shard_restarts(
        pair: ShardPair) -> None:
    t0, t1 = pair.owned_by(0, "px", "topic"), pair.owned_by(1, "px", "topic")
    subscriber = pair[1].client()
    _subscribe(subscriber, "/topic/px.>", "w")
    producer = pair[1].client()
    _send(producer, f"/topic/{t0}", "before-0")
    _send(producer, f"/topic/{t1}", "before-1")
    assert sorted(b for _, b, _ in _receive(subscriber, 2)) == ["before-0", "before-1"]
    pair.stop_owner(0)
    pair.start(0)
    pair.wait_linked()
    poll(lambda: pair[0].topic_subscribers(t0) == 1, what="the wildcard on the restarted shard")
    late = pair.owned_by(0, "px.late", "topic")  # a topic that first appears now
    for i in range(3):
        _send(producer, f"/topic/{t0}", f"a{i}")
        _send(producer, f"/topic/{late}", f"l{i}")
    got = [(d, b) for d, b, _ in _receive(subscriber, 6)]
    assert [b for d, b in got if d == f"/topic/{t0}"] == ["a0", "a1", "a2"]
    assert [b for d, b in got if d == f"/topic/{late}"] == ["l0", "l1", "l2"]
    for client in (producer, subscriber):
        client.close()


def test_a_wildcard_is_confirmed_while_a_shard_is_down_and_opened_there_when_it_is_back(
        pair: ShardPair) -> None:
    peers = pair[1].runtime.shard_peers if pair[1].runtime is not None else None
    assert peers is not None
    pair[1].run(lambda: setattr(peers, "owner_wait_s", 0.3))
    waiting = pair[1].client()
    pair.stop_owner(0)
    # Subscribed before shard 0 is given up on: confirmed once it is.
    waiting.send_frame("SUBSCRIBE", [("destination", "/queue/dn.>"), ("id", "q"),
                                     ("receipt", "early")])
    poll(lambda: pair[1].run(lambda: peers.peers[0].down), what="shard 0 given up on")
    waiting.read_until_receipt("early")
    subscriber = pair[1].client()
    _subscribe(subscriber, "/topic/dn.>", "w")  # (its RECEIPT: not waiting for shard 0)
    pair.start(0)
    pair.wait_linked()
    poll(lambda: pair[0].topic_subscribers(pair.owned_by(0, "dn", "topic")) == 1,
         what="the wildcard opened on the shard that came back")
    producer = pair[0].client()
    _send(producer, f"/topic/{pair.owned_by(0, 'dn', 'topic')}", "back")
    assert [b for _, b, _ in _receive(subscriber, 1)] == ["back"]
    for client in (producer, subscriber, waiting):
        client.close()


def test_a_durable_subscriber_gets_what_was_published_while_away_through_either_shard(
        pair: ShardPair) -> None:
    topic = pair.owned_by(1, "news", "topic")
    name = ("activemq.subscriptionName", "daily")
    first = _client(pair[0], "reader")
    _subscribe(first, f"/topic/{topic}", "d", name)
    assert _durable(pair[1], "reader", "daily") == "active"
    assert _durable(pair[0], "reader", "daily") == "absent"
    first.close()
    poll(lambda: _durable(pair[1], "reader", "daily") == "idle", what="the client gone")
    producer = pair[0].client()
    for i in range(3):
        _send(producer, f"/topic/{topic}", f"m{i}")
    again = _client(pair[0], "reader")  # back through the shard that does not own it
    early = _subscribe(again, f"/topic/{topic}", "d", name)
    assert [b for _, b, _ in _receive(again, 3, early)] == ["m0", "m1", "m2"]
    again.close()
    poll(lambda: _durable(pair[1], "reader", "daily") == "idle", what="the client gone")
    _send(producer, f"/topic/{topic}", "m3")
    owner_side = _client(pair[1], "reader")  # and through the owner
    early = _subscribe(owner_side, f"/topic/{topic}", "d", name)
    assert [b for _, b, _ in _receive(owner_side, 1, early)] == ["m3"]
    owner_side.close()
    poll(lambda: _durable(pair[1], "reader", "daily") == "idle", what="the client gone")
    # Removing it by name through the other shard removes it on the owner.
    remover = _client(pair[0], "reader")
    remover.send_frame("UNSUBSCRIBE", [("id", "d"), name, ("receipt", "gone")])
    remover.read_until_receipt("gone")
    poll(lambda: _durable(pair[1], "reader", "daily") == "absent", what="the removal")
    for client in (producer, remover):
        client.close()


def test_a_durable_removed_while_its_owner_is_down_is_removed_when_it_is_back(
        pair: ShardPair) -> None:
    topic = pair.owned_by(0, "stale", "topic")
    name = ("activemq.subscriptionName", "old")
    first = _client(pair[1], "leaver")
    _subscribe(first, f"/topic/{topic}", "d", name)
    first.close()
    poll(lambda: _durable(pair[0], "leaver", "old") == "idle", what="the client gone")
    pair.stop_owner(0)
    remover = _client(pair[1], "leaver")
    remover.send_frame("UNSUBSCRIBE", [("id", "d"), name, ("receipt", "gone")])
    remover.read_until_receipt("gone")
    pair.start(0)  # (it recovers the subscription from its store)
    pair.wait_linked()
    poll(lambda: _durable(pair[0], "leaver", "old") == "absent", what="the removal")
    remover.close()


def test_a_durable_wildcard_keeps_what_both_shards_own(pair: ShardPair) -> None:
    t0, t1 = pair.owned_by(0, "ev", "topic"), pair.owned_by(1, "ev", "topic")
    name = ("activemq.subscriptionName", "all")
    first = _client(pair[0], "watcher")
    _subscribe(first, "/topic/ev.>", "d", name)
    first.close()
    for k in (0, 1):
        poll(lambda k=k: _durable(pair[k], "watcher", "all") == "idle",
             what=f"the durable wildcard kept on shard {k}")
    producer = pair[0].client()
    _send(producer, f"/topic/{t0}", "zero")
    _send(producer, f"/topic/{t1}", "one")
    again = _client(pair[1], "watcher")
    early = _subscribe(again, "/topic/ev.>", "d", name)
    assert sorted(b for _, b, _ in _receive(again, 2, early)) == ["one", "zero"]
    for client in (producer, again):
        client.close()


def test_mqtt_wildcards_at_qos_0_and_1_get_every_shards_topics(tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topics = [_owned(pair, k, "sensors.r{}.temp").replace(".", "/") for k in (0, 1)]
        qos1 = RawMqtt(pair[1].mqtt_port)
        qos0 = RawMqtt(pair[0].mqtt_port)
        clients += [qos1, qos0]
        qos1.connect("w1")
        qos1.subscribe("sensors/+/temp", qos=1)
        qos0.connect("w0")
        qos0.subscribe("#", qos=0)
        publisher = RawMqtt(pair[0].mqtt_port)
        clients.append(publisher)
        publisher.connect("pub")
        for i in range(10):
            publisher.publish(topics[i % 2], f"{i % 2}-{i}".encode(), qos=1)
        for client, qos in ((qos1, 1), (qos0, 0)):
            got: dict[str, list[str]] = {}
            for publish in client.publishes(10):
                assert publish.qos == qos
                got.setdefault(publish.topic, []).append(publish.payload.decode())
                client.ack(publish)
            assert got == {topics[0]: [f"0-{i}" for i in range(0, 10, 2)],
                           topics[1]: [f"1-{i}" for i in range(1, 10, 2)]}
    finally:
        for c in clients:
            c.close()
        pair.stop()


def test_an_mqtt_persistent_session_keeps_qos1_messages_on_the_topics_owner(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topic = pair.owned_by(1, "alerts", "topic").replace(".", "/")
        session = RawMqtt(pair[0].mqtt_port)
        clients.append(session)
        session.connect("dev", clean=False)
        session.subscribe(topic, qos=1)
        session.close()
        durable = f"mqtt1:{topic}"
        poll(lambda: _durable(pair[1], "dev", durable) == "idle", what="the session away")
        publisher = RawMqtt(pair[1].mqtt_port)
        clients.append(publisher)
        publisher.connect("pub")
        for i in range(3):
            publisher.publish(topic, f"a{i}".encode(), qos=1)
        back = RawMqtt(pair[0].mqtt_port)
        clients.append(back)
        assert back.connect("dev", clean=False).session_present
        got = [p.payload.decode() for p in back.publishes(3)]
        assert got == ["a0", "a1", "a2"]
        back.close()
        poll(lambda: _durable(pair[1], "dev", durable) == "idle", what="the session away")
        # A clean start ends the session: its subscription on the owner goes too.
        clean = RawMqtt(pair[0].mqtt_port)
        clients.append(clean)
        clean.connect("dev", clean=True)
        poll(lambda: _durable(pair[1], "dev", durable) == "absent", what="the clean start")
    finally:
        for c in clients:
            c.close()
        pair.stop()


def _owned(pair: ShardPair, k: int, template: str) -> str:
    """A topic name ``template.format(n)`` that shard ``k`` owns."""
    for n in itertools.count():
        name = template.format(n)
        if owner(Destination.parse_uri(f"topic://{name}"), pair.count, node=NODE) == k:
            return name
    raise AssertionError("unreachable")


def test_mqtt_retained_messages_of_every_owner_reach_a_new_subscription(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    clients: list[RawMqtt] = []

    def retained_on(k: int, flt: str, count: int) -> dict[str, str]:
        client = RawMqtt(pair[k].mqtt_port)
        clients.append(client)
        client.connect(f"r{len(clients)}")
        client.subscribe(flt, qos=1)
        got = {}
        for publish in client.publishes(count):
            assert publish.retain
            got[publish.topic] = publish.payload.decode()
            client.ack(publish)
        client.close()
        return got

    try:
        pair.wait_linked()
        topics = [_owned(pair, k, "home.room{}.temp").replace(".", "/") for k in (0, 1)]
        publisher = RawMqtt(pair[0].mqtt_port)
        clients.append(publisher)
        publisher.connect("pub")
        for k, topic in enumerate(topics):
            publisher.publish(topic, f"old{k}".encode(), qos=1, retain=True)
            publisher.publish(topic, f"t{k}".encode(), qos=1, retain=True)
        expected = {topics[0]: "t0", topics[1]: "t1"}
        for k in (0, 1):  # a wildcard gets every owner's, on either shard
            assert retained_on(k, "home/+/temp", 2) == expected
        assert retained_on(0, topics[1], 1) == {topics[1]: "t1"}
        # Shard 1 restarts: its own come back from its store, shard 0's over the link.
        pair.stop_owner(1)
        publisher.publish(topics[0], b"while-away", qos=1, retain=True)
        pair.start(1)
        pair.wait_linked()
        expected[topics[0]] = "while-away"
        # (A copy follows its owner's change one link hop later.)
        poll(lambda: _retained_here(pair[1]) == [b"t1", b"while-away"],
             what="shard 0's retained message copied to the restarted shard 1")
        assert retained_on(1, "home/#", 2) == expected
        # Cleared on its owner through the other shard: gone everywhere.
        publisher.publish(topics[1], b"", qos=1, retain=True)
        assert retained_on(1, "home/#", 1) == {topics[0]: "while-away"}
        poll(lambda: _retained_here(pair[0]) == [b"while-away"], what="the clearing copied")
        assert retained_on(0, "home/#", 1) == {topics[0]: "while-away"}
    finally:
        for c in clients:
            c.close()
        pair.stop()


def _retained_here(shard: ShardBroker) -> list[bytes]:
    """The retained messages a new subscription on ``shard`` would get, sorted."""
    assert shard.runtime is not None
    broker = shard.runtime.broker
    return shard.run(lambda: sorted(m.body for m in broker.retained_for(
        [Destination.parse_uri("topic://home.>")])))


def test_an_expired_mqtt_session_takes_its_subscription_on_the_owner_with_it(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topic = pair.owned_by(1, "expiring", "topic").replace(".", "/")
        session = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(session)
        session.connect("brief", clean=False,
                        properties=Properties(session_expiry_interval=1))
        session.subscribe(topic, qos=1)
        durable = f"mqtt1:{topic}"
        assert _durable(pair[1], "brief", durable) == "active"
        session.disconnect()
        session.close()
        # Kept while the session may come back, then gone with it on the owner too.
        poll(lambda: _durable(pair[1], "brief", durable) == "idle", what="the session away")
        poll(lambda: _durable(pair[1], "brief", durable) == "absent", 10,
             "the expired session's subscription dropped on the owner")
    finally:
        for c in clients:
            c.close()
        pair.stop()


def test_an_mqtt_wildcard_fed_by_both_shards_keeps_the_clients_receive_maximum(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True).start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topics = [_owned(pair, k, "rm.dev{}").replace(".", "/") for k in (0, 1)]
        subscriber = RawMqtt(pair[1].mqtt_port, level=5)
        publisher = RawMqtt(pair[0].mqtt_port)
        clients += [subscriber, publisher]
        subscriber.connect("few", properties=Properties(receive_maximum=2))
        subscriber.subscribe("rm/+", qos=1)
        publisher.connect("many")
        for i in range(6):
            for k, topic in enumerate(topics):
                publisher.publish(topic, f"{k}-{i}".encode(), qos=1)
        first = subscriber.publishes(2)
        # Each owner gives the subscription a window of 2: all 8 (6 of shard 1's, 2 of
        # shard 0's) are on the subscriber's shard, 2 of them with the client.
        poll(lambda: _window(pair[1]) == (2, 8), what="every owner's window on shard 1")
        assert [p for p in subscriber.ping() if isinstance(p, Publish)] == []
        got = first
        for publish in first:
            subscriber.ack(publish)
        while len(got) < 12:
            batch = subscriber.publishes(1)
            got += batch
            subscriber.ack(batch[0])
        payloads = [p.payload.decode() for p in got]
        for k in (0, 1):
            assert [x for x in payloads if x.startswith(f"{k}-")] == \
                [f"{k}-{i}" for i in range(6)]
    finally:
        for c in clients:
            c.close()
        pair.stop()


def _window(shard: ShardBroker) -> tuple[int, int]:
    """The one client subscription on ``shard``: (deliveries with its client, those
    plus what waits for it there: its local topic queue, relayed ones held back)."""
    assert shard.runtime is not None
    broker = shard.runtime.broker

    def look() -> tuple[int, int]:
        [consumer] = [c for conn in broker.state.connections.values()
                      if conn.protocol == "mqtt" for c in conn.consumers.values()]
        relays = [q for q in consumer.sources if isinstance(q, RelayQueue)]
        local = sum(q.depth for q in consumer.sources if q not in relays)
        relayed = sum(1 for e in consumer.dispatched.values() if e.queue in relays)
        waiting = sum(len(getattr(r, "_waiting", ())) for r in relays)
        return len(consumer.dispatched), local + relayed + waiting
    return shard.run(look)


def test_three_shards_a_wildcard_and_retained_messages_from_every_owner(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True, count=3).start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topics = [_owned(pair, k, "tri.s{}").replace(".", "/") for k in range(3)]
        publisher = RawMqtt(pair[0].mqtt_port)
        clients.append(publisher)
        publisher.connect("tpub")
        for k, topic in enumerate(topics):
            publisher.publish(topic, f"r{k}".encode(), qos=1, retain=True)
        for k in range(3):  # every shard has every owner's retained message
            poll(lambda k=k: len(pair[k].run(lambda k=k: pair[k].runtime.broker.retained_for(
                [Destination.parse_uri("topic://tri.>")]))) == 3,
                 what=f"the retained messages on shard {k}")
        subscriber = RawMqtt(pair[2].mqtt_port)
        clients.append(subscriber)
        subscriber.connect("tsub")
        subscriber.subscribe("tri/+", qos=1)
        retained = subscriber.publishes(3)
        assert sorted(p.payload for p in retained) == [b"r0", b"r1", b"r2"]
        assert all(p.retain for p in retained)
        for p in retained:
            subscriber.ack(p)
        for i in range(3):
            for topic in topics:
                publisher.publish(topic, f"{topic}:{i}".encode(), qos=1)
        got: dict[str, list[str]] = {}
        for publish in subscriber.publishes(9):
            got.setdefault(publish.topic, []).append(publish.payload.decode())
            subscriber.ack(publish)
        assert got == {t: [f"{t}:{i}" for i in range(3)] for t in topics}
    finally:
        for c in clients:
            c.close()
        pair.stop()
