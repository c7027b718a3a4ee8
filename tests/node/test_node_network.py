"""A node of shards as one member of a network of brokers, with a real ``--shards 2``
node and a single broker bridged to it: messages both ways, for destinations owned by
either shard, with consumers on either shard. Shard 0 holds the node's broker-link
listener and network connectors; the other shard is reached through it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.destinations import queue as queue_named
from meshmq.core.shards import owner
from tests.interop.stomp_helpers import RawClient
from tests.interop.test_stomp_push_back import BacklogWatch, Producer, _send, held_producers
from tests.network.helpers import (
    LINK_USER,
    bridges,
    connector,
    consumers_on,
    net_config,
    tcp_uri,
)
from tests.support.brokers import ThreadBroker, poll
from tests.support.nodes import NodeProcess, stomp_on, write_node_toml

pytestmark = pytest.mark.slow

SHARDS = (0, 1)
LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
             '[[listeners]]\nname = "tcp"\nurl = "tcp://127.0.0.1:0"\n')
LINK_LOGIN = (f'[[auth.users]]\nname = "{LINK_USER.name}"\n'
              f'password = "{LINK_USER.password}"\n')


def owned_by(shard: int, prefix: str, kind: str = "queue") -> str:
    n = 0
    while owner(Destination.parse_uri(f"{kind}://{prefix}.{n}"), 2) != shard:
        n += 1
    return f"{prefix}.{n}"


def start_node(tmp: Path, extra: str = "") -> NodeProcess:
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS,
                             extra="\n" + LINK_LOGIN + extra)
    return NodeProcess(config, tmp / "node.log").start()


class Clients:
    """STOMP clients of the node (on a chosen shard) and of the remote broker, all
    closed at the end of the test."""

    def __init__(self, node: NodeProcess, remote: ThreadBroker) -> None:
        self.node = node
        self.remote = remote
        self.open: list[RawClient] = []

    def on_node(self, shard: int) -> RawClient:
        client = stomp_on(self.node, shard)
        self.open.append(client)
        return client

    def on_remote(self) -> RawClient:
        client = RawClient(self.remote)
        client.connect()
        self.open.append(client)
        return client

    def close(self) -> None:
        for client in self.open:
            client.close()


@pytest.fixture(params=["remote-dials", "node-dials"])
def remote_to_node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Clients]:
    """One duplex bridge: the single broker dials the node's tcp:// listener (shard 0),
    or the node's network connector (run by shard 0) dials the single broker."""
    if request.param == "remote-dials":
        node = start_node(tmp_path)
        remote = ThreadBroker(net_config(
            tmp_path / "remote", "remote",
            connector(f"tcp://127.0.0.1:{node.ports['tcp']}", duplex=True))).start()
    else:
        remote = ThreadBroker(net_config(tmp_path / "remote", "remote")).start()
        try:
            node = start_node(tmp_path, "\n[[network_connectors]]\n"
                              f'uri = "{tcp_uri(remote)}"\nduplex = true\n'
                              f'username = "{LINK_USER.name}"\n'
                              f'password = "{LINK_USER.password}"\n')
        except BaseException:
            remote.stop()
            raise
    clients = Clients(node, remote)
    try:
        yield clients
    finally:
        clients.close()
        remote.stop()
        node.terminate()


def subscribe(client: RawClient, dest: str, sub: str) -> None:
    client.send_frame("SUBSCRIBE", [("destination", dest), ("id", sub), ("ack", "auto"),
                                    ("receipt", f"sub-{sub}")])
    client.read_until_receipt(f"sub-{sub}")


def send(client: RawClient, dest: str, body: str) -> None:
    client.send_frame("SEND", [("destination", dest), ("persistent", "true"),
                               ("receipt", body)], body.encode())
    client.read_until_receipt(body)


def bodies(client: RawClient, count: int, timeout: float = 30.0) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {got} of {count} messages"
        frame, _ = client.read_until("MESSAGE", timeout=left)
        got.append(frame.body.decode())
    return got


def wait_demand(remote: ThreadBroker, queue: str, consumers: int = 1) -> None:
    """Until the remote broker sees the node's demand for ``queue`` (its network
    consumer), so that what is sent there is forwarded rather than kept."""
    poll(lambda: consumers_on(remote, f"queue://{queue}") >= consumers, 30,
         f"the node's demand for {queue} to reach the remote broker")


