"""A node of two shards routes as one broker, end to end: real ``meshmq broker --shards
2`` subprocesses, every client through the node's one port (each test picks which shard
a connection reached, so both shards have producers and consumers), destinations named
so that each shard owns some."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.interop.stomp_helpers import Address, RawClient
from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import (
    NodeProcess,
    mqtt_on,
    pid_gone,
    shard_api,
    stomp_on,
    write_node_toml,
)
from tests.support.raw_stomp import ClosedError

pytestmark = pytest.mark.slow

SHARDS = (0, 1)
LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
             '[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:0"\n')


def owned_by(shard: int, prefix: str, kind: str = "queue") -> str:
    """A destination name starting with ``prefix`` that ``shard`` of the node owns."""
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"{kind}://{name}"), 2, node="node") == shard:
            return name
    raise AssertionError("unreachable")


def _start(tmp: Path, *, handoff: bool = False) -> NodeProcess:
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=LISTENERS,
                             handoff=handoff)
    return NodeProcess(config, tmp / "node.log").start()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    n = _start(tmp_path_factory.mktemp("node"))
    # One node for the module's tests (each uses its own destinations): this fixture
    # stops it, not the per-test cleanup of subprocess brokers.
    ProcessBroker.running.discard(n)
    try:
        yield n
    finally:
        n.terminate()


def _send(client: RawClient, queue: str, body: str, receipt: str | None = None,
          headers: tuple[tuple[str, str], ...] = ()) -> None:
    frame = [("destination", f"/queue/{queue}"), ("persistent", "true"), *headers]
    if receipt is not None:
        frame.append(("receipt", receipt))
    client.send_frame("SEND", frame, body.encode())
    if receipt is not None:
        client.read_until_receipt(receipt)


def _subscribe(client: RawClient, queue: str, sub: str, *, ack: str = "auto",
               prefetch: int | None = None, selector: str | None = None) -> list[str]:
    """SUBSCRIBE with a receipt; the bodies of messages that came before the receipt
    (a relayed subscription's first may overtake it)."""
    headers = [("destination", f"/queue/{queue}"), ("id", sub), ("ack", ack),
               ("receipt", f"sub-{sub}")]
    if prefetch is not None:
        headers.append(("activemq.prefetchSize", str(prefetch)))
    if selector is not None:
        headers.append(("selector", selector))
    client.send_frame("SUBSCRIBE", headers)
    return [f.body.decode() for f in client.read_until_receipt(f"sub-{sub}")
            if f.command == "MESSAGE"]


def _bodies(client: RawClient, count: int) -> list[str]:
    return [client.read_until("MESSAGE")[0].body.decode() for _ in range(count)]


def _drain(consumers: list[RawClient], total: int, *, ack: bool = False,
           timeout: float = 30.0) -> list[list[str]]:
    """Read the consumers in turn until they have ``total`` messages between them
    (acknowledging each when ``ack``); each one's bodies in the order it got them."""
    got: list[list[str]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while sum(len(g) for g in got) < total:
        assert time.monotonic() < deadline, f"only {got} of {total} messages"
        for k, client in enumerate(consumers):
            try:
                frame, _ = client.read_until("MESSAGE", timeout=0.1)
            except TimeoutError:
                continue
            got[k].append(frame.body.decode())
            if ack:
                client.send_frame("ACK", [("id", frame.get("ack") or "")])
    return got


def _in_order_per_producer(bodies: list[str]) -> bool:
    """Bodies are ``<producer>-<n>``: each producer's numbers rise."""
    seen: dict[str, int] = {}
    for body in bodies:
        producer, n = body.rsplit("-", 1)
        if seen.get(producer, -1) >= int(n):
            return False
        seen[producer] = int(n)
    return True


def _owner_depth(node: NodeProcess, shard: int, queue: str) -> int | None:
    for dest in shard_api(node, shard, "/api/stat")["destinations"]:
        if dest["type"] == "queue" and dest["name"] == queue:
            return int(dest["depth"])
    return None


def test_each_producers_messages_stay_in_order_per_destination(node: NodeProcess) -> None:
    queues = [owned_by(k, "ordered") for k in SHARDS]
    # A consumer of each queue on each shard: every message crosses at least once for
    # one of them.
    consumers = {(q, k): stomp_on(node, k) for q in queues for k in SHARDS}
    for (q, k), c in consumers.items():
        _subscribe(c, q, f"s{k}", prefetch=1000)
    producers = [stomp_on(node, k) for k in (0, 0, 1, 1)]
    per_producer = 25
    for i in range(per_producer):
        for p, producer in enumerate(producers):
            for q in queues:
                _send(producer, q, f"p{p}-{i}")
    for p, producer in enumerate(producers):  # everything is stored by now
        for q in queues:
            _send(producer, q, f"p{p}-{per_producer}", receipt=f"last-{p}-{q}")
    total = len(producers) * (per_producer + 1)
    for q in queues:
        got = _drain([consumers[(q, k)] for k in SHARDS], total)
        everything = got[0] + got[1]
        assert sorted(everything) == sorted(f"p{p}-{i}" for p in range(len(producers))
                                            for i in range(per_producer + 1))  # each once
        for k in SHARDS:
            assert _in_order_per_producer(got[k]), (q, k, got[k])
    for c in (*consumers.values(), *producers):
        c.close()


def test_selectors_apply_across_shards(node: NodeProcess) -> None:
    for queue_owner in SHARDS:
        queue = owned_by(queue_owner, f"colors{queue_owner}")
        red, blue = stomp_on(node, 0), stomp_on(node, 1)
        _subscribe(red, queue, "r", selector="color = 'red'")
        _subscribe(blue, queue, "b", selector="color = 'blue'")
        producers = [stomp_on(node, k) for k in SHARDS]
        for i in range(20):
            color = "red" if i % 2 else "blue"
            _send(producers[i % 2], queue, f"{color}-{i}", receipt=f"c{i}",
                  headers=(("color", color),))
        assert _bodies(red, 10) == [f"red-{i}" for i in range(1, 20, 2)]
        assert _bodies(blue, 10) == [f"blue-{i}" for i in range(0, 20, 2)]
        for c in (red, blue, *producers):
            c.close()


def test_a_queue_shared_by_consumers_on_both_shards_gives_each_message_once(
        node: NodeProcess) -> None:
    for queue_owner in SHARDS:
        queue = owned_by(queue_owner, f"jobs{queue_owner}")
        consumers = [stomp_on(node, k) for k in SHARDS]
        for k, c in enumerate(consumers):
            _subscribe(c, queue, f"s{k}", ack="client-individual", prefetch=1)
        producer = stomp_on(node, 1 - queue_owner)
        for i in range(20):
            _send(producer, queue, f"job{i}", receipt=f"j{i}")
        # Prefetch 1: each holds one until it acknowledges it, so both get some (how
        # many depends on whose acknowledgement reaches the owner first).
        received = _drain(consumers, 20, ack=True)
        assert sorted(received[0] + received[1]) == sorted(f"job{i}" for i in range(20))
        assert all(received), received
        poll(lambda queue=queue, o=queue_owner: _owner_depth(node, o, queue) == 0,
             20, "every job acknowledged on the owner")
        for c in (*consumers, producer):
            c.close()


def test_mqtt_qos1_across_shards(node: NodeProcess) -> None:
    topics = [owned_by(k, "sensors", kind="topic").replace(".", "/") for k in SHARDS]
    # Each topic's subscriber on the shard that does not own it.
    subscribers = [mqtt_on(node, 1 - k, f"sub{k}") for k in SHARDS]
    for k, sub in enumerate(subscribers):
        sub.subscribe(topics[k], qos=1)  # its SUBACK: the owner has the subscription
    publishers = [mqtt_on(node, k, f"pub{k}") for k in SHARDS]
    for i in range(20):
        for k, topic in enumerate(topics):
            puback = publishers[(i + k) % 2].publish(topic, f"p{(i + k) % 2}-{i}".encode(),
                                                     qos=1)
            assert puback is not None and puback.reason_code == 0
    for k, sub in enumerate(subscribers):
        got = []
        for publish in sub.publishes(20):
            assert publish.qos == 1
            got.append(publish.payload.decode())
            sub.ack(publish)
        assert sorted(got) == sorted(f"p{(i + k) % 2}-{i}" for i in range(20))
        assert _in_order_per_producer(got), got
    for client in (*subscribers, *publishers):
        client.close()


def test_stat_shows_each_destination_once_with_its_owners_depth(node: NodeProcess) -> None:
    queues = [owned_by(k, "counted") for k in SHARDS]
    # Producers and a consumer on both shards, so that each shard has met each queue.
    producers = [stomp_on(node, k) for k in SHARDS]
    for q in queues:
        for k, producer in enumerate(producers):
            for i in range(3 + k):
                _send(producer, q, f"m{k}-{i}", receipt=f"r{q}-{k}-{i}")
    # Each queue's consumer on the other shard (relayed), one message in flight.
    consumers = [stomp_on(node, 1 - k) for k in SHARDS]
    for k, c in enumerate(consumers):
        if not _subscribe(c, queues[k], "s", ack="client", prefetch=1):
            c.read_until("MESSAGE")
    for k, q in enumerate(queues):
        poll(lambda k=k, q=q: _owner_depth(node, k, q) == 7, 20,
             f"{q} on its owner")
        assert _owner_depth(node, 1 - k, q) is None  # only its owner lists it
    stat = node.api("/api/stat")
    rows = [d for d in stat["destinations"] if d["name"] in queues]
    assert sorted((d["name"], d["depth"], d["enqueued"], d["consumers"], d["inflight"])
                  for d in rows) == sorted((q, 7, 7, 1, 1) for q in queues)
    shown = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                            f"127.0.0.1:{node.ports['management']}"],
                           check=False, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for q in queues:
        lines = [ln.split() for ln in shown.stdout.splitlines() if f" {q} " in ln]
        assert len(lines) == 1 and lines[0][:4] == ["queue", q, "7", "7"], shown.stdout
    # Each shard's link to the other, as /api/shards counts it.
    links = {s["shard"]: s["links"] for s in node.api("/api/shards")["shards"]}
    for k in SHARDS:
        (link,) = links[k]
        assert (link["shard"], link["up"], link["retried"]) == (1 - k, True, 0)
        assert link["sent"] >= 3 + k  # producer k's sends to the queue the other owns
        # (The node serves the module's earlier tests too: counters only grow.)
        assert link["delivered_out"] >= 1 and link["relays_served"] >= 1
    for c in (*producers, *consumers):
        c.close()


def _reconnect(node: NodeProcess, deadline_s: float = 60.0) -> RawClient:
    """A new connection to the node's port, on whichever shard takes it."""
    def attempt() -> RawClient | None:
        try:
            client = RawClient(Address(node.port))
        except OSError:
            return None
        try:
            client.connect()
        except (OSError, ClosedError):
            client.close()
            return None
        return client

    return poll(attempt, deadline_s, "a connection to the node")


class _Consumer(threading.Thread):
    """Reads one queue with client acknowledgements until stopped, noting each copy and
    whether it came flagged redelivered; a connection lost with its shard is opened
    again on whichever shard the port gives."""

    def __init__(self, node: NodeProcess, queue: str, client: RawClient) -> None:
        super().__init__(daemon=True)
        self.node, self.queue, self.client = node, queue, client
        self.copies: list[tuple[str, bool]] = []
        self.reconnects = 0
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def subscribe(self) -> None:  # no receipt: every frame is read by run()
        self.client.send_frame("SUBSCRIBE", [
            ("destination", f"/queue/{self.queue}"), ("id", "s"),
            ("ack", "client-individual"), ("activemq.prefetchSize", "10")])

    def run(self) -> None:
        self.subscribe()
        while not self.halt.is_set():
            try:
                frame, _ = self.client.read_until("MESSAGE", timeout=0.2)
                with self.lock:
                    self.copies.append((frame.body.decode(),
                                        frame.get("redelivered") == "true"))
                self.client.send_frame("ACK", [("id", frame.get("ack") or "")])
            except TimeoutError:
                continue
            except (ClosedError, OSError):
                self.client.close()
                if self.halt.is_set():
                    return
                self.client = _reconnect(self.node)
                self.reconnects += 1
                self.subscribe()
        self.client.close()

    def bodies(self) -> list[tuple[str, bool]]:
        with self.lock:
            return list(self.copies)


class _Producer(threading.Thread):
    """Sends ``count`` persistent messages with receipts, alternating over ``queues``;
    notes the receipted ones. A send whose connection is lost is neither retried nor
    counted (its client never learnt whether it was stored): the next one goes on a new
    connection."""

    def __init__(self, node: NodeProcess, name: str, queues: list[str], client: RawClient,
                 count: int) -> None:
        super().__init__(daemon=True)
        self.node, self.name_, self.queues, self.client = node, name, queues, client
        self.count = count
        self.receipted: list[str] = []
        self.failures = 0

    def run(self) -> None:
        for i in range(self.count):
            queue = self.queues[i % len(self.queues)]
            body = f"{queue}/{self.name_}-{i}"
            try:
                _send(self.client, queue, body, receipt=f"r{i}-{len(self.receipted)}")
                self.receipted.append(body)
            except (ClosedError, OSError):
                self.failures += 1
                self.client.close()
                self.client = _reconnect(self.node)
        self.client.close()


@pytest.mark.parametrize("handoff", [False, True], ids=["crossing", "handoff"])
def test_receipted_messages_survive_a_killed_shard(tmp_path: Path, handoff: bool) -> None:
    """Producers and consumers of a queue owned by each shard, on both shards; shard 1
    is killed with SIGKILL mid-stream and the node restarts it. Every receipted message
    is delivered; a message delivered twice (its consumer's shard died before the ack
    settled, or its owner died after storing it and before the sender saw it stored)
    comes flagged redelivered. With handoff, a consumer and a producer that landed on
    the wrong shard are served by their (first) destination's owner, and the producers
    still cross for their other queue."""
    node = _start(tmp_path, handoff=handoff)
    consumers: list[_Consumer] = []
    try:
        queues = [owned_by(k, "kept") for k in SHARDS]
        consumers = [_Consumer(node, q, stomp_on(node, k)) for q in queues for k in SHARDS]
        producers = [_Producer(node, f"p{n}", queues, stomp_on(node, n % 2), 60)
                     for n in range(4)]
        for t in (*consumers, *producers):
            t.start()
        poll(lambda: sum(len(p.receipted) for p in producers) >= 60, 60,
             "a quarter of the sends receipted")
        victim = node.shards()[1]["pid"]
        os.kill(victim, signal.SIGKILL)
        poll(lambda: pid_gone(victim), 10, "shard 1 to die")
        for p in producers:
            p.join(120)
            assert not p.is_alive(), f"{p.name_} did not finish"
        receipted = {b for p in producers for b in p.receipted}
        assert sum(p.failures for p in producers) <= 2  # the killed shard's producers
        assert len(receipted) >= 4 * 60 - 2

        def every_receipted_received() -> bool:
            seen = {b for c in consumers for b, _ in c.bodies()}
            return receipted <= seen

        poll(every_receipted_received, 60, "every receipted message delivered")
        for c in consumers:
            c.halt.set()
        for c in consumers:
            c.join(30)
        copies: dict[str, list[bool]] = defaultdict(list)
        for c in consumers:
            for body, redelivered in c.bodies():
                copies[body].append(redelivered)
        # A message delivered again (its consumer's shard, or its owner, was killed
        # before the acknowledgement was settled) comes flagged: at most one copy not.
        assert [b for b, flags in copies.items() if flags.count(False) > 1] == []
        assert any(c.reconnects for c in consumers)  # shard 1's consumers came back
        # Every shard's own figures (a shard busy past the node's 3 s wait is listed
        # without them).
        def answered() -> list[dict[str, Any]] | None:
            rows = node.shards()
            return rows if all(r["answering"] for r in rows) else None

        rows = poll(answered, 30, "every shard answering /api/shards")
        assert rows[1]["restarts"] == 1 and rows[1]["last_exit"] == "killed by SIGKILL"
        if handoff:  # the consumers of queue 0 on shard 1 and every producer moved
            # (what shard 1 adopted went with its restart; shard 0 keeps its count)
            assert sum(int(r["handoffs"]["adopted"]) for r in rows) >= 1, \
                [r["handoffs"] for r in rows]
    finally:
        for c in consumers:
            c.halt.set()
        node.terminate()


def test_a_subscriptions_receipt_means_the_owner_has_it(node: NodeProcess) -> None:
    """A topic message published right after the RECEIPT (MQTT: SUBACK) of a
    subscription on the other shard reaches it: the confirmation waited for the owner
    to run the relayed consumer. Published on the owner's shard, the message takes no
    link hop, so it would overtake a relayed consumer still on its way."""
    rounds = 8
    for k in SHARDS:
        subscriber, publisher = stomp_on(node, 1 - k), stomp_on(node, k)
        for n in range(rounds):
            topic = owned_by(k, f"news{k}.{n}", kind="topic")
            subscriber.send_frame("SUBSCRIBE", [("destination", f"/topic/{topic}"),
                                                ("id", f"t{n}"), ("receipt", f"t{n}")])
            subscriber.read_until_receipt(f"t{n}")
            publisher.send_frame("SEND", [("destination", f"/topic/{topic}")],
                                 f"{topic}!".encode())
            frame, _ = subscriber.read_until("MESSAGE")
            assert frame.body.decode() == f"{topic}!"
        for c in (subscriber, publisher):
            c.close()
        mqtt_subscriber = mqtt_on(node, 1 - k, f"late-sub{k}")
        mqtt_publisher = mqtt_on(node, k, f"late-pub{k}")
        for n in range(rounds):
            topic = owned_by(k, f"alerts{k}.{n}", kind="topic").replace(".", "/")
            mqtt_subscriber.subscribe(topic, qos=0)
            mqtt_publisher.publish(topic, f"{topic}!".encode(), qos=0)
            [publish] = mqtt_subscriber.publishes(1)
            assert publish.payload.decode() == f"{topic}!"
        for m in (mqtt_subscriber, mqtt_publisher):
            m.close()


def test_an_acks_receipt_means_the_owner_stored_it(node: NodeProcess) -> None:
    """The RECEIPT of an ACK for a relayed message waits for the owner to have stored
    the acknowledgement: while the owner is stopped (SIGSTOP) none comes."""
    for k in SHARDS:
        queue = owned_by(k, f"acked{k}")
        producer = stomp_on(node, k)
        for i in range(2):
            _send(producer, queue, f"a{i}", receipt=f"a{i}")
        consumer = stomp_on(node, 1 - k)
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                          ("ack", "client-individual"),
                                          ("activemq.prefetchSize", "1")])
        frame, _ = consumer.read_until("MESSAGE")
        assert frame.body == b"a0"
        owner_pid = node.shards()[k]["pid"]
        os.kill(owner_pid, signal.SIGSTOP)
        try:
            consumer.send_frame("ACK", [("id", frame.get("ack") or ""), ("receipt", "ack")])
            with pytest.raises(TimeoutError):  # a bounded negative check
                consumer.read_until_receipt("ack", timeout=0.3)
        finally:
            os.kill(owner_pid, signal.SIGCONT)
        consumer.read_until_receipt("ack")
        assert _owner_depth(node, k, queue) == 1  # a0 is gone from the owner's store
        for c in (producer, consumer):
            c.close()


