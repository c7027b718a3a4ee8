"""The MQTT failover client against real brokers without sockets: QoS levels, user
properties, topic filters, persistent sessions across reconnects, acks and logins."""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.memory_failover import ClientDialer, kinds, run, until
from tests.support.memory_network import MemoryNetwork

from meshmq.client import (
    AuthenticationFailedError,
    ClientError,
    Event,
    EventKind,
    FailoverClient,
    OperationTimeoutError,
)
from meshmq.config.model import AuthConfig, User

AB = "failover:(mqtt://a,mqtt://b)?randomize=false&initialReconnectDelay=1"
A_ONLY = "failover:(mqtt://a)?initialReconnectDelay=1"


def client(dialer: ClientDialer, uri: str = AB, **kw: Any) -> FailoverClient:
    kw.setdefault("keep_alive", 0)
    return FailoverClient(uri, dialer=dialer, **kw)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_each_qos_is_delivered_with_its_level(ab: MemoryNetwork, dialer: ClientDialer,
                                              qos: int) -> None:
    async def main() -> None:
        async with client(dialer, client_id="q") as c:
            sub = await c.subscribe("q/t", qos=2)
            await c.send("q/t", f"at {qos}", qos=qos)
            msg = await sub.get(5)
            assert (msg.text, msg.headers["qos"]) == (f"at {qos}", str(qos))
    run(ab, main())


def test_mqtt5_carries_headers_and_the_dedup_id_as_user_properties(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, client_id="v5") as c:
            sub = await c.subscribe("props/t")
            dedup = await c.send("props/t", "hi", {"color": "red"})
            msg = await sub.get(5)
            assert msg.headers["color"] == "red"
            assert msg.headers["dedup-id"] == dedup == msg.key
    run(ab, main())


def test_mqtt311_has_no_headers_and_no_dedup_key(ab: MemoryNetwork,
                                                 dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, client_id="v4", mqtt_version=4) as c:
            sub = await c.subscribe("plain/t")
            await c.send("plain/t", "hi", {"color": "red"})
            msg = await sub.get(5)
            assert msg.headers == {"qos": "1"} and msg.key is None
    run(ab, main())


def test_messages_are_routed_by_topic_filter(ab: MemoryNetwork,
                                             dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, client_id="f") as c:
            plus = await c.subscribe("s/+/x")
            hash_ = await c.subscribe("h/#")
            await c.send("s/1/x", "one")
            await c.send("h/a/b", "deep")
            assert (await plus.get(5)).text == "one"
            deep = await hash_.get(5)
            assert (deep.text, deep.destination, deep.subscription) == ("deep", "h/a/b",
                                                                        hash_.id)
    run(ab, main())


def test_subscriptions_are_restored_on_the_next_broker(ab: MemoryNetwork,
                                                       dialer: ClientDialer) -> None:
    events: list[Event] = []

    async def main() -> None:
        async with client(dialer, client_id="r", on_event=events.append) as c:
            sub = await c.subscribe("r/t")
            dialer.refuse("a")
            dialer.cut("a")
            await c.send("r/t", "on b")
            assert (await sub.get(5)).text == "on b"
            assert c.endpoint is not None and c.endpoint.host == "b"
    run(ab, main())
    assert kinds(events) == [EventKind.CONNECTED, EventKind.INTERRUPTED, EventKind.RESUMED]


def test_a_persistent_session_keeps_what_was_published_while_away(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, A_ONLY, client_id="keeper", durable=True) as c:
            await c.subscribe("news/#", qos=1)
        async with client(dialer, A_ONLY, client_id="pub") as p:
            await p.send("news/a", "while away 1")
            await p.send("news/b", "while away 2")
        async with client(dialer, A_ONLY, client_id="keeper", durable=True) as c:
            # The backlog arrives right after CONNACK, before subscribe(): it is kept.
            sub = await c.subscribe("news/#", qos=1)
            assert [(await sub.get(5)).text for _ in range(2)] == ["while away 1",
                                                                   "while away 2"]
    run(ab, main())


def test_a_clean_session_forgets_what_was_published_while_away(
        ab: MemoryNetwork, dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, A_ONLY, client_id="forgetful") as c:
            await c.subscribe("news/#", qos=1)
        async with client(dialer, A_ONLY, client_id="pub") as p:
            await p.send("news/a", "while away")
        async with client(dialer, A_ONLY, client_id="forgetful") as c:
            sub = await c.subscribe("news/#", qos=1)
            with pytest.raises(OperationTimeoutError):
                await sub.get(0.02)
    run(ab, main())


def test_an_unacked_message_comes_again_after_a_reconnect(ab: MemoryNetwork,
                                                          dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, A_ONLY, client_id="worker", durable=True) as c:
            sub = await c.subscribe("jobs/1", qos=1, ack="client")
            await c.send("jobs/1", "job")
            first = await sub.get(5)
            assert not first.redelivered
            dialer.cut("a")
            again = await sub.get(5)
            assert (again.text, again.redelivered, again.key) == ("job", True, first.key)
            assert await c.ack(again)
    run(ab, main())


def test_mqtt_has_no_negative_acknowledgement(ab: MemoryNetwork,
                                              dialer: ClientDialer) -> None:
    async def main() -> None:
        async with client(dialer, client_id="n") as c:
            sub = await c.subscribe("n/t", ack="client")
            await c.send("n/t", "x")
            with pytest.raises(ClientError, match="no negative acknowledgement"):
                await c.nack(await sub.get(5))
    run(ab, main())


def test_a_durable_session_needs_a_client_id() -> None:
    with pytest.raises(ClientError, match="durable MQTT session needs a client_id"):
        FailoverClient("mqtt://a", durable=True)


def test_a_refused_login_is_permanent(network: MemoryNetwork, dialer: ClientDialer) -> None:
    network.add("a", auth=AuthConfig(users=(User("app", "right"),), anonymous_access=False))
    network.add("b")
    network.start()
    events: list[Event] = []

    async def main() -> None:
        c = client(dialer, login="app", passcode="wrong", client_id="x",
                   on_event=events.append)
        with pytest.raises(AuthenticationFailedError, match="login refused"):
            await c.connect()
        await c.close()
    run(network, main())
    assert dialer.dials == ["a"] and kinds(events) == [EventKind.FAILED]


def test_a_durable_client_keeps_no_backup_connection(ab: MemoryNetwork,
                                                     dialer: ClientDialer) -> None:
    async def main() -> int:
        async with client(dialer, AB + "&backup=true", client_id="plain") as c:
            await until(lambda: c.backup_endpoints, what="a backup connection")
        before = len(dialer.dials)
        async with client(dialer, AB + "&backup=true", client_id="d", durable=True) as c:
            for _ in range(3):
                await c.send("d/t", "round trip")
            assert c.backup_endpoints == ()
        return before
    before = run(ab, main())
    assert dialer.dials[before:] == ["a"]  # a backup would take the session over
