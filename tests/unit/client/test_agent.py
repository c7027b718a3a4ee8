"""The Python Cartridge Agent mode: agent.conf, the agent's failover policy (first
available broker, retry for ever), the publisher's timeout and drop counter, per-topic
subscriptions that move on, missed-event counting and the durable mode; the brokers
are real, the connections in memory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.memory_failover import ClientDialer, run, until
from tests.support.memory_network import MemoryNetwork

from meshmq.backoff import ReconnectSchedule
from meshmq.client import (
    AuthenticationFailedError,
    Event,
    EventKind,
    FailoverClient,
    Message,
)
from meshmq.client.agent import (
    SEQ_HEADER,
    AgentConfig,
    EventPublisher,
    TopicSubscriber,
    load_agent_conf,
    parse_agent_conf,
    stomp_topic,
)
from meshmq.client.options import parse_failover
from meshmq.config.model import AuthConfig, User
from meshmq.errors import ConfigError

FAST = "mb.retry.initial.delay=1\nmb.retry.max.delay=5\n"
PROTOCOLS = ["mqtt", "stomp"]


def conf(*hosts: str, extra: str = "") -> AgentConfig:
    urls = ",".join(f"{h}:1883" for h in hosts)
    return parse_agent_conf(f"mb.urls={urls}\n{FAST}{extra}")


# ------------------------------------------------------------------------ agent.conf


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
    assert (c.protocol, c.durable, c.client_id) == ("mqtt", False, None)


def test_defaults_of_the_optional_keys() -> None:
    c = parse_agent_conf("mb.urls=h:1")
    assert (c.username, c.password, c.publisher_timeout, c.alive_check_interval,
            c.retry_initial_delay, c.retry_max_delay) == (None, None, 900.0, 30, 2000, 60000)


def test_the_single_broker_keys_of_older_agents() -> None:
    assert parse_agent_conf("mb.ip=h\nmb.port=1884").urls == (("h", 1884),)
    assert parse_agent_conf("mb.ip=h").urls == (("h", 1883),)
    # mb.urls wins when both are there.
    assert parse_agent_conf("mb.ip=h\nmb.urls=g:2").urls == (("g", 2),)


def test_comments_separators_and_other_keys() -> None:
    c = parse_agent_conf("! a comment\n# another\n\nmb.urls: h:1\nmb.protocol = STOMP\n"
                         "cartridge.key=value\n")
    assert c.urls == (("h", 1),) and c.protocol == "stomp"


def test_ipv6_brokers_in_the_list() -> None:
    c = parse_agent_conf("mb.urls=[::1]:1883,h:1884")
    assert c.urls == (("::1", 1883), ("h", 1884))
    assert c.failover_uri().startswith("failover:(mqtt://[::1]:1883,mqtt://h:1884)")


def test_an_unknown_mb_key_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "meshmq.client.agent"):
        parse_agent_conf("mb.urls=h:1\nmb.bogus=1\nother.key=2", file="agent.conf")
    assert "agent.conf: unknown agent option mb.bogus ignored" in caplog.text
    assert "other.key" not in caplog.text


@pytest.mark.parametrize(("text", "option", "reason"), [
    ("mb.username=x", "mb.urls", "mb.urls is missing"),
    ("mb.urls=", "mb.urls", "mb.urls is missing"),
    ("mb.urls=h:1,nohost", "mb.urls", "'nohost' is not host:port"),
    ("mb.urls=h:99999", "mb.urls", "'h:99999' is not host:port"),
    ("mb.urls=h:1,,g:2", "mb.urls", "'' is not host:port"),
    ("mb.urls=h:1\nmb.publisher.timeout=soon", "mb.publisher.timeout", "expected a number"),
    ("mb.urls=h:1\nmb.publisher.timeout=-1", "mb.publisher.timeout", "at least 0"),
    ("mb.urls=h:1\nmb.alive.check.interval=0", "mb.alive.check.interval", "at least 1"),
    ("mb.urls=h:1\nmb.retry.initial.delay=-5", "mb.retry.initial.delay", "at least 0"),
    ("mb.urls=h:1\nmb.retry.max.delay=x", "mb.retry.max.delay", "expected a number"),
    ("mb.urls=h:1\nmb.protocol=amqp", "mb.protocol", "mqtt or stomp"),
    ("mb.urls=h:1\nmb.durable=yes please", "mb.durable", "true or false"),
])
def test_a_bad_agent_conf_names_the_option(text: str, option: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        parse_agent_conf(text, file="agent.conf")
    assert info.value.option == option


def test_a_line_that_is_not_key_value_names_its_line() -> None:
    with pytest.raises(ConfigError, match="expected key=value") as info:
        parse_agent_conf("mb.urls=h:1\njust words", file="agent.conf")
    assert info.value.line == 2


@pytest.mark.parametrize(("mqtt", "stomp"), [
    ("instance/+/status/#", "/topic/instance.*.status.>"),
    ("topology", "/topic/topology"),
    ("a/b/c", "/topic/a.b.c"),
    ("#", "/topic/>"),
])
def test_mqtt_topics_as_stomp_topics(mqtt: str, stomp: str) -> None:
    assert stomp_topic(mqtt) == stomp


# ------------------------------------------------------------ the failover policy


def test_the_agents_policy_is_first_available_in_order_for_ever() -> None:
    c = parse_agent_conf("mb.urls=a:1,b:2,c:3")
    spec = parse_failover(c.failover_uri())
    o = spec.options
    assert (o.randomize, o.maxReconnectAttempts, o.initialReconnectDelay,
            o.maxReconnectDelay, o.timeout) == (False, -1, 2000, 60000, -1)
    schedule = ReconnectSchedule(spec.endpoints, o.policy())
    attempts = [next(iter(schedule)) for _ in range(12)]
    assert [a.endpoint.host for a in attempts] == list("abc") * 4
    # Stratos retries in 2..60 s steps: 2, 4, 8, 16, 32, then 60 s between passes.
    starts = [a.delay for a in attempts[::3]]
    assert starts == [0, 2.0, 4.0, 8.0]
    more = [a.delay for a in (next(iter(schedule)) for _ in range(9)) if a.delay]
    assert more == [16.0, 32.0, 60.0]
    assert not schedule.exhausted


@pytest.mark.parametrize(("protocol", "scheme"), [("mqtt", "mqtt"), ("stomp", "stomp")])
def test_the_failover_uri_speaks_the_configured_protocol(protocol: str, scheme: str) -> None:
    c = parse_agent_conf(f"mb.urls=h:1\nmb.protocol={protocol}")
    (endpoint,) = parse_failover(c.failover_uri(timeout_ms=500)).endpoints
    assert endpoint.uri() == f"{scheme}://h:1" and endpoint.protocol == protocol
    assert parse_failover(c.failover_uri(timeout_ms=500)).options.timeout == 500


# --------------------------------------------------------------- against brokers


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_first_broker_down_publisher_and_subscriber_use_the_next(
        ab: MemoryNetwork, dialer: ClientDialer, protocol: str) -> None:
    dialer.refuse("a")
    config = conf("a", "b", extra=f"mb.protocol={protocol}\n")

    async def main() -> None:
        got: list[str] = []
        sub = TopicSubscriber(config, "topology/#", lambda m: got.append(m.text),
                              dialer=dialer)
        sub.start()
        await sub.wait_subscribed(5)
        pub = EventPublisher(config, dialer=dialer)
        assert await pub.publish("topology/member", "MemberActivated")
        await until(lambda: got == ["MemberActivated"], what="the event")
        for client in (pub.client, sub.client):
            assert client.endpoint is not None and client.endpoint.host == "b"
        assert (pub.published, pub.dropped) == (1, 0)
        await sub.close()
        await pub.close()
    run(ab, main())


def test_each_subscription_moves_on_by_itself(ab: MemoryNetwork,
                                              dialer: ClientDialer) -> None:
    config = conf("a", "b")

    async def main() -> None:
        got: list[str] = []
        subs = [TopicSubscriber(config, t, lambda m: got.append(m.text), dialer=dialer)
                for t in ("instance/#", "application/#")]
        for s in subs:
            s.start()
            await s.wait_subscribed(5)
        assert dialer.connected_to("a") == 2  # a connection per subscription
        dialer.refuse("a")
        dialer.cut("a")
        for s in subs:
            await until(lambda s=s: s.client.connected and s.client.endpoint is not None
                        and s.client.endpoint.host == "b", what="the move to b")
        pub = EventPublisher(config, dialer=dialer)
        await pub.publish("instance/x", "instance up")
        await pub.publish("application/y", "application up")
        await until(lambda: sorted(got) == ["application up", "instance up"],
                    what="both events")
        for s in subs:
            await s.close()
        await pub.close()
    run(ab, main())


def test_without_a_broker_the_publisher_drops_after_its_timeout(
        network: MemoryNetwork, dialer: ClientDialer,
        caplog: pytest.LogCaptureFixture) -> None:
    config = conf("a", "b", extra="mb.publisher.timeout=0.02\n")

    async def main() -> None:
        pub = EventPublisher(config, dialer=dialer)
        with caplog.at_level(logging.WARNING, "meshmq.client.agent"):
            assert not await pub.publish("instance/x", "lost")
            assert not await pub.publish("instance/x", "lost too")
        assert (pub.published, pub.dropped) == (0, 2)
        await pub.close()
    run(network, main())
    assert "event on instance/x dropped after 0.02 s without a broker (2 dropped so far)" \
        in caplog.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_events_published_while_a_subscriber_was_away_are_counted_as_missed(
        ab: MemoryNetwork, dialer: ClientDialer, protocol: str,
        caplog: pytest.LogCaptureFixture) -> None:
    dialer.aliases["sub-link"] = "a"  # the subscriber's way to broker a
    got: list[str] = []
    events: list[Event] = []

    async def main() -> TopicSubscriber:
        pub = EventPublisher(conf("a", extra=f"mb.protocol={protocol}\n"), dialer=dialer)
        assert await pub.publish("cluster/c1", "before")  # event 1: nobody listens yet
        sub = TopicSubscriber(conf("sub-link", extra=f"mb.protocol={protocol}\n"),
                              "cluster/#", lambda m: got.append(m.text),
                              on_event=events.append, dialer=dialer)
        sub.start()
        await sub.wait_subscribed(5)
        assert await pub.publish("cluster/c1", "one")  # the first it hears: no gap
        await until(lambda: got == ["one"], what="the first event")
        dialer.refuse("sub-link")
        dialer.cut("sub-link")  # the subscriber's link goes dark ...
        await until(lambda: not sub.client.connected, what="the subscriber to drop")
        assert await pub.publish("cluster/c1", "two")  # ... so this one is lost
        dialer.accept("sub-link")  # it comes back with a fresh subscription
        await until(lambda: sub.client.connected, what="the subscriber back")
        assert await pub.publish("cluster/c1", "three")
        await until(lambda: got == ["one", "three"], what="the third event")
        await sub.close()
        await pub.close()
        return sub

    with caplog.at_level(logging.WARNING, "meshmq.client.agent"):
        sub = run(ab, main())
    assert sub.missed == 1
    missed = [e for e in events if e.kind is EventKind.EVENTS_MISSED]
    topic = "cluster/c1" if protocol == "mqtt" else "/topic/cluster.c1"
    assert [(e.missed, e.topic) for e in missed] == [(1, topic)]
    assert "1 event(s) on" in caplog.text and "did not arrive" in caplog.text


def test_repeats_and_events_without_a_number_are_not_gaps(ab: MemoryNetwork,
                                                          dialer: ClientDialer) -> None:
    got: list[str] = []

    async def main() -> TopicSubscriber:
        sub = TopicSubscriber(conf("a"), "seq/#", lambda m: got.append(m.text),
                              dialer=dialer)
        sub.start()
        await sub.wait_subscribed(5)
        async with FailoverClient("mqtt://a", dialer=dialer, keep_alive=0,
                                  client_id="raw") as raw:
            for text, seq in [("p1", "p:1"), ("p1 again", "p:1"), ("p2", "p:2"),
                              ("none", ""), ("junk", "p:x"), ("q5", "q:5"), ("q6", "q:6")]:
                await raw.send("seq/t", text, {SEQ_HEADER: seq} if seq else {})
        await until(lambda: len(got) == 7, what="every event")
        await sub.close()
        return sub

    sub = run(ab, main())
    assert sub.missed == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_durable_mode_keeps_events_published_while_away(
        ab: MemoryNetwork, dialer: ClientDialer, protocol: str) -> None:
    durable = conf("a", extra=f"mb.protocol={protocol}\nmb.durable=true\n"
                   "mb.client.id=cart1\n")
    plain = conf("a", extra=f"mb.protocol={protocol}\n")

    async def main() -> tuple[list[str], list[str]]:
        got: list[str] = []
        missed: list[str] = []
        for config, sink in ((durable, got), (plain, missed)):
            sub = TopicSubscriber(config, "cluster/#", sink_of(sink), dialer=dialer)
            sub.start()
            await sub.wait_subscribed(5)
            await sub.close()  # away (a failover, a restart)
        pub = EventPublisher(plain, dialer=dialer)
        assert await pub.publish("cluster/c1", "while away")
        for config, sink in ((durable, got), (plain, missed)):
            sub = TopicSubscriber(config, "cluster/#", sink_of(sink), dialer=dialer)
            sub.start()
            await sub.wait_subscribed(5)
            await pub.publish("cluster/c1", "back")
            await until(lambda sink=sink: "back" in sink, what="the event after return")
            await sub.close()
        await pub.close()
        return got, missed

    got, missed = run(ab, main())
    assert got == ["while away", "back"] and missed == ["back"]


def sink_of(sink: list[str]) -> Callable[[Message], None]:
    return lambda m: sink.append(m.text)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stratos_credentials_work_against_a_broker_without_users(
        network: MemoryNetwork, dialer: ClientDialer, protocol: str) -> None:
    network.add("a", auth=AuthConfig())  # no users: any login is accepted
    network.start()
    config = conf("a", extra=f"mb.protocol={protocol}\nmb.username=system\n"
                  "mb.password=manager\n")

    async def main() -> None:
        pub = EventPublisher(config, dialer=dialer)
        assert await pub.publish("member/m1", "activated")
        await pub.close()
    run(network, main())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_refused_login_is_raised_not_dropped(network: MemoryNetwork,
                                               dialer: ClientDialer, protocol: str) -> None:
    network.add("a", auth=AuthConfig(users=(User("system", "the-real-one"),)))
    network.start()
    config = conf("a", extra=f"mb.protocol={protocol}\nmb.username=system\n"
                  "mb.password=manager\n")
    events: list[Event] = []

    async def main() -> None:
        sub = TopicSubscriber(config, "member/#", lambda m: None, on_event=events.append,
                              dialer=dialer)
        sub.start()
        pub = EventPublisher(config, on_event=events.append, dialer=dialer)
        with pytest.raises(AuthenticationFailedError, match="login refused"):
            await pub.publish("member/m1", "activated")  # mb.publisher.timeout: 900 s
        with pytest.raises(AuthenticationFailedError):
            await sub.wait_subscribed(5)
        assert pub.dropped == 0  # not a drop: the credentials must be fixed
        await sub.close()
        await pub.close()
    run(network, main())
    failed = [e for e in events if e.kind is EventKind.FAILED]
    assert len(failed) == 2
    assert all(isinstance(e.error, AuthenticationFailedError) for e in failed)
