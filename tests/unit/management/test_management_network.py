"""/api/network through the real management app, without a socket, for brokers of a
``MemoryNetwork`` linked by real bridges over in-memory pipes: connector and bridge
state, a dial failure's last_error, an operator stopping and starting a connector (one
configured with auto_start = false included), and an unknown connector's 404."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.management.http import basic
from tests.support.memory_management import MemoryManagement, management_of
from tests.support.memory_network import LINK_USER, MemoryNetwork, connector, memory_network

from meshmq.config.model import AuthConfig, User

# Users are configured (the link user), so changes need an admin.
AUTH = AuthConfig(users=(LINK_USER, User("ops", "ops-pw", ("admins",))))
ADMIN = basic("ops", "ops-pw")


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    with memory_network() as n:
        yield n


def network(api: MemoryManagement) -> dict[str, Any]:
    return api.get("/api/network")  # type: ignore[no-any-return]


def bridge_states(api: MemoryManagement) -> list[str]:
    return [b["state"] for b in network(api)["connectors"][0]["bridges"]]


def test_stopping_and_starting_a_connector(net: MemoryNetwork) -> None:
    net.add("B")
    net.add("A", connector("B", name="to-b", auto_start=False), auth=AUTH)
    net.start()
    with management_of(net.brokers["A"]) as a, management_of(net.brokers["B"]) as b:
        body = network(a)
        assert body["broker"] == "A" and body["inbound"] == []
        assert body["connectors"] == [{"name": "to-b", "uri": "static:(tcp://B:61616)",
                                       "auto_start": False, "duplex": False,
                                       "state": "stopped", "bridges": []}]
        status, started = a.call("POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        assert status == 200 and started["state"] == "started"
        assert len(started["bridges"]) == 1
        a.poll(lambda: bridge_states(a) == ["forwarding"], what="the bridge forwarding")
        (bridge,) = network(a)["connectors"][0]["bridges"]
        assert bridge["peer"] == "B" and bridge["direction"] == "outbound"
        assert bridge["connector"] == "to-b"
        assert bridge["uri"] == "tcp://B:61616" and bridge["last_error"] is None
        assert {"forwarded", "acked", "in_flight", "reconnects", "refused",
                "forward_rate"} <= set(bridge)
        (inbound,) = b.poll(lambda: network(b)["inbound"], what="B lists the inbound bridge")
        assert (inbound["peer"], inbound["direction"], inbound["state"]) == (
            "A", "inbound", "forwarding")
        assert inbound["last_error"] is None
        # Starting a started connector changes nothing.
        status, again = a.call("POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        assert status == 200 and len(again["bridges"]) == 1
        assert [x["id"] for x in again["bridges"]] == [bridge["id"]]

        status, stopped = a.call("POST", "/api/network/connectors/to-b/stop", headers=ADMIN)
        assert (status, stopped["state"], stopped["bridges"]) == (200, "stopped", [])
        # The link was closed cleanly: B drops its end too.
        b.poll(lambda: network(b)["inbound"] == [], what="B's inbound end gone")
        # Stopping a stopped connector changes nothing.
        status, still = a.call("POST", "/api/network/connectors/to-b/stop", headers=ADMIN)
        assert (status, still["state"], still["bridges"]) == (200, "stopped", [])

        a.call("POST", "/api/network/connectors/to-b/start", headers=ADMIN)
        a.poll(lambda: bridge_states(a) == ["forwarding"], what="forwarding again")
        b.poll(lambda: [i["peer"] for i in network(b)["inbound"]] == ["A"],
               what="B lists the new inbound bridge")


def test_changing_a_connector_needs_an_admin(net: MemoryNetwork) -> None:
    net.add("A", connector("B", name="to-b", auto_start=False), auth=AUTH)
    net.start()
    with management_of(net.brokers["A"]) as a:
        status, _ = a.call("POST", "/api/network/connectors/to-b/start")
        assert status == 401
        status, _ = a.call("POST", "/api/network/connectors/to-b/start",
                           user=LINK_USER.name, password=LINK_USER.password)
        assert status == 403
        assert network(a)["connectors"][0]["state"] == "stopped"


def test_a_bridge_that_cannot_dial_reports_why(net: MemoryNetwork) -> None:
    # "nowhere" is a broker this network never starts: every dial is refused.
    net.add("A", connector("nowhere", name="nowhere"))
    net.start()
    with management_of(net.brokers["A"]) as a:
        def failed() -> dict[str, Any] | None:
            (bridge,) = network(a)["connectors"][0]["bridges"]
            return bridge if bridge["last_error"] is not None else None

        bridge = a.poll(failed, what="a dial failure recorded")
        assert bridge["state"] in ("backing-off", "connecting")
        assert bridge["last_error"]["kind"] and bridge["last_error"]["message"]
        assert bridge["last_error"]["at"]
        assert bridge["uri"] == "tcp://nowhere:61616" and bridge["peer"] is None
        # It keeps trying, and keeps the error while it does.
        again = a.poll(lambda: (b := failed()) and b["reconnects"] >= 1 and b,
                       what="a reconnect counted")
        assert again["last_error"]["kind"] == bridge["last_error"]["kind"]


def test_unknown_connector_is_404(net: MemoryNetwork) -> None:
    net.add("A", connector("B", name="nc1", auto_start=False), auth=AUTH)
    net.start()
    with management_of(net.brokers["A"]) as a:
        status, body = a.call("POST", "/api/network/connectors/nope/stop", headers=ADMIN)
        assert status == 404 and body["connectors"] == ["nc1"]
        assert "'nope'" in body["error"]
        status, body = a.call("POST", "/api/network/connectors/nope/start", headers=ADMIN)
        assert status == 404 and body["connectors"] == ["nc1"]
        status, body = a.call("GET", "/api/network/connectors/nc1/start")
        assert status == 405
        assert network(a)["connectors"][0]["state"] == "stopped"
