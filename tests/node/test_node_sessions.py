"""Client ids and MQTT sessions on a node of two shards, end to end: a real
``meshmq broker --shards 2`` subprocess and paho-mqtt clients through the node's one
port (the kernel picks each connection's shard; each test reconnects until it has the
shards it needs). A second connection with a client id takes the first one over
whichever shards they landed on, a persistent session resumes, ``session present``
and subscribed, through the other shard, and a shared subscription's members on both
shards are one group."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.interop.mqtt_helpers import Paho
from tests.node.test_node_routing import LISTENERS, owned_by
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import NodeProcess, shard_of, write_node_toml

pytestmark = pytest.mark.slow

SESSION_TAKEN_OVER = 0x8E


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp = tmp_path_factory.mktemp("node")
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS)
    n = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(n)  # stopped by this fixture, after the module
    try:
        yield n
    finally:
        n.terminate()


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
