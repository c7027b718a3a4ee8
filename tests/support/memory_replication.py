"""Replicated master/slave nodes linked without sockets, on a clock the test moves.

``ReplicationNet`` runs real ``ReplicatedHa`` nodes (votes, elections, the master's
streams, the followers' journals, snapshots) on the test's event loop. Where a node
would listen and dial TCP, its links are pairs of ``MemoryPipe`` transports
(tests/support/memory_network.py) carrying the real wire bytes, served by the node's own
inbound link handler, as its listener would. Every node reads one ``ManualClock``: time
stands still until the test moves it, so no lease runs out and no election starts
behind the test's back.

A node is addressed ``<name>:7000``. ``down`` lists nodes that refuse connections;
``isolate`` also breaks the links they have open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from meshmq.config.model import BrokerConfig, HaConfig, StoreConfig
from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.ha.replication import ReplicatedHa
from meshmq.protocol.wire.codec import (
    MAGIC,
    FrameType,
    WireDecoder,
    WireFrame,
    decode_json,
    encode_json,
)
from meshmq.store.base import AddMessage
from tests.support.memory_network import MemoryPipe

PORT = 7000


def address(name: str) -> str:
    return f"{name}:{PORT}"


class ManualClock:
    """Milliseconds of a monotonic clock that moves only when told."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def node_config(root: Path, name: str, names: tuple[str, ...], *, witness: bool = False,
                **ha: Any) -> BrokerConfig:
    """Node ``name`` of a cluster of ``names`` (each its own data directory)."""
    table = HaConfig(mode="replicated", listen=address(name),
                     members=tuple(address(n) for n in names if n != name), node_id=name,
                     role="witness" if witness else "broker", lease_ms=1000,
                     keepalive_ms=100)
    return BrokerConfig(broker_name=name, data_directory=root / name,
                        store=StoreConfig(fsync=False),
                        ha=dataclasses.replace(table, **ha))


class _Listening:
    """What a node's replication listener is to ``stop()``."""

    def __init__(self, net: ReplicationNet, addr: str) -> None:
        self._net = net
        self._addr = addr

    def close(self) -> None:
        self._net.listening.discard(self._addr)

    async def wait_closed(self) -> None:
        return None


