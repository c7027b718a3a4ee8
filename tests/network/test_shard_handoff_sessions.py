"""Connection handoff of MQTT persistent sessions (transport/mqtt_server.py
``_offer_resume`` and ``_offer``, network/shard_clients.py): a CONNECT that resumes a
session subscribed to one other shard's topics is handed to that shard before its
CONNACK, and a persistent session without subscriptions at its first PUBLISH or
SUBSCRIBE, its expiry and QoS 2 exchanges with it. What waited for the session is
delivered by the shard that took it, a QoS 2 exchange in progress survives the handoff
and a SIGKILL of the adopting shard, a second CONNECT with the id takes the handed
connection over, and the session's expiry runs once, on the client id's owner. And a
STOMP CONNECT with a client id an MQTT connection holds is refused at once while that
connection lives, and accepted at once after its client left, as on one broker. Real
sockets, real Unix-socket links, in-process shards (one a subprocess, for SIGKILL)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from meshmq.config.model import ShardsConfig
from meshmq.protocol.mqtt import (
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import RawClient
from tests.network.test_shard_handoff_ids import _client_id, _clients, _holder, _stats, _topic
from tests.network.test_shard_sessions import _held
from tests.support.brokers import poll
from tests.support.shard_pair import ShardBroker, ShardPair, ShardProcess

EXPIRY = Properties(session_expiry_interval=600)


@pytest.fixture
def handing(tmp_path: Path) -> Iterator[ShardPair]:
    """Two linked shards, with STOMP and MQTT listeners, that hand connections over."""
    shards = ShardPair(tmp_path, mqtt=True, sharding=ShardsConfig(handoff=True)).start()
    shards.wait_linked()
    yield shards
    shards.stop()


def _record(shard: ShardBroker, client_id: str) -> dict[str, Any] | None:
    """The session record the client id's owner ``shard`` keeps."""
    assert shard.runtime is not None
    broker = shard.runtime.broker
    stored = shard.run(lambda: broker.records.get(f"mqtt-session/{client_id}"))
    return None if stored is None else cast(dict[str, Any], json.loads(stored[1]))


def _states(shard: ShardBroker) -> set[str]:
    """The persistent sessions ``shard``'s MQTT service keeps in memory."""
    assert shard.runtime is not None
    service = shard.runtime.mqtt
    return shard.run(lambda: set(service.states))


def _connect(client: RawMqtt, client_id: str, level: int) -> bool:
    """A persistent session's CONNECT (3.1.1 clean session 0; MQTT 5 with an expiry);
    whether the session was present."""
    ack = client.connect(client_id, clean=False,
                         properties=EXPIRY if level == 5 else None)
    return bool(ack.session_present)


@pytest.mark.parametrize(("level", "id_owner"), [(4, 0), (4, 1), (5, 0), (5, 1)])
def test_a_resumed_session_is_handed_to_its_topics_owner_with_what_waited_for_it(
        handing: ShardPair, level: int, id_owner: int) -> None:
    topic = _topic(handing, 0, "meters")
    client_id = _client_id(handing, id_owner, "meter")
    made = RawMqtt(handing[1].mqtt_port, level=level)
    publisher = RawMqtt(handing[0].mqtt_port, level=level)
    back = RawMqtt(handing[1].mqtt_port, level=level)
    try:
        assert not _connect(made, client_id, level)
        # A persistent session without subscriptions goes at its first SUBSCRIBE.
        made.subscribe((topic, 1))
        poll(lambda: _stats(handing[1])["handed"] == 1, what="handed at its SUBSCRIBE")
        assert _holder(handing, client_id) == 0
        made.disconnect()
        poll(lambda: _holder(handing, client_id) is None, what="the id released")
        assert (_record(handing[id_owner], client_id) or {}).get("shard") == 0
        assert _states(handing[1]) == set()  # nothing of it is left where it came from
        publisher.connect(_client_id(handing, 0, "pub"))
        for i in range(3):
            assert isinstance(publisher.publish(topic, f"m{i}".encode(), qos=1), Puback)
        # Resumed on shard 1, handed at CONNECT to shard 0, where its messages wait.
        assert _connect(back, client_id, level)
        poll(lambda: _stats(handing[1])["handed"] == 2, what="handed at its CONNECT")
        got = back.publishes(3)
        assert [(p.payload, p.qos) for p in got] == [(b"m0", 1), (b"m1", 1), (b"m2", 1)]
        for packet in got:
            back.ack(packet)
        assert isinstance(publisher.publish(topic, b"live", qos=1), Puback)
        [live] = back.publishes(1)
        back.ack(live)
        back.ping()
        assert _stats(handing[0])["sessions"] == 2  # both of them persistent sessions
        assert _clients(handing[1], "mqtt") == 0  # served by the topic's owner alone
        assert _holder(handing, client_id) == 0
        assert client_id in _states(handing[0]) and client_id not in _states(handing[1])
        record = _record(handing[id_owner], client_id)
        assert record is not None and record["shard"] == 0
        assert record["subs"] == [f"mqtt1:{topic}"]
    finally:
        made.close()
        publisher.close()
        back.close()