def test_an_ack_whose_owner_dies_before_storing_it_is_never_receipted(
        tmp_path: Path) -> None:
    """The owner is killed while an ACK's RECEIPT waits for it: no RECEIPT, the
    connection is failed with one ERROR, and the message comes again, flagged."""
    node = _start(tmp_path)
    try:
        queue = owned_by(1, "unsettled")
        producer = stomp_on(node, 1)
        _send(producer, queue, "only", receipt="only")
        producer.close()
        consumer = stomp_on(node, 0)
        consumer.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s"),
                                          ("ack", "client-individual")])
        frame, _ = consumer.read_until("MESSAGE")
        owner_pid = node.shards()[1]["pid"]
        os.kill(owner_pid, signal.SIGSTOP)
        consumer.send_frame("ACK", [("id", frame.get("ack") or ""), ("receipt", "ack")])
        with pytest.raises(TimeoutError):  # a bounded negative check
            consumer.read_until_receipt("ack", timeout=0.3)
        os.kill(owner_pid, signal.SIGKILL)
        frames = consumer.expect_closed(30)
        consumer.close()
        assert [f.command for f in frames] == ["ERROR"], frames
        assert "stopped before it stored an acknowledgement" in (frames[0].get("message")
                                                                 or ""), frames[0]
        again = _reconnect(node)
        again.send_frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s")])
        frame, _ = again.read_until("MESSAGE", timeout=60)
        assert frame.body == b"only" and frame.get("redelivered") == "true"
        again.close()
    finally:
        node.terminate()