class MemoryNode(ReplicatedHa):
    """A ``ReplicatedHa`` whose listener and dialer are the net's in-memory links."""

    def __init__(self, net: ReplicationNet, config: BrokerConfig) -> None:
        super().__init__(config, on_lost=self._lost, clock=net.clock)
        self.net = net
        self.lost: list[str] = []
        self.task: asyncio.Task[bool] | None = None

    def _lost(self, why: str) -> None:
        self.lost.append(why)

    async def _listen(self, host: str, port: int) -> Any:
        addr = f"{host}:{port}"
        self.net.listening.add(addr)
        return _Listening(self.net, addr)

    async def _dial(self, host: str, port: int
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return self.net.connect(f"{host}:{port}", origin=self.node_id)


class ReplicationNet:
    def __init__(self, root: Path, clock: ManualClock | None = None) -> None:
        self.root = root
        self.clock = clock if clock is not None else ManualClock()
        self.nodes: dict[str, MemoryNode] = {}  # by address
        self.listening: set[str] = set()
        self.down: set[str] = set()
        self._pipes: list[tuple[str, str, MemoryPipe]] = []  # (origin, target, client end)
        self._links: list[Link] = []

    def add(self, config: BrokerConfig) -> MemoryNode:
        node = MemoryNode(self, config)
        self.nodes[config.ha.listen] = node
        return node

    def cluster(self, names: tuple[str, ...], witnesses: tuple[str, ...] = (),
                **ha: Any) -> dict[str, MemoryNode]:
        return {n: self.add(node_config(self.root, n, names, witness=n in witnesses, **ha))
                for n in names}

    def link(self, name: str) -> Link:
        """A link from the test to node ``name`` (closed by ``stop``)."""
        link = Link(*self.connect(address(name)))
        self._links.append(link)
        return link

    def connect(self, addr: str, origin: str = "test"
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new link to the node at ``addr``, served by its inbound link handler."""
        target = self.nodes.get(addr)
        name = addr.partition(":")[0]
        if target is None or addr not in self.listening or name in self.down \
                or origin in self.down:
            raise ConnectionRefusedError(f"{addr} refuses connections")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        client = asyncio.StreamReaderProtocol(reader)
        server = asyncio.StreamReaderProtocol(asyncio.StreamReader(), target._serve)
        client_end = MemoryPipe(loop, client, ("127.0.0.1", PORT))
        server_end = MemoryPipe(loop, server, ("127.0.0.1", 50000 + len(self._pipes)))
        client_end.peer, server_end.peer = server_end, client_end
        server.connection_made(server_end)  # type: ignore[arg-type]
        client.connection_made(client_end)  # type: ignore[arg-type]
        self._pipes.append((origin, name, client_end))
        writer = asyncio.StreamWriter(client_end, client, reader, loop)  # type: ignore[arg-type]
        return reader, writer

    def isolate(self, *names: str) -> None:
        """These nodes refuse new links, and their open links break."""
        self.down.update(names)
        for origin, target, pipe in self._pipes:
            if (origin in names or target in names) and not pipe.lost:
                pipe.cut()

    def heal(self, *names: str) -> None:
        self.down.difference_update(names)

    async def start(self, *nodes: MemoryNode) -> None:
        for node in nodes:
            node.task = asyncio.get_running_loop().create_task(node.acquire())
        await until(lambda: all(n.role.value != "starting" for n in nodes),
                    "the nodes to start")

    async def stop(self) -> None:
        """Stop every started node. Time moves meanwhile (a lease per 200 ms), so waits
        bounded by a lease, such as a master's handover, end."""
        async def tick() -> None:
            while True:
                await asyncio.sleep(0.01)
                self.clock.advance(50)

        ticking = asyncio.get_running_loop().create_task(tick())
        try:
            await self._stop_nodes()
        finally:
            ticking.cancel()

    async def _stop_nodes(self) -> None:
        for node in self.nodes.values():
            if node.task is None:
                continue
            if node.role.value != "stopped":
                await node.stop()
            await asyncio.gather(node.task, return_exceptions=True)
        for link in self._links:
            link.writer.close()
        for _, _, pipe in self._pipes:  # inbound links still open end at EOF
            pipe.close()
        for _ in range(5):
            await asyncio.sleep(0)


async def until(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Yield to the loop until ``pred()`` holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


# What a test runs once its nodes are up: ``body(net, nodes by name)``.
Body = Callable[[ReplicationNet, dict[str, MemoryNode]], Awaitable[None]]


def add(i: int) -> AddMessage:
    """The store op that adds persistent message ``m<i>`` to queue ``q`` at sequence ``i``."""
    m = Message(message_id=f"m{i}", destination=dst.queue("q"), body=b"body %d" % i,
                persistent=True)
    return AddMessage(m, (("queue://q", i),))


def hello(**extra: Any) -> bytes:
    """The bytes that open a replication link: magic and HELLO."""
    return MAGIC + encode_json(FrameType.HELLO, {"replication": 1, "node": "test", **extra})


class Link:
    """The test's end of a link to a node: send frames, read its answers in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = WireDecoder(expect_magic=False)
        self._frames: list[WireFrame] = []

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))

    async def frame(self, timeout: float = 10.0) -> WireFrame | None:
        """The next frame from the node, or None once it closed the link."""
        async with asyncio.timeout(timeout):
            while not self._frames:
                data = await self.reader.read(1 << 16)
                if not data:
                    return None
                self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    async def json(self, ftype: FrameType) -> dict[str, Any]:
        """The next frame, which must be of type ``ftype``, as JSON."""
        frame = await self.frame()
        assert frame is not None, f"the link closed instead of a {ftype.name}"
        assert frame.type is ftype, (frame.type, frame.payload[:200])
        return decode_json(frame)
