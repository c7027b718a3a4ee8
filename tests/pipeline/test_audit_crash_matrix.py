"""Crash matrix: real ``meshmq broker`` subprocesses with exact tracing (one scenario
also without), killed with SIGKILL mid-stream; the test's own clients record the
ground truth (every body confirmed, every delivery read, every ack confirmed) and the
audit must agree with it: every message read is consumed once, what nobody read is
lost (or ``unknown``, with a reason, where the trace cannot know), the duplicates
are exactly the ids the consumers read twice, and a failover window brackets the kill
and restart the test timed; a producer's re-sends that the broker's idempotent window
did not catch are the ``resent`` duplicates, those it caught are not duplicates.
``tests/pipeline/crash_matrix.py`` has the clients and the comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ha.support import SHARED, HaProcess, write_config
from tests.pipeline.crash_matrix import (
    HEARTBEAT_MS,
    QUEUE,
    Consumer,
    DedupProducer,
    ExactNode,
    LooseNode,
    Producer,
    Pump,
    ReplyHold,
    Truth,
    audit,
    check,
    check_window,
    kill_and_restart,
    now_us,
    send_all,
)
from tests.support.brokers import poll
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 200


def settle(truth: Truth, nodes: list[Any], pump: Pump) -> None:
    """Wait until every confirmed body was read and acked and no broker holds or
    forwards anything of the queue. A consumer thread that died fails at once, and a
    timeout says what was still missing."""
    def state() -> tuple[bool, str]:
        lost = truth.read_then_lost()  # never coming again: nothing to wait for
        with truth.lock:
            unread = truth.confirmed - set(truth.body.values())
            unacked = set(truth.seen) - (truth.acked | truth.unconfirmed) - lost
        depths = [n.destination(QUEUE)["depth"] for n in nodes]
        inflight = [br["inflight"] for n in nodes for br in n.bridges()]
        done = not unread and not unacked and not any(depths) and not any(inflight)
        return done, (f"{len(unread)} confirmed bodies unread, {len(unacked)} read ids "
                      f"unacked, queue depths {depths}, bridge in-flight {inflight}, "
                      f"consumer connections {pump.connections}, ended by {pump.failovers}")

    def quiet() -> bool:
        if pump.error is not None:
            raise AssertionError(f"the consuming thread failed: {pump.error!r}")
        return state()[0]

    try:
        poll(quiet, 90, "every message to be consumed and every broker to be empty")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {state()[1]}") from None


def stop(*nodes: ExactNode) -> None:
    for node in nodes:
        node.stop()


def test_receiving_broker_killed_mid_stream(tmp_path: Path, spark: Any) -> None:
    """east -> west, consumer on west; west dies while the stream flows and the consumer
    holds a full prefetch of unacked messages, and comes back: those are read again."""
    west = ExactNode("west", tmp_path / "west").start()
    east = ExactNode("east", tmp_path / "east").connect_to(
        f"static:({west.uri})", name="east-west").start()
    truth = Truth()
    held = 5
    pump = Pump(truth, lambda: [west.port], prefetch=held)
    try:
        east.wait_forwarding()
        consumer = Consumer(truth, lambda: [west.port], prefetch=held)
        poll(lambda: east.destination(QUEUE)["consumers"] >= 1, 30, "west's demand")
        producer = Producer(truth, lambda: [east.port], N)
        producer.start()
        consumer.consume_then_hold(N // 3, held)
        killed, up = kill_and_restart(west, consumer.abandon)
        pump.start()
        producer.finish()
        assert producer.sent == N and not truth.in_doubt
        settle(truth, [east, west], pump)
        pump.finish()
    finally:
        pump.stop.set()
        stop(east, west)
    got = audit(spark, tmp_path / "east" / "trace", tmp_path / "west" / "trace")
    check(got, truth)
    assert len(truth.duplicates()) == held
    check_window(got, "west", killed=killed, up=up)


@pytest.mark.parametrize("node", [ExactNode, LooseNode], ids=["exact", "not-exact"])
def test_sending_broker_killed_mid_stream(tmp_path: Path, spark: Any,
                                          node: type[ExactNode]) -> None:
    """The producer's broker A dies with messages stored, forwarded and in flight on
    the bridge A->B, and 10 non-persistent ones planted on a queue nobody consumes
    (really lost). Without exact tracing those are ``unknown``, not lost."""
    b = node("B", tmp_path / "B").start()
    a = node("A", tmp_path / "A").connect_to(f"static:({b.uri})", name="A-B").start()
    truth = Truth()
    pump = Pump(truth, lambda: [b.port])
    try:
        a.wait_forwarding()
        pump.start()
        poll(lambda: a.destination(QUEUE)["consumers"] >= 1, 30, "B's demand on A")
        send_all(a.port, "m.volatile", [f"v{i}" for i in range(10)], truth,
                 persistent=False)
        producer = Producer(truth, lambda: [a.port], N)
        producer.start()
        poll(lambda: producer.sent >= N // 3, 60, "a third of the stream sent to A")
        killed, up = kill_and_restart(a)
        producer.finish()
        settle(truth, [a, b], pump)
        pump.finish()
        assert a.destination("m.volatile")["depth"] == 0, "non-persistent: gone with A"
    finally:
        pump.stop.set()
        stop(a, b)
    got = audit(spark, tmp_path / "A" / "trace", tmp_path / "B" / "trace")
    check(got, truth, exact=node.exact)
    check_window(got, "A", killed=killed, up=up)
    assert not [w for w in got.failovers if w["broker"] == "B"]


def test_relaying_broker_killed_mid_stream(tmp_path: Path, spark: Any) -> None:
    """A -> B -> C, consumer on C; the relay B dies with messages arriving from A and
    leaving for C, and comes back. Nobody's send is in doubt: nothing may be lost."""
    c = ExactNode("C", tmp_path / "C").start()
    b = ExactNode("B", tmp_path / "B").connect_to(f"static:({c.uri})", name="B-C",
                                                   network_ttl=2).start()
    a = ExactNode("A", tmp_path / "A").connect_to(f"static:({b.uri})", name="A-B",
                                                   network_ttl=2).start()
    truth = Truth()
    pump = Pump(truth, lambda: [c.port])
    try:
        a.wait_forwarding()
        b.wait_forwarding()
        pump.start()
        poll(lambda: a.destination(QUEUE)["consumers"] >= 1, 30, "C's demand on A")
        producer = Producer(truth, lambda: [a.port], N)
        producer.start()
        poll(lambda: len(truth.seen) >= N // 3, 60, "a third of the stream on C")
        killed, up = kill_and_restart(b)
        producer.finish()
        assert producer.sent == N and not truth.in_doubt
        settle(truth, [a, b, c], pump)
        pump.finish()
    finally:
        pump.stop.set()
        stop(a, b, c)
    got = audit(spark, *(tmp_path / n / "trace" for n in "ABC"))
    check(got, truth)
    assert all(j["status"] == "consumed" for j in got.journeys.values())
    check_window(got, "B", killed=killed, up=up)
    crossed = [j["path"] for j in got.journeys.values() if j["origin_broker"] == "A"]
    assert crossed and all(p[:1] == ["A"] and p[-1] == "C" for p in crossed)


def test_shared_store_master_killed(tmp_path: Path, spark: Any) -> None:
    """A shared-store pair (one broker name, one store, one trace directory): the
    master dies while the producer streams and the consumer holds a full prefetch of
    unacked messages; the slave takes over, clients fail over to it, and it delivers
    the held messages again (read twice: duplicates)."""
    ports = [free_port(), free_port()]
    trace = tmp_path / "trace"

    def make(i: int) -> HaProcess:
        cfg = write_config(tmp_path / f"hub{i}.toml", name="hub", data_dir=tmp_path / "data",
                           ha=SHARED, stomp_port=ports[i])
        with cfg.open("a") as f:
            f.write(f'\n[trace]\nenabled = true\ndirectory = "{trace}"\nflush_interval_ms = 1\n'
                    f"exact = true\nheartbeat_interval_ms = {HEARTBEAT_MS}\n")
        return HaProcess(cfg, tmp_path / f"hub{i}.log")

    master = make(0).start().wait_master()
    slave = make(1).start().wait_slave()
    truth = Truth()
    held = 5
    pump = Pump(truth, lambda: ports, prefetch=held)
    try:
        consumer = Consumer(truth, lambda: ports, prefetch=held)
        producer = Producer(truth, lambda: ports, N)
        producer.start()
        consumer.consume_then_hold(N // 3, held)
        killed = (now_us(), 0)
        master.kill9()
        killed = (killed[0], now_us())
        consumer.abandon()
        pump.start()
        slave.wait_master()
        up = (killed[0], now_us())
        producer.finish()

        class Hub:  # the surviving broker, as settle() asks it
            def destination(self, name: str) -> dict[str, Any]:
                for d in slave.stat()["destinations"]:
                    if d["name"] == name and d["type"] == "queue":
                        return d  # type: ignore[no-any-return]
                return {"depth": 0}

            def bridges(self) -> list[dict[str, Any]]:
                return []

        settle(truth, [Hub()], pump)
        pump.finish()
        assert pump.connections == 1
    finally:
        pump.stop.set()
        for proc in (master, slave):
            if proc.alive():
                proc.terminate()
    got = audit(spark, trace)
    check(got, truth)
    # Every held message is read again, but one whose send was still being stored.
    assert len(truth.duplicates()) == held - len(truth.read_then_lost())
    check_window(got, "hub", killed=killed, up=up)


def test_consumer_crash_redelivers_unacked(tmp_path: Path, spark: Any) -> None:
    """A client-ack consumer reads a full prefetch, acks some, reads up to the
    prefetch again and dies without acking the rest; a second consumer gets those
    redelivered. Each is consumed once; the ids read twice are the duplicates, the ids
    the first consumer acked are not."""
    solo = ExactNode("solo", tmp_path / "solo").start()
    truth = Truth()
    prefetch = 10
    pump = Pump(truth, lambda: [solo.port])
    try:
        send_all(solo.port, QUEUE, [f"p{i}" for i in range(100)], truth)
        first = Consumer(truth, lambda: [solo.port], prefetch=prefetch)
        frames = [first.take(30) for _ in range(prefetch)]
        for frame in frames[:4]:
            assert frame is not None
            first.ack(frame)
        frames += [first.take(30) for _ in range(4)]
        assert all(f is not None for f in frames)
        first.abandon()
        pump.start()
        settle(truth, [solo], pump)
        pump.finish()
    finally:
        pump.stop.set()
        stop(solo)
    got = audit(spark, tmp_path / "solo" / "trace")
    check(got, truth)
    unacked = {f.get("message-id") for f in frames[4:] if f is not None}
    assert set(truth.duplicates()) == unacked
    assert all(got.journeys[m]["redeliveries"] >= 1 for m in unacked)
    assert not {m for m, j in got.journeys.items() if j["redeliveries"]} - unacked


def test_broker_killed_after_delivery_plants_duplicates(tmp_path: Path, spark: Any) -> None:
    """30 messages delivered to one consumer: 10 acked with a receipt, 10 acked without
    one, 10 not acked; the broker is killed at once and restarted. What comes again is
    read twice (a duplicate the audit must list); an ack that made it into the store but
    not into the trace leaves its message ``unknown``, never lost."""
    solo = ExactNode("solo", tmp_path / "solo").start()
    truth = Truth()
    pump = Pump(truth, lambda: [solo.port])
    try:
        send_all(solo.port, QUEUE, [f"p{i}" for i in range(30)], truth)
        consumer = Consumer(truth, lambda: [solo.port], prefetch=30)
        frames = [consumer.take(30) for _ in range(30)]
        assert all(f is not None for f in frames)
        for i, frame in enumerate(frames[:20]):
            assert frame is not None
            consumer.ack(frame, confirm=i < 10)
        killed, up = kill_and_restart(solo, consumer.abandon)
        pump.start()
        settle(truth, [solo], pump)
        pump.finish()
    finally:
        pump.stop.set()
        stop(solo)
    got = audit(spark, tmp_path / "solo" / "trace")
    check(got, truth)
    ids = [f.get("message-id") for f in frames if f is not None]
    dups = set(truth.duplicates())
    assert set(ids[20:]) <= dups and not set(ids[:10]) & dups
    check_window(got, "solo", killed=killed, up=up)


def test_producer_resends_across_a_broker_kill(tmp_path: Path, spark: Any) -> None:
    """A failover producer sends persistent messages with dedup ids over a link that
    can lose the broker's replies. First the link alone breaks after the broker stored
    a batch whose receipts it lost: the producer sends the batch again to the same
    broker, whose idempotent window drops every copy (``dropped``, no duplicate). Then
    the broker stores two more batches whose receipts never reach the producer; a
    consumer reads and acks one of them, and the broker is SIGKILLed. The restarted
    broker puts the dedup ids of what it still stores back in its window, so the
    re-sends of the unread batch are dropped (each body read once); the acked batch is
    gone from the store, so its re-sends are stored again and read a second time, under
    new message ids: the audit's ``resent`` duplicates, exactly those dedup ids."""
    solo = ExactNode("solo", tmp_path / "solo").start()
    link = ReplyHold(solo.port).start()
    truth = Truth()
    pump = Pump(truth, lambda: [solo.port])
    early: Pump | None = None
    producer: DedupProducer | None = None
    caught = [f"c{i}" for i in range(20)]  # re-sent to the broker that stored them
    kept = [f"k{i}" for i in range(20)]  # stored, unread, broker killed, re-sent
    twice = [f"t{i}" for i in range(30)]  # stored, read and acked, killed, re-sent
    try:
        producer = DedupProducer(f"failover:(stomp://127.0.0.1:{link.port})?randomize=false"
                                 "&initialReconnectDelay=50&maxReconnectDelay=500")
        producer.send(truth, [f"p{i}" for i in range(20)]).result(60)

        link.hold()
        pending = producer.send(truth, caught)
        poll(lambda: link.receipts_dropped() == len(caught), 30,
             "the broker to store the batch and answer (answers lost)")
        truth.resent.update(caught)
        link.release()  # the producer's connection breaks; the broker lives on
        pending.result(60)

        link.hold()
        pending_twice = producer.send(truth, twice, queue="m.early")
        pending_kept = producer.send(truth, kept)
        poll(lambda: link.receipts_dropped() == len(twice) + len(kept), 30,
             "the broker to store both batches and answer (answers lost)")
        truth.resent.update(twice + kept)
        early = Pump(truth, lambda: [solo.port], queue="m.early")
        early.start()
        poll(lambda: {truth.body[m] for m in truth.acked} >= set(twice), 60,
             "the consumer to read and ack the first batch (acks confirmed)")
        early.finish()
        killed, up = kill_and_restart(solo)
        pending_twice.result(120)
        pending_kept.result(120)
        assert producer.resent == len(caught) + len(twice) + len(kept)

        early = Pump(truth, lambda: [solo.port], queue="m.early")
        early.start()
        pump.start()
        settle(truth, [solo], pump)
        poll(lambda: early.error is not None or len(truth.seen) == 20 + 20 + 20 + 60, 60,
             "the re-sent first batch read again")
        early.finish()
        pump.finish()
    finally:
        pump.stop.set()
        if early is not None:
            early.stop.set()
        if producer is not None:
            producer.close()
        link.close()
        stop(solo)
    got = audit(spark, tmp_path / "solo" / "trace")
    check(got, truth)
    assert set(truth.resent_copies()) == {f"d-{b}" for b in twice}
    assert {j["dedup_id"] for j in got.journeys.values() if j["status"] == "dropped"} \
        == {f"d-{b}" for b in caught + kept}
    assert not got.duplicates  # no message id was delivered twice
    check_window(got, "solo", killed=killed, up=up)


def test_producer_resends_to_a_second_broker_of_the_network(tmp_path: Path,
                                                            spark: Any) -> None:
    """The same producer with A and B in its failover list, A bridged to B, nobody
    consuming yet: A stores a batch whose receipts never reach the producer and is
    SIGKILLed; the producer sends the batch again to B, which stores it. A comes back,
    a consumer on B makes A forward what it recovered, and B's idempotent window (which
    holds the re-sends' dedup ids) drops A's originals: every body is read once, the
    originals are ``dropped``, and nothing is a ``resent`` duplicate."""
    b = ExactNode("B", tmp_path / "B").start()
    a = ExactNode("A", tmp_path / "A").connect_to(f"static:({b.uri})", name="A-B").start()
    link = ReplyHold(a.port).start()
    truth = Truth()
    pump = Pump(truth, lambda: [b.port])
    producer: DedupProducer | None = None
    again = [f"t{i}" for i in range(30)]
    try:
        a.wait_forwarding()
        producer = DedupProducer(
            f"failover:(stomp://127.0.0.1:{link.port},stomp://127.0.0.1:{b.port})"
            "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=500")
        producer.send(truth, [f"p{i}" for i in range(20)]).result(60)
        link.hold()
        pending = producer.send(truth, again)
        poll(lambda: link.receipts_dropped() == len(again), 30,
             "A to store the batch and answer (answers lost)")
        truth.resent.update(again)
        killed, up = kill_and_restart(a, lambda: pending.result(120))  # re-sent to B
        assert producer.resent == len(again)
        assert b.destination(QUEUE)["depth"] == len(again)
        a.wait_forwarding()
        pump.start()
        settle(truth, [a, b], pump)
        pump.finish()
    finally:
        pump.stop.set()
        if producer is not None:
            producer.close()
        link.close()
        stop(a, b)
    got = audit(spark, tmp_path / "A" / "trace", tmp_path / "B" / "trace")
    check(got, truth)
    assert not truth.resent_copies() and not got.resent and not got.duplicates
    dropped = {j["dedup_id"]: j for j in got.journeys.values() if j["status"] == "dropped"}
    assert set(dropped) == {f"d-{body}" for body in again}
    assert all(j["origin_broker"] == "A" and j["last_broker"] == "B" and j["hops"] == 1
               for j in dropped.values())
    check_window(got, "A", killed=killed, up=up)