def test_qos2_exchanges_in_progress_survive_a_handoff_at_connect(
        handing: ShardPair) -> None:
    """A QoS 2 delivery to the session whose PUBCOMP is missing and a QoS 2 PUBLISH of
    its whose PUBREL is missing, both on shard 0 (to which the session was handed),
    are finished after a resume through shard 1 handed to shard 0 at its CONNECT: the
    PUBREL comes again, the client's PUBREL is answered, nothing is routed twice."""
    topic, other = _topic(handing, 0, "q2-sub"), _topic(handing, 0, "q2-pub")
    client_id = _client_id(handing, 1, "q2")
    made = RawMqtt(handing[1].mqtt_port, level=5)
    back = RawMqtt(handing[1].mqtt_port, level=5)
    publisher = RawMqtt(handing[0].mqtt_port, level=5)
    watcher = RawMqtt(handing[0].mqtt_port, level=5)
    try:
        watcher.connect(_client_id(handing, 0, "q2-watch"))
        watcher.subscribe((other, 1))
        _connect(made, client_id, 5)
        made.subscribe((topic, 2))
        poll(lambda: _stats(handing[1])["handed"] == 1, what="handed at its SUBSCRIBE")
        publisher.connect(_client_id(handing, 0, "q2-pub"))
        publisher.publish(topic, b"out", qos=2)
        [out] = made.publishes(1)
        made.send(Pubrec(out.packet_id or 0))
        made._expect_ack(Pubrel, out.packet_id)  # and no PUBCOMP
        pid = made.next_pid()
        made.send(Publish(other, b"in", qos=2, packet_id=pid))
        made._expect_ack(Pubrec, pid)  # and no PUBREL
        made.disconnect()
        poll(lambda: _holder(handing, client_id) is None, what="the id released")
        assert _connect(back, client_id, 5)
        poll(lambda: _stats(handing[1])["handed"] == 2, what="handed at its CONNECT")
        assert back.expect(Pubrel).packet_id == out.packet_id  # sent again
        back.send(Pubcomp(out.packet_id or 0))
        back.send(Pubrel(pid))
        assert back._expect_ack(Pubcomp, pid).reason_code == ReasonCode.SUCCESS
        back.publish(other, b"marker", qos=1)
        got = watcher.publishes(2)
        assert [p.payload for p in got] == [b"in", b"marker"]  # "in" routed once
        poll(lambda: (_record(handing[1], client_id) or {}).get("qos2_in") == [] and
             (_record(handing[1], client_id) or {}).get("pubrel_out") == [],
             what="both exchanges ended in the owner's record")
    finally:
        for c in (made, back, publisher, watcher):
            c.close()


