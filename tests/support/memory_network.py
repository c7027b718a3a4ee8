"""Networks of real brokers linked without sockets, for fast deterministic tests.

``MemoryNetwork`` runs several real ``BrokerRuntime``s on one event loop in the test's
thread (each a ``MemoryBroker`` for its clients). Their network connectors dial through
the manager's ``dialer``: here it connects the bridge's ``WireLink`` to a new inbound
link of the target broker (``NetworkManager.accept``, what its tcp:// listener does)
over a pair of in-memory transports. Everything above the socket is real: the HELLO
handshake and its authentication, the wire codec's bytes (delivered in small chunks, so
frames are split across reads), keep-alive, back-pressure (a transport pauses its writer
past a high-water mark until the peer has read), the bridge machine's reconnects.

A connector names its target by broker name: ``static:(tcp://b:61616)`` dials broker
``b`` (the port is ignored). A broker not started yet is waited for; a stopped one
refuses the connection.

Real sockets, TLS, processes that die, multicast discovery and interop with ActiveMQ
stay in tests/network/.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator, Sequence
from typing import Any

from meshmq.config.model import AuthConfig, BrokerConfig, NetworkConnectorConfig, User
from meshmq.connector_uri import Endpoint
from meshmq.network.link import WireLink
from meshmq.protocol.stomp.frames import Frame
from meshmq.store.base import Store
from meshmq.store.memory import MemoryStore
from meshmq.transport.runtime import BrokerRuntime
from tests.support.loop_teardown import drain_loop
from tests.support.memory_broker import MemoryBroker, StompClient, memory_config

# Broker links are admitted only for a configured user: every broker has this one
# (anonymous clients are still welcome) and connectors log in with it by default.
LINK_USER = User("link", "link-secret")
LINK_AUTH = AuthConfig(users=(LINK_USER,))

CHUNK = 16 * 1024  # bytes handed to the reader per loop turn
HIGH_WATER = 64 * 1024  # unread bytes that pause the writer ...
LOW_WATER = 16 * 1024  # ... until the reader is down to this


def connector(target: str, **kw: Any) -> NetworkConnectorConfig:
    """A connector of a static bridge to broker ``target`` (fast reconnects)."""
    kw.setdefault("username", LINK_USER.name)
    kw.setdefault("password", LINK_USER.password)
    kw.setdefault("initial_reconnect_delay_ms", 20)
    kw.setdefault("max_reconnect_delay_ms", 200)
    kw.setdefault("heartbeat_ms", 500)
    uri = kw.pop("uri", f"static:(tcp://{target}:61616)")
    return NetworkConnectorConfig(uri=uri, **kw)


class MemoryPipe:
    """One end of an in-memory connection, as an asyncio transport: what its protocol
    writes reaches the other end's protocol on later loop turns, in chunks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                 peername: tuple[str, int]) -> None:
        self._loop = loop
        self.protocol = protocol
        self._peername = peername
        self.peer: MemoryPipe | None = None
        self._buffer = bytearray()
        self._scheduled = False
        self._writer_paused = False
        self.reading = True
        self.closing = False  # close(): the rest of the buffer goes, then EOF
        self.lost = False
        self.bytes_written = 0

    # -- the transport interface WireLink uses
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or self.lost:
            return
        self._buffer += data
        self.bytes_written += len(data)
        self._schedule()
        if not self._writer_paused and len(self._buffer) > HIGH_WATER:
            self._writer_paused = True
            self.protocol.pause_writing()

    def is_closing(self) -> bool:
        return self.closing or self.lost

    def close(self) -> None:
        if not (self.closing or self.lost):
            self.closing = True
            self._schedule()

    def cut(self) -> None:
        """The connection breaks mid-stream: bytes not yet read are lost and both ends
        see the connection lost with an error (a cable pulled, a firewall's reset)."""
        for end in (self, self.peer):
            if end is not None and not end.lost:
                end._buffer.clear()
                end._lose(ConnectionResetError("connection reset by peer"))

    def abort(self) -> None:
        """A reset: nothing more is delivered; both ends see the connection lost."""
        if self.lost:
            return
        self._buffer.clear()
        self._lose(None)
        if self.peer is not None:
            self.peer._lose(ConnectionResetError("connection reset by peer"))

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        if self.peer is not None:
            self.peer._schedule()

    def is_reading(self) -> bool:
        return self.reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # fixed marks (HIGH_WATER, LOW_WATER): small, so back-pressure happens

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peername if name == "peername" else default

    # -- delivery
    def _schedule(self) -> None:
        if not self._scheduled and not self.lost:
            self._scheduled = True
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        peer = self.peer
        if self.lost or peer is None:
            return
        if self._buffer and not peer.lost:
            if not peer.reading:
                return  # resume_reading() schedules us again
            chunk = bytes(self._buffer[:CHUNK])
            del self._buffer[:CHUNK]
            peer.protocol.data_received(chunk)
            if self._buffer:
                self._schedule()
        if self._writer_paused and len(self._buffer) <= LOW_WATER and not self.lost:
            self._writer_paused = False
            self.protocol.resume_writing()
        if self.closing and not self._buffer:
            self._lose(None)
            peer._lose(None)  # EOF: "connection closed by the peer"

    def _lose(self, exc: Exception | None) -> None:
        if not self.lost:
            self.lost = True
            self._buffer.clear()
            self._loop.call_soon(self.protocol.connection_lost, exc)


