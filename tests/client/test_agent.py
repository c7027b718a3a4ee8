"""The Python Cartridge Agent mode over real sockets: subscriptions that move on when
their broker process is killed, and the blocking facade. The agent's configuration,
policy and semantics are tested without sockets in tests/unit/client/test_agent.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from meshmq.client import Message
from meshmq.client.agent import (
    Agent,
    AgentConfig,
    EventPublisher,
    TopicSubscriber,
    parse_agent_conf,
)
from tests.client.test_client_features import run
from tests.support.brokers import ProcessBroker, ThreadBroker, poll

FAST = "mb.retry.initial.delay=20\nmb.retry.max.delay=200\nmb.alive.check.interval=2\n"


def conf(*ports: int, extra: str = "") -> AgentConfig:
    urls = ",".join(f"127.0.0.1:{p}" for p in ports)
    return parse_agent_conf(f"mb.urls={urls}\nmb.username=\nmb.password=\n{FAST}{extra}")


def mqtt_port(b: ThreadBroker) -> int:
    assert b.runtime is not None
    return b.runtime.addresses["mqtt"][1]


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