def test_remote_messages_reach_consumers_on_either_shard(
        remote_to_node: Clients) -> None:
    clients = remote_to_node
    remote = clients.remote
    # Every pairing of owner and consumer's shard: 0/0, 0/1, 1/0, 1/1.
    queues = {(own, on): owned_by(own, f"in-{own}{on}") for own in SHARDS for on in SHARDS}
    consumers = {}
    for (own, on), queue in queues.items():
        client = clients.on_node(on)
        subscribe(client, f"/queue/{queue}", f"s{own}{on}")
        consumers[(own, on)] = client
    for queue in queues.values():
        wait_demand(remote, queue)
    producer = clients.on_remote()
    for (own, on), queue in queues.items():
        for i in range(10):
            send(producer, f"/queue/{queue}", f"{own}{on}-{i}")
    for key, client in consumers.items():
        assert bodies(client, 10) == [f"{key[0]}{key[1]}-{i}" for i in range(10)], key


def test_node_messages_reach_a_remote_consumer_from_either_shard(
        remote_to_node: Clients) -> None:
    clients = remote_to_node
    queues = {own: owned_by(own, "out") for own in SHARDS}
    consumers = {}
    for own, queue in queues.items():
        client = clients.on_remote()
        subscribe(client, f"/queue/{queue}", f"r{own}")
        consumers[own] = client
    producers = {on: clients.on_node(on) for on in SHARDS}
    for queue in queues.values():
        for i in range(10):
            for on, producer in producers.items():
                send(producer, f"/queue/{queue}", f"{on}-{i}")
    for own, client in consumers.items():
        got = bodies(client, 20)
        for on in SHARDS:  # each producer's order is kept
            assert [b for b in got if b.startswith(f"{on}-")] == [
                f"{on}-{i}" for i in range(10)], (own, got)


def until_one_crosses(producer: RawClient, dest: str, consumer: RawClient,
                      tag: str) -> None:
    """A topic keeps nothing for a subscriber that is not known yet: send probes until
    one reaches ``consumer`` (the subscription's demand has crossed), then a marker, and
    read up to it (probes sent meanwhile arrive before it)."""
    deadline = time.monotonic() + 30
    n = 0
    while True:
        assert time.monotonic() < deadline, f"no message on {dest} crossed the bridge"
        send(producer, dest, f"{tag}-probe-{n}")
        n += 1
        try:
            if any(b.startswith(tag) for b in bodies(consumer, 1, timeout=0.2)):
                break
        except (AssertionError, TimeoutError):
            continue
    send(producer, dest, f"{tag}-marker")
    deadline = time.monotonic() + 30
    while f"{tag}-marker" not in bodies(consumer, 1):
        assert time.monotonic() < deadline, f"no marker on {dest}"


def test_topic_messages_cross_both_ways_for_subscribers_on_either_shard(
        remote_to_node: Clients) -> None:
    clients = remote_to_node
    topics = {own: owned_by(own, "news", "topic") for own in SHARDS}
    on_node = {}
    for own, topic in topics.items():
        client = clients.on_node(1 - own)  # a subscriber away from the topic's owner
        subscribe(client, f"/topic/{topic}", f"t{own}")
        on_node[own] = client
    on_remote = {}
    for own, topic in topics.items():
        client = clients.on_remote()
        subscribe(client, f"/topic/{topic}", f"r{own}")
        on_remote[own] = client
    remote_producer = clients.on_remote()
    node_producers = {on: clients.on_node(on) for on in SHARDS}
    for own, topic in topics.items():
        until_one_crosses(remote_producer, f"/topic/{topic}", on_node[own], "in")
        until_one_crosses(node_producers[own], f"/topic/{topic}", on_remote[own], "out")
    for topic in topics.values():
        for i in range(5):
            send(remote_producer, f"/topic/{topic}", f"remote-{i}")
            for on, producer in node_producers.items():
                send(producer, f"/topic/{topic}", f"node{on}-{i}")
    # Each side gets the other's messages, in order per sender (and its own side's).
    for own in SHARDS:
        for client, senders in ((on_node[own], ("remote",)),
                                (on_remote[own], ("node0", "node1"))):
            got: list[str] = []
            deadline = time.monotonic() + 30
            while not all(f"{sender}-4" in got for sender in senders):
                assert time.monotonic() < deadline, (own, senders, got)
                got.extend(bodies(client, 1))
            for sender in senders:
                assert [b for b in got if b.startswith(f"{sender}-")] == [
                    f"{sender}-{i}" for i in range(5)], (own, got)


