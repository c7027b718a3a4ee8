"""STOMP and MQTT over WebSocket (ws://) through the failover client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from meshmq.client import FailoverClient
from meshmq.config.model import ListenerConfig
from tests.client.conftest import LISTENERS, stomp_uri
from tests.client.test_client_features import run
from tests.support.brokers import ThreadBroker

WS = ListenerConfig(name="ws", protocol="ws", host="127.0.0.1", port=0)


def ws_uri(b: ThreadBroker) -> str:
    assert b.runtime is not None
    return f"ws://127.0.0.1:{b.runtime.addresses['ws'][1]}"


def test_stomp_and_mqtt_over_websocket(meshmq_factory: Callable[..., ThreadBroker]) -> None:
    b = meshmq_factory(listeners=(*LISTENERS, WS))

    async def main() -> None:
        async with FailoverClient(f"failover:({ws_uri(b)}/stomp)") as c:
            assert c.protocol == "stomp" and c.endpoint is not None and c.endpoint.websocket
            sub = await c.subscribe("/queue/ws", ack="client-individual")
            await c.send("/queue/ws", b"\x00binary\xff body")
            msg = await sub.get(10)
            assert msg.body == b"\x00binary\xff body" and await c.ack(msg)
        async with FailoverClient(ws_uri(b), protocol="mqtt", client_id="wsm") as m:
            sub = await m.subscribe("ws/+", qos=1)
            await m.send("ws/1", "over websocket")
            assert (await sub.get(10)).text == "over websocket"
    run(main())


def test_failover_from_a_websocket_endpoint_to_a_tcp_one(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    a = meshmq_factory(listeners=(*LISTENERS, WS))
    b = meshmq_factory()

    async def main() -> None:
        async with FailoverClient(f"failover:({ws_uri(a)},{stomp_uri(b)})?randomize=false",
                                  protocol="stomp") as c:
            sub = await c.subscribe("/topic/mixed")
            await asyncio.to_thread(a.stop)
            await c.send("/topic/mixed", "after")
            assert (await sub.get(10)).text == "after"
            assert c.endpoint is not None and not c.endpoint.websocket
    run(main())
