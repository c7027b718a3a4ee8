"""The same client cases against meshmq and Apache ActiveMQ 5.17 (Debian ``activemq``).

ActiveMQ runs as a subprocess on free loopback ports (tests/support/activemq.py); its
cases are skipped, with the reason, only where the package is not installed. Known
ActiveMQ differences the cases allow for: MQTT 3.1.1 only (no user properties, so no
``dedup-id`` on MQTT), and no idempotent-producer window (the consumer's duplicate
filter is what drops a re-sent copy).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from meshmq.client import Event, EventKind, FailoverClient, Message
from meshmq.client.mqtt_connection import MqttConnection
from tests.client.conftest import (
    LISTENERS,
    mqtt_uri,
    stomp_uri,
    wait_for_event,
    write_process_config,
)
from tests.client.test_client_features import run
from tests.support import activemq
from tests.support.brokers import ProcessBroker, ThreadBroker, make_config
from tests.support.ports import free_ports

pytestmark = pytest.mark.slow

KINDS = ["meshmq", "activemq"]


@dataclass
class Target:
    kind: str
    stomp: str
    mqtt: str
    mqtt_version: int | None  # None: automatic (MQTT 5, else 3.1.1)
    kill9: Callable[[], None]


def _skip_unless_activemq() -> None:
    reason = activemq.missing()
    if reason is not None:
        pytest.skip(f"ActiveMQ cases skipped: {reason}")


def _start(kind: str, directory: Path, name: str) -> tuple[Target, Callable[[], None]]:
    if kind == "activemq":
        _skip_unless_activemq()
        amq = activemq.ActiveMQProcess(directory, name).start()
        return (Target(kind, f"stomp://127.0.0.1:{amq.ports['stomp']}",
                       f"mqtt://127.0.0.1:{amq.ports['mqtt']}", None, amq.kill9), amq.stop)
    cfg = write_process_config(directory, name, *free_ports(2))
    pb = ProcessBroker(cfg, directory / "broker.log").start()

    def stop() -> None:
        if pb.proc is not None and pb.proc.poll() is None:
            pb.terminate()
    return (Target(kind, f"stomp://127.0.0.1:{pb.ports['stomp']}",
                   f"mqtt://127.0.0.1:{pb.ports['mqtt']}", 5, pb.kill9), stop)


@pytest.fixture(scope="module", params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Target]:
    """One broker of each kind for the whole module (ActiveMQ takes seconds to start);
    meshmq in-process here (subprocess brokers do not outlive a test, see conftest)."""
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "activemq":
        t, stop = _start("activemq", directory, "one")
    else:
        tb = ThreadBroker(make_config(directory / "data", listeners=LISTENERS)).start()
        assert tb.runtime is not None
        t = Target("meshmq", stomp_uri(tb), mqtt_uri(tb), 5, tb.stop)
        stop = tb.stop
    try:
        yield t
    finally:
        stop()


@pytest.fixture(params=KINDS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Target, Target]]:
    a, stop_a = _start(request.param, tmp_path / "a", "a")
    try:
        b, stop_b = _start(request.param, tmp_path / "b", "b")
    except BaseException:
        stop_a()
        raise
    try:
        yield a, b
    finally:
        stop_a()
        stop_b()


def uid() -> str:
    return uuid.uuid4().hex[:8]


def test_stomp_confirmed_send_receive_and_headers(target: Target) -> None:
    q = f"/queue/x{uid()}"

    async def main() -> None:
        async with FailoverClient(f"failover:({target.stomp})") as c:
            sub = await c.subscribe(q, ack="client-individual")
            dedup = await c.send(q, "hello", {"color": "red"})
            msg = await sub.get(20)
            assert (msg.text, msg.headers["color"], msg.headers["dedup-id"]) == \
                ("hello", "red", dedup)
            assert await c.ack(msg)
    run(main())


def test_stomp_transactions(target: Target) -> None:
    q = f"/queue/tx{uid()}"

    async def main() -> None:
        async with FailoverClient(target.stomp) as c:
            sub = await c.subscribe(q)
            tx = await c.begin()
            await c.send(q, "dropped", transaction=tx)
            await c.abort(tx)
            tx = await c.begin()
            await c.send(q, "kept", transaction=tx)
            await c.commit(tx)
            assert (await sub.get(20)).text == "kept"
            await c.send(q, "marker")
            assert (await sub.get(20)).text == "marker"  # nothing from the aborted one
    run(main())


def test_stomp_durable_subscription(target: Target) -> None:
    topic, cid = f"/topic/d{uid()}", f"cid{uid()}"

    async def main() -> None:
        async with FailoverClient(target.stomp, client_id=cid) as c:
            sub = await c.subscribe(topic, durable_name="dur")
            await sub.unsubscribe()  # deactivate (confirmed), keep the subscription
        async with FailoverClient(target.stomp) as p:
            await p.send(topic, "while away")
        async with FailoverClient(target.stomp, client_id=cid) as c:
            sub = await c.subscribe(topic, durable_name="dur")
            assert (await sub.get(20)).text == "while away"
            await sub.unsubscribe(remove_durable=True)
    run(main())


def test_mqtt_qos1_and_durable_session(target: Target) -> None:
    topic, cid = f"t{uid()}/state", f"m{uid()}"

    async def main() -> None:
        kw = {"mqtt_version": target.mqtt_version}
        async with FailoverClient(target.mqtt, client_id=cid, durable=True, **kw) as c:
            # ActiveMQ 5.17 refuses MQTT 5; the automatic version falls back to 3.1.1.
            assert isinstance(c._conn, MqttConnection)
            assert c._conn.level == (4 if target.kind == "activemq" else 5)
            sub = await c.subscribe(topic, qos=1)
            await c.send(topic, "live")
            assert (await sub.get(20)).text == "live"
        async with FailoverClient(target.mqtt, client_id=f"p{uid()}", **kw) as p:
            await p.send(topic, "while away")
        async with FailoverClient(target.mqtt, client_id=cid, durable=True, **kw) as c:
            sub = await c.subscribe(topic, qos=1)
            assert (await sub.get(20)).text == "while away"
    run(main())


def test_consumer_filter_drops_a_resent_copy(target: Target) -> None:
    q = f"/queue/r{uid()}"

    async def main() -> None:
        async with FailoverClient(target.stomp) as c:
            sub = await c.subscribe(q, ack="client-individual")
            for _ in range(2):  # meshmq drops the second; ActiveMQ stores it, we drop it
                await c.send(q, "once", dedup_id=f"fixed-{q}")
            await c.send(q, "marker")
            texts = []
            while not texts or texts[-1] != "marker":
                msg = await sub.get(20)
                texts.append(msg.text)
                await c.ack(msg)
            assert texts == ["once", "marker"]
            assert sub.duplicates == (1 if target.kind == "activemq" else 0)
    run(main())


def test_kill9_failover_resubscribes_and_resumes(pair: tuple[Target, Target]) -> None:
    a, b = pair
    q = f"/queue/k{uid()}"

    async def main() -> None:
        events: list[Event] = []
        got: list[str] = []
        uri = f"failover:({a.stomp},{b.stomp})?randomize=false&timeout=60000"
        consumer = FailoverClient(uri, on_event=events.append)
        producer = FailoverClient(uri)
        await consumer.connect()
        await producer.connect()

        def on_message(m: Message) -> None:
            got.append(m.headers["dedup-id"])
        await consumer.subscribe(q, callback=on_message)
        before = [await producer.send(q, f"a{i}") for i in range(50)]
        async with asyncio.timeout(30):
            while not set(before) <= set(got):
                await asyncio.sleep(0.01)  # polled with a deadline
        await asyncio.to_thread(a.kill9)
        await wait_for_event(events, EventKind.RESUMED, timeout=60)
        after = [await producer.send(q, f"b{i}") for i in range(50)]
        async with asyncio.timeout(30):
            while not set(after) <= set(got):
                await asyncio.sleep(0.01)  # polled with a deadline
        assert len(got) == len(set(got))
        assert consumer.endpoint is not None and str(consumer.endpoint) == b.stomp
        await producer.close()
        await consumer.close()
    run(main())