class SlowConsumer:
    """A client-ack consumer of ``queue`` with a window of 10, read only when the test
    says; ``seen`` has the numbers of the messages read (-1 for ``end``)."""

    def __init__(self, client: RawClient, name: str) -> None:
        self.client = client
        client.send_frame("SUBSCRIBE", [("destination", f"/queue/{name}"), ("id", "s"),
                                        ("ack", "client-individual"),
                                        ("activemq.prefetchSize", "10"), ("receipt", "sub")])
        client.read_until_receipt("sub")
        self.seen: list[int] = []

    def take(self, n: int, *, ack: bool) -> list[str]:
        """Read ``n`` messages, acking each when ``ack``; their ack ids."""
        tags = []
        for _ in range(n):
            frame, _ = self.client.read_until("MESSAGE", timeout=30)
            self.seen.append(-1 if frame.body == b"end" else int(frame.body[1:9]))
            tags.append(frame["ack"])
            if ack:
                self.client.send_frame("ACK", [("id", frame["ack"])])
        return tags

    def ack(self, tags: list[str]) -> None:
        for tag in tags:
            self.client.send_frame("ACK", [("id", tag)])


def test_a_slow_consumer_on_the_node_holds_the_remote_brokers_producer(
        remote_to_node: Clients) -> None:
    """A consumer on the node takes 10 messages of a queue owned by shard 1 and acks
    none; a producer on the remote broker sends 20,000. The owner holds the front
    shard's sends of it (a shard note), the front shard asks the remote broker to hold
    the queue (a link note), and the remote broker stops reading its producer; every
    message arrives once, in order, once the consumer acks."""
    clients = remote_to_node
    remote = clients.remote
    name = owned_by(1, "held")
    count = 20_000
    consumer = SlowConsumer(clients.on_node(1), name)
    wait_demand(remote, name)
    producer = Producer(remote, f"/queue/{name}", count, 1024).start()
    clients.open.append(producer.client)
    first = consumer.take(10, ack=False)
    poll(lambda: [b["held"] for b in bridges(remote)] == [[f"queue://{name}"]], 60,
         "the node's hold on the remote broker")
    poll(lambda: held_producers(remote) == 1, 30, "the producer held on the remote broker")
    consumer.ack(first)
    consumer.take(count + 1 - 10, ack=True)
    producer.wait_done(60)
    assert consumer.seen == [*range(count), -1]
    poll(lambda: [b["held"] for b in bridges(remote)] == [[]], 30, "the release")


def test_a_slow_consumer_on_the_remote_holds_the_nodes_forwards_from_another_shard(
        remote_to_node: Clients) -> None:
    """The other way: a producer on shard 1 of the node sends 20,000 messages to a
    queue shard 1 owns, whose consumer is on the remote broker (taking 10, acking
    none). The front shard's demand for it is relayed from the owner; the remote's hold
    pauses it, and what the owner still dispatches within its window waits on the
    front shard unforwarded, so the owner's window fills, the run waits on the node
    (whose owner then holds the producer) instead of in the remote broker's memory.
    Every message arrives once, in order, once the consumer acks."""
    clients = remote_to_node
    remote = clients.remote
    name = owned_by(1, "out-held")
    count = 20_000
    consumer = SlowConsumer(clients.on_remote(), name)
    producer = clients.on_node(1)
    # The node's demand for the remote consumer is there once a message crosses.
    producer.send_frame("SEND", [("destination", f"/queue/{name}"), ("receipt", "first")],
                        b"p-0000001")
    producer.read_until_receipt("first")
    consumer.take(1, ack=True)
    consumer.seen.clear()
    on_remote = BacklogWatch(remote, queue_named(name))

    def write() -> None:
        for start in range(0, count, 64):
            producer.send_bytes(b"".join(_send(f"/queue/{name}", i, 1024, [])
                                         for i in range(start, min(count, start + 64))))
        producer.send_frame("SEND", [("destination", f"/queue/{name}"), ("receipt", "end")],
                            b"end")
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    first = consumer.take(10, ack=False)
    poll(lambda: any(b["holds_sent"] == 1 for b in bridges(remote)), 60,
         "the remote broker's hold note")
    consumer.ack(first)
    consumer.take(count + 1 - 10, ack=True)
    writer.join(60)
    producer.read_until_receipt("end", timeout=60)
    peak = on_remote.stop()
    assert consumer.seen == [*range(count), -1]
    print(f"the remote broker's peak backlog {peak} (the run {count})")
    assert peak < count // 4, peak
