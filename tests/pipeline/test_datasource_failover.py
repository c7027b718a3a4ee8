"""format("meshmq") across a broker's death: a shared-store master/slave pair of real
broker subprocesses (tracing, exact), the master killed with SIGKILL while a query
reads a stream, or while it writes through the sink."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.client import BlockingClient
from tests.ha.support import SHARED, HaProcess, write_config
from tests.pipeline.crash_matrix import HEARTBEAT_MS, Pump, ReplyHold, Truth, audit
from tests.support.brokers import poll
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("pyspark")

from meshmq.pipeline import datasource as ds  # noqa: E402

STREAMS = '\n[[streams]]\nmatch = "queue://stream.>"\n'


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[HaProcess, HaProcess, str]]:
    """Master a and slave b on one store, tracing exactly into ``tmp_path / "trace"``;
    the failover URL of both."""
    data = tmp_path / "data"
    ports = {"a": free_port(), "b": free_port()}
    procs = {}
    trace = (f'\n[trace]\nenabled = true\ndirectory = "{tmp_path / "trace"}"\n'
             f"flush_interval_ms = 1\nexact = true\nheartbeat_interval_ms = {HEARTBEAT_MS}\n")
    for name, port in ports.items():
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=data, ha=SHARED,
                           stomp_port=port)
        cfg.write_text(cfg.read_text() + STREAMS + trace)
        procs[name] = HaProcess(cfg, tmp_path / f"{name}.log")
    a = procs["a"].start().wait_master()
    b = procs["b"].start().wait_slave()
    url = (f"failover:(stomp://127.0.0.1:{ports['a']},stomp://127.0.0.1:{ports['b']})"
           "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=1000")
    try:
        yield a, b, url
    finally:
        for p in (a, b):
            if p.alive():
                p.terminate()


def send(url: str, dest: str, bodies: range) -> None:
    with BlockingClient(url) as client:
        for i in bodies:
            client.send(dest, f"rec-{i:05d}")  # confirmed, re-sent across a failover


def test_a_stream_read_survives_the_master_killed_exactly_once(
        spark: Any, pair: tuple[HaProcess, HaProcess, str], tmp_path: Path) -> None:
    a, b, url = pair
    n = 400
    send(url, "/queue/stream.rec", range(n // 2))
    ds.register(spark)
    out = tmp_path / "out"
    query = (spark.readStream.format("meshmq").option("url", url)
             .option("destination", "/queue/stream.rec").option("maxRowsPerBatch", "20")
             .option("partitionSize", "10").load()
             .selectExpr("offset", "body")
             .writeStream.format("json").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())

    def processed() -> int:
        return sum(p["numInputRows"] for p in query.recentProgress)

    try:
        poll(lambda: processed() >= 40, 240, "a few batches before the kill")
        a.kill9()  # mid-stream: half the records are not read yet
        assert processed() < n // 2
        b.wait_master(60)
        send(url, "/queue/stream.rec", range(n // 2, n))  # onto the new master
        poll(lambda: query.exception() is not None or processed() >= n, 300,
             "every record through the query")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    rows = [json.loads(line) for f in sorted(out.glob("*.json"))
            for line in f.read_text().splitlines()]
    bodies = sorted(r["body"] for r in rows)
    assert bodies == [f"rec-{i:05d}" for i in range(n)]  # each record exactly once
    assert sorted(r["offset"] for r in rows) == list(range(n))


def test_the_sink_survives_the_master_killed_mid_write(
        spark: Any, pair: tuple[HaProcess, HaProcess, str], tmp_path: Path) -> None:
    """A query copies a stream into a queue through the sink; while it writes, the
    master's receipts to the sink are lost on the way and the master dies. The query
    finishes on the slave and a consumer reads every row exactly once: the sends the
    master stored but the sink never saw confirmed are still in the store, so the slave
    puts their dedup ids back in its idempotent window when it takes over, and drops
    the sink's re-sends (``dropped``, duplicate dedup-id; no ``resent`` duplicates)."""
    a, b, url = pair
    a_port, b_port = (int(p) for p in re.findall(r"stomp://127\.0\.0\.1:(\d+)", url))
    link = ReplyHold(a_port).start()
    sink_url = (f"failover:(stomp://127.0.0.1:{link.port},stomp://127.0.0.1:{b_port})"
                "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=1000")
    n = 1500
    send(url, "/queue/stream.rec", range(n))
    ds.register(spark)
    query = (spark.readStream.format("meshmq").option("url", url)
             .option("destination", "/queue/stream.rec").option("maxRowsPerBatch", "150")
             .option("partitionSize", "75").load()
             .selectExpr("body")
             .writeStream.format("meshmq").option("url", sink_url)
             .option("destination", "/queue/out")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="100 milliseconds").start())

    def processed() -> int:
        return sum(p["numInputRows"] for p in query.recentProgress)

    try:
        poll(lambda: depth(a, "out") >= 300, 240, "a few batches written")
        link.hold(new=True)  # the master stores the next writes; the sink hears nothing
        # Several: a DISCONNECT's receipt may be among them, most are sends'.
        poll(lambda: link.receipts_dropped() >= 10, 60, "writes stored, their receipts lost")
        a.kill9()
        assert processed() < n
        b.wait_master(60)
        poll(lambda: query.exception() is not None or processed() >= n, 300,
             "every row through the query")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        link.close()

    truth = Truth()
    pump = Pump(truth, lambda: [b.port], queue="out")
    pump.start()
    try:
        poll(lambda: pump.error is not None or (len(truth.bodies_seen()) == n
                                                and not depth(b, "out")), 120,
             "every row read from the queue")
        pump.finish()
    finally:
        pump.stop.set()
        b.terminate()
    assert truth.bodies_seen() == {f"rec-{i:05d}" for i in range(n)}
    assert not truth.duplicates()  # no message id read twice: nobody crashed reading
    assert not truth.resent_copies()  # no row stored twice: exactly once
    assert len(truth.seen) == n

    got = audit(spark, tmp_path / "trace")
    assert not got.resent
    out = {m: j for m, j in got.journeys.items() if j["destination"] == "queue://out"}
    assert {m: out[m]["status"] for m in truth.seen} == dict.fromkeys(truth.seen, "consumed")
    read_keys = set(truth.dedup.values())
    caught = 0
    for mid, j in out.items():
        if mid in truth.seen:
            continue
        # A re-send the window dropped, or the master's copy of a send it had not stored
        # yet, taken when b took over (its re-send was read): never a message no copy
        # of reached the consumer.
        assert j["dedup_id"] in read_keys, (mid, j)
        assert j["status"] in ("dropped", "resent"), (mid, j)
        assert j["status"] != "resent" or j["reason"].startswith("taken by b's takeover "
                                                                   "from a;"), j
        assert j["status"] != "dropped" or "duplicate dedup-id" in j["drop_reason"], j
        caught += j["status"] == "dropped"
    # Writes stored without a receipt came again and were dropped. (Not as many as the
    # receipts lost: one may be a DISCONNECT's, and a send stored just before the kill
    # may have had no receipt yet.)
    assert caught >= 1, {m: j["status"] for m, j in out.items() if m not in truth.seen}
    # a's run ended when b took its lease over.
    assert [(w["broker"], w["kind"], w["up_on"]) for w in got.failovers] == [("a", "crash",
                                                                                "b")]


