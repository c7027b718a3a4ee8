"""Client ids and MQTT sessions on a node of two shards, end to end: a real
``meshmq broker --shards 2`` subprocess and paho-mqtt clients through the node's one
port (the kernel picks each connection's shard; each test reconnects until it has the
shards it needs). A second connection with a client id takes the first one over
whichever shards they landed on, a persistent session resumes, ``session present``
and subscribed, through the other shard, and a shared subscription's members on both
shards are one group; and a stored session follows its client id's owner through
``meshmq shards rebalance``."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.shards import client_owner
from tests.interop.mqtt_helpers import Paho, RawMqtt
from tests.node.test_node_routing import LISTENERS, owned_by
from tests.node.test_rebalance import _rebalance
from tests.support.brokers import ProcessBroker, poll, write_broker_toml
from tests.support.nodes import NodeProcess, plain_module_node, shard_of, write_node_toml

pytestmark = pytest.mark.slow

SESSION_TAKEN_OVER = 0x8E


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    yield from plain_module_node(tmp_path_factory.mktemp("node"), listeners=LISTENERS)


def _shard(node: NodeProcess, client: Paho) -> int:
    sock = client.client.socket()
    assert isinstance(sock, socket.socket)
    return shard_of(node, sock)


def test_a_second_connection_on_the_other_shard_takes_the_client_id_over(
        node: NodeProcess) -> None:
    """Connections with one client id until two in a row land on different shards:
    the earlier one is closed (MQTT 5: DISCONNECT "session taken over"), as on one
    broker, and the later one stays."""
    opened: list[Paho] = []
    try:
        holder = Paho(node.ports["mqtt"], client_id="node-dev")
        opened.append(holder)
        where = _shard(node, holder)
        for _ in range(64):
            newer = Paho(node.ports["mqtt"], client_id="node-dev")
            opened.append(newer)
            there = _shard(node, newer)
            holder.wait(lambda h=holder: h.disconnects, what="the take-over")
            assert [rc.value for rc, _ in holder.disconnects] == [SESSION_TAKEN_OVER]
            if there != where:
                break
            holder, where = newer, there  # same shard: as on one broker; again
        else:
            raise AssertionError("64 connections and none reached the other shard")
        newer.subscribe("node/alive", qos=1)  # still served
        assert not newer.disconnects
    finally:
        for client in opened:
            client.close()


def test_a_persistent_session_resumes_through_the_other_shard(node: NodeProcess) -> None:
    topic = owned_by(1, "node.alerts", "topic").replace(".", "/")
    opened: list[Paho] = []
    try:
        made = Paho(node.ports["mqtt"], level=4, client_id="node-sess", clean=False)
        opened.append(made)
        made.subscribe(topic, qos=1)
        first = _shard(node, made)
        made.disconnect()
        for _ in range(64):
            back = Paho(node.ports["mqtt"], level=4, client_id="node-sess", clean=False)
            opened.append(back)
            # Present on either shard (on one broker too), and on the other one it is
            # the owner's record that says so.
            assert back.session_present
            if _shard(node, back) != first:
                break
            back.disconnect()
        else:
            raise AssertionError("64 connections and none reached the other shard")
        publisher = Paho(node.ports["mqtt"], client_id="node-pub")
        opened.append(publisher)
        publisher.publish(topic, b"to the session", qos=1)
        # Subscribed without SUBSCRIBE: the session's subscription was reopened.
        assert [m.payload for m in back.wait_for(b"to the session")] == [b"to the session"]
    finally:
        for client in opened:
            client.close()


def test_an_mqtt_shared_subscription_spreads_over_members_on_both_shards(
        node: NodeProcess) -> None:
    topic = owned_by(1, "node.jobs", "topic").replace(".", "/")
    opened: list[Paho] = []
    members: dict[int, Paho] = {}
    try:
        for n in range(64):
            member = Paho(node.ports["mqtt"], client_id=f"node-worker-{n}")
            opened.append(member)
            members.setdefault(_shard(node, member), member)
            if len(members) == 2:
                break
        assert len(members) == 2, "no member reached each shard"
        for member in members.values():
            member.subscribe(f"$share/workers/{topic}", qos=1)
        publisher = Paho(node.ports["mqtt"], client_id="node-jobs-pub")
        opened.append(publisher)
        jobs = [f"job {i}".encode() for i in range(10)]
        for job in jobs:
            publisher.publish(topic, job, qos=1)
        got: list[bytes] = []

        def all_in() -> bool:
            got[:] = members[0].payloads() + members[1].payloads()
            return len(got) >= len(jobs)
        poll(all_in, what="every job, on one member or the other")
        assert sorted(got) == sorted(jobs)  # each job to exactly one member
        members[1].disconnect()  # the member on the topic's owner leaves
        later = [f"later {i}".encode() for i in range(4)]
        for job in later:
            publisher.publish(topic, job, qos=1)
        members[0].wait_for(later[-1])
        assert sorted(p for p in members[0].payloads() if p.startswith(b"later")) == \
            sorted(later)
    finally:
        for client in opened:
            client.close()


def test_a_stored_session_follows_its_client_id_through_rebalances(tmp_path: Path) -> None:
    """A persistent session made on a node of 2 shards resumes, ``session present``
    and subscribed, after ``meshmq shards rebalance`` to one broker process and then to
    3 shards: its record goes to the client id's owner under each count (here shard 1,
    then the one process, then shard 2), and its subscription with its topic."""
    client_id = next(c for c in (f"rb-dev-{n}" for n in itertools.count())
                     if client_owner(c, 2) == 1 and client_owner(c, 3) == 2)
    topic = "rb/session"
    data = tmp_path / "data"

    def node(shards: int) -> ProcessBroker:
        if shards == 1:
            config = write_broker_toml(tmp_path / "one.toml", name="node", data=data,
                                       extra=LISTENERS.split("\n\n")[1])
            return ProcessBroker(config, tmp_path / "one.log").start()
        return NodeProcess(write_node_toml(tmp_path / f"node{shards}.toml", data=data,
                                           shards=shards, listeners=LISTENERS),
                           tmp_path / "node.log").start()

    def publish(port: int, payload: bytes) -> None:
        publisher = RawMqtt(port)
        try:
            publisher.connect("rb-pub")
            publisher.publish(topic, payload, qos=1)
            publisher.disconnect()
        finally:
            publisher.close()

    def resume(port: int, expected: bytes) -> None:
        client = RawMqtt(port)
        try:
            assert client.connect(client_id, clean=False).session_present
            [got] = client.publishes(1)
            assert got.payload == expected
            client.ack(got)
            client.ping()
            client.disconnect()
        finally:
            client.close()

    broker = node(2)
    try:
        made = RawMqtt(broker.ports["mqtt"])
        try:
            assert not made.connect(client_id, clean=False).session_present
            made.subscribe((topic, 1))
            made.disconnect()
        finally:
            made.close()
        publish(broker.ports["mqtt"], b"while on 2 shards")
    finally:
        assert broker.terminate() == 0
    for to, payload in ((1, b"while one process"), (3, None)):
        done = _rebalance(data, to)
        assert done.returncode == 0, done.stderr
        broker = node(to)
        try:
            resume(broker.ports["mqtt"],
                   b"while on 2 shards" if to == 1 else b"while one process")
            if payload is not None:
                publish(broker.ports["mqtt"], payload)
        finally:
            assert broker.terminate() == 0
