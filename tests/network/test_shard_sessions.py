"""Client ids across two shards of one node, over real links with real STOMP and MQTT
clients on each shard's own port: a client id names one connection node-wide, as on
one broker. A second MQTT connection takes the first one over whichever shards they
are on (and whichever shard owns the id); a second STOMP ``client-id`` is refused until
the first one leaves; a restarted owner learns again who holds its ids; an owner that
is down refuses connects with its ids, retriably, once ``owner_wait_ms`` has passed.
MQTT sessions keep one broker's guarantees with shards killed (SIGKILL): a QoS 2
exchange's state is on the owner before its PUBREC, a change made while the owner is
down reaches it once it is back, and the owner ends an expired session on time."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from meshmq.config.model import ShardsConfig
from meshmq.core.shards import client_owner
from meshmq.protocol.mqtt import (
    Disconnect,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair, ShardProcess


def _client_id(pair: ShardPair, k: int, prefix: str) -> str:
    """A fresh client id that shard ``k`` owns."""
    for n in itertools.count():
        name = f"{prefix}-{n}"
        if client_owner(name, pair.count) == k:
            return name
    raise AssertionError("unreachable")


@pytest.fixture
def pair(tmp_path: Path):
    shards = ShardPair(tmp_path, mqtt=True).start()
    shards.wait_linked()
    yield shards
    shards.stop()


@pytest.mark.parametrize("owner", [0, 1])
def test_a_second_mqtt_connection_on_another_shard_takes_the_first_one_over(
        pair: ShardPair, owner: int) -> None:
    client_id = _client_id(pair, owner, "dev")
    first = RawMqtt(pair[0].mqtt_port, level=5)
    second = RawMqtt(pair[1].mqtt_port, level=5)
    try:
        first.connect(client_id)
        assert second.connect(client_id).reason_code == ReasonCode.SUCCESS
        # The old connection is told why and closed, as on one broker (MQTT 3.1.4-3).
        closing = first.until_closed()
        assert [p.reason_code for p in closing if isinstance(p, Disconnect)] == [
            ReasonCode.SESSION_TAKEN_OVER]
        second.ping()  # the new one stays
        # And back: a third on the first shard takes the second over.
        third = RawMqtt(pair[0].mqtt_port, level=5)
        try:
            third.connect(client_id)
            second.until_closed()
            third.ping()
        finally:
            third.close()
    finally:
        first.close()
        second.close()


def test_a_persistent_session_taken_over_keeps_its_subscription_free_for_the_new_one(
        pair: ShardPair) -> None:
    """The take-over finishes before the CONNACK: the old connection's consumers are
    gone, so the new connection on the other shard subscribes to the same durable."""
    client_id = _client_id(pair, 1, "dev")
    topic = pair.owned_by(1, "alerts", "topic").replace(".", "/")
    first = RawMqtt(pair[1].mqtt_port)
    second = RawMqtt(pair[0].mqtt_port)
    publisher = RawMqtt(pair[0].mqtt_port)
    try:
        first.connect(client_id, clean=False)
        first.subscribe(topic, qos=1)
        second.connect(client_id, clean=False)
        first.until_closed()
        second.subscribe(topic, qos=1)
        publisher.connect("pub")
        publisher.publish(topic, b"after", qos=1)
        assert [p.payload for p in second.publishes(1)] == [b"after"]
    finally:
        for c in (first, second, publisher):
            c.close()


def test_a_stomp_client_id_in_use_on_another_shard_is_refused_until_it_leaves(
        pair: ShardPair) -> None:
    for owner in (0, 1):
        client_id = _client_id(pair, owner, "durable")
        first = RawClient(pair[0])
        first.connect(extra=[("client-id", client_id)])
        second = RawClient(pair[1])
        second.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                      ("client-id", client_id)])
        try:
            error = second.expect_error_and_close()
        finally:
            second.close()
        assert f"Client: {client_id} already connected" in (error.get("message") or "")
        first.receipt_roundtrip()  # the first one is untouched
        # An MQTT connection with that id is refused as well (it is not MQTT's).
        mqtt = RawMqtt(pair[1].mqtt_port, level=5)
        try:
            ack = mqtt.connect(client_id, expect_success=False)
            assert ack.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
        finally:
            mqtt.close()
        first.send_frame("DISCONNECT", [("receipt", "bye")])
        first.read_until_receipt("bye")
        first.close()
        # Released: the id connects on the other shard now (the release may still be
        # on its way to the owner, so the first tries can be refused).
        def connects(client_id: str = client_id) -> bool:
            again = RawClient(pair[1])
            try:
                again.send_frame("CONNECT", [("accept-version", "1.2"),
                                             ("host", "localhost"), ("client-id", client_id)])
                ok = again.read_frame().command == "CONNECTED"
            finally:
                again.close()
            return ok
        poll(connects, what="the client id released")


def test_a_restarted_owner_learns_again_which_shard_holds_its_client_ids(
        pair: ShardPair) -> None:
    client_id = _client_id(pair, 0, "dev")
    holder = RawMqtt(pair[1].mqtt_port, level=5)
    try:
        holder.connect(client_id)
        pair.stop_owner(0)
        pair.start(0)
        pair.wait_linked()
        newer = RawMqtt(pair[0].mqtt_port, level=5)
        try:
            newer.connect(client_id)
            holder.until_closed()  # taken over: the owner knew it was on shard 1
            newer.ping()
        finally:
            newer.close()
    finally:
        holder.close()


def test_a_connect_whose_client_id_owner_is_down_is_refused_after_owner_wait(
        tmp_path: Path) -> None:
    shards = ShardPair(tmp_path, mqtt=True)
    shards.configs = [dataclasses.replace(c, sharding=ShardsConfig(owner_wait_ms=300))
                      for c in shards.configs]
    shards.start()
    try:
        shards.wait_linked()
        shards.stop_owner(0)
        poll(lambda: shards[1].run(lambda: shards[1].runtime.shard_peers.peers[0].down),
             what="shard 0 counted as down")
        client = RawMqtt(shards[1].mqtt_port, level=5)
        try:
            ack = client.connect(_client_id(shards, 0, "dev"), expect_success=False)
            assert ack.reason_code == ReasonCode.SERVER_UNAVAILABLE
        finally:
            client.close()
        stomp = RawClient(shards[1])
        stomp.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                     ("client-id", _client_id(shards, 0, "durable"))])
        try:
            error = stomp.expect_error_and_close()
        finally:
            stomp.close()
        assert "unreachable" in (error.get("message") or "")
        # A client id shard 1 owns, or none, connects as ever.
        ok = RawMqtt(shards[1].mqtt_port, level=5)
        try:
            ok.connect(_client_id(shards, 1, "dev"))
            ok.ping()
        finally:
            ok.close()
    finally:
        shards.stop()


def _states(shard: ShardBroker) -> set[str]:
    """Client ids whose persistent session ``shard``'s MQTT service keeps."""
    assert shard.runtime is not None
    mqtt = shard.runtime.mqtt
    return shard.run(lambda: set(mqtt.states))


