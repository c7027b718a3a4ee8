"""A sharded node (``meshmq broker --shards N``) as a real subprocess: its supervisor's
ports and management endpoint read from its log, its shards' processes from
``/api/shards``, and a raw STOMP connection to see which shard a client reached."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.interop.mqtt_helpers import RawMqtt
from tests.interop.stomp_helpers import Address, RawClient
from tests.support.brokers import ProcessBroker, poll

_NODE_STARTED = re.compile(r"meshmq node '[^']*' started: \d+ shards on (.*)")
_NODE_PORT = re.compile(r"(\S+)://([\d.]+):(\d+)")
_MANAGEMENT = re.compile(r"management endpoint of the node on https?://[\d.]+:(\d+)/")


def write_node_toml(path: Path, *, data: Path, shards: int = 2, listeners: str = "",
                    extra: str = "", handoff: bool = False) -> Path:
    """A node of ``shards`` shards: one STOMP listener (or ``listeners``, TOML
    [[listeners]] tables) and management on ports the OS picks, no fsync.

    Connection handoff to the owning shard is off unless ``handoff``: the node tests
    place clients on chosen shards to test what crosses between them."""
    listeners = listeners or '[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n'
    setting = f"handoff = {'true' if handoff else 'false'}\n"
    if "[shards]\n" in extra:
        extra = extra.replace("[shards]\n", "[shards]\n" + setting, 1)
    else:
        extra += "\n[shards]\n" + setting
    path.write_text(f'[broker]\nname = "node"\ndata_directory = "{data}"\nshards = {shards}\n\n'
                    f"{listeners}\n[management]\nhost = \"127.0.0.1\"\nport = 0\n\n"
                    f"[store]\nfsync = false\n{extra}")
    return path


def plain_module_node(tmp: Path, *, listeners: str = "", handoff: bool = False
                      ) -> Iterator[NodeProcess]:
    """Body of a module-scoped fixture: one node of ``write_node_toml``'s defaults (or
    these ``listeners`` and ``handoff``) for every test of a module (the fixture stops
    it, not the per-test cleanup)."""
    config = write_node_toml(tmp / "node.toml", data=tmp / "data", listeners=listeners,
                             handoff=handoff)
    node = NodeProcess(config, tmp / "node.log").start()
    ProcessBroker.running.discard(node)
    try:
        yield node
    finally:
        node.terminate()


class NodeProcess(ProcessBroker):
    """A node's supervisor as a subprocess; ``ports`` by listener protocol once started."""

    def start(self, timeout: float = 60.0) -> NodeProcess:
        self._begin()
        poll(self._ready, timeout, "the node to start")
        return self

    def _begin(self) -> None:
        import subprocess
        import sys

        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
             str(self.config_path), *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        ProcessBroker.running.add(self)

    def _ready(self) -> bool:
        assert self.proc is not None
        text = self.log_path.read_text(errors="replace")[self._offset:]
        if self.proc.poll() is not None:
            raise AssertionError(f"node exited with {self.proc.returncode}:\n{text}")
        started = _NODE_STARTED.search(text)
        management = _MANAGEMENT.search(text)
        if started is None or management is None:
            return False
        for protocol, _host, port in _NODE_PORT.findall(started.group(1)):
            self.ports[protocol] = int(port)
        self.ports["management"] = int(management.group(1))
        return True

    def api(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.ports['management']}{path}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def shards(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.api("/api/shards")["shards"]
        return rows

    def handoffs(self) -> dict[str, int]:
        """The node's connection handoff counters, summed over its shards."""
        total: dict[str, int] = {}
        for row in self.shards():
            counters: dict[str, Any] = row.get("handoffs") or {}
            for key, value in counters.items():
                total[key] = total.get(key, 0) + int(value)
        return total

    def shard_pids(self) -> list[int]:
        return [row["pid"] for row in self.shards() if row["pid"] is not None]


def shard_api(node: NodeProcess, shard: int, path: str) -> Any:
    """One shard's own management answer, through its Unix socket."""
    import http.client

    sock_path = node.shards()[shard]["management_socket"]

    class _Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(sock_path)

    conn = _Unix("shard")
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def pid_gone(pid: int) -> bool:
    """The process has exited with all its threads (gone, or a zombie nobody has reaped
    yet). A main thread killed first shows as a zombie while its other threads still
    run and hold its files: its listening sockets still take connections, which the
    kernel resets when the last thread closes them."""
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        threads = os.listdir(proc / "task")
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z" and threads == [str(pid)]


def stomp_connect(port: int, wrap: Any = None) -> socket.socket:
    """A STOMP connection that got CONNECTED (``wrap``: a TLS wrapper for the socket)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if wrap is not None:
        sock = wrap(sock)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:node\n\n\x00")
    reply = b""
    while b"\x00" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"the node closed the connection: {reply!r}")
        reply += chunk
    assert reply.startswith(b"CONNECTED"), reply
    return sock


def shard_of(node: NodeProcess, sock: socket.socket) -> int:
    """Which shard serves the client connection on ``sock``: the one that lists its
    address among its connections (the kernel chose it when it connected)."""
    port = sock.getsockname()[1]

    def find() -> int | None:
        for k in range(len(node.shards())):
            for conn in shard_api(node, k, "/api/connections")["connections"]:
                if str(conn["address"]).endswith(f":{port}"):
                    return k + 1  # truthy for poll
        return None

    return poll(find, 20, f"a shard to list the connection from port {port}") - 1


def stomp_on(node: NodeProcess, shard: int, tries: int = 64) -> RawClient:
    """A connected raw STOMP client that the node's port handed to ``shard``: new
    connections until the kernel's hash picks it (each is one in two with 2 shards)."""
    for _ in range(tries):
        client = RawClient(Address(node.port))
        client.connect()
        if shard_of(node, client.sock) == shard:
            return client
        client.close()
    raise AssertionError(f"{tries} connections and none reached shard {shard}")


def mqtt_on(node: NodeProcess, shard: int, client_id: str, tries: int = 64) -> RawMqtt:
    """A connected raw MQTT client (clean session) on ``shard``, as ``stomp_on``."""
    for _ in range(tries):
        client = RawMqtt(node.ports["mqtt"])
        client.suback_first = False  # see MqttClientOps.suback_first
        client.connect(client_id)
        if shard_of(node, client.sock) == shard:
            return client
        client.close()
    raise AssertionError(f"{tries} connections and none reached shard {shard}")
