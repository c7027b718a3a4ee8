"""The failover client's features against an in-process meshmq: STOMP and MQTT, asyncio
and blocking, ack modes, transactions, durable subscriptions, events, timeouts."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from meshmq.client import (
    BlockingClient,
    BrokerError,
    ClientError,
    ConnectionFailedError,
    EventKind,
    FailoverClient,
    OperationTimeoutError,
)
from meshmq.config.model import AuthConfig, User
from meshmq.uri import URIError
from tests.client.conftest import mqtt_uri, stomp_uri
from tests.support.brokers import ThreadBroker

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_stomp_send_receive_with_receipt_and_dedup_id(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        events = []
        async with FailoverClient(f"failover:({stomp_uri(meshmq)})",
                                  on_event=events.append) as c:
            sub = await c.subscribe("/queue/q1")
            dedup = await c.send("/queue/q1", "hello", {"color": "red"})
            msg = await sub.get(10)
            assert (msg.text, msg.headers["color"]) == ("hello", "red")
            assert msg.headers["dedup-id"] == dedup and msg.headers["persistent"] == "true"
            assert msg.key == dedup
        assert [e.kind for e in events] == [EventKind.CONNECTED]
    run(main())


def test_stomp_client_individual_ack_and_nack_redelivers(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(stomp_uri(meshmq)) as c:
            sub = await c.subscribe("/queue/q2", ack="client-individual")
            await c.send("/queue/q2", "one")
            first = await sub.get(10)
            assert await c.nack(first)
            again = await sub.get(10)
            assert again.text == "one" and again.redelivered
            assert await c.ack(again)
        from tests.support.brokers import poll
        poll(lambda: meshmq.destination_stats("q2")["depth"] == 0, 10, "the ack")
    run(main())


def test_stomp_transactions_commit_and_abort(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(stomp_uri(meshmq)) as c:
            sub = await c.subscribe("/queue/q3")
            tx = await c.begin()
            await c.send("/queue/q3", "dropped", transaction=tx)
            await c.abort(tx)
            tx = await c.begin()
            await c.send("/queue/q3", "kept", transaction=tx)
            await c.commit(tx)
            assert (await sub.get(10)).text == "kept"
            with pytest.raises(ClientError, match="already finished"):
                await c.commit(tx)
    run(main())


def test_stomp_durable_subscription_keeps_messages_while_away(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(stomp_uri(meshmq), client_id="d1") as c:
            sub = await c.subscribe("/topic/news", durable_name="n1")
            await sub.unsubscribe()  # leave, but keep the durable subscription
        async with FailoverClient(stomp_uri(meshmq)) as p:
            await p.send("/topic/news", "while away")
        async with FailoverClient(stomp_uri(meshmq), client_id="d1") as c:
            sub = await c.subscribe("/topic/news", durable_name="n1")
            assert (await sub.get(10)).text == "while away"
            await sub.unsubscribe(remove_durable=True)
        with pytest.raises(ClientError, match="client_id"):
            async with FailoverClient(stomp_uri(meshmq)) as c:
                await c.subscribe("/topic/news", durable_name="n2")
    run(main())


def test_broker_refusal_is_a_broker_error_not_retried(meshmq_factory: Callable[..., ThreadBroker]
                                                      ) -> None:
    b = meshmq_factory(auth=AuthConfig(anonymous_access=False,
                                       users=(User("u", "p", ("admins",)),)))

    async def main() -> None:
        with pytest.raises(ConnectionFailedError, match=r"User name \[null\] or password is"):
            await FailoverClient(f"failover:({stomp_uri(b)})?startupMaxReconnectAttempts=2"
                                 "&initialReconnectDelay=1").connect()
        async with FailoverClient(stomp_uri(b), login="u", passcode="p") as c:
            with pytest.raises(BrokerError, match="unexpected token"):
                await c.subscribe("/queue/x", selector="a = = b")
    run(main())


def test_mqtt_qos1_send_and_subscribe(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(f"failover:({mqtt_uri(meshmq)})", client_id="m1") as c:
            assert c.protocol == "mqtt"
            sub = await c.subscribe("sensors/+/temp", qos=1)
            dedup = await c.send("sensors/k/temp", b"21.5", {"unit": "C"})
            msg = await sub.get(10)
            assert (msg.destination, msg.body) == ("sensors/k/temp", b"21.5")
            assert msg.headers["dedup-id"] == dedup and msg.headers["unit"] == "C"
            with pytest.raises(ClientError, match="no transactions"):
                await c.begin()
    run(main())


def test_mqtt_client_ack_mode_and_311(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(mqtt_uri(meshmq), client_id="m2", mqtt_version=4) as c:
            sub = await c.subscribe("a/b", qos=1, ack="client-individual")
            await c.send("a/b", "x")
            msg = await sub.get(10)
            assert msg.text == "x" and await c.ack(msg)
            with pytest.raises(ClientError, match="no negative"):
                await c.nack(msg)
    run(main())


def test_mqtt_durable_session_receives_what_was_published_while_away(meshmq: ThreadBroker
                                                                     ) -> None:
    async def main() -> None:
        async with FailoverClient(mqtt_uri(meshmq), client_id="dur", durable=True) as c:
            await c.subscribe("events/#", qos=1)
        async with FailoverClient(mqtt_uri(meshmq), client_id="pub") as p:
            await p.send("events/x", "missed?")
        async with FailoverClient(mqtt_uri(meshmq), client_id="dur", durable=True) as c:
            sub = await c.subscribe("events/#", qos=1)
            assert (await sub.get(10)).text == "missed?"
        with pytest.raises(ClientError, match="client_id"):
            FailoverClient(mqtt_uri(meshmq), durable=True)
    run(main())


def test_timeout_option_bounds_operations_while_no_broker_answers() -> None:
    async def main() -> None:
        c = FailoverClient(f"failover:(stomp://127.0.0.1:{dead_port()})?timeout=300")
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(OperationTimeoutError, match="not connected"):
            await c.connect()
        assert loop.time() - start < 5
        with pytest.raises(OperationTimeoutError):
            await c.send("/queue/x", "y")
        assert not c.is_closed()
        await c.close()
    run(main())


def test_startup_attempts_exhausted_reports_failed() -> None:
    async def main() -> None:
        events = []
        c = FailoverClient(f"failover:(stomp://127.0.0.1:{dead_port()},"
                           f"stomp://127.0.0.1:{dead_port()})?startupMaxReconnectAttempts=3"
                           "&initialReconnectDelay=1", on_event=events.append)
        with pytest.raises(ConnectionFailedError, match="gave up"):
            await c.connect()
        assert [e.kind for e in events] == [EventKind.FAILED]
        await c.close()
    run(main())


def test_blocking_client_same_features(meshmq: ThreadBroker) -> None:
    with BlockingClient(f"failover:({stomp_uri(meshmq)})?timeout=10000") as c:
        sub = c.subscribe("/queue/b1", ack="client-individual")
        c.send("/queue/b1", "blocking")
        msg = sub.get(10)
        assert msg.text == "blocking" and c.ack(msg)
        assert sub.poll(0.05) is None
        tx = c.begin()
        c.send("/queue/b1", "in tx", transaction=tx)
        c.commit(tx)
        assert sub.get(10).text == "in tx"
    with BlockingClient(mqtt_uri(meshmq), client_id="bm") as m:
        got: list[str] = []
        m.subscribe("t/1", callback=lambda msg: got.append(msg.text))
        m.send("t/1", "cb")
        from tests.support.brokers import poll
        poll(lambda: got == ["cb"], 10, "the callback")


def test_bad_uri_and_options_name_the_bad_part() -> None:
    with pytest.raises(URIError, match=r"'randomise' \(did you mean 'randomize'"):
        FailoverClient("failover:(stomp://a:1)?randomise=false")
    with pytest.raises(URIError, match="mixes STOMP and MQTT"):
        FailoverClient("failover:(stomp://a:1,mqtt://b:2)")


def test_meshmq_stores_a_resend_with_the_same_dedup_id_once(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(stomp_uri(meshmq)) as c:
            for _ in range(3):  # what a producer does when confirmations are lost
                await c.send("/queue/idem", "once", dedup_id="fixed-1")
        async with FailoverClient(f"failover:({mqtt_uri(meshmq)})?checkForDuplicates=false",
                                  client_id="idem-sub") as sub_client, \
                FailoverClient(mqtt_uri(meshmq), client_id="idem") as m:
            sub = await sub_client.subscribe("idem/t", qos=1)
            for _ in range(2):
                await m.send("idem/t", "once", dedup_id="fixed-2")
            await m.send("idem/t", "marker")
            assert [(await sub.get(10)).text for _ in range(2)] == ["once", "marker"]
        from tests.support.brokers import poll
        poll(lambda: meshmq.destination_stats("idem")["depth"] == 1, 10, "one copy stored")
    run(main())


def test_mqtt_qos2_both_ways_and_async_iteration(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        async with FailoverClient(mqtt_uri(meshmq), client_id="q2") as c:
            sub = await c.subscribe("exactly/once", qos=2)
            for i in range(3):
                await c.send("exactly/once", f"m{i}", qos=2)  # PUBREC, PUBREL, PUBCOMP
            got = []
            async for msg in sub:
                got.append(msg.text)
                if len(got) == 3:
                    break
            assert got == ["m0", "m1", "m2"]
            assert msg.headers["qos"] == "2"
    run(main())


def test_fire_and_forget_and_tracked_sends(meshmq: ThreadBroker) -> None:
    async def main() -> None:
        uri = f"failover:({stomp_uri(meshmq)})?trackMessages=true&maxCacheSize=1000"
        async with FailoverClient(uri) as c:
            sub = await c.subscribe("/queue/ff")
            for i in range(5):
                await c.send("/queue/ff", f"tracked {i}", confirm=False)
            await c.send("/queue/ff", "x" * 2000, confirm=False)  # over the cache: untracked
            texts = {(await sub.get(10)).text for _ in range(6)}
            # Tracked sends run as tasks: the untracked one may overtake them.
            assert texts == {f"tracked {i}" for i in range(5)} | {"x" * 2000}
            async with asyncio.timeout(10):
                while c.tracked_bytes:
                    await asyncio.sleep(0.01)  # polled with a deadline
    run(main())