def test_a_resume_subscribed_on_several_shards_topics_stays_and_crosses(
        handing: ShardPair) -> None:
    client_id = _client_id(handing, 1, "split")
    topics = [_topic(handing, 0, "split-a"), _topic(handing, 1, "split-b")]
    made = RawMqtt(handing[1].mqtt_port, level=5)
    back = RawMqtt(handing[1].mqtt_port, level=5)
    publisher = RawMqtt(handing[0].mqtt_port, level=5)
    try:
        _connect(made, client_id, 5)
        made.subscribe((topics[0], 1), (topics[1], 1))  # two filters: not offered
        made.disconnect()
        poll(lambda: _holder(handing, client_id) is None, what="the id released")
        publisher.connect(_client_id(handing, 0, "split-pub"))
        for t in topics:
            publisher.publish(t, t.encode(), qos=1)
        assert _connect(back, client_id, 5)
        got = back.publishes(2)
        assert sorted(p.payload for p in got) == sorted(t.encode() for t in topics)
        assert _stats(handing[1])["offered"] == 0 and _holder(handing, client_id) == 1
    finally:
        made.close()
        back.close()
        publisher.close()


@pytest.mark.parametrize("second_on", [0, 1])
def test_a_second_connect_takes_a_handed_over_session_over(
        handing: ShardPair, second_on: int) -> None:
    topic = _topic(handing, 0, "twice")
    client_id = _client_id(handing, 1, "twice")
    first = RawMqtt(handing[1].mqtt_port, level=5)
    second = RawMqtt(handing[second_on].mqtt_port, level=5)
    publisher = RawMqtt(handing[0].mqtt_port, level=5)
    try:
        _connect(first, client_id, 5)
        first.subscribe((topic, 1))
        first.disconnect()
        poll(lambda: _holder(handing, client_id) is None, what="the id released")
        first.close()
        first = RawMqtt(handing[1].mqtt_port, level=5)
        assert _connect(first, client_id, 5)  # handed at CONNECT
        assert _holder(handing, client_id) == 0
        assert _connect(second, client_id, 5)  # present: the session goes on
        closing = first.until_closed()
        assert [p.reason_code for p in closing if isinstance(p, Disconnect)] == [
            ReasonCode.SESSION_TAKEN_OVER]
        publisher.connect(_client_id(handing, 0, "twice-pub"))
        publisher.publish(topic, b"to the second", qos=1)
        [got] = second.publishes(1)
        assert got.payload == b"to the second"
        second.ack(got)
        assert _holder(handing, client_id) == 0  # (from shard 1, handed there too)
    finally:
        first.close()
        second.close()
        publisher.close()