@pytest.mark.parametrize("owner", [0, 1])
def test_an_mqtt_session_resumes_through_the_other_shard(pair: ShardPair, owner: int) -> None:
    """``session present`` and the subscriptions back, without subscribing again,
    whichever shard the client reconnects through and whichever owns its id."""
    client_id = _client_id(pair, owner, "dev")
    topics = [pair.owned_by(k, "alerts", "topic").replace(".", "/") for k in (0, 1)]
    made = RawMqtt(pair[0].mqtt_port)
    publisher = RawMqtt(pair[1].mqtt_port)
    clients = [made, publisher]
    try:
        assert not made.connect(client_id, clean=False).session_present
        made.subscribe(*((t, 1) for t in topics))
        made.close()
        publisher.connect("pub")
        for topic in topics:
            publisher.publish(topic, f"away {topic}".encode(), qos=1)
        back = RawMqtt(pair[1].mqtt_port)
        clients.append(back)
        assert back.connect(client_id, clean=False).session_present
        away = back.publishes(2)
        assert {p.payload.decode() for p in away} == {f"away {t}" for t in topics}
        for p in away:
            back.ack(p)
        poll(lambda: client_id not in _states(pair[0]), what="shard 0 forgetting it")
        # The session is still subscribed to both, live.
        publisher.publish(topics[0], b"live", qos=1)
        [live] = back.publishes(1)
        assert live.payload == b"live"
        back.ack(live)
        back.ping()
        back.close()
        # And back through the first shard again.
        again = RawMqtt(pair[0].mqtt_port)
        clients.append(again)
        assert again.connect(client_id, clean=False).session_present
        publisher.publish(topics[1], b"again", qos=1)
        assert [p.payload for p in again.publishes(1)] == [b"again"]
        again.close()
        # A clean start through either shard ends it.
        clean = RawMqtt(pair[1].mqtt_port)
        clients.append(clean)
        assert not clean.connect(client_id, clean=True).session_present
        clean.close()
        resumed = RawMqtt(pair[0].mqtt_port)
        clients.append(resumed)
        assert not resumed.connect(client_id, clean=False).session_present
    finally:
        for c in clients:
            c.close()


