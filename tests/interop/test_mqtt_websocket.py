"""MQTT over WebSocket (subprotocol ``mqtt``) on the runtime's ``ws`` listener with
paho-mqtt (transport="websockets") and aiomqtt, and an MQTT client exchanging messages
with a STOMP-over-WebSocket client (websockets library) on the same listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from tests.interop.mqtt_helpers import LEVELS, MqttEnv, uid
from tests.support.node_target import make_env


@pytest.fixture
def env(topology: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "data")
    try:
        yield e
    finally:
        e.close()


@pytest.mark.parametrize("level", LEVELS)
def test_paho_over_websocket_round_trip_with_tcp_client(env: MqttEnv, level: int) -> None:
    topic = uid("ws/")
    ws = env.paho(level, transport="websockets")
    tcp = env.paho(level)
    assert ws.subscribe(topic, 2)[0] == 2
    tcp.subscribe(topic, 1)
    for qos in (0, 1, 2):
        tcp.publish(topic, b"tcp-%d" % qos, qos)
        ws.publish(topic, b"ws-%d" % qos, qos)
    got = ws.wait_messages(6)
    assert sorted((m.payload, m.qos) for m in got) == [
        (b"tcp-0", 0), (b"tcp-1", 1), (b"tcp-2", 2), (b"ws-0", 0), (b"ws-1", 1), (b"ws-2", 2)]
    tcp_got = tcp.wait_messages(6)
    assert sorted(m.payload for m in tcp_got) == sorted(m.payload for m in got)


@pytest.mark.parametrize("level", LEVELS)
def test_websocket_persistent_session_and_retained(env: MqttEnv, level: int) -> None:
    topic = uid("wsret/")
    cid = uid("wspersist")
    expiry = 300 if level == 5 else None
    pub = env.paho(level)
    pub.publish(topic, b"retained over tcp", 1, retain=True)
    ws = env.paho(level, transport="websockets", client_id=cid, clean=False,
                  session_expiry=expiry)
    ws.subscribe(topic, 1)
    first = ws.wait_messages(1)[0]
    assert (first.payload, first.retain) == (b"retained over tcp", True)
    ws.disconnect()
    pub.publish(topic, b"while away", 1)
    back = env.paho(level, transport="websockets", client_id=cid, clean=False,
                    session_expiry=expiry)
    assert back.session_present
    assert back.wait_messages(1)[0].payload == b"while away"


def test_mqtt_and_stomp_over_websocket_exchange(env: MqttEnv) -> None:
    base = uid("mix")
    mqtt = env.paho(5, transport="websockets")
    mqtt.subscribe(f"{base}/from-stomp", 1)
    stomp = env.ws_stomp()
    stomp.receipt("SUBSCRIBE", [("destination", f"/topic/{base}.from-mqtt"), ("id", "1"),
                                ("ack", "auto")])
    mqtt.publish(f"{base}/from-mqtt", b"hello stomp", 1)
    frame = stomp.next("MESSAGE")
    assert frame.body == b"hello stomp"
    assert frame.get("destination") == f"/topic/{base}.from-mqtt"
    assert frame.get("ActiveMQ.MQTT.QoS") == "1"
    stomp.receipt("SEND", [("destination", f"/topic/{base}.from-stomp"),
                           ("persistent", "true")], b"hello mqtt")
    msg = mqtt.wait_messages(1)[0]
    assert (msg.topic, msg.payload, msg.qos) == (f"{base}/from-stomp", b"hello mqtt", 1)


def test_aiomqtt_over_websocket(env: MqttEnv) -> None:
    topic = uid("aiows/")

    async def main() -> bytes:
        async with asyncio.timeout(15):
            async with aiomqtt.Client("127.0.0.1", env.ws_port, identifier=uid("aiows"),
                                      transport="websockets", websocket_path="/",
                                      protocol=aiomqtt.ProtocolVersion.V5) as c:
                await c.subscribe(topic, qos=1)
                await c.publish(topic, b"over ws", qos=1)
                async for msg in c.messages:
                    return bytes(msg.payload)  # type: ignore[arg-type]
        raise AssertionError("no message")

    assert asyncio.run(main()) == b"over ws"
