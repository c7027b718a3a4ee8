"""A node of two shards as real processes: one port for both (SO_REUSEPORT), a shard
killed with SIGKILL is restarted while the port keeps answering, the shards never
outlive their supervisor, and refusals are one line."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect as ws_connect

from tests.support.brokers import ProcessBroker, poll
from tests.support.nodes import (
    NodeProcess,
    pid_gone,
    shard_api,
    stomp_connect,
    write_node_toml,
)
from tests.support.pki import Pki

pytestmark = pytest.mark.slow

CONNECTIONS = 24


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    config = write_node_toml(tmp_path / "node.toml", data=tmp_path / "data")
    n = NodeProcess(config, tmp_path / "node.log").start()
    try:
        yield n
    finally:
        n.terminate()


def _per_shard(node: NodeProcess, total: int) -> list[int] | None:
    counts = [row["connections"] or 0 for row in node.shards()]
    return counts if sum(counts) == total else None


def test_connections_to_one_port_land_on_both_shards(node: NodeProcess) -> None:
    socks = [stomp_connect(node.port) for _ in range(CONNECTIONS)]
    try:
        counts = poll(lambda: _per_shard(node, CONNECTIONS), 20, "every connection counted")
        # The kernel hashes each connection to one of the two listening shards: all 24
        # on one would happen once in 2**23 runs.
        assert all(c > 0 for c in counts), counts
        stat = node.api("/api/stat")
        assert stat["connections"] == CONNECTIONS
        assert [s["state"] for s in stat["shards"]] == ["up", "up"]
        assert node.api("/api/broker")["connections"] == CONNECTIONS
        shown = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                                f"127.0.0.1:{node.ports['management']}"],
                               check=False, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert f"broker node  connections {CONNECTIONS}" in shown.stdout
        assert "shards 2  up 2  placement hash\n" in shown.stdout
    finally:
        for s in socks:
            s.close()


def test_a_killed_shard_is_restarted_and_the_port_answers_meanwhile(
        node: NodeProcess) -> None:
    before = node.shards()
    victim = before[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    poll(lambda: pid_gone(victim), 10, "shard 1 to die")  # with every thread: see pid_gone

    def restarted() -> list[dict[str, Any]] | None:
        # While shard 1 is down or restarting, every new connection reaches shard 0.
        stomp_connect(node.port).close()
        rows = node.shards()
        return rows if rows[1]["state"] == "running" and rows[1]["pid"] not in (
            victim, None) else None

    rows = poll(restarted, 30, "shard 1 to be restarted")
    assert rows[1]["restarts"] == 1 and rows[1]["last_exit"] == "killed by SIGKILL"
    assert rows[0]["pid"] == before[0]["pid"] and rows[0]["restarts"] == 0
    # The restarted shard takes connections again.
    socks = [stomp_connect(node.port) for _ in range(CONNECTIONS)]
    try:
        counts = poll(lambda: _per_shard(node, CONNECTIONS), 20, "every connection counted")
        assert counts[1] > 0, counts
    finally:
        for s in socks:
            s.close()


def test_shards_exit_when_the_supervisor_is_killed(node: NodeProcess) -> None:
    pids = node.shard_pids()
    assert len(pids) == 2
    node.kill9()
    poll(lambda: all(pid_gone(p) for p in pids), 20, "the shards to exit")


def test_sigterm_stops_every_shard_and_exits_0(node: NodeProcess) -> None:
    pids = node.shard_pids()
    assert node.terminate() == 0
    assert all(pid_gone(p) for p in pids)
    assert "meshmq node 'node' stopped" in node.log_path.read_text()


def test_tls_and_websocket_listeners_are_shared_by_the_shards(tmp_path: Path,
                                                               pki: Pki) -> None:
    cert, key = pki.broker("a")
    listeners = (f'[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                 f'[[listeners]]\nname = "tls"\nurl = "stomp+ssl://127.0.0.1:0"\n'
                 f'ssl_certfile = "{cert}"\nssl_keyfile = "{key}"\n\n'
                 f'[[listeners]]\nname = "ws"\nurl = "ws://127.0.0.1:0"\n\n'
                 f'[[listeners]]\nname = "links"\nurl = "tcp://127.0.0.1:0"\n'
                 "allow_anonymous_links = true\n")
    config = write_node_toml(tmp_path / "node.toml", data=tmp_path / "data",
                             listeners=listeners)
    node = NodeProcess(config, tmp_path / "node.log").start()
    client_tls = ssl.create_default_context(cafile=str(pki.ca))
    client_tls.check_hostname = False
    opened: list[Any] = []
    try:
        for _ in range(CONNECTIONS):
            opened.append(stomp_connect(node.ports["stomp+ssl"], client_tls.wrap_socket))
        counts = poll(lambda: _per_shard(node, CONNECTIONS), 20, "TLS connections counted")
        assert all(c > 0 for c in counts), counts
        for _ in range(CONNECTIONS):
            ws = ws_connect(f"ws://127.0.0.1:{node.ports['ws']}/",
                            subprotocols=["v12.stomp"], open_timeout=10)
            ws.send("CONNECT\naccept-version:1.2\nhost:node\n\n\x00")
            assert str(ws.recv(timeout=10)).startswith("CONNECTED")
            opened.append(ws)
        counts = poll(lambda: _per_shard(node, 2 * CONNECTIONS), 20,
                      "WebSocket connections counted")
        assert all(c > CONNECTIONS // 4 for c in counts), counts
        # Broker links are the front shard's alone.
        log = node.log_path.read_text()
        assert "[shard 0] listening for links on tcp://127.0.0.1:" in log
        assert "[shard 1] listening for links" not in log
        socket.create_connection(("127.0.0.1", node.ports["tcp"]), timeout=10).close()
    finally:
        for conn in opened:
            conn.close()
        node.terminate()


def test_only_the_front_shard_runs_network_connectors(tmp_path: Path) -> None:
    extra = ('\n[[network_connectors]]\nname = "out"\n'
             'uri = "static:(tcp://127.0.0.1:9)"\n')
    config = write_node_toml(tmp_path / "node.toml", data=tmp_path / "data", extra=extra)
    node = NodeProcess(config, tmp_path / "node.log").start()
    try:
        front = shard_api(node, 0, "/api/stat")["network"]["bridges"]
        other = shard_api(node, 1, "/api/stat")["network"]["bridges"]
        assert [b["name"] for b in front] == ["out:tcp://127.0.0.1:9"] and other == []
    finally:
        node.terminate()


def _meshmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", "broker", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("meshmq")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("value", ["0", "many", "999"])
def test_a_wrong_shards_flag_is_one_line_naming_it(tmp_path: Path, value: str) -> None:
    result = _meshmq("--shards", value, "--data", str(tmp_path / "data"))
    assert result.returncode == 2
    line = _error_line(result)
    assert "--shards" in line and '"auto"' in line, line


def test_a_wrong_shards_option_is_one_line_naming_it(tmp_path: Path) -> None:
    config = write_node_toml(tmp_path / "node.toml", data=tmp_path / "data")
    config.write_text(config.read_text().replace("shards = 2", 'shards = "lots"'))
    result = _meshmq("--config", str(config))
    assert result.returncode == 2
    line = _error_line(result)
    assert "node.toml:4" in line and "'broker.shards'" in line, line


def test_two_shards_on_a_one_process_store_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_node_toml(tmp_path / "node.toml", data=data, shards=1)
    plain = ProcessBroker(config, tmp_path / "plain.log").start()
    assert plain.terminate() == 0
    result = _meshmq("--config", str(config), "--shards", "2")
    assert result.returncode == 1
    line = _error_line(result)
    assert "one-process store" in line and "shards = 1" in line, line
    assert not (data / "shards.json").exists() and not (data / "shard-0").exists()


def test_a_shard_that_cannot_start_fails_the_node_with_its_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    listeners = (f'[[listeners]]\nname = "tls"\nurl = "stomp+ssl://127.0.0.1:0"\n'
                 f'ssl_certfile = "{missing}"\n')
    config = write_node_toml(tmp_path / "node.toml", data=tmp_path / "data",
                             listeners=listeners)
    result = _meshmq("--config", str(config))
    assert result.returncode == 2  # as one broker reports a configuration error
    line = _error_line(result)
    assert "listeners[0].ssl_certfile" in line and str(missing) in line, line
    assert "meshmq node 'node' stopped" in result.stderr