def test_a_handed_over_sessions_expiry_runs_once_on_its_owner(
        handing: ShardPair, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshmq.shards")
    caplog.set_level(logging.INFO, logger="meshmq.mqtt")
    topic = _topic(handing, 0, "brief")
    client_id = _client_id(handing, 1, "brief")
    client = RawMqtt(handing[1].mqtt_port, level=5)
    try:
        client.connect(client_id, clean=False,
                       properties=Properties(session_expiry_interval=1))
        client.subscribe((topic, 1))
        poll(lambda: _stats(handing[1])["handed"] == 1, what="handed at its SUBSCRIBE")
        client.disconnect()
    finally:
        client.close()
    poll(lambda: _record(handing[1], client_id) is None, timeout=15,
         what="the session expired on its client id's owner")
    poll(lambda: handing[0].topic_subscribers(topic.replace("/", ".")) == 0,
         what="its durable subscription gone from the topic's owner")
    expired = [r for r in caplog.records
               if r.getMessage() == f"MQTT session {client_id} expired"]
    assert len(expired) == 1
    again = RawMqtt(handing[1].mqtt_port, level=5)
    try:
        assert not _connect(again, client_id, 5)
    finally:
        again.close()
    assert len([r for r in caplog.records
                if r.getMessage() == f"MQTT session {client_id} expired"]) == 1


def _mqtt_shard(pair: ShardPair, k: int) -> ShardProcess:
    """Shard ``k`` as a real subprocess (handing over), with an MQTT listener too."""
    proc = pair.process(k)
    with proc.config_path.open("a") as toml:
        toml.write('\n[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:0"\n')
    return proc


@pytest.mark.parametrize("id_owner", [0, 1])
def test_a_handed_over_qos2_exchange_survives_a_sigkill_of_the_adopting_shard(
        tmp_path: Path, id_owner: int) -> None:
    """A persistent session handed at its first PUBLISH to the topic's owner, a
    subprocess: its QoS 1 message is confirmed, its QoS 2 one has its PUBREC, then the
    owner is killed. The client resumes (``session present``) through the other shard,
    its PUBREL is answered, and a subscriber gets every message once."""
    pair = ShardPair(tmp_path, mqtt=True, sharding=ShardsConfig(handoff=True))
    pair.start(0)
    shard1 = _mqtt_shard(pair, 1).start()
    clients: list[RawMqtt] = []
    try:
        poll(lambda: pair[0].links_up() == 1, what="shard 0's link")
        client_id = _client_id(pair, id_owner, "dev")
        topic = pair.owned_by(1, "orders", "topic").replace(".", "/")
        subscriber = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(subscriber)
        subscriber.connect(_client_id(pair, 0, "sub"), clean=False, properties=EXPIRY)
        subscriber.subscribe((topic + "/#", 1))  # (a wildcard: it stays on shard 0)
        client = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(client)
        assert not _connect(client, client_id, 5)
        # With the id owned by shard 1, the first PUBLISH waits for the owner to have
        # stored the CONNECT's record, and is handed then.
        assert isinstance(client.publish(topic, b"one", qos=1), Puback)
        poll(lambda: _stats(pair[0])["handed"] == 1, what="handed at its PUBLISH")
        pid = client.next_pid()
        client.send(Publish(topic, b"two", qos=2, packet_id=pid))
        client.expect(Pubrec)
        shard1.kill9()
        if id_owner == 0:  # the record the adopting shard sent is on the owner
            record = _record(pair[0], client_id)
            assert record is not None and record["qos2_in"] == [pid]
            assert record["shard"] == 1
        shard1 = _mqtt_shard(pair, 1).start()
        poll(lambda: pair[0].links_up() == 1, what="shard 0's link back")
        back = RawMqtt(pair[0].mqtt_port, level=5)
        clients.append(back)
        assert _connect(back, client_id, 5)
        back.send(Pubrel(pid))
        assert back._expect_ack(Pubcomp, pid).reason_code == ReasonCode.SUCCESS
        assert isinstance(back.publish(topic, b"marker", qos=1), Puback)
        got: list[Publish] = []
        while not got or got[-1].payload != b"marker":
            got.append(subscriber.expect(Publish, timeout=15))
            subscriber.ack(got[-1])
        assert [p.payload for p in got if not p.dup] == [b"one", b"two", b"marker"]
    finally:
        for c in clients:
            c.close()
        if shard1.proc is not None and shard1.proc.poll() is None:
            shard1.kill9()
        pair.stop()


@pytest.mark.parametrize("holder", [0, 1])  # on the STOMP client's shard, or the other
def test_a_stomp_client_id_held_by_mqtt_is_refused_while_it_lives_then_free(
        handing: ShardPair, holder: int) -> None:
    """As on one broker: refused at once (well within owner_wait_ms) while the MQTT
    connection lives, accepted at once after its client left."""
    client_id = _client_id(handing, 0, "mixed")
    mqtt = RawMqtt(handing[holder].mqtt_port, level=5)
    try:
        mqtt.connect(client_id)
        started = time.monotonic()
        refused = RawClient(handing[1])
        try:
            refused.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                           ("client-id", client_id)])
            error = refused.expect_error_and_close()
        finally:
            refused.close()
        assert f"Client: {client_id} already connected" in (error.get("message") or "")
        assert time.monotonic() - started < 5  # owner_wait_ms is 10 s
        mqtt.abort()  # the client leaves; its shard may not have read that yet
        accepted = RawClient(handing[1])
        try:
            accepted.send_frame("CONNECT", [("accept-version", "1.2"),
                                            ("host", "localhost"), ("client-id", client_id)])
            assert accepted.read_frame().command == "CONNECTED"
        finally:
            accepted.close()
    finally:
        mqtt.close()


