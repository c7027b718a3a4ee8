"""A real broker runtime driven without sockets, for fast deterministic tests.

``MemoryBroker`` runs a real ``BrokerRuntime`` (core, store, pump, the real STOMP and
MQTT sessions) on its own event loop in the test's thread; clients are the runtime's
protocol objects connected to in-memory transports. Nothing is mocked but the socket:
what a test sends is what the session reads, what it receives is what the session
wrote. A test advances the loop explicitly (``broker.wait_for(...)``, or the clients'
``expect`` helpers), so there are no threads and no sleeps.

Use it for broker and protocol behaviour (frames, reason codes, receipts, acks,
ordering, flow control). Interoperability with real client libraries (stomp.py,
paho-mqtt) and anything about sockets, TLS or process death stays in socket tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from meshmq.config.model import BrokerConfig, ManagementConfig
from meshmq.protocol.mqtt.client import ClientConnection
from meshmq.protocol.mqtt.packets import Connack, Connect, Packet
from meshmq.protocol.stomp.encoder import encode_frame
from meshmq.protocol.stomp.frames import Frame
from meshmq.protocol.stomp.parser import StompParser
from meshmq.store.base import Store
from meshmq.store.memory import MemoryStore
from meshmq.transport.runtime import BrokerRuntime
from tests.support.loop_teardown import drain_loop

if TYPE_CHECKING:
    from meshmq.transport.mqtt_server import MqttProtocol
    from meshmq.transport.stomp_server import StompProtocol

DEFAULT_TIMEOUT_S = 10.0
T = TypeVar("T")


def memory_config(**changes: Any) -> BrokerConfig:
    """A broker config with no listeners and no management endpoint."""
    base: dict[str, Any] = {"persistent": False, "listeners": (),
                            "management": ManagementConfig(enabled=False)}
    base.update(changes)
    return BrokerConfig(**base)


class MemoryTransport:
    """Stands in for an asyncio transport: keeps what the broker writes, and tells the
    protocol the connection is lost (on the next loop turn) when either side closes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                 peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        self._loop = loop
        self._protocol = protocol
        self._peer = peer
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self._lost = False
        # Called (on the next loop turn) when the session resumes reading, so a client
        # can hand over what it held back, as a socket's buffer would.
        self.on_resume: Callable[[], None] | None = None

    # -- what the broker calls
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.closed:
            self.written += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        if self.on_resume is not None:
            self._loop.call_soon(self.on_resume)

    def is_reading(self) -> bool:
        return self.reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    # -- what the client side calls
    def drop(self) -> None:
        """The client's connection breaks (no DISCONNECT): the broker sees it lost."""
        if not self.closed:
            self.closed = True
            self._connection_lost(ConnectionResetError("connection reset by peer"))

    def _connection_lost(self, exc: Exception | None) -> None:
        if not self._lost:
            self._lost = True
            self._protocol.connection_lost(exc)


