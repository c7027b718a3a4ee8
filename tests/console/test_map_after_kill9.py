"""The network map across a real crash: two `meshmq broker` subprocesses joined by a
bridge; the far one is killed with SIGKILL, and the map of the near one shows it
unreachable and the bridge down, then both back once it restarts on the same ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.management.http import get
from tests.support.brokers import ProcessBroker, poll
from tests.support.ports import free_port

pytestmark = pytest.mark.slow


def _toml(path: Path, name: str, data: Path, *, tcp: int, mgmt: int, extra: str = "") -> Path:
    path.write_text(f'''[broker]
name = "{name}"
data_directory = "{data}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"

[[listeners]]
name = "tcp"
url = "tcp://127.0.0.1:{tcp}"
allow_anonymous_links = true

[management]
host = "127.0.0.1"
port = {mgmt}
{extra}''')
    return path


def _edge_state(view: dict[str, Any]) -> str | None:
    """The A→B edge's state; None while A's bridge has not yet met B (before its first
    handshake the edge is named by B's URI)."""
    states = [e["state"] for e in view["edges"] if (e["from"], e["to"]) == ("A", "B")]
    assert len(states) <= 1
    return states[0] if states else None


def _node(view: dict[str, Any], name: str) -> dict[str, Any]:
    (node,) = [n for n in view["nodes"] if n["broker"] == name]
    return node


def test_the_map_shows_a_killed_broker_and_its_return(tmp_path: Path) -> None:
    b_tcp, b_mgmt, a_mgmt = free_port(), free_port(), free_port()
    b_conf = _toml(tmp_path / "b.toml", "B", tmp_path / "b", tcp=b_tcp, mgmt=b_mgmt)
    a_conf = _toml(tmp_path / "a.toml", "A", tmp_path / "a", tcp=0, mgmt=a_mgmt, extra=f'''
[[network_connectors]]
name = "to-b"
uri = "static:(tcp://127.0.0.1:{b_tcp})"
initial_reconnect_delay_ms = 50
max_reconnect_delay_ms = 300
heartbeat_ms = 500
''')
    b = ProcessBroker(b_conf, tmp_path / "b.log").start()
    a = ProcessBroker(a_conf, tmp_path / "a.log").start()
    try:
        def view() -> dict[str, Any]:
            return get(a_mgmt, "/api/network/map")  # type: ignore[no-any-return]

        poll(lambda: _edge_state(view()) == "forwarding", what="A→B forwarding")
        assert _node(view(), "B")["reachable"] is True

        b.kill9()
        poll(lambda: _edge_state(view()) not in (None, "forwarding")
             and _node(view(), "B")["reachable"] is False, what="B down on the map")

        b = ProcessBroker(b_conf, tmp_path / "b.log").start()
        poll(lambda: _edge_state(view()) == "forwarding"
             and _node(view(), "B")["reachable"] is True, what="B back on the map")
    finally:
        for broker in (a, b):
            if broker.proc is not None and broker.proc.poll() is None:
                broker.terminate()
