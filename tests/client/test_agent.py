"""The Python Cartridge Agent mode: agent.conf broker lists, first available broker,
publisher timeout with a drop counter, per-topic subscriptions that move on, and the
durable mode."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from meshmq.client import AuthenticationFailedError, Event, EventKind, Message
from meshmq.client.agent import (
    Agent,
    AgentConfig,
    EventPublisher,
    TopicSubscriber,
    load_agent_conf,
    parse_agent_conf,
    stomp_topic,
)
from meshmq.config.model import AuthConfig, User
from meshmq.errors import ConfigError
from tests.client.test_client_features import dead_port, run
from tests.support.brokers import ProcessBroker, ThreadBroker, poll
from tests.support.tcp_proxy import TcpProxy

FAST = "mb.retry.initial.delay=20\nmb.retry.max.delay=200\nmb.alive.check.interval=2\n"


def conf(*ports: int, extra: str = "") -> AgentConfig:
    urls = ",".join(f"127.0.0.1:{p}" for p in ports)
    return parse_agent_conf(f"mb.urls={urls}\nmb.username=\nmb.password=\n{FAST}{extra}")


def mqtt_port(b: ThreadBroker) -> int:
    assert b.runtime is not None
    return b.runtime.addresses["mqtt"][1]


def test_agent_conf_as_in_the_stratos_docs(tmp_path: Path) -> None:
    path = tmp_path / "agent.conf"
    path.write_text("""# Cartridge agent configuration