class MemoryBroker:
    """A started ``BrokerRuntime`` on a private event loop; close() stops it."""

    def __init__(self, config: BrokerConfig | None = None, store: Store | None = None) -> None:
        self.config = config if config is not None else memory_config()
        self.loop = asyncio.new_event_loop()
        self.runtime = BrokerRuntime(self.config, store=store if store is not None
                                     else MemoryStore())
        self._ports = iter(range(40000, 60000))
        self.loop.run_until_complete(self.runtime.start())

    @property
    def broker(self) -> Any:
        return self.runtime.broker

    def turn(self, turns: int = 3) -> None:
        """Let the loop run a few turns (pumps, deferred callbacks)."""
        async def spin() -> None:
            for _ in range(turns):
                await asyncio.sleep(0)
        self.loop.run_until_complete(spin())

    def wait_for(self, predicate: Callable[[], bool], timeout: float = DEFAULT_TIMEOUT_S,
                 what: str = "the condition") -> None:
        """Run the loop until ``predicate()``; fail after ``timeout`` seconds."""
        async def poll() -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                await asyncio.sleep(0.001 if self.loop._ready else 0.005)  # type: ignore[attr-defined]
        self.loop.run_until_complete(poll())

    def call(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` inside the loop, as a socket read would (sessions may create
        tasks), then let the loop take a turn. Already inside the loop: just ``fn()``."""
        if self.loop.is_running():
            fn()
            return

        async def run() -> None:
            fn()
            await asyncio.sleep(0)
        self.loop.run_until_complete(run())

    def connect(self, protocol: asyncio.Protocol,
                peer: tuple[str, int] | None = None) -> MemoryTransport:
        """``protocol`` connected to a new transport whose remote end is ``peer``
        (by default a new port of 127.0.0.1, as a loopback client's)."""
        transport = MemoryTransport(self.loop, protocol,
                                    peer if peer is not None else ("127.0.0.1", next(self._ports)))
        self.call(lambda: protocol.connection_made(transport))  # type: ignore[arg-type]
        return transport

    def stomp(self, listener: str | None = None,
              peer: tuple[str, int] | None = None) -> StompClient:
        """A STOMP client; ``peer``: the address it connects from."""
        return StompClient(self, listener, peer)

    def mqtt(self, level: int = 4, listener: str | None = None,
             peer: tuple[str, int] | None = None) -> MqttClient:
        """An MQTT client; ``peer``: the address it connects from."""
        return MqttClient(self, level, listener, peer)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self.runtime.stop())
        finally:
            self.loop.run_until_complete(drain_loop())
            self.loop.close()

    def __enter__(self) -> MemoryBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MemoryConnection(Generic[T]):
    """What the STOMP and the MQTT clients share: bytes go to the session as a socket
    read would hand them over, what the session wrote is decoded into items (frames,
    packets) that the waits below take from."""

    def __init__(self, broker: MemoryBroker, protocol: asyncio.Protocol,
                 peer: tuple[str, int] | None = None) -> None:
        self.broker = broker
        self.protocol = protocol
        self.transport = broker.connect(protocol, peer)
        self._seen = 0
        self._items: list[T] = []

    def _decode(self, chunk: bytes) -> list[T]:
        raise NotImplementedError

    def _show(self, items: list[T]) -> str:
        raise NotImplementedError

    def send_raw(self, data: bytes) -> None:
        self.broker.call(lambda: self.protocol.data_received(data))

    def _read(self) -> None:
        data = self.transport.written
        if len(data) > self._seen:
            chunk = bytes(data[self._seen:])
            self._seen = len(data)
            self._items.extend(self._decode(chunk))

    def received(self) -> list[T]:
        """Items received so far and not yet taken (STOMP heart-beats are dropped)."""
        self._read()
        return list(self._items)

    def _next(self, timeout: float, what: str) -> T:
        """Run the loop until an item arrives; take it."""
        def ready() -> bool:
            self._read()
            return bool(self._items)
        self.broker.wait_for(ready, timeout, what)
        return self._items.pop(0)

    def expect_none(self, turns: int = 10) -> None:
        """Nothing more arrives within a few loop turns."""
        self.broker.turn(turns)
        self._read()
        assert not self._items, f"unexpected {self._show(self._items)}"

    @property
    def closed(self) -> bool:
        """The broker closed the connection."""
        return self.transport.closed

    def wait_closed(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.broker.wait_for(lambda: self.transport.closed, timeout, "the broker to close")

    def drop(self) -> None:
        self.transport.drop()


class StompClient(_MemoryConnection[Frame]):
    """A STOMP client over an in-memory transport: raw frames out, parsed frames in."""

    protocol: StompProtocol

    def __init__(self, broker: MemoryBroker, listener: str | None = None,
                 peer: tuple[str, int] | None = None) -> None:
        from meshmq.transport.stomp_server import StompProtocol

        super().__init__(broker, StompProtocol(broker.runtime, listener), peer)
        self._parser = StompParser()
        self.version = "1.2"

    def _decode(self, chunk: bytes) -> list[Frame]:
        return self._parser.feed(chunk)

    def _show(self, items: list[Frame]) -> str:
        return f"frames: {[f.command for f in items]}"

    def send(self, command: str, headers: dict[str, str] | None = None,
             body: bytes = b"") -> None:
        self.send_raw(encode_frame(command, list((headers or {}).items()), body,
                                   version=self.version))

    def expect(self, command: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Frame:
        """The next frame (of ``command``, which must be the next one)."""
        frame = self._next(timeout, f"a {command or 'STOMP'} frame")
        if command is not None and frame.command != command:
            raise AssertionError(f"expected {command}, got {frame.command} "
                                 f"{dict(frame.headers)} {frame.body[:200]!r}")
        return frame

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        self.version = version if version in ("1.0", "1.1", "1.2") else "1.2"
        self.send("CONNECT", {"accept-version": version, "host": "/", **headers})
        connected = self.expect()
        if connected.command == "CONNECTED":
            # The broker's frames after CONNECTED use the negotiated version's escaping.
            self._parser.version = connected.get("version") or "1.0"
        return connected


class MqttClient(_MemoryConnection[Packet]):
    """An MQTT client over an in-memory transport: packets out, decoded packets in."""

    protocol: MqttProtocol

    def __init__(self, broker: MemoryBroker, level: int = 4,
                 listener: str | None = None, peer: tuple[str, int] | None = None) -> None:
        from meshmq.transport.mqtt_server import MqttProtocol

        super().__init__(broker, MqttProtocol(broker.runtime, listener), peer)
        self.level = level
        self._client = ClientConnection(level)

    def _decode(self, chunk: bytes) -> list[Packet]:
        return self._client.receive_data(chunk)

    def _show(self, items: list[Packet]) -> str:
        return f"packets: {items}"

    def send(self, packet: Packet) -> None:
        self.send_raw(self._client.send(packet))

    def connect(self, client_id: str = "", **fields: Any) -> Connack:
        """CONNECT at this client's protocol level; the CONNACK."""
        self.send(Connect(client_id=client_id, protocol_level=self.level, **fields))
        connack: Connack = self.expect(Connack)
        return connack

    def expect(self, kind: type[Packet] | None = None,
               timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """The next packet (of type ``kind``, which must be the next one)."""
        packet = self._next(timeout, f"a {kind.__name__ if kind else 'MQTT'} packet")
        if kind is not None and not isinstance(packet, kind):
            raise AssertionError(f"expected {kind.__name__}, got {packet!r}")
        return packet


@contextlib.contextmanager
def memory_broker(config: BrokerConfig | None = None,
                  store: Store | None = None) -> Iterator[MemoryBroker]:
    broker = MemoryBroker(config, store)
    try:
        yield broker
    finally:
        broker.close()
