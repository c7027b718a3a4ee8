"""A node of shards as the interop suite's broker: the same client fixtures and the same
MQTT environment, every client through the node's one port (the kernel spreads the
connections over the shards, so a producer and its consumer are often on different
shards). The node runs as a user's would, with connection handoff on: a connection whose
first SEND or SUBSCRIBE names the other shard's destination moves to that shard, and what
it does later with other destinations crosses (tests/network and tests/node test the
crossings with handoff off). A test reads the node only through its ports and its log,
never one broker's internals; those that must are marked ``one_broker`` in tests/interop.
"""

from __future__ import annotations

import errno
import itertools
import re
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
import stomp

from tests.interop.mqtt_helpers import MqttEnv, Paho, RawMqtt, WsStomp
from tests.interop.stomp_helpers import Client
from tests.support.brokers import ProcessBroker
from tests.support.mqtt_client_ops import ErrorLog
from tests.support.nodes import NodeProcess, shard_of, write_node_toml
from tests.support.raw_stomp import uid

T = TypeVar("T")

SHARDS = 2
# What the interop suite's MQTT environment has on one broker: STOMP, MQTT, WebSocket.
NODE_LISTENERS = ('[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                  '[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:0"\n\n'
                  '[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n')
# A line the node logged at ERROR or worse, or an exception's traceback.
_ERROR_LINE = re.compile(r"^.*(?: ERROR | CRITICAL |Traceback \(most recent).*$", re.MULTILINE)


def start_node(tmp: Path, extra_toml: str = "") -> NodeProcess:
    """A ``meshmq broker --shards 2`` subprocess with the interop listeners, kept across
    tests (the caller stops it: it is not in ``ProcessBroker.running``)."""
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", shards=SHARDS,
                             listeners=NODE_LISTENERS, extra=extra_toml, handoff=True)
    node = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(node)  # outlives each test; the module's fixture stops it
    return node


def module_node(tmp: Path, extra_toml: str = "") -> Iterator[NodeProcess]:
    """Body of a module-scoped fixture: one node for every test of a module."""
    node = start_node(tmp, extra_toml)
    try:
        yield node
    finally:
        node.terminate()


def _reset_close(sock: socket.socket) -> None:
    """Close with a TCP reset: no TIME_WAIT, so the local port is free again at once."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _ws_handshake(sock: socket.socket, port: int, frame: bytes) -> None:
    """STOMP CONNECT over WebSocket with websockets' sans-I/O client on ``sock`` itself:
    no reader thread holds the socket, so the reset close that follows frees its port
    at once (the threaded client's reader kept it open, or closed it gracefully into
    TIME_WAIT, and the next client could not bind the port)."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame
    from websockets.http11 import Response
    from websockets.typing import Subprotocol
    from websockets.uri import parse_uri

    ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"),
                        subprotocols=[Subprotocol("v12.stomp")])
    ws.send_request(ws.connect())
    sock.sendall(b"".join(ws.data_to_send()))
    upgraded = False
    while True:
        data = sock.recv(65536)
        assert data, "the node closed the WebSocket connection"
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Response):
                assert event.status_code == 101, f"no upgrade: {event.status_code}"
                upgraded = True
                ws.send_text(frame)
                sock.sendall(b"".join(ws.data_to_send()))
            elif isinstance(event, Frame):
                assert upgraded and bytes(event.data).startswith(b"CONNECTED"), event
                return


def _handshake(listener: str, sock: socket.socket, port: int) -> None:
    """Open a session on ``sock`` (a shard lists a connection once it has one)."""
    if listener == "mqtt":
        from meshmq.protocol.mqtt import Connect, encode

        sock.sendall(encode(Connect(client_id=uid("placing"), keep_alive=0,
                                    protocol_level=4), 4))
        assert sock.recv(4)[:1] == b"\x20", "no CONNACK"
        return
    frame = b"CONNECT\naccept-version:1.2\nhost:node\n\n\x00"
    if listener == "ws":
        _ws_handshake(sock, port, frame)
        return
    sock.sendall(frame)
    reply = b""
    while b"\x00" not in reply:
        chunk = sock.recv(4096)
        assert chunk, f"the node closed the connection: {reply!r}"
        reply += chunk


class ShardPlacer:
    """Source ports whose connections the kernel hands to a chosen shard, so that a
    test's clients take turns over the shards (its first on shard 0, its second on shard
    1, ...) whatever the kernel's hash: a producer and the consumer made after it are on
    different shards on every run. The kernel picks a listening socket of the
    ``SO_REUSEPORT`` group by a hash of the connection's addresses and ports, so a source
    port that reached shard k once reaches it again while the shards stay up. A port is
    found by trying: connect, open a session, ask the shards who has it, reset."""

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self._turn = itertools.count()

    def next_port(self, listener: str) -> int:
        """A source port for the next client on ``listener`` (stomp, mqtt, ws)."""
        return self.port_on(next(self._turn) % SHARDS, listener)

    def placed(self, listener: str, make: Callable[[int], T], tries: int = 3) -> T:
        """``make(source_port)`` for the next client on ``listener``. The port is free
        when placed, but any process's outgoing connection may take it before ``make``
        binds it (EADDRINUSE): then another port is placed, on the same shard."""
        shard = next(self._turn) % SHARDS
        for _ in range(tries - 1):
            try:
                return make(self.port_on(shard, listener))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        return make(self.port_on(shard, listener))

    def port_on(self, shard: int, listener: str, tries: int = 64) -> int:
        port = self.node.ports[listener]
        for _ in range(tries):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.bind(("127.0.0.1", 0))
                sock.connect(("127.0.0.1", port))
                _handshake(listener, sock, port)
                reached = shard_of(self.node, sock)
                source = int(sock.getsockname()[1])
            finally:
                _reset_close(sock)
            if reached == shard:
                return source
        raise AssertionError(f"{tries} source ports and none reached shard {shard}")


