"""format("meshmq") across a broker's death: a shared-store master/slave pair of real
broker subprocesses, the master killed with SIGKILL while a query runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.client import BlockingClient
from tests.ha.support import SHARED, HaProcess, write_config
from tests.support.brokers import poll
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("pyspark")

from meshmq.pipeline import datasource as ds  # noqa: E402

STREAMS = '\n[[streams]]\nmatch = "queue://stream.>"\n'


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[HaProcess, HaProcess, str]]:
    """Master a and slave b on one store; the failover URL of both."""
    data = tmp_path / "data"
    ports = {"a": free_port(), "b": free_port()}
    procs = {}
    for name, port in ports.items():
        cfg = write_config(tmp_path / f"{name}.toml", name=name, data_dir=data, ha=SHARED,
                           stomp_port=port)
        cfg.write_text(cfg.read_text() + STREAMS)
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