cep.stats.publisher.enabled    =false
mb.urls                               =localhost:1885,localhost:1886,localhost:1887
mb.username                           =system
mb.password                           =manager
mb.publisher.timeout                  =900
""")
    c = load_agent_conf(path)
    assert c.urls == (("localhost", 1885), ("localhost", 1886), ("localhost", 1887))
    assert (c.username, c.password, c.publisher_timeout) == ("system", "manager", 900.0)
    assert (c.protocol, c.durable) == ("mqtt", False)
    uri = c.failover_uri()
    assert uri.startswith("failover:(mqtt://localhost:1885,mqtt://localhost:1886,")
    assert "randomize=false" in uri
    assert parse_agent_conf("mb.urls=h:1").publisher_timeout == 900.0
    assert parse_agent_conf("mb.ip=h\nmb.port=1883").urls == (("h", 1883),)


@pytest.mark.parametrize(("text", "option", "reason"), [
    ("mb.username=x", "mb.urls", "missing"),
    ("mb.urls=h:1,nohost", "mb.urls", "'nohost' is not host:port"),
    ("mb.urls=h:99999", "mb.urls", "not host:port"),
    ("mb.urls=h:1\nmb.publisher.timeout=soon", "mb.publisher.timeout", "expected a number"),
    ("mb.urls=h:1\nmb.protocol=amqp", "mb.protocol", "mqtt or stomp"),
    ("mb.urls=h:1\nmb.durable=yes please", "mb.durable", "true or false"),
])
def test_bad_agent_conf_names_the_option(text: str, option: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        parse_agent_conf(text, file="agent.conf")
    assert info.value.option == option


def test_stomp_topic_names() -> None:
    assert stomp_topic("instance/+/status/#") == "/topic/instance.*.status.>"


def test_first_broker_down_at_start_publisher_and_subscriber_use_the_next(
        meshmq: ThreadBroker) -> None:
    config = conf(dead_port(), mqtt_port(meshmq))

    async def main() -> None:
        got: list[str] = []
        sub = TopicSubscriber(config, "topology/#", lambda m: got.append(m.text))
        sub.start()
        await sub.wait_subscribed(20)
        pub = EventPublisher(config)
        assert await pub.publish("topology/member", "MemberActivated")
        async with asyncio.timeout(10):
            while got != ["MemberActivated"]:
                await asyncio.sleep(0.01)  # polled with a deadline
        assert pub.client.endpoint is not None
        assert pub.client.endpoint.port == mqtt_port(meshmq)
        assert (pub.published, pub.dropped) == (1, 0)
        await sub.close()
        await pub.close()
    run(main())


def test_connected_broker_dies_and_the_subscriber_moves_on(
        process_brokers: Callable[[str], ProcessBroker]) -> None:
    a, b = process_brokers("a"), process_brokers("b")
    config = conf(a.ports["mqtt"], b.ports["mqtt"])

    async def main() -> None:
        got: list[str] = []
        subs = [TopicSubscriber(config, t, lambda m: got.append(m.text))
                for t in ("instance/#", "application/#")]
        for s in subs:
            s.start()
            await s.wait_subscribed(20)
            assert s.client.endpoint is not None and s.client.endpoint.port == a.ports["mqtt"]
        await asyncio.to_thread(a.kill9)
        pub = EventPublisher(config)
        # Each subscription reconnects on its own; publish until both have seen an event.
        async with asyncio.timeout(30):
            while not {"instance", "application"} <= {t.split(":")[0] for t in got}:
                await pub.publish("instance/x", "instance:up")
                await pub.publish("application/y", "application:up")
                await asyncio.sleep(0.05)  # retry cadence while subscribers re-subscribe
        for s in subs:
            assert s.client.endpoint is not None and s.client.endpoint.port == b.ports["mqtt"]
            await s.close()
        await pub.close()
    run(main())


def test_no_broker_publisher_drops_after_the_timeout(caplog: pytest.LogCaptureFixture
                                                     ) -> None:
    config = conf(dead_port(), dead_port(), extra="mb.publisher.timeout=0.3\n")

    async def main() -> None:
        pub = EventPublisher(config)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with caplog.at_level(logging.WARNING, "meshmq.client.agent"):
            assert not await pub.publish("instance/x", "lost")
            assert not await pub.publish("instance/x", "lost too")
        assert loop.time() - start < 5
        assert (pub.published, pub.dropped) == (0, 2)
        assert "dropped after 0.3 s" in caplog.text
        await pub.close()
    run(main())


@pytest.mark.parametrize("protocol", ["mqtt", "stomp"])
def test_durable_mode_keeps_events_published_while_the_subscriber_is_away(
        meshmq: ThreadBroker, protocol: str) -> None:
    assert meshmq.runtime is not None
    port = meshmq.runtime.addresses[protocol][1]
    durable = conf(port, extra=f"mb.protocol={protocol}\nmb.durable=true\nmb.client.id=cart1\n")
    plain = conf(port, extra=f"mb.protocol={protocol}\n")

    async def main() -> None:
        got: list[str] = []
        missed: list[str] = []
        for config, sink in ((durable, got), (plain, missed)):
            sub = TopicSubscriber(config, "cluster/#", lambda m, s=sink: s.append(m.text))
            sub.start()
            await sub.wait_subscribed(20)
            await sub.close()  # away (a failover, a restart)
        pub = EventPublisher(durable)
        assert await pub.publish("cluster/c1", "while away")
        for config, sink in ((durable, got), (plain, missed)):
            sub = TopicSubscriber(config, "cluster/#", lambda m, s=sink: s.append(m.text))
            sub.start()
            await sub.wait_subscribed(20)
            if sink is got:
                async with asyncio.timeout(10):
                    while got != ["while away"]:
                        await asyncio.sleep(0.01)  # polled with a deadline
            await sub.close()
        assert missed == []
        await pub.close()
    run(main())


def test_blocking_agent_facade(meshmq: ThreadBroker) -> None:
    agent = Agent(conf(mqtt_port(meshmq)))
    try:
        got: list[Message] = []
        sub = agent.subscribe("health/#", got.append)
        agent.wait_subscribed(sub)
        assert agent.publish("health/m1", "ok")
        poll(lambda: [m.text for m in got] == ["ok"], 10, "the event")
        assert agent.dropped == 0
    finally:
        agent.close()


def port_of(b: ThreadBroker, protocol: str) -> int:
    assert b.runtime is not None
    return b.runtime.addresses[protocol][1]


def stratos_conf(port: int, protocol: str, password: str = "manager") -> AgentConfig:
    return parse_agent_conf(f"mb.urls=127.0.0.1:{port}\nmb.username=system\n"
                            f"mb.password={password}\nmb.protocol={protocol}\n{FAST}")


@pytest.mark.parametrize("protocol", ["mqtt", "stomp"])
def test_stratos_credentials_work_against_a_broker_without_users(
        meshmq: ThreadBroker, protocol: str) -> None:
    agent = Agent(stratos_conf(port_of(meshmq, protocol), protocol))
    try:
        got: list[Message] = []
        agent.wait_subscribed(agent.subscribe("member/#", got.append))
        assert agent.publish("member/m1", "activated")
        poll(lambda: [m.text for m in got] == ["activated"], 10, "the event")
    finally:
        agent.close()


@pytest.mark.parametrize("protocol", ["mqtt", "stomp"])
def test_refused_login_is_reported_to_the_application_not_retried(
        meshmq_factory: Callable[..., ThreadBroker], protocol: str) -> None:
    b = meshmq_factory(auth=AuthConfig(users=(User("system", "the-real-one"),)))
    events: list[Event] = []
    agent = Agent(stratos_conf(port_of(b, protocol), protocol), on_event=events.append)
    try:
        sub = agent.subscribe("member/#", lambda m: None)
        start = time.monotonic()
        with pytest.raises(AuthenticationFailedError, match="login refused"):
            agent.publish("member/m1", "activated")  # mb.publisher.timeout is 900 s
        with pytest.raises(AuthenticationFailedError):
            agent.wait_subscribed(sub, timeout=10)
        assert time.monotonic() - start < 10
        assert agent.dropped == 0  # not a drop: the credentials must be fixed
        poll(lambda: sum(e.kind is EventKind.FAILED for e in events) == 2, 10,
             "FAILED events of the publisher and the subscriber")
        assert all(isinstance(e.error, AuthenticationFailedError) for e in events
                   if e.kind is EventKind.FAILED)
    finally:
        agent.close()


@pytest.mark.parametrize("protocol", ["mqtt", "stomp"])
def test_events_missed_while_a_subscriber_reconnects_are_counted_logged_and_reported(
        meshmq: ThreadBroker, protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    port = port_of(meshmq, protocol)
    proxy = TcpProxy(port).start()
    sub_conf = conf(proxy.port, extra=f"mb.protocol={protocol}\n")
    pub_conf = conf(port, extra=f"mb.protocol={protocol}\n")

    async def main() -> None:
        got: list[str] = []
        events: list[Event] = []
        sub = TopicSubscriber(sub_conf, "cluster/#", lambda m: got.append(m.text),
                              on_event=events.append)
        sub.start()
        await sub.wait_subscribed(20)
        pub = EventPublisher(pub_conf)

        async def until(what: list[str]) -> None:
            async with asyncio.timeout(10):
                while got != what:
                    await asyncio.sleep(0.01)  # polled with a deadline

        assert await pub.publish("cluster/c1", "one")
        await until(["one"])
        proxy.cut()  # the subscriber's link goes dark ...
        assert await pub.publish("cluster/c1", "two")  # ... so this one is lost
        proxy.heal()  # the subscriber reconnects (non-durable: a fresh subscription)
        async with asyncio.timeout(20):
            while not any(e.kind is EventKind.RESUMED for e in events):
                await asyncio.sleep(0.01)  # polled with a deadline
        assert await pub.publish("cluster/c1", "three")
        await until(["one", "three"])
        assert sub.missed == 1
        missed = [e for e in events if e.kind is EventKind.EVENTS_MISSED]
        assert [(e.missed, e.topic) for e in missed] == [
            (1, "cluster/c1" if protocol == "mqtt" else "/topic/cluster.c1")]
        assert "1 event(s) on" in caplog.text and "did not arrive" in caplog.text
        await sub.close()
        await pub.close()

    try:
        with caplog.at_level(logging.WARNING, "meshmq.client.agent"):
            run(main())
    finally:
        proxy.close()