@pytest.mark.parametrize("owner", [0, 1])
def test_a_client_id_passes_between_mqtt_and_stomp_at_once_across_shards(
        handing: ShardPair, owner: int) -> None:
    """A client that drops its connection and connects again at once with the same id,
    by the other protocol or on the other shard, is never refused (on one broker
    neither)."""
    client_id = _client_id(handing, owner, "alternate")
    for n in range(24):
        shard, mqtt = n % 2, (n // 2) % 2 == 0
        if mqtt:
            client = RawMqtt(handing[shard].mqtt_port, level=5)
            try:
                assert client.connect(client_id, expect_success=False).reason_code == \
                    ReasonCode.SUCCESS, f"connection {n} (MQTT on shard {shard}) refused"
            finally:
                client.close()
        else:
            stomp = RawClient(handing[shard])
            try:
                stomp.send_frame("CONNECT", [("accept-version", "1.2"),
                                             ("host", "localhost"), ("client-id", client_id)])
                frame = stomp.read_frame()
                assert frame.command == "CONNECTED", \
                    f"connection {n} (STOMP on shard {shard}): {frame.get('message')}"
            finally:
                stomp.close()


def test_a_stomp_connect_just_after_the_mqtt_client_left_is_accepted(
        handing: ShardPair) -> None:
    """The MQTT client leaves while its shard is busy (its end not read, its claim not
    released) and a STOMP CONNECT with its id reaches the id's owner on the other
    shard: the owner asks the MQTT connection's shard, which finds the client gone, so
    the CONNECT is accepted, as on one broker."""
    client_id = _client_id(handing, 1, "left")
    mqtt = RawMqtt(handing[0].mqtt_port, level=5)
    stomp: RawClient | None = None
    owner = handing[1]
    assert owner.runtime is not None and owner.runtime.shard_peers is not None
    claims = owner.runtime.shard_peers.clients
    try:
        mqtt.connect(client_id)
        with _held(handing[0]):
            mqtt.abort()
            stomp = RawClient(handing[1])
            stomp.send_frame("CONNECT", [("accept-version", "1.2"), ("host", "localhost"),
                                         ("client-id", client_id)])
            poll(lambda: owner.run(lambda: bool(claims._checking)),
                 what="the owner asking the MQTT connection's shard")
        frame = stomp.read_frame()
        assert frame.command == "CONNECTED", frame.get("message")
    finally:
        mqtt.close()
        if stomp is not None:
            stomp.close()


def test_a_resume_the_topics_owner_declines_is_answered_where_it_landed(
        tmp_path: Path) -> None:
    pair = ShardPair(tmp_path, mqtt=True, sharding=ShardsConfig(handoff=True))
    # The owner takes one connection per listener: a handed one would be a second.
    pair.configs[0] = dataclasses.replace(pair.configs[0], listeners=tuple(
        dataclasses.replace(lst, max_connections=1) for lst in pair.configs[0].listeners))
    pair.start()
    clients: list[RawMqtt] = []
    try:
        pair.wait_linked()
        topic = _topic(pair, 0, "declined")
        client_id = _client_id(pair, 0, "kept")
        made = RawMqtt(pair[0].mqtt_port, level=4)
        clients.append(made)
        _connect(made, client_id, 4)
        made.subscribe((topic, 1))
        made.disconnect()
        poll(lambda: _holder(pair, client_id) is None, what="the id released")
        blocker = RawMqtt(pair[0].mqtt_port, level=4)  # the owner's one MQTT connection
        clients.append(blocker)
        blocker.connect(_client_id(pair, 0, "blocker"))
        blocker.publish(topic, b"waiting", qos=1)
        back = RawMqtt(pair[1].mqtt_port, level=4)
        clients.append(back)
        assert _connect(back, client_id, 4)  # answered by shard 1, present
        stats = _stats(pair[1])
        assert (stats["offered"], stats["declined"], stats["handed"]) == (1, 1, 0)
        [got] = back.publishes(1)
        assert got.payload == b"waiting"
        back.ack(got)
        assert _clients(pair[1], "mqtt") == 1 and _holder(pair, client_id) == 1
        blocker.publish(topic, b"crossing", qos=1)
        [later] = back.publishes(1)
        assert later.payload == b"crossing"
        back.ack(later)
        back.ping()
    finally:
        for c in clients:
            c.close()
        pair.stop()