class NodeTarget:
    """Where the STOMP client fixtures connect (``host``, ``port``) when the broker is a
    node; ``errors()`` are the node's logged errors since this test began."""

    host = "127.0.0.1"

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self._offset = node.log_path.stat().st_size
        self.placer = ShardPlacer(node)

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def ports(self) -> dict[str, int]:
        return self.node.ports

    def errors(self) -> list[str]:
        with open(self.node.log_path, "rb") as f:
            f.seek(self._offset)
            text = f.read().decode(errors="replace")
        return _ERROR_LINE.findall(text)

    def check_alive(self) -> None:
        """The supervisor runs and every shard is up (no shard died meanwhile)."""
        assert self.node.proc is not None and self.node.proc.poll() is None, "the node exited"
        rows = self.node.shards()
        assert [r["state"] for r in rows] == ["running"] * SHARDS, rows
        assert all(r["restarts"] == 0 for r in rows), rows


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def stomp_client(target: NodeTarget, version: str = "1.2", *, connect: bool = True,
                 **kw: Any) -> Client:
    """A stomp.py client on the node's next shard. stomp.py binds its source port in
    ``connect()`` and reports a failed bind as a failed connection: when the port is
    found taken after such a failure, another is placed (``ShardPlacer.placed``). A
    client made unconnected binds when the test connects it, later, and keeps that
    (small) window."""
    if "source_port" in kw or not connect:
        kw.setdefault("source_port", target.placer.next_port("stomp"))
        return Client(target, version, connect=connect, **kw)

    def make(port: int) -> Client:
        client = Client(target, version, connect=False, source_port=port, **kw)
        try:
            client.connect()
        except stomp.exception.ConnectFailedException:
            if _port_taken(port):
                raise OSError(errno.EADDRINUSE, f"source port {port} taken") from None
            raise
        return client

    return target.placer.placed("stomp", make)


class NodeMqttEnv(MqttEnv):
    """:class:`MqttEnv` on a running node: the same client factories on the node's
    ports; ``close`` fails the test if the node logged an error meanwhile."""

    def __init__(self, node: NodeProcess) -> None:
        self.target = NodeTarget(node)
        self.broker = self.target  # type: ignore[assignment] - what Client() connects to
        self.errors = ErrorLog()
        self._closers = []

    @property
    def runtime(self) -> NoReturn:
        raise AssertionError("a node has no in-process runtime: mark the test one_broker")

    @property
    def mqtt_port(self) -> int:
        return self.target.ports["mqtt"]

    @property
    def ws_port(self) -> int:
        return self.target.ports["ws"]

    def raw(self, level: int = 4) -> RawMqtt:
        r = self.target.placer.placed(
            "mqtt", lambda port: RawMqtt(self.mqtt_port, level, source_port=port))
        r.suback_first = False  # see MqttClientOps.suback_first
        self._closers.append(r.close)
        return r

    def paho(self, level: int = 5, **kw: Any) -> Paho:
        listener = "ws" if kw.get("transport") == "websockets" else "mqtt"
        if "bind_port" in kw:
            return super().paho(level, **kw)
        return self.target.placer.placed(
            listener, lambda port: super(NodeMqttEnv, self).paho(level, bind_port=port, **kw))

    def stomp(self, version: str = "1.2", **kw: Any) -> Client:
        c = stomp_client(self.target, version, **kw)
        self._closers.append(c.disconnect)
        return c

    def ws_stomp(self, login: str | None = None, passcode: str | None = None) -> WsStomp:
        w = self.target.placer.placed("ws", lambda port: WsStomp(
            self.ws_port, login=login, passcode=passcode, source_port=port))
        self._closers.append(w.close)
        return w

    def durables(self, client_id: str) -> Any:
        raise AssertionError("a node's durables are per shard: mark the test one_broker")

    def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:
                pass
        errors = self.target.errors()
        assert errors == [], f"the node logged errors: {errors}"
        self.target.check_alive()


def make_env(request: pytest.FixtureRequest, topology: str, data_dir: Path,
             **config: Any) -> MqttEnv:
    """The MQTT environment of the test's ``topology`` (tests/interop/conftest.py): one
    broker made with ``config``, or the module's node (``interop_node``, configured by
    the module's ``NODE_TOML``)."""
    if topology == "node":
        return NodeMqttEnv(request.getfixturevalue("interop_node"))
    return MqttEnv(data_dir, **config)
