"""/api/network over real HTTP between two in-process brokers linked by a real bridge:
connector and bridge state, a dial failure's last_error, and an operator stopping and
starting a connector (one configured with auto_start = false included)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from meshmq.config.model import AuthConfig, User
from tests.management.http import basic, call, get
from tests.network.helpers import LINK_USER, connector, net_config, tcp_uri
from tests.support.brokers import ThreadBroker, poll

# Users are configured (the link user), so changes need an admin.
AUTH = AuthConfig(users=(LINK_USER, User("ops", "ops-pw", ("admins",))))
ADMIN = basic("ops", "ops-pw")


def network(broker: ThreadBroker) -> dict[str, Any]:
    return get(broker.management_port, "/api/network")  # type: ignore[no-any-return]


def bridge_states(broker: ThreadBroker) -> list[str]:
    return [b["state"] for b in network(broker)["connectors"][0]["bridges"]]


def test_stopping_and_starting_a_connector(tmp_path: Path) -> None:
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:({tcp_uri(b)})", name="to-b", auto_start=False), auth=AUTH)).start()
    try:
        port = a.management_port
        body = network(a)
        assert body["broker"] == "A" and body["inbound"] == []
        assert body["connectors"] == [{"name": "to-b", "uri": f"static:({tcp_uri(b)})",
                                       "auto_start": False, "duplex": False,
                                       "state": "stopped", "bridges": []}]
        status, started = call(port, "POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        assert status == 200 and started["state"] == "started"
        assert len(started["bridges"]) == 1
        poll(lambda: bridge_states(a) == ["forwarding"], what="the bridge forwarding")
        (bridge,) = network(a)["connectors"][0]["bridges"]
        assert bridge["peer"] == "B" and bridge["direction"] == "outbound"
        assert bridge["uri"] == tcp_uri(b) and bridge["last_error"] is None
        assert {"forwarded", "acked", "in_flight", "reconnects", "refused",
                "forward_rate"} <= set(bridge)
        poll(lambda: [i["peer"] for i in network(b)["inbound"]] == ["A"],
             what="B lists the inbound bridge")
        # Starting a started connector changes nothing.
        status, again = call(port, "POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        assert status == 200 and len(again["bridges"]) == 1

        status, stopped = call(port, "POST", "/api/network/connectors/to-b/stop", headers=ADMIN)
        assert (status, stopped["state"], stopped["bridges"]) == (200, "stopped", [])
        # The link was closed cleanly: B drops its end too.
        poll(lambda: network(b)["inbound"] == [], what="B's inbound end gone")

        call(port, "POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        poll(lambda: bridge_states(a) == ["forwarding"], what="forwarding again")
    finally:
        a.stop()
        b.stop()


def test_a_bridge_that_cannot_dial_reports_why(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port the OS gave out and nothing listens on now
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(
        f"static:(tcp://127.0.0.1:{dead})", name="nowhere"))).start()
    try:
        def failed() -> dict[str, Any] | None:
            (bridge,) = network(a)["connectors"][0]["bridges"]
            return bridge if bridge["last_error"] is not None else None

        bridge = poll(failed, what="a dial failure recorded")
        assert bridge["state"] in ("backing-off", "connecting")
        assert bridge["last_error"]["kind"] and bridge["last_error"]["message"]
        assert bridge["uri"] == f"tcp://127.0.0.1:{dead}" and bridge["peer"] is None
    finally:
        a.stop()


def test_unknown_connector_is_404(tmp_path: Path) -> None:
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector("static:(tcp://127.0.0.1:1)",
                                                               name="nc1",
                                                               auto_start=False),
                                 auth=AUTH)).start()
    try:
        status, body = call(a.management_port, "POST", "/api/network/connectors/nope/stop",
                            headers=ADMIN)
        assert status == 404 and body["connectors"] == ["nc1"]
        assert "'nope'" in body["error"]
        status, body = call(a.management_port, "GET", "/api/network/connectors/nc1/start")
        assert status == 405
    finally:
        a.stop()
