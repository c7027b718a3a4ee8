"""Raw MQTT conversations with a broker driven in memory (``memory_broker``).

``MemoryMqtt`` speaks MQTT packet by packet (or byte by byte) to a real MQTT session of
a ``MemoryBroker``: packets out with meshmq's encoder, packets in through a client-side
decoder, exactly as the session wrote them. ``MqttEnv`` is the broker plus client
factories, and fails the test if the broker logged an error.

Why not the harness's ``MqttClient`` alone: broker behaviour tests need whole
conversations (subscribe and wait for the SUBACK, publish and run the QoS flow, read
until the broker closes) and the proof of absence the socket tests used: a PINGREQ
whose PINGRESP comes after anything the broker had decided to send.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from meshmq.config.model import BrokerConfig
from meshmq.protocol.mqtt import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from meshmq.store.base import Store
from tests.support.memory_broker import DEFAULT_TIMEOUT_S, MemoryBroker, StompClient

LEVELS = (4, 5)
T = TypeVar("T")
_ids = itertools.count(1)


def uid(prefix: str = "m") -> str:
    """A name unique within this test process (client ids, topics)."""
    return f"{prefix}{next(_ids)}"


def _in_loop(broker: MemoryBroker, call: Callable[[], T]) -> T:
    """``call()`` inside the broker's running loop, as asyncio calls a protocol (the
    session schedules timers and tasks on the running loop)."""
    async def run() -> T:
        return call()
    return broker.loop.run_until_complete(run())


class ClosedError(AssertionError):
    """The broker closed the connection while a packet was awaited."""


class MemoryMqtt:
    """One MQTT connection to a memory broker, driven like a raw socket client."""

    def __init__(self, broker: MemoryBroker, level: int = 4,
                 listener: str | None = None) -> None:
        self.broker = broker
        self.level = level
        self.client = _in_loop(broker, lambda: broker.mqtt(level, listener))
        self.decoder = MqttDecoder(server_side=False, protocol_level=level)
        self.pending: list[Packet] = []
        self._seen = 0
        self._pid = itertools.count(1)

    # -- output -------------------------------------------------------------------------
    def send(self, packet: Packet) -> None:
        self.send_bytes(encode(packet, self.level))

    def send_bytes(self, data: bytes) -> None:
        if not self.client.transport.closed:
            _in_loop(self.broker, lambda: self.client.send_raw(data))

    def next_pid(self) -> int:
        return next(self._pid) % 65535 + 1

    @property
    def session(self) -> Any:
        """The broker's session object for this connection."""
        return self.client.protocol.session

    # -- input --------------------------------------------------------------------------
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

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        self.broker.wait_for(lambda: (self._read() or True) and ready(), timeout, what)

    def recv(self, timeout: float = DEFAULT_TIMEOUT_S) -> Packet:
        self._wait(lambda: self.pending or self.eof, timeout, "an MQTT packet")
        self._read()
        if not self.pending:
            raise ClosedError("connection closed by the broker")
        return self.pending.pop(0)

    def expect(self, cls: type[Any], timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        packet = self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def until_closed(self, timeout: float = DEFAULT_TIMEOUT_S) -> list[Packet]:
        """Every packet received until the broker closes (fails at the deadline)."""
        try:
            self._wait(lambda: self.eof, timeout, "the broker to close")
        except AssertionError:
            self._read()
            raise AssertionError(f"connection still open; received {self.pending!r}") \
                from None
        self.broker.turn()
        self._read()
        got, self.pending = self.pending, []
        return got

    def until_closed_or(self, stop: type[Any],
                        timeout: float = DEFAULT_TIMEOUT_S) -> list[Packet]:
        """Packets until the broker closes; fails if a ``stop`` packet arrives first
        (e.g. the PINGRESP of a PINGREQ sent after what should have closed us)."""
        got = self.until_closed(timeout)
        assert not any(isinstance(p, stop) for p in got), \
            f"connection not closed first; received {got!r}"
        return got

    def ping(self, timeout: float = DEFAULT_TIMEOUT_S) -> list[Packet]:
        """PINGREQ -> PINGRESP; returns what arrived before the PINGRESP.

        The loop first runs a few turns (pumps, store syncs), as a socket's latency
        would let it; the session answers one connection's packets in order, so anything
        the broker decided to send before the PINGREQ is in the returned list."""
        self.broker.turn(10)
        self.send(Pingreq())
        before: list[Packet] = []
        while True:
            packet = self.recv(timeout)
            if isinstance(packet, Pingresp):
                return before
            before.append(packet)

    # -- conversations --------------------------------------------------------------------
    def connect(self, client_id: str = "", *, clean: bool = True, keep_alive: int = 0,
                properties: Properties | None = None, will: Will | None = None,
                username: str | None = None, password: bytes | None = None,
                expect_success: bool = True) -> Connack:
        self.send(Connect(client_id=client_id, clean_start=clean, keep_alive=keep_alive,
                          username=username, password=password, will=will,
                          properties=properties or Properties(), protocol_level=self.level))
        ack: Connack = self.expect(Connack)
        if expect_success:
            assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
        return ack

    def subscribe(self, *filters: str | tuple[str, int] | tuple[str, SubscriptionOptions],
                  qos: int = 1, properties: Properties | None = None) -> Suback:
        subs: list[tuple[str, SubscriptionOptions]] = []
        for f in filters:
            if isinstance(f, str):
                subs.append((f, SubscriptionOptions(qos=qos)))
            elif isinstance(f[1], int):
                subs.append((f[0], SubscriptionOptions(qos=f[1])))
            else:
                subs.append((f[0], f[1]))
        pid = self.next_pid()
        self.send(Subscribe(pid, subs, properties or Properties()))
        ack: Suback = self.expect(Suback)
        assert ack.packet_id == pid
        return ack

    def unsubscribe(self, *filters: str) -> Unsuback:
        pid = self.next_pid()
        self.send(Unsubscribe(pid, list(filters)))
        ack: Unsuback = self.expect(Unsuback)
        assert ack.packet_id == pid
        return ack

    def publish(self, topic: str, payload: bytes = b"", *, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> Packet | None:
        """PUBLISH; for QoS 1 returns the PUBACK, for QoS 2 runs the whole flow and
        returns the PUBCOMP. Other packets arriving meanwhile stay in ``pending``."""
        pid = self.next_pid() if qos else None
        self.send(Publish(topic, payload, qos=qos, retain=retain, packet_id=pid,
                          properties=properties or Properties()))
        if qos == 0:
            return None
        if qos == 1:
            return self._expect_ack(Puback, pid)  # type: ignore[no-any-return]
        rec = self._expect_ack(Pubrec, pid)
        assert rec.reason_code < 0x80, rec
        self.send(Pubrel(pid or 0))
        return self._expect_ack(Pubcomp, pid)  # type: ignore[no-any-return]

    def _expect_ack(self, cls: type[Any], pid: int | None,
                    timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """Wait for the ack ``cls`` of ``pid``; other packets stay in ``pending``."""
        def find() -> int | None:
            for i, p in enumerate(self.pending):
                if isinstance(p, cls) and p.packet_id == pid:
                    return i
            return None
        self._wait(lambda: find() is not None or self.eof, timeout,
                   f"{cls.__name__} for {pid}")
        self._read()
        i = find()
        if i is None:
            raise ClosedError(f"closed while waiting for {cls.__name__} {pid}")
        return self.pending.pop(i)

    def publishes(self, n: int, timeout: float = DEFAULT_TIMEOUT_S) -> list[Publish]:
        """The next ``n`` packets, which must all be PUBLISH."""
        return [self.expect(Publish, timeout) for _ in range(n)]

    def ack(self, publish: Publish) -> None:
        """Complete the receiver side of a QoS 1/2 delivery."""
        if publish.qos == 1:
            self.send(Puback(publish.packet_id or 0))
        elif publish.qos == 2:
            self.send(Pubrec(publish.packet_id or 0))
            self._expect_ack(Pubrel, publish.packet_id)
            self.send(Pubcomp(publish.packet_id or 0))

    def disconnect(self, code: int = 0, properties: Properties | None = None) -> None:
        self.send(Disconnect(ReasonCode(code), properties or Properties()))

    def close(self) -> None:
        """The client closes its side cleanly (an EOF, no DISCONNECT)."""
        _in_loop(self.broker, self.client.transport.close)

    def abort(self) -> None:
        """The connection breaks (a reset, no DISCONNECT): the broker sees it at once."""
        _in_loop(self.broker, self.client.drop)


class ErrorLog(logging.Handler):
    """Collects ERROR records (an exception in the broker's pump, an internal error)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        out = []
        for r in self.records:
            text = r.getMessage()
            if r.exc_info and r.exc_info[1] is not None:
                text += f" -> {type(r.exc_info[1]).__name__}: {r.exc_info[1]}"
            out.append(text)
        return out


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


__all__ = ["LEVELS", "ClosedError", "MemoryMqtt", "MqttEnv", "mqtt_env", "uid"]