def test_the_shard_a_session_was_made_on_forgets_it_once_another_resumes_it(
        pair: ShardPair) -> None:
    """The shard the session was made on forgets it once another resumes it, so the
    short expiry it was given there does not end the session that goes on."""
    client_id = _client_id(pair, 1, "dev")
    topic = pair.owned_by(1, "alerts", "topic").replace(".", "/")
    first = RawMqtt(pair[0].mqtt_port, level=5)
    clients = [first]
    try:
        first.connect(client_id, clean=True,
                      properties=Properties(session_expiry_interval=1))
        first.subscribe((topic, 1))
        first.close()
        poll(lambda: client_id in _states(pair[0]), what="the session kept on shard 0")
        back = RawMqtt(pair[1].mqtt_port, level=5)
        clients.append(back)
        assert back.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=600)).session_present
        poll(lambda: client_id not in _states(pair[0]), what="shard 0 forgetting it")
        back.close()
        poll(lambda: client_id in _states(pair[1]), what="the session kept on shard 1")
        later = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(later)
        assert later.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=600)).session_present
    finally:
        for c in clients:
            c.close()


def _collect(members: list[RawMqtt], total: int) -> list[list[bytes]]:
    """What each member gets (acknowledged as it comes) until ``total`` arrived."""
    got: list[list[bytes]] = [[] for _ in members]

    def arrived() -> bool:
        for i, member in enumerate(members):
            for packet in member.ping():
                if isinstance(packet, Publish):
                    got[i].append(packet.payload)
                    member.ack(packet)
        return sum(map(len, got)) >= total
    poll(arrived, what=f"{total} messages to the group")
    return got


@pytest.mark.parametrize("wildcard", [False, True])
def test_an_mqtt_shared_subscription_is_one_group_across_the_shards(
        pair: ShardPair, wildcard: bool) -> None:
    """Members on both shards: each message goes to one of them, whichever shard owns
    its topic, and a member alone in the group gets every message."""
    topics = [pair.owned_by(k, "jobs", "topic").replace(".", "/") for k in (0, 1)]
    flt = f"$share/workers/{topics[0].split('/')[0]}/#" if wildcard else topics[1]
    sent_to = topics if wildcard else [topics[1]]
    members = [RawMqtt(pair[k].mqtt_port, level=5) for k in (0, 1)]
    publisher = RawMqtt(pair[0].mqtt_port, level=5)
    try:
        for k, member in enumerate(members):
            member.connect(f"worker-{k}")
            member.subscribe(flt if wildcard else f"$share/workers/{flt}", qos=1)
        publisher.connect("pub")
        payloads = [f"job {i}".encode() for i in range(20)]
        for i, payload in enumerate(payloads):
            publisher.publish(sent_to[i % len(sent_to)], payload, qos=1)
        got = _collect(members, len(payloads))
        assert sorted(got[0] + got[1]) == sorted(payloads)  # each to exactly one member
        # The member on shard 1 leaves: the one on shard 0 gets all that follows.
        members[1].disconnect()
        members[1].close()
        more = [f"later {i}".encode() for i in range(6)]
        for i, payload in enumerate(more):
            publisher.publish(sent_to[i % len(sent_to)], payload, qos=1)
        [alone] = _collect(members[:1], len(more))
        assert sorted(alone) == sorted(more)
    finally:
        for c in (*members, publisher):
            c.close()


