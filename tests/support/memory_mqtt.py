"""Raw MQTT conversations with a broker driven in memory (``memory_broker``).

``MemoryMqtt`` speaks MQTT packet by packet (or byte by byte) to a real MQTT session of
a ``MemoryBroker``: packets out with meshmq's encoder, packets in through a client-side
decoder, exactly as the session wrote them; the conversations themselves are the
socket client's (``mqtt_client_ops``), only the bytes travel differently. ``MqttEnv``
is the broker plus client factories, and fails the test if the broker logged an error.

Why not the harness's ``MqttClient`` alone: broker behaviour tests need whole
conversations (subscribe and wait for the SUBACK, publish and run the QoS flow, read
until the broker closes) and the proof of absence the socket tests used: a PINGREQ
whose PINGRESP comes after anything the broker had decided to send.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from meshmq.config.model import BrokerConfig
from meshmq.protocol.mqtt import Publish
from meshmq.store.base import Store
from tests.support.memory_broker import MemoryBroker, StompClient
from tests.support.mqtt_client_ops import (
    LEVELS,
    ClosedError,
    ErrorLog,
    MqttClientOps,
    uid,
)

T = TypeVar("T")


def _in_loop(broker: MemoryBroker, call: Callable[[], T]) -> T:
    """``call()`` inside the broker's running loop, as asyncio calls a protocol (the
    session schedules timers and tasks on the running loop)."""
    async def run() -> T:
        return call()
    return broker.loop.run_until_complete(run())


class MemoryMqtt(MqttClientOps):
    """One MQTT connection to a memory broker, driven like a raw socket client."""

    def __init__(self, broker: MemoryBroker, level: int = 4,
                 listener: str | None = None) -> None:
        super().__init__(level)
        self.broker = broker
        self.client = _in_loop(broker, lambda: broker.mqtt(level, listener))
        self._seen = 0

    @property
    def session(self) -> Any:
        """The broker's session object for this connection."""
        return self.client.protocol.session

    def send_bytes(self, data: bytes) -> None:
        if not self.client.transport.closed:
            _in_loop(self.broker, lambda: self.client.send_raw(data))

    @property
    def eof(self) -> bool:
        return self.client.transport.closed

    def _read(self) -> bool:
        """Decode what the broker wrote since the last read; True if anything new."""
        data = self.client.transport.written
        if len(data) <= self._seen:
            return False
        chunk = bytes(data[self._seen:])
        self._seen = len(data)
        self.pending.extend(self.decoder.feed(chunk))
        return True

    def _fill(self, deadline: float) -> bool:
        """Run the loop until the broker writes or closes. Once it has closed, a few
        more turns let the session finish going away (wills, session state)."""
        if self._read():
            return True
        if self.eof:
            self.broker.turn()
            return self._read()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            self.broker.wait_for(lambda: self._read() or self.eof, remaining,
                                 "an MQTT packet")
        except AssertionError:
            raise TimeoutError from None
        return True

    def _settle(self) -> None:
        """A few loop turns (pumps, store syncs), as a socket's latency would allow."""
        self.broker.turn(10)

    def close(self) -> None:
        """The client closes its side cleanly (an EOF, no DISCONNECT)."""
        _in_loop(self.broker, self.client.transport.close)

    def abort(self) -> None:
        """The connection breaks (a reset, no DISCONNECT): the broker sees it at once."""
        _in_loop(self.broker, self.client.drop)


class MqttEnv:
    """A memory broker and MQTT/STOMP client factories."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.errors = ErrorLog()

    @property
    def runtime(self) -> Any:
        return self.broker.runtime

    def raw(self, level: int = 4, listener: str | None = None) -> MemoryMqtt:
        return MemoryMqtt(self.broker, level, listener)

    def raw_connected(self, level: int = 4, client_id: str | None = None,
                      **kw: Any) -> MemoryMqtt:
        r = self.raw(level)
        r.connect(uid("raw") if client_id is None else client_id, **kw)
        return r

    def stomp(self) -> StompClient:
        c = self.broker.stomp()
        assert c.connect().command == "CONNECTED"
        return c

    def durables(self, client_id: str) -> list[str]:
        """Names of the durable subscriptions the broker holds for ``client_id``."""
        return sorted(name for cid, name in self.runtime.broker.durables if cid == client_id)

    def assert_healthy(self, bystander: MemoryMqtt | None = None) -> None:
        """Nothing else is affected: a connected client still round-trips and the broker
        still accepts new MQTT connections at both levels."""
        if bystander is not None:
            topic = uid("health/")
            bystander.subscribe(topic, qos=1)
            payload = uid("alive-").encode()
            self.raw_connected(5).publish(topic, payload, qos=1)
            got = bystander.expect(Publish)
            assert got.payload == payload
            bystander.ack(got)
        for level in LEVELS:
            r = self.raw_connected(level, uid("fresh"))
            assert r.ping() == []


@contextlib.contextmanager
def mqtt_env(config: BrokerConfig | None = None,
             store: Store | None = None) -> Iterator[MqttEnv]:
    """A started memory broker; at the end it is stopped, and the test fails if the
    broker logged an error meanwhile."""
    from tests.support.memory_broker import memory_broker

    env: MqttEnv | None = None
    root = logging.getLogger()
    errors = ErrorLog()
    root.addHandler(errors)
    try:
        with memory_broker(config, store) as broker:
            env = MqttEnv(broker)
            env.errors = errors
            yield env
    finally:
        root.removeHandler(errors)
    assert errors.records == [], f"the broker logged errors: {errors.messages()}"


def received(sub: MemoryMqtt, n: int) -> list[Publish]:
    """The next ``n`` PUBLISHes ``sub`` gets, each acknowledged."""
    got = sub.publishes(n)
    for p in got:
        sub.ack(p)
    return got


def watched(env: MqttEnv, level: int, qos: int = 2,
            prefix: str = "will/") -> tuple[str, MemoryMqtt]:
    """A fresh topic and a client at ``level`` subscribed to it with ``qos``."""
    topic = uid(prefix)
    watcher = env.raw_connected(level)
    watcher.subscribe(topic, qos=qos)
    return topic, watcher


__all__ = ["LEVELS", "ClosedError", "MemoryMqtt", "MqttEnv", "mqtt_env", "received", "uid",
           "watched"]
