"""The failover client (``meshmq.client``) against real brokers without sockets.

``ClientDialer`` is a client dialer (``FailoverClient(dialer=...)``) that reaches the
brokers of a ``MemoryNetwork`` by host name: ``stomp://a:61613`` is broker ``a``'s real
STOMP session (``mqtt://a`` its MQTT session) over a pair of ``MemoryPipe``s, with the
client's own asyncio streams, codecs and failover logic on top. ``refuse(host)`` makes
dials to a host fail as a closed port does; ``cut(host)`` breaks every open connection
to it mid-stream, as a pulled cable or a killed broker would. A host can also be served
by a ``ScriptedStompPeer``: a stand-in broker that answers CONNECT and receipts, and
whose script decides, frame by frame, to answer, stay silent or break the connection.
``aliases`` give a broker more host names, so that one client's connections can be
cut apart from another's.

Everything runs on the network's loop in the test's thread: ``run(network, coro)``.
Real sockets, TLS, WebSocket upgrades and processes killed with SIGKILL stay in
tests/client.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from meshmq.client.options import Endpoint
from meshmq.client.types import Event, EventKind
from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from tests.support.memory_network import MemoryNetwork, MemoryPipe

T = TypeVar("T")

#: What a scripted peer does with a frame: answer (CONNECTED / RECEIPT), stay silent,
#: break the connection without answering, or refuse it (an ERROR naming the frame's
#: receipt, then the connection is closed, as a STOMP broker does).
Reaction = Literal["answer", "silent", "drop", "error"]
Script = Callable[[Frame, int], Reaction]


def run(network: MemoryNetwork, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the network's loop (brokers and clients share it)."""
    return network.loop.run_until_complete(coro)


async def until(predicate: Callable[[], object], timeout: float = 5.0,
                what: str = "the condition") -> None:
    """Let the loop run until ``predicate()`` holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.001)  # polled with a deadline


def kinds(events: list[Event]) -> list[EventKind]:
    return [e.kind for e in events]


@dataclass
class ScriptedStompPeer:
    """A STOMP broker stand-in. Every connection to it shares ``frames`` (what it
    received, in order, with the number of the connection, from 1) and
    ``connections``; ``script(frame, connection number)`` decides per frame (default:
    answer)."""

    script: Script = field(default=lambda frame, n: "answer")
    frames: list[tuple[int, Frame]] = field(default_factory=list)
    connections: int = 0
    error_message: str | None = None  # an ERROR's message (default: "<COMMAND> refused")
    error_headers: list[tuple[str, str]] = field(default_factory=list)  # an ERROR's others

    def commands(self, connection: int | None = None) -> list[str]:
        """The commands received (on one connection, or on all)."""
        return [f.command for n, f in self.frames if connection in (None, n)]

    def received(self, command: str) -> list[Frame]:
        return [f for _, f in self.frames if f.command == command]

    def protocol(self) -> asyncio.Protocol:
        self.connections += 1
        return _PeerProtocol(self, self.connections)


class _PeerProtocol(asyncio.Protocol):
    def __init__(self, peer: ScriptedStompPeer, number: int) -> None:
        self.peer = peer
        self.number = number
        self.parser = StompParser(version="1.2")
        self.transport: MemoryPipe | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, MemoryPipe)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for frame in self.parser.feed(data):
            if self.transport.lost:
                return
            self.peer.frames.append((self.number, frame))
            reaction = self.peer.script(frame, self.number)
            if reaction == "drop":
                self.transport.cut()
                return
            if reaction == "silent":
                continue
            if reaction == "error":
                headers = [("message", self.peer.error_message
                            or f"{frame.command} refused")]
                headers += self.peer.error_headers
                if receipt := frame.get("receipt"):
                    headers.append(("receipt-id", receipt))
                self.transport.write(encode_frame("ERROR", headers, version="1.2"))
                self.transport.close()
                return
            if frame.command in ("CONNECT", "STOMP"):
                self.transport.write(encode_frame(
                    "CONNECTED", [("version", "1.2"), ("heart-beat", "0,0")]))
            elif receipt := frame.get("receipt"):
                self.transport.write(encode_frame("RECEIPT", [("receipt-id", receipt)],
                                                  version="1.2"))


class ClientDialer:
    """Dials ``network``'s brokers (and scripted peers) by the endpoint's host name."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.refused: set[str] = set()
        self.peers: dict[str, ScriptedStompPeer] = {}
        # Other names of a broker: connections dialed by an alias can be cut or refused
        # apart from those dialed by the broker's own name.
        self.aliases: dict[str, str] = {}
        self.dials: list[str] = []  # the host of every dial, in order
        self.open: list[tuple[str, MemoryPipe]] = []  # (host, the client's end)
        self._ports = itertools.count(50000)

    def refuse(self, *hosts: str) -> None:
        self.refused.update(hosts)

    def accept(self, *hosts: str) -> None:
        self.refused.difference_update(hosts)

    def cut(self, host: str) -> int:
        """Break every open connection to ``host`` (both ends see it lost, bytes in
        flight are gone); how many were open."""
        live = [pipe for h, pipe in self.open if h == host and not pipe.lost]
        for pipe in live:
            pipe.cut()
        return len(live)

    def connected_to(self, host: str) -> int:
        return sum(1 for h, pipe in self.open if h == host and not pipe.lost)

    async def __call__(self, endpoint: Endpoint, tls: ssl.SSLContext | None
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await asyncio.sleep(0)  # a connect never completes within the call
        host = endpoint.host
        self.dials.append(host)
        server = self._server(endpoint, tls)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        client_end = MemoryPipe(loop, protocol, (host, endpoint.port))
        server_end = MemoryPipe(loop, server, ("127.0.0.1", next(self._ports)))
        client_end.peer, server_end.peer = server_end, client_end
        self.open.append((host, client_end))
        server.connection_made(server_end)  # type: ignore[arg-type]
        protocol.connection_made(client_end)  # type: ignore[arg-type]
        return reader, asyncio.StreamWriter(client_end, protocol, reader, loop)  # type: ignore[arg-type]

    def _server(self, endpoint: Endpoint, tls: ssl.SSLContext | None) -> asyncio.Protocol:
        host = endpoint.host
        if host in self.refused:
            raise ConnectionRefusedError("connection refused")
        if tls is not None:
            raise ConnectionRefusedError("no TLS without sockets")
        peer = self.peers.get(host)
        if peer is not None:
            return peer.protocol()
        broker = self.network.brokers.get(self.aliases.get(host, host))
        if broker is None or broker.stopped:
            raise ConnectionRefusedError("connection refused")
        if endpoint.protocol == "mqtt":
            from meshmq.transport.mqtt_server import MqttProtocol
            return MqttProtocol(broker.runtime, None)
        from meshmq.transport.stomp_server import StompProtocol
        return StompProtocol(broker.runtime, None)