def _mqtt_shard(pair: ShardPair, k: int, extra: str = "") -> ShardProcess:
    """Shard ``k`` as a real subprocess with an MQTT listener too (killed with
    SIGKILL by the tests); ``extra``: more TOML."""
    proc = pair.process(k)
    with proc.config_path.open("a") as toml:
        toml.write(f'\n[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:0"\n{extra}\n')
    return proc


def _linked(pair: ShardPair, k: int = 0) -> None:
    """Thread shard ``k`` linked to every other shard (processes, some of them)."""
    poll(lambda: pair[k].links_up() == pair.count - 1, what=f"shard {k}'s links")


def _record(shard: ShardBroker, client_id: str) -> dict[str, Any] | None:
    """The session record the client id's owner ``shard`` keeps."""
    assert shard.runtime is not None
    broker = shard.runtime.broker
    stored = shard.run(lambda: broker.records.get(f"mqtt-session/{client_id}"))
    return None if stored is None else cast(dict[str, Any], json.loads(stored[1]))


@contextlib.contextmanager
def _held(shard: ShardBroker) -> Iterator[None]:
    """``shard``'s event loop does nothing while inside (as a slow owner would)."""
    entered, leave = threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        leave.wait(30)

    shard.loop.call_soon_threadsafe(block)
    assert entered.wait(10)
    try:
        yield
    finally:
        leave.set()


def test_a_qos2_exchange_survives_the_kill_of_the_clients_shard_right_after_pubrec(
        tmp_path: Path) -> None:
    """The PUBREC leaves only once the client id's owner has stored the exchange, so a
    SIGKILL of the client's shard right after it loses nothing: the client resumes
    through the owner's shard, its PUBLISH sent again is not routed again, its PUBREL
    is answered, and the subscriber gets the message once."""
    pair = ShardPair(tmp_path, mqtt=True)
    pair.start(0)
    shard1 = _mqtt_shard(pair, 1).start()
    clients: list[RawMqtt] = []
    try:
        _linked(pair)
        client_id = _client_id(pair, 0, "dev")  # owned by shard 0
        topic = pair.owned_by(1, "orders", "topic").replace(".", "/")  # stored by 1
        subscriber = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(subscriber)
        subscriber.connect("exactly-once-sub", clean=False,
                           properties=Properties(session_expiry_interval=600))
        subscriber.subscribe((topic, 1))
        client = RawMqtt(shard1.ports["mqtt"], level=5)
        clients.append(client)
        client.connect(client_id, clean=False,
                       properties=Properties(session_expiry_interval=600))
        pid = client.next_pid()
        publish = Publish(topic, b"once", qos=2, packet_id=pid)
        with _held(pair[0]):
            client.send(publish)
            # Stored on shard 1 at once, but the owner has not stored the exchange yet:
            # no PUBREC (a bounded negative check).
            with pytest.raises(AssertionError, match="no packet arrived"):
                client.expect(Pubrec, timeout=0.5)
        client.expect(Pubrec)
        shard1.kill9()
        record = _record(pair[0], client_id)
        assert record is not None and record["qos2_in"] == [pid]
        shard1 = _mqtt_shard(pair, 1).start()
        _linked(pair)
        back = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(back)
        assert back.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=600)).session_present
        back.send(Publish(topic, b"once", qos=2, packet_id=pid, dup=True))
        back.expect(Pubrec)  # known: acknowledged, not routed again
        back.send(Pubrel(pid))
        assert back._expect_ack(Pubcomp, pid).reason_code == ReasonCode.SUCCESS
        back.publish(topic, b"marker", qos=1)
        got: list[Publish] = []
        while not got or got[-1].payload != b"marker":
            got.append(subscriber.expect(Publish, timeout=15))
            subscriber.ack(got[-1])
        # Routed once: a delivery the restart of shard 1 interrupted may come again,
        # flagged DUP, but no second message.
        assert [p.payload for p in got if not p.dup] == [b"once", b"marker"]
        assert (_record(pair[0], client_id) or {}).get("qos2_in") == []
    finally:
        for c in clients:
            c.close()
        if shard1.proc is not None and shard1.proc.poll() is None:
            shard1.kill9()
        pair.stop()


