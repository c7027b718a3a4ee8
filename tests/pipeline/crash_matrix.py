"""Clients that record the ground truth of a crash-matrix run, and the comparison of
that truth with the audit's verdicts (tests/pipeline/test_audit_crash_matrix.py).

The truth is what the test's own clients saw: every body sent with a receipt (or
left in doubt by a broker that died before answering, or sent again with its
``dedup-id`` by a failover producer that never read the receipt), every delivery read
from a socket (message id, its dedup id, how often) and every ack the broker confirmed
with a receipt."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshmq.client import FailoverClient
from meshmq.client.simple_stomp import SimpleStompClient, StompClientError
from meshmq.errors import MeshmqError
from meshmq.protocol.stomp import Frame, encode_frame
from tests.pipeline.test_audit_end_to_end import TracedNode
from tests.support.brokers import poll
from tests.support.tcp_proxy import TcpProxy

HEARTBEAT_MS = 100
QUEUE = "m.orders"


class ExactNode(TracedNode):
    """A traced network node, in ``exact`` mode with 100 ms heartbeats."""

    exact = True

    def write_config(self) -> Path:
        path = super().write_config()
        with path.open("a") as f:
            f.write(f"exact = {'true' if self.exact else 'false'}\n"
                    f"heartbeat_interval_ms = {HEARTBEAT_MS}\n")
        return path


class LooseNode(ExactNode):
    """The same without ``exact``: a crash may take unflushed events with it."""

    exact = False


def now_us() -> int:
    return time.time_ns() // 1000


Span = tuple[int, int]  # (before, after) in µs: when something happened, bounded


def kill_and_restart(node: Any, between: Callable[[], None] | None = None
                     ) -> tuple[Span, Span]:
    """SIGKILL ``node``, run ``between`` (a client giving up, say), start it again; when
    the kill and the restart happened, each bounded by clock readings around it."""
    before = now_us()
    node.kill9()
    killed = (before, now_us())
    if between is not None:
        between()
    before = now_us()
    node.start()
    return killed, (before, now_us())


@dataclass
class Truth:
    """What the clients know. Thread-safe: producers and consumers run in threads."""

    confirmed: set[str] = field(default_factory=set)  # bodies the broker confirmed
    in_doubt: set[str] = field(default_factory=set)  # sends the broker died on
    seen: collections.Counter[str] = field(default_factory=collections.Counter)  # id -> reads
    body: dict[str, str] = field(default_factory=dict)  # message id -> body
    acked: set[str] = field(default_factory=set)  # ids whose ack the broker confirmed
    unconfirmed: set[str] = field(default_factory=set)  # ids acked without a receipt
    acks: collections.Counter[str] = field(default_factory=collections.Counter)  # id -> acks
    confirmed_acks: collections.Counter[str] = field(default_factory=collections.Counter)
    volatile: set[str] = field(default_factory=set)  # non-persistent bodies confirmed
    dedup: dict[str, str] = field(default_factory=dict)  # message id -> its dedup-id
    resent: set[str] = field(default_factory=set)  # bodies sent again with their dedup-id
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, frame: Frame) -> str:
        mid = frame.get("message-id") or ""
        with self.lock:
            self.seen[mid] += 1
            self.body[mid] = frame.body.decode()
            dedup = frame.get("dedup-id")
            if dedup is not None:
                self.dedup[mid] = dedup
        return mid

    def bodies_seen(self) -> set[str]:
        with self.lock:
            return set(self.body.values())

    def duplicates(self) -> dict[str, int]:
        with self.lock:
            return {mid: n for mid, n in self.seen.items() if n > 1}

    def resent_copies(self) -> dict[str, list[str]]:
        """Dedup ids read under more than one message id: a producer's send and its
        re-send both stored, both delivered (the broker's window did not catch it)."""
        with self.lock:
            ids: dict[str, set[str]] = collections.defaultdict(set)
            for mid, dedup in self.dedup.items():
                ids[dedup].add(mid)
        return {d: sorted(m) for d, m in ids.items() if len(m) > 1}

    def read_then_lost(self) -> set[str]:
        """Ids read once, never acked, whose send the broker died on: a broker dispatches
        a persistent message while it is being stored (as ActiveMQ's concurrent store
        and dispatch does), so a consumer may read a message that the crash then took
        before it was durable. Its producer never had a receipt; it never comes again."""
        with self.lock:
            return {m for m, n in self.seen.items()
                    if n == 1 and self.body[m] in self.in_doubt
                    and m not in self.acked and m not in self.unconfirmed}


def connect(ports: Callable[[], Sequence[int]], deadline_s: float = 60.0) -> SimpleStompClient:
    """A connection to the first of ``ports()`` that accepts one (failover, in order)."""
    found: list[SimpleStompClient] = []

    def attempt() -> bool:
        for port in ports():
            try:
                found.append(SimpleStompClient("127.0.0.1", port, timeout=5))
                return True
            except (OSError, MeshmqError):
                continue
        return False

    poll(attempt, deadline_s, f"a broker on {list(ports())} to accept a connection")
    return found[0]


class Consumer:
    """A client-individual consumer that records every frame it reads."""

    def __init__(self, truth: Truth, ports: Callable[[], Sequence[int]], *,
                 queue: str = QUEUE, prefetch: int | None = None) -> None:
        self.truth = truth
        self.client = connect(ports)
        headers = None if prefetch is None else {"activemq.prefetchSize": str(prefetch)}
        try:
            self.client.subscribe(f"/queue/{queue}", "c", ack="client-individual",
                                  headers=headers)
        except BaseException:
            self.client.close()
            raise

    def take(self, timeout: float) -> Frame | None:
        frame = self.client.receive(timeout)
        if frame is not None:
            self.truth.saw(frame)
        return frame

    def ack(self, frame: Frame, *, confirm: bool = True) -> None:
        """Ack ``frame``; with ``confirm``, wait for the broker's receipt and count it
        acked (the ack is then in the broker, and in an exact trace)."""
        headers = [("id", frame.get("ack") or "")]
        receipt = self.client._receipt() if confirm else None
        if receipt is not None:
            headers.append(("receipt", receipt))
        self.client._send(encode_frame("ACK", headers, version="1.2"))
        mid = frame.get("message-id") or ""
        with self.truth.lock:
            self.truth.acks[mid] += 1
        if receipt is None:
            with self.truth.lock:
                self.truth.unconfirmed.add(mid)
        else:
            self.client._await_receipt(receipt, 30)
            with self.truth.lock:
                self.truth.acked.add(mid)
                self.truth.confirmed_acks[mid] += 1

    def consume_then_hold(self, n: int, held: int) -> list[Frame]:
        """Read and ack until ``n`` ids were read in all, then read ``held`` more (the
        subscription's prefetch) without acking: the broker dispatches no further, so
        nothing it traced as dispatched is left unread when it is killed now."""
        while len(self.truth.seen) < n:
            frame = self.take(30)
            assert frame is not None, f"only {len(self.truth.seen)} of {n} read"
            self.ack(frame)
        frames = [self.take(30) for _ in range(held)]
        assert all(frames), "fewer than a prefetch of messages dispatched"
        return [f for f in frames if f is not None]

    def abandon(self) -> None:
        """Drop the connection without DISCONNECT (as a crashed client would)."""
        self.client.sock.close()


class Pump(threading.Thread):
    """Reads and acks (confirmed) every message of a consumer until ``stop``; when the
    broker drops the connection it reconnects to ``ports()`` and carries on."""

    def __init__(self, truth: Truth, ports: Callable[[], Sequence[int]],
                 consumer: Consumer | None = None, **options: Any) -> None:
        super().__init__(daemon=True)
        self.truth = truth
        self.ports = ports
        self.options = options
        self.consumer = consumer
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.connections = 0
        self.failovers: list[str] = []  # why each connection (or attempt) ended

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    if self.consumer is None:
                        # No broker may accept yet (a slave still taking over), or the
                        # one that does may drop us before SUBSCRIBE: try again.
                        self.consumer = Consumer(self.truth, self.ports, **self.options)
                        self.connections += 1
                    frame = self.consumer.take(0.1)
                    if frame is not None:
                        self.consumer.ack(frame)
                except (OSError, MeshmqError, AssertionError) as exc:
                    self.failovers.append(repr(exc))
                    if self.consumer is not None:
                        self.consumer.abandon()
                        self.consumer = None  # the broker died: fail over
        except BaseException as exc:
            self.error = exc
        finally:
            if self.consumer is not None:
                self.consumer.client.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, self.error


class Producer(threading.Thread):
    """Sends ``n`` persistent bodies ``<prefix><i>``, one at a time with a receipt, never
    more than ``window`` ahead of what the consumers have read (so the stream is in
    flight on every hop when a broker is killed). A send the broker dies on is left in
    doubt (not re-sent); the producer fails over to ``ports()`` and goes on."""

    def __init__(self, truth: Truth, ports: Callable[[], Sequence[int]], n: int, *,
                 prefix: str = "p", queue: str = QUEUE, window: int = 40) -> None:
        super().__init__(daemon=True)
        self.truth = truth
        self.ports = ports
        self.n = n
        self.prefix = prefix
        self.queue = queue
        self.window = window
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            client = connect(self.ports)
            for i in range(self.n):
                poll(lambda i=i: i - len(self.truth.bodies_seen()) < self.window, 60,
                     "the consumers to keep up")
                body = f"{self.prefix}{i}"
                try:
                    client.send(f"/queue/{self.queue}", body.encode(), {"persistent": "true"})
                except (OSError, StompClientError):
                    with self.truth.lock:
                        self.truth.in_doubt.add(body)
                    client.sock.close()
                    client = connect(self.ports)
                else:
                    with self.truth.lock:
                        self.truth.confirmed.add(body)
                self.sent = i + 1
            client.close()
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(120)
        assert not self.is_alive()
        assert self.error is None, self.error


def send_all(port: int, queue: str, bodies: Sequence[str], truth: Truth, *,
             persistent: bool = True) -> None:
    with SimpleStompClient("127.0.0.1", port) as producer:
        for body in bodies:
            producer.send(f"/queue/{queue}", body.encode(),
                          {"persistent": "true" if persistent else "false"})
            with truth.lock:
                (truth.confirmed if persistent else truth.volatile).add(body)


class ReplyHold(TcpProxy):
    """A proxy in front of a broker that can lose the broker's replies: ``hold()`` drops
    every byte the broker sends on the connections open now, so their receipts never
    reach the client while its frames still reach the broker; ``release()`` breaks those
    connections, as a network that lost them would. New connections pass both ways,
    unless ``hold(new=True)``: then they get the broker's first answer (CONNECTED) and
    nothing after it."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self._clients: set[asyncio.StreamWriter] = set()
        self._held: dict[asyncio.StreamWriter, bytearray] = {}  # client side -> dropped
        self._hold_new = False
        self._first: set[asyncio.StreamWriter] = set()  # held; first answer passes

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self._links.add(writer)
        self._clients.add(writer)
        if self._hold_new:
            self._held[writer] = bytearray()
            self._first.add(writer)
        try:
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return
            self._links.add(up_w)
            try:
                await asyncio.gather(self._copy(reader, up_w, None),
                                     self._copy(up_r, writer, writer))
            finally:
                up_w.close()
                self._links.discard(up_w)
        finally:
            writer.close()
            self._links.discard(writer)
            self._clients.discard(writer)

    async def _copy(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    client: asyncio.StreamWriter | None) -> None:
        """Copy until ``src`` ends (``client``: the broker's replies to it, dropped
        while held); closing ``dst`` then ends the other direction too."""
        try:
            while data := await src.read(65536):
                dropped = self._held.get(client) if client is not None else None
                if dropped is not None and client in self._first:
                    self._first.discard(client)
                elif dropped is not None:
                    dropped += data
                    continue
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            dst.close()

    def _ask(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def hold(self, *, new: bool = False) -> None:
        def do() -> None:
            self._held.update({w: bytearray() for w in self._clients})
            self._hold_new = new

        self._ask(do)

    def receipts_dropped(self) -> int:
        return int(self._ask(lambda: sum(b.count(b"RECEIPT\n") for b in self._held.values())))

    def release(self) -> None:
        def do() -> None:
            for w in self._held:
                w.transport.abort()
            self._held.clear()
            self._first.clear()
            self._hold_new = False

        self._ask(do)


class DedupProducer:
    """meshmq's failover client (on its own event-loop thread) sending persistent
    bodies, each with the ``dedup-id`` ``d-<body>``, all of a batch at once: a send
    whose receipt never came is sent again with its dedup-id on the next connection
    (the client's own retry; ``resent`` counts them)."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="dedup-producer")
        self._thread.start()

        async def connect() -> FailoverClient:
            client = FailoverClient(url)
            await client.connect(30)
            return client

        self.client = self._run(connect()).result(60)

    def _run(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def send(self, truth: Truth, bodies: Sequence[str], queue: str = QUEUE
             ) -> concurrent.futures.Future[Any]:
        async def one(body: str) -> None:
            await self.client.send(f"/queue/{queue}", body, dedup_id=f"d-{body}")
            with truth.lock:
                truth.confirmed.add(body)

        async def every() -> None:
            await asyncio.gather(*(one(b) for b in bodies))

        return self._run(every())

    @property
    def resent(self) -> int:
        return int(self.client.stats["resent"])

    def close(self) -> None:
        try:
            self._run(self.client.close()).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


# --------------------------------------------------------------------------- audit

@dataclass
class Audit:
    journeys: dict[str, dict[str, Any]]
    duplicates: dict[str, dict[str, Any]]  # kind "redelivered", by message id
    failovers: list[dict[str, Any]]
    resent: dict[str, dict[str, Any]]  # kind "resent", by dedup id


def audit(spark: Any, *dirs: Path) -> Audit:
    from meshmq.pipeline.audit_job import compute, read_traces

    tables = compute(read_traces(spark, list(dirs)), cache_events=False)
    dups = [r.asDict() for r in tables.duplicates.collect()]
    return Audit(
        journeys={r["message_id"]: r.asDict() for r in tables.journeys.collect()},
        duplicates={d["key"]: d for d in dups if d["kind"] == "redelivered"},
        failovers=[r.asDict() for r in tables.failovers.collect()],
        resent={d["key"]: d for d in dups if d["kind"] == "resent"})


def check(got: Audit, truth: Truth, *, exact: bool = True,
          planted_lost: str = "m.volatile") -> None:
    """The audit's verdicts against the clients' record.

    * every id a consumer read is ``consumed``, with at least the acks the broker
      confirmed and at most those the consumers sent (the test's consumers ack all they
      read in the end), and nothing else is consumed; but an id read once and
      acked without a receipt just before its broker was killed may be ``unknown``
      (whether the ack made it is unknowable, to the client and to the trace);
    * ``duplicates`` lists exactly the ids the consumers read more than once, each with
      as many deliveries as reads (``redelivered``), and exactly the dedup ids the
      consumers read under several message ids, with those ids (``resent``);
    * a re-send the broker's idempotent window caught was never read: it is
      ``dropped`` (duplicate dedup-id), a copy of a body the producer re-sent and a
      consumer read under its first message id, never a duplicate;
    * what no consumer ever read is lost (exact tracing: the trace holds every
      delivery), or ``unknown`` with a reason (the crashed run's trace was not exact);
      it is the non-persistent messages planted on queue ``planted_lost`` on a broker
      that was then killed, plus at most the sends left in doubt, never a persistent
      message the broker confirmed.
    """
    journeys = got.journeys
    seen = set(truth.seen)
    assert seen <= set(journeys), f"read by a consumer, not traced: {sorted(seen - set(journeys))}"
    ids_per_body = collections.Counter(truth.body[m] for m in seen)
    assert {b for b, n in ids_per_body.items() if n > 1} <= truth.resent, \
        "one body, two message ids, and its producer never re-sent it"
    in_doubt_acks = {m for m in truth.unconfirmed - truth.acked if truth.seen[m] == 1}
    undecided = {m for m in in_doubt_acks if journeys[m]["status"] == "unknown"}
    undecided |= truth.read_then_lost()  # delivered, never acked, gone with its broker
    for mid in undecided:
        assert journeys[mid]["status"] == "unknown", (mid, journeys[mid]["status"])
        assert journeys[mid]["reason"].startswith("delivered to a consumer; no ack traced")
    # Acks in the trace: at least those the broker confirmed (and one), at most those the
    # clients sent (an unconfirmed ack may die with the broker; the message then comes
    # again and is acked a second time).
    wrong = {m: (journeys[m]["status"], journeys[m]["acks"], journeys[m]["reason"])
             for m in seen - undecided
             if journeys[m]["status"] != "consumed"
             or not max(1, truth.confirmed_acks[m]) <= journeys[m]["acks"]
             <= max(1, truth.acks[m])}
    assert not wrong, f"read and acked, not consumed as the clients acked: {wrong}"
    consumed = {m for m, j in journeys.items() if j["status"] == "consumed"}
    assert consumed == seen - undecided

    truth_dups = truth.duplicates()
    assert {m: d["deliveries"] for m, d in got.duplicates.items()} == truth_dups
    for mid, n in truth_dups.items():
        assert journeys[mid]["deliveries"] == n
    truth_resent = truth.resent_copies()
    assert {k: sorted(d["message_ids"]) for k, d in got.resent.items()} == truth_resent
    for key, mids in truth_resent.items():
        assert got.resent[key]["deliveries"] == sum(truth.seen[m] for m in mids)

    unseen = {m: j for m, j in journeys.items() if m not in seen}
    caught = {m: j for m, j in unseen.items() if j["status"] == "dropped"}
    read_resends = {truth.dedup[m] for m in seen if truth.body[m] in truth.resent}
    for mid, j in caught.items():
        assert "duplicate dedup-id" in (j["drop_reason"] or ""), (mid, j["drop_reason"])
        assert j["dedup_id"] in read_resends, (mid, j["dedup_id"])
    unseen = {m: j for m, j in unseen.items() if m not in caught}
    for mid, j in unseen.items():
        if exact:
            assert j["status"] == "lost", (mid, j["status"], j["reason"])
        else:
            assert j["status"] == "unknown", (mid, j["status"])
            assert "crashed; its trace was not exact" in j["reason"], j["reason"]
    in_planted = {m for m, j in unseen.items() if j["destination"] == f"queue://{planted_lost}"}
    assert len(in_planted) == len(truth.volatile)
    assert len(unseen) - len(in_planted) <= len(truth.in_doubt)
    assert truth.confirmed <= truth.bodies_seen(), "a confirmed persistent message never came"


def check_window(got: Audit, broker: str, *, killed: tuple[int, int],
                 up: tuple[int, int]) -> None:
    """The one failover window of ``broker``: it went down at most a heartbeat interval
    (plus 150 ms of scheduling slack) before the kill the test timed (``killed``: just before,
    just after, in µs) and came up while the test was starting it (``up``)."""
    windows = [w for w in got.failovers if w["broker"] == broker]
    assert len(windows) == 1, windows
    w = windows[0]
    assert w["kind"] == "crash"
    assert w["uncertainty_ms"] == HEARTBEAT_MS
    slack_us = (HEARTBEAT_MS + 150) * 1000  # a heartbeat, plus event-loop lag on a busy box
    assert killed[0] - slack_us <= w["down_from_ts"] <= killed[1], (w, killed)
    assert up[0] <= w["up_again_ts"] <= up[1], (w, up)
