"""format("meshmq"): the Spark source and sink against a real broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshmq.client.simple_stomp import SimpleStompClient
from meshmq.client.tls import TlsSettings, client_context
from meshmq.config.model import AuthConfig, ListenerConfig, StreamPolicy, User
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.pki import Pki

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("pyspark")

from meshmq.pipeline import datasource as ds  # noqa: E402
from meshmq.pipeline.broker_client import build_spec  # noqa: E402

EXAMPLE = Path(__file__).parents[2] / "examples" / "spark_stream_copy.py"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadBroker]:
    config = make_config(tmp_path / "data", broker_name="spark",
                         streams=(StreamPolicy(match="queue://stream.>"),))
    b = ThreadBroker(config).start()
    try:
        yield b
    finally:
        b.stop()


def produce(port: int, dest: str, bodies: list[str]) -> None:
    with SimpleStompClient("127.0.0.1", port) as client:
        for i, body in enumerate(bodies):
            client.send(dest, body.encode(), confirm=i == len(bodies) - 1)


def addresses(url: str, **kwargs: Any) -> list[tuple[str, int, bool]]:
    return [(e.host, e.port, e.tls) for e in build_spec(url, **kwargs).endpoints]


def test_options_and_broker_lists() -> None:
    assert addresses("failover:(tcp://a:1,stomp://b:2)?randomize=false") == [
        ("a", 1, False), ("b", 2, False)]
    assert addresses("stomp+ssl://s") == [("s", 61612, True)]
    assert addresses("h") == [("h", 61613, False)]
    assert addresses("a:1, b:2") == [("a", 1, False), ("b", 2, False)]
    assert addresses("tcp://a:1", tls_only=True) == [("a", 1, True)]
    # A job gives up on a dead cluster unless the URI says otherwise.
    assert build_spec("h").options.maxReconnectAttempts == 15
    assert build_spec("failover:(tcp://h:1)?maxReconnectAttempts=-1"
                      ).options.maxReconnectAttempts == -1
    assert build_spec("failover:(tcp://h:1)?startupMaxReconnectAttempts=2"
                      ).options.maxReconnectAttempts == -1
    with pytest.raises(ValueError, match=r"^meshmq option url: .*unknown failover option "
                                         r"'randomise' \(did you mean 'randomize'\?\)"):
        ds.Options.parse({"url": "failover:(tcp://a:1)?randomise=false",
                          "destination": "q"}, reading=True)
    with pytest.raises(ValueError, match=r"^meshmq option url: "):
        ds.Options.parse({"url": "failover:(tcp://a:1", "destination": "q"}, reading=True)
    with pytest.raises(ValueError, match="'url' is required"):
        ds.Options.parse({}, reading=True)
    assert ds.Options.parse({"brokers": "h:1"}, reading=False).url == "h:1"  # old name
    with pytest.raises(ValueError, match="maxRowsPerBatch must be an integer >= 0"):
        ds.Options.parse({"url": "h", "destination": "q", "maxRowsPerBatch": "x"},
                         reading=True)
    with pytest.raises(ValueError, match="keyStoreKey needs keyStore"):
        ds.Options.parse({"url": "h", "keyStoreKey": "k.pem"}, reading=False)
    with pytest.raises(ValueError, match="verifyHostName must be true or false"):
        ds.Options.parse({"url": "h", "verifyHostName": "no"}, reading=False)
    with pytest.raises(ValueError, match="startingOffset"):
        ds.Options.parse({"url": "h", "destination": "q", "startingOffset": "late"},
                         reading=True)
    opts = ds.Options.parse({"url": "h", "destination": "stream.x",
                             "maxRowsPerBatch": "10"}, reading=True)
    assert opts.destination == "/queue/stream.x" and opts.prefetch == 30
    assert [(p.start, p.end) for p in ds.split(5, 17, 5)] == [(5, 10), (10, 15), (15, 17)]


def test_exact_ranges_read_the_same_rows_every_time(broker: ThreadBroker) -> None:
    produce(broker.port, "/queue/stream.r", [f"m{i}" for i in range(30)])
    opts = ds.Options.parse({"url": f"127.0.0.1:{broker.port}",
                             "destination": "/queue/stream.r"}, reading=True)
    assert ds.stream_head(opts) == (0, 30)
    first = list(ds.read_range(opts, 10, 20))
    assert [(r[0], r[4]) for r in first] == [(i, f"m{i}") for i in range(10, 20)]
    assert list(ds.read_range(opts, 10, 20)) == first
    plain = ds.Options.parse({"url": f"127.0.0.1:{broker.port}",
                              "destination": "/queue/plain"}, reading=True)
    with pytest.raises(ds.StompIOError, match="not a stream destination"):
        ds.stream_head(plain)


def test_spark_reads_a_stream_in_batches(spark: Any, broker: ThreadBroker) -> None:
    ds.register(spark)
    produce(broker.port, "/queue/stream.s", [f"m{i}" for i in range(250)])
    frame = (spark.readStream.format("meshmq")
             .option("url", f"failover:(tcp://127.0.0.1:{broker.port})")
             .option("destination", "/queue/stream.s").option("maxRowsPerBatch", "100")
             .option("partitionSize", "40").load())
    query = (frame.writeStream.format("memory").queryName("stream_rows")
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    rows = spark.sql("select offset, body, headers from stream_rows").collect()
    assert sorted((r["offset"], r["body"]) for r in rows) == [(i, f"m{i}") for i in range(250)]
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        100, 100, 50]


def test_spark_reads_a_queue_at_least_once(spark: Any, broker: ThreadBroker) -> None:
    ds.register(spark)
    produce(broker.port, "/queue/work", [f"w{i}" for i in range(60)])
    frame = (spark.readStream.format("meshmq").option("url", f"127.0.0.1:{broker.port}")
             .option("destination", "/queue/work").option("mode", "queue")
             .option("maxRowsPerBatch", "25").load())
    query = (frame.writeStream.format("memory").queryName("queue_rows")
             .trigger(processingTime="100 milliseconds").start())
    try:
        poll(lambda: spark.sql("select count(*) c from queue_rows").collect()[0]["c"] >= 60,
             120, "60 rows from the queue")
        # Acks follow commits: once a later batch ran, everything but the last batch
        # is acknowledged and gone from the queue.
        poll(lambda: broker.destination_stats("work")["depth"] <= 25, 60,
             "the committed batches to be acknowledged")
    finally:
        query.stop()
    rows = spark.sql("select body, message_id from queue_rows").collect()
    assert sorted(r["body"] for r in rows) == sorted(f"w{i}" for i in range(60))
    assert len({r["message_id"] for r in rows}) == 60


def test_a_killed_query_restarted_from_its_checkpoint_writes_everything_once(
        broker: ThreadBroker, tmp_path: Path) -> None:
    n = 400
    produce(broker.port, "/queue/stream.in", [f"msg-{i}" for i in range(n)])
    cmd = [sys.executable, str(EXAMPLE), "--brokers", f"127.0.0.1:{broker.port}",
           "--source", "/queue/stream.in", "--sink", "/queue/out", "--checkpoint",
           str(tmp_path / "ckpt"), "--max-rows", "40"]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    log = (tmp_path / "run1.log").open("wb")
    first = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # its JVM is in the same group
    try:
        poll(lambda: broker.destination_stats("out")["enqueued"] >= 80
             if any(d["name"] == "out" for d in broker.stats()["destinations"]) else False,
             240, "the first run to write a few batches")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # driver and JVM, mid-run
        first.wait(30)
        log.close()
    written = broker.destination_stats("out")["enqueued"]
    assert written < n, "the first run finished before it could be killed"
    second = subprocess.run([*cmd, "--available-now"], env=env, capture_output=True,
                            timeout=400, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert broker.destination_stats("out")["enqueued"] == n  # replays were dropped
    bodies = []
    with SimpleStompClient("127.0.0.1", broker.port) as client:
        client.subscribe("/queue/out", "o", ack="client-individual")
        for _ in range(n):
            frame = client.receive(timeout=10)
            assert frame is not None
            bodies.append(frame.body.decode())
            client.ack(frame)
        assert client.receive(timeout=0.3) is None
    assert sorted(bodies) == sorted(f"MSG-{i}" for i in range(n))


def test_credentials_and_tls_options_reach_the_broker(spark: Any, tmp_path: Path,
                                                      pki: Pki) -> None:
    cert, key = pki.broker("a")
    listener = ListenerConfig(name="stomp_ssl", protocol="stomp+ssl", host="127.0.0.1",
                              port=0, ssl_certfile=cert, ssl_keyfile=key, ssl_cafile=pki.ca,
                              client_auth="need")
    auth = AuthConfig(anonymous_access=False, users=(User("etl", "pw", ("jobs",)),))
    b = ThreadBroker(make_config(tmp_path / "data", listeners=(listener,), auth=auth,
                                 streams=(StreamPolicy(match="queue://stream.>"),))).start()
    try:
        assert b.runtime is not None
        port = b.runtime.addresses["stomp_ssl"][1]
        client_cert, client_key = pki.client("app")
        with SimpleStompClient("127.0.0.1", port, login="etl", passcode="pw",
                               tls=client_context(TlsSettings(str(pki.ca), str(client_cert),
                                                              str(client_key)))) as c:
            for i in range(5):
                c.send("/queue/stream.tls", f"t{i}".encode(), confirm=i == 4)
        options = {"url": f"failover:(stomp+ssl://127.0.0.1:{port})",
                   "destination": "/queue/stream.tls", "login": "etl", "passcode": "pw",
                   "trustStore": str(pki.ca), "keyStore": str(client_cert),
                   "keyStoreKey": str(client_key)}
        wrong = ds.Options.parse({**options, "passcode": "nope"}, reading=True)
        with pytest.raises(ds.StompIOError, match=r"User name \[etl\] or password is invalid"):
            ds.stream_head(wrong)
        untrusted = ds.Options.parse({**options, "trustStore": str(pki.untrusted / "ca.pem")},
                                     reading=True)
        with pytest.raises(ds.StompIOError, match=f"127.0.0.1:{port}: certificate verify "
                                                  "failed: .*; pass the broker's CA with "
                                                  "trustStore"):
            ds.stream_head(untrusted)

        ds.register(spark)
        reader = spark.readStream.format("meshmq")
        for name, value in options.items():
            reader = reader.option(name, value)
        query = (reader.load().writeStream.format("memory").queryName("tls_rows")
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        rows = spark.sql("select offset, body from tls_rows").collect()
        assert sorted((r["offset"], r["body"]) for r in rows) == [(i, f"t{i}")
                                                                   for i in range(5)]
    finally:
        b.stop()