class NetworkBroker(MemoryBroker):
    """One broker of a ``MemoryNetwork``: a ``MemoryBroker`` on the network's loop."""

    def __init__(self, network: MemoryNetwork, config: BrokerConfig,
                 store: Store | None = None) -> None:
        # Not MemoryBroker.__init__: the loop is the network's, and starting waits.
        self.config = config
        self.loop = network.loop
        self.network = network
        self.runtime = BrokerRuntime(config, store=store if store is not None
                                     else MemoryStore())
        self.runtime.network.dialer = self._dial
        self._ports = iter(range(40000, 60000))
        self.started: asyncio.Future[None] = self.loop.create_future()
        self.stopped = False

    @property
    def name(self) -> str:
        return self.config.broker_name

    async def _dial(self, link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                    timeout: float) -> None:
        await self.network.dial(link, endpoint, ctx, timeout, origin=self.name)

    def stomp(self, listener: str | None = None,
              peer: tuple[str, int] | None = None) -> StompClient:
        return LoopStompClient(self, listener, peer)

    def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` inside the running loop (as the broker's own callbacks run)."""
        async def run() -> Any:
            return fn(*args)
        return self.loop.run_until_complete(run())

    def start(self) -> None:
        self.loop.run_until_complete(self.runtime.start())
        if not self.started.done():
            self.started.set_result(None)

    def stop(self) -> None:
        """Stop this broker (its links say BYE); the others keep running."""
        if not self.stopped:
            self.stopped = True
            self.loop.run_until_complete(self.runtime.stop())

    def close(self) -> None:
        self.stop()

    # -- what tests read
    def bridges(self) -> list[dict[str, Any]]:
        return self.runtime.network.status()

    def outbound(self) -> list[dict[str, Any]]:
        return [b for b in self.bridges() if b["direction"] == "outbound"]

    def wait_forwarding(self, count: int = 1) -> None:
        """Until ``count`` of this broker's bridges forward and their remotes synced."""
        self.wait_for(lambda: sum(b["state"] == "forwarding" for b in self.outbound())
                      >= count, what=f"{count} bridges of {self.name} forwarding")

    def queue_depth(self, name: str) -> int:
        from meshmq.core.destinations import queue
        q = self.broker.queues.get(queue(name))
        return 0 if q is None else q.depth

    def consumers_on(self, name: str) -> int:
        """Consumers (local and network demand) on queue ``name``."""
        from meshmq.core.destinations import queue
        q = self.broker.queues.get(queue(name))
        return 0 if q is None else len(q.consumers)


class LoopStompClient(StompClient):
    """A ``StompClient`` whose frames reach the session inside the running loop: a
    broker linked to others reacts to a new consumer by scheduling interest updates."""

    broker: NetworkBroker

    def send_raw(self, data: bytes) -> None:
        self.broker.call(self.protocol.data_received, data)

    def drop(self) -> None:
        self.broker.call(self.transport.drop)

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        frame = super().connect(version, **headers)
        # Frames after CONNECTED escape their headers as the version says (an
        # ActiveMQ id's ':' comes as "\c"): read them as a client library would.
        self._parser.version = self.version
        return frame

    def bodies(self) -> list[str]:
        return [f.body.decode() for f in self.received() if f.command == "MESSAGE"]


class MemoryNetwork:
    """Brokers on one event loop, linked by their connectors over in-memory pipes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.brokers: dict[str, NetworkBroker] = {}
        # (dialing broker, target broker, the dialer's end, the target's end)
        self.pipes: list[tuple[str, str, MemoryPipe, MemoryPipe]] = []
        self._peer_ports = iter(range(20000, 40000))

    def add(self, name: str, *connectors: NetworkConnectorConfig, store: Store | None = None,
            **changes: Any) -> NetworkBroker:
        changes.setdefault("auth", LINK_AUTH)
        config = memory_config(broker_name=name, network_connectors=connectors, **changes)
        broker = NetworkBroker(self, config, store)
        self.brokers[name] = broker
        return broker

    def linked(self, **options: Any) -> tuple[NetworkBroker, NetworkBroker]:
        """Brokers A and B, A bridged to B by ``connector("B", **options)``, both
        started and A's bridge forwarding: ``(a, b)``."""
        b = self.add("B")
        a = self.add("A", connector("B", **options))
        self.start()
        a.wait_forwarding()
        return a, b

    def mesh(self, names: Sequence[str], **options: Any) -> dict[str, NetworkBroker]:
        """A broker for each of ``names``, each bridged to all the others by one static
        connector (``options`` its settings), all started and every bridge forwarding."""
        nodes = {n: self.add(n, connector("", uri="static:(" + ",".join(
            f"tcp://{o}:61616" for o in names if o != n) + ")", **options)) for n in names}
        self.start()
        for node in nodes.values():
            node.wait_forwarding(len(names) - 1)
        return nodes

    def restart(self, name: str, store: Store) -> NetworkBroker:
        """Start broker ``name`` again after ``stop()``: a new runtime on the same
        config over ``store`` (a new store on the files of a persistent one finds
        its messages again)."""
        old = self.brokers[name]
        assert old.stopped, f"{name} is still running"
        broker = NetworkBroker(self, old.config, store)
        self.brokers[name] = broker
        broker.start()
        return broker

    def start(self) -> None:
        for broker in self.brokers.values():
            if not broker.started.done():
                broker.start()

    async def dial(self, link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                   timeout: float, origin: str = "?") -> None:
        target = self.brokers.get(endpoint.host)
        if target is not None and not target.started.done() and not target.stopped:
            await asyncio.wait_for(asyncio.shield(target.started), timeout)
        if target is None or target.stopped or ctx is not None:
            link.connection_lost(None)
            raise ConnectionRefusedError(f"no broker {endpoint.host!r} in this network")
        inbound = target.runtime.network.accept(None)
        port = next(self._peer_ports)
        a = MemoryPipe(self.loop, link, (endpoint.host, endpoint.port))
        b = MemoryPipe(self.loop, inbound, ("127.0.0.1", port))
        a.peer, b.peer = b, a
        self.pipes.append((origin, endpoint.host, a, b))
        inbound.connection_made(b)  # type: ignore[arg-type]
        link.connection_made(a)  # type: ignore[arg-type]

    def cut(self, origin: str, target: str) -> int:
        """Break every open link ``origin`` dialed to ``target`` mid-stream (both ends
        see the connection lost); the number broken."""
        live = [a for o, t, a, b in self.pipes if (o, t) == (origin, target)
                and not (a.lost or b.lost)]
        for pipe in live:
            self.loop.call_soon(pipe.cut)
        return len(live)

    def wait_for(self, predicate: Any, timeout: float = 10.0, what: str = "the condition"
                 ) -> None:
        next(iter(self.brokers.values())).wait_for(predicate, timeout, what)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            for broker in self.brokers.values():
                broker.stop()
        finally:
            self.loop.run_until_complete(drain_loop())
            self.loop.close()


# Client steps the network tests share: a connected client on a broker, SUBSCRIBE, a
# persistent SEND.
def client(broker: NetworkBroker, **headers: str) -> LoopStompClient:
    c = broker.stomp()
    assert isinstance(c, LoopStompClient)
    frame = c.connect(**headers)
    assert frame.command == "CONNECTED", frame.body
    return c


def subscribe(c: StompClient, dest: str, sub_id: str = "1", ack: str = "auto",
              **headers: str) -> None:
    c.send("SUBSCRIBE", {"destination": dest, "id": sub_id, "ack": ack, **headers})


def send(c: StompClient, dest: str, body: str, **headers: str) -> None:
    c.send("SEND", {"destination": dest, "persistent": "true", **headers}, body.encode())


@contextlib.contextmanager
def memory_network() -> Iterator[MemoryNetwork]:
    network = MemoryNetwork()
    try:
        yield network
    finally:
        network.close()