def _unstored(shard: ShardBroker) -> set[str]:
    """Client ids whose session change ``shard`` holds for an owner that has not
    stored it yet."""
    assert shard.runtime is not None and shard.runtime.shard_peers is not None
    claims = shard.runtime.shard_peers.clients
    return shard.run(lambda: set(claims.unstored))


@pytest.mark.parametrize("away", ["back in time", "past owner_wait"])
def test_a_session_change_while_the_owner_is_killed_reaches_it_once_it_is_back(
        tmp_path: Path, away: str) -> None:
    """The change is held for the owner and sent when it is back. Back within
    ``owner_wait_ms``, the PUBREC waits for it; past that, the connection is closed
    unconfirmed, as one broker whose store fails, and the client, resuming once the
    owner is back, finds the exchange it started."""
    pair = ShardPair(tmp_path, mqtt=True)
    if away == "past owner_wait":
        pair.configs = [dataclasses.replace(c, sharding=ShardsConfig(owner_wait_ms=300))
                        for c in pair.configs]
    owner = _mqtt_shard(pair, 0).start()
    pair.start(1)
    clients: list[RawMqtt] = []
    try:
        _linked(pair, 1)
        client_id = _client_id(pair, 0, "dev")
        topic = pair.owned_by(1, "orders", "topic").replace(".", "/")
        client = RawMqtt(pair[1].mqtt_port, level=5)
        clients.append(client)
        client.connect(client_id, clean=False,
                       properties=Properties(session_expiry_interval=600))
        owner.kill9()
        poll(lambda: pair[1].links_up() == 0, what="the link to the owner to drop")
        pid = client.next_pid()
        client.send(Publish(topic, b"held", qos=2, packet_id=pid))
        poll(lambda: client_id in _unstored(pair[1]), what="the change held")
        if away == "past owner_wait":
            closing = client.until_closed()
            assert not [p for p in closing if isinstance(p, Pubrec)]
            assert [p.reason_code for p in closing if isinstance(p, Disconnect)] == [
                ReasonCode.UNSPECIFIED_ERROR]
        owner = _mqtt_shard(pair, 0).start()
        _linked(pair, 1)
        if away == "back in time":
            client.expect(Pubrec, timeout=15)  # once the owner has stored it
        poll(lambda: not _unstored(pair[1]), what="the change stored by the owner")
        # Through the owner's own shard (a take-over): the exchange is there.
        back = RawMqtt(owner.ports["mqtt"], level=5)
        clients.append(back)
        assert back.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=600)).session_present
        back.send(Publish(topic, b"held", qos=2, packet_id=pid, dup=True))
        back.expect(Pubrec)
        back.send(Pubrel(pid))
        assert back._expect_ack(Pubcomp, pid).reason_code == ReasonCode.SUCCESS
    finally:
        for c in clients:
            c.close()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.kill9()
        pair.stop()


def _durables(shard: ShardBroker, client_id: str) -> list[str]:
    assert shard.runtime is not None
    broker = shard.runtime.broker
    return shard.run(lambda: sorted(name for cid, name in broker.durables if cid == client_id))


