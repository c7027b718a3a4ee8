"""The MQTT session's delivery and publish fast paths write exactly what the general
path writes.

A real ``BrokerRuntime`` (memory store, no listeners) and real ``MqttProtocol``
sessions over in-memory transports: a 3.1.1 publisher sends random topics, payloads,
QoS and retain flags; two subscribers (3.1.1 and 3.1.1 or 5, any QoS, retain as
published) must receive byte for byte what the general encoder
(:func:`meshmq.protocol.mqtt.encode`) makes of the expected PUBLISH packets. That
covers the cached topic fields, the prepared PUBLISH encoder, the QoS 0 3.1.1 packet
encoded once per message (``wire_cache``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshmq.config.model import BrokerConfig, ManagementConfig
from meshmq.core.message import Message
from meshmq.protocol.mqtt import (
    Connect,
    MqttDecoder,
    Publish,
    Subscribe,
    SubscriptionOptions,
    encode,
)
from meshmq.store.memory import MemoryStore
from meshmq.transport import mqtt_server
from meshmq.transport.mqtt_server import MqttProtocol
from meshmq.transport.runtime import BrokerRuntime

LEVEL_TEXT = st.text(st.characters(exclude_categories=("Cs",),
                                   exclude_characters="\x00/+#"), max_size=5)
# Not starting with '$': a '#' subscription does not see those (tested elsewhere).
TOPICS = st.lists(LEVEL_TEXT, min_size=1, max_size=4).map("/".join).filter(
    lambda t: bool(t) and not t.startswith("$"))
PAYLOADS = st.one_of(st.binary(max_size=200), st.sampled_from([b"x" * 127, b"y" * 128,
                                                               b"z" * 16_400]))
MESSAGES = st.lists(st.tuples(TOPICS, PAYLOADS, st.integers(0, 2), st.booleans()),
                    min_size=1, max_size=8)


class MemoryTransport:
    """An asyncio transport that keeps what the broker writes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol: MqttProtocol | None = None

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            # As asyncio transports do: the protocol hears of it on the next loop turn.
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def connect(runtime: BrokerRuntime, client_id: str, level: int) -> tuple[MqttProtocol,
                                                                         MemoryTransport]:
    transport = MemoryTransport()
    proto = transport.protocol = MqttProtocol(runtime)
    proto.connection_made(transport)  # type: ignore[arg-type]
    proto.data_received(encode(Connect(client_id=client_id, protocol_level=level), level))
    return proto, transport


def received(transport: MemoryTransport, level: int) -> list[bytes]:
    """The PUBLISH packets in what ``transport`` got, each as its wire bytes."""
    decoder = MqttDecoder(protocol_level=level, server_side=False)
    packets = [p for p in decoder.feed(bytes(transport.data)) if isinstance(p, Publish)]
    assert decoder.buffered == 0
    wire = b"".join(encode(p, level) for p in packets)
    assert wire in bytes(transport.data)  # the packets were written as encode writes them
    return [encode(p, level) for p in packets]


async def scenario(messages: list[tuple[str, bytes, int, bool]],
                   subscribers: list[tuple[int, int, bool]]) -> None:
    config = BrokerConfig(persistent=False, listeners=(), advisory_support=False,
                          management=ManagementConfig(enabled=False))
    runtime = BrokerRuntime(dataclasses.replace(config, network_connectors=()),
                            store=MemoryStore())
    await runtime.start()
    try:
        sinks = []
        for n, (level, qos, rap) in enumerate(subscribers):
            proto, transport = connect(runtime, f"sub{n}", level)
            options = SubscriptionOptions(qos, retain_as_published=rap)
            proto.data_received(encode(Subscribe(1, [("#", options)]), level))
            await asyncio.sleep(0)
            transport.data.clear()  # CONNACK, SUBACK
            sinks.append(transport)
        producer, _ = connect(runtime, "pub", 4)
        for pid, (topic, payload, qos, retain) in enumerate(messages, 1):
            producer.data_received(encode(Publish(topic, payload, qos, retain, False,
                                                  pid if qos else None), 4))
        for _ in range(5):
            await asyncio.sleep(0)
        for (level, sub_qos, rap), transport in zip(subscribers, sinks, strict=True):
            out_pid = 0
            expected = []
            for topic, payload, qos, retain in messages:
                q = min(qos, sub_qos)
                if q:
                    out_pid += 1
                expected.append(encode(Publish(topic, payload, q, rap and retain, False,
                                               out_pid if q else None), level))
            assert received(transport, level) == expected
            assert bytes(transport.data) == b"".join(expected)
    finally:
        await runtime.stop()


@settings(derandomize=True, database=None, deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow])
@given(messages=MESSAGES, first_qos=st.integers(0, 2), level=st.sampled_from([4, 5]),
       qos=st.integers(0, 2), rap=st.booleans())
def test_delivered_bytes_equal_the_general_encoder(
        messages: list[tuple[str, bytes, int, bool]], first_qos: int, level: int, qos: int,
        rap: bool) -> None:
    asyncio.run(scenario(messages, [(4, first_qos, False), (level, qos, rap and level == 5)]))


def test_fan_out_encodes_a_qos0_packet_once() -> None:
    async def run() -> None:
        config = BrokerConfig(persistent=False, listeners=(), advisory_support=False,
                              management=ManagementConfig(enabled=False))
        runtime = BrokerRuntime(dataclasses.replace(config, network_connectors=()),
                                store=MemoryStore())
        await runtime.start()
        try:
            sinks = []
            for n in range(3):
                proto, transport = connect(runtime, f"sub{n}", 4)
                proto.data_received(encode(Subscribe(1, [("a/b", SubscriptionOptions(0))]), 4))
                sinks.append(transport)
            await asyncio.sleep(0)
            for transport in sinks:
                transport.data.clear()
                transport.writes.clear()
            delivered: list[Message] = []
            original = mqtt_server.MqttSession.deliver

            def spy(self: mqtt_server.MqttSession, outcome: Any) -> None:
                delivered.append(outcome.message)
                original(self, outcome)

            mqtt_server.MqttSession.deliver = spy  # type: ignore[method-assign]
            try:
                producer, _ = connect(runtime, "pub", 4)
                producer.data_received(encode(Publish("a/b", b"hello"), 4))
                for _ in range(3):
                    await asyncio.sleep(0)
            finally:
                mqtt_server.MqttSession.deliver = original  # type: ignore[method-assign]
            wire = encode(Publish("a/b", b"hello"), 4)
            assert [bytes(t.data) for t in sinks] == [wire] * 3
            assert len(delivered) == 3 and len({id(m) for m in delivered}) == 1
            cache = delivered[0].wire_cache
            assert cache is not None and list(cache.values()) == [wire]
            # Every subscriber was written the very same bytes object: encoded once.
            writes = [w for t in sinks for w in t.writes]
            assert len(writes) == 3 and all(w is writes[0] for w in writes)
        finally:
            await runtime.stop()

    asyncio.run(run())