def depth(proc: HaProcess, queue: str) -> int:
    """Messages on ``queue`` of a live broker (0 when it has none)."""
    for d in proc.stat()["destinations"]:
        if d["name"] == queue and d["type"] == "queue":
            return int(d["depth"])
    return 0


def test_an_unreachable_cluster_or_a_bad_url_is_one_line(spark: Any) -> None:
    ds.register(spark)
    dead = f"failover:(stomp://127.0.0.1:{free_port()})?maxReconnectAttempts=1" \
        "&initialReconnectDelay=10"
    query = (spark.readStream.format("meshmq").option("url", dead)
             .option("destination", "/queue/stream.none").load()
             .writeStream.format("memory").queryName("dead_rows").start())
    try:
        query.awaitTermination(120)
    except Exception as exc:  # the query's exception is what is checked
        text = str(exc)
    else:
        pytest.fail("the query ran without a broker")
    finally:
        query.stop()
    # Spark wraps the worker's traceback; the error itself is one line naming the cause.
    line = next(x.strip() for x in text.splitlines() if x.strip().startswith(
        "meshmq.pipeline.broker_client.StompIOError: "))
    assert f"{dead}: failover gave up: " in line and "Connect call failed" in line
    with pytest.raises(Exception, match=r"meshmq option url: .*unknown failover option"):
        (spark.readStream.format("meshmq").option("url", "failover:(tcp://h:1)?randomise=1")
         .option("destination", "/queue/stream.x").load()
         .writeStream.format("memory").queryName("bad_url").start().awaitTermination(60))