def test_the_owner_ends_an_expired_session_even_with_the_clients_shard_killed(
        tmp_path: Path) -> None:
    """A session that ended on shard 1 and whose client id shard 0 owns expires on
    shard 0, on time, though shard 1 was killed meanwhile; its subscriptions on both
    topic owners go with it (shard 1's when it is back)."""
    pair = ShardPair(tmp_path, mqtt=True)
    pair.start(0)
    shard1 = _mqtt_shard(pair, 1).start()
    clients: list[RawMqtt] = []
    try:
        _linked(pair)
        client_id = _client_id(pair, 0, "dev")
        topics = [pair.owned_by(k, "alerts", "topic").replace(".", "/") for k in (0, 1)]
        client = RawMqtt(shard1.ports["mqtt"], level=5)
        clients.append(client)
        client.connect(client_id, clean=True, properties=Properties(session_expiry_interval=2))
        client.subscribe(*((t, 1) for t in topics))
        client.disconnect()
        client.close()
        poll(lambda: (_record(pair[0], client_id) or {}).get("ended") is not None,
             what="the session's end on its owner")
        ended = (_record(pair[0], client_id) or {})["ended"]
        assert _durables(pair[0], client_id)  # its subscription on shard 0's topic
        shard1.kill9()
        poll(lambda: _record(pair[0], client_id) is None, timeout=15,
             what="the owner ending the session")
        assert pair[0].runtime is not None
        assert pair[0].run(pair[0].runtime.broker.now_ms) >= ended + 2000  # not before
        assert _durables(pair[0], client_id) == []
        # Shard 1, back (in a thread, to look inside): its subscription goes too.
        pair.start(1)
        pair.wait_linked()
        poll(lambda: _durables(pair[1], client_id) == [], what="shard 1's subscription")
        again = RawMqtt(pair[1].mqtt_port, level=5)
        clients.append(again)
        assert not again.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=60)).session_present
    finally:
        for c in clients:
            c.close()
        if shard1.proc is not None and shard1.proc.poll() is None:
            shard1.kill9()
        pair.stop()


def test_a_restarted_owner_arms_a_sessions_expiry_again_from_its_store(
        tmp_path: Path) -> None:
    """The owner is killed after the session's connection ended on shard 1 (which runs
    no expiry of its own on a node): restarted, it arms the expiry again from the
    stored record and ends the session, its subscription on shard 1's topic with it."""
    pair = ShardPair(tmp_path, mqtt=True)
    owner = _mqtt_shard(pair, 0).start()
    pair.start(1)
    clients: list[RawMqtt] = []
    try:
        _linked(pair, 1)
        client_id = _client_id(pair, 0, "dev")
        topic = pair.owned_by(1, "alerts", "topic").replace(".", "/")
        client = RawMqtt(pair[1].mqtt_port, level=5)
        clients.append(client)
        client.connect(client_id, clean=True, properties=Properties(session_expiry_interval=2))
        client.subscribe((topic, 1))
        client.disconnect()
        client.close()
        poll(lambda: client_id in _states(pair[1]), what="the session's end on shard 1")
        assert _durables(pair[1], client_id)
        poll(lambda: not _unstored(pair[1]), what="its last record stored by the owner")
        owner.kill9()
        owner = _mqtt_shard(pair, 0).start()
        _linked(pair, 1)
        poll(lambda: _durables(pair[1], client_id) == [], timeout=15,
             what="the restarted owner ending the session")
        poll(lambda: client_id not in _states(pair[1]), what="shard 1 forgetting it")
        again = RawMqtt(pair[1].mqtt_port, level=5)
        clients.append(again)
        assert not again.connect(client_id, clean=False, properties=Properties(
            session_expiry_interval=60)).session_present
    finally:
        for c in clients:
            c.close()
        if owner.proc is not None and owner.proc.poll() is None:
            owner.kill9()
        pair.stop()
