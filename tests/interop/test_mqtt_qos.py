"""A real asyncio MQTT client (aiomqtt) round trip at QoS 1 and 2, over a socket. The
broker's QoS behaviour on the wire is tested without sockets in
tests/unit/broker/mqtt/test_mqtt_qos.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import pytest

from tests.interop.mqtt_helpers import MqttEnv, uid
from tests.support.node_target import make_env


@pytest.fixture
def env(topology: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MqttEnv]:
    e = make_env(request, topology, tmp_path / "data")
    try:
        yield e
    finally:
        e.close()


@pytest.mark.parametrize("version", ["v311", "v5"])
def test_aiomqtt_round_trip_qos1_and_qos2(env: MqttEnv, version: str) -> None:
    protocol = aiomqtt.ProtocolVersion.V5 if version == "v5" else aiomqtt.ProtocolVersion.V311
    topic = uid("aio/")

    async def main() -> list[tuple[str, bytes, int]]:
        async with asyncio.timeout(15):
            async with aiomqtt.Client("127.0.0.1", env.mqtt_port, identifier=uid("aiosub"),
                                      protocol=protocol) as sub:
                await sub.subscribe(topic + "/#", qos=2)
                async with aiomqtt.Client("127.0.0.1", env.mqtt_port,
                                          identifier=uid("aiopub"), protocol=protocol) as pub:
                    await pub.publish(topic + "/one", b"q1", qos=1)
                    await pub.publish(topic + "/two", b"q2", qos=2)
                got = []
                async for msg in sub.messages:
                    got.append((str(msg.topic), bytes(msg.payload), msg.qos))  # type: ignore[arg-type]
                    if len(got) == 2:
                        break
                return got

    # Two topics: each keeps its order, but MQTT orders no topic against another (on a
    # node of shards they may have different owners).
    assert sorted(asyncio.run(main())) == [(topic + "/one", b"q1", 1),
                                           (topic + "/two", b"q2", 2)]
