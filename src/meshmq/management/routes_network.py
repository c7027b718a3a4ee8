"""``/api/network``: this broker's network connectors with their outbound bridges, the
inbound bridges other brokers opened to it, and stopping or starting a configured
connector (one with ``auto_start = false`` included) while the broker runs.

Bridges are reported from ``NetworkManager``'s own status (the figures ``meshmq stat``
shows), reshaped into one document per bridge whichever side dialed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from meshmq.errors import ConfigError
from meshmq.management.api import ApiError, reply, runtime_of

if TYPE_CHECKING:
    from meshmq.network.manager import NetworkManager

routes = web.RouteTableDef()


def _error(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    if not raw:
        return None
    at = raw.get("at")
    return {"kind": raw.get("kind"), "message": raw.get("message"),
            "at": datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
            if isinstance(at, int | float) else None}


def bridge_document(status: dict[str, Any]) -> dict[str, Any]:
    """One bridge (either direction) from its ``status()``."""
    outbound = status["direction"] == "outbound"
    targets = status.get("targets") or []
    return {
        "id": status["name"],
        "connector": status["connector"],
        "peer": status.get("remote_broker"),
        # The broker it is linked to now; an outbound bridge that is down: its targets.
        "uri": status.get("connected_to") or (",".join(targets) if outbound else None),
        "direction": status["direction"],
        "state": status["state"],
        "state_since": datetime.fromtimestamp(status["state_since"], UTC).isoformat(
            timespec="milliseconds"),
        "duplex": status.get("duplex", False),
        "last_error": _error(status.get("last_error")) if outbound else None,
        "forwarded": status["forwarded"],
        "acked": status["acknowledged"],
        "in_flight": status["inflight"],
        "received": status["received"],
        # Dial attempts after the first (every target tried counts one).
        "reconnects": max(status.get("attempts", 0) - 1, 0),
        "refused": status["refused"],
        "forward_rate": status["forward_rate"],
        # Push-back over the link: destinations the remote asked this broker to stop
        # forwarding for now, and how often either side asked.
        "held": status.get("held", []),
        "holds_sent": status.get("holds_sent", 0),
        "holds_received": status.get("holds_received", 0),
    }


def connector_document(network: NetworkManager, name: str) -> dict[str, Any]:
    config = network.connector_config(name)
    assert config is not None
    return {"name": name, "uri": config.uri, "auto_start": config.auto_start,
            "duplex": config.duplex,
            "state": "started" if name in network.running else "stopped",
            "bridges": [bridge_document(b.status()) for b in network.bridges
                        if b.config.name == name]}


def _connector_named(network: NetworkManager, request: web.Request) -> str:
    name = request.match_info["name"]
    if network.connector_config(name) is None:
        known = [nc.name for nc in network.config.network_connectors]
        raise ApiError(404, f"no network connector named {name!r}: the configured ones are "
                       f"{known}" if known else
                       f"no network connector named {name!r}: this broker has none "
                       "configured (network_connectors in the configuration)",
                       connectors=known)
    return name


@routes.get("/api/network")
async def network_status(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    network = runtime.network
    return reply({
        "broker": runtime.config.broker_name,
        "connectors": [connector_document(network, nc.name)
                       for nc in runtime.config.network_connectors],
        "inbound": [bridge_document(r.status()) for r in network.inbound if r.ready],
    })


@routes.post("/api/network/connectors/{name}/stop")
async def stop_connector(request: web.Request) -> web.Response:
    network = runtime_of(request).network
    name = _connector_named(network, request)
    await network.stop_connector(name)
    return reply(connector_document(network, name))


@routes.post("/api/network/connectors/{name}/start")
async def start_connector(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    network = runtime.network
    name = _connector_named(network, request)
    if not runtime.started:
        raise ApiError(409, "this broker is not serving (a slave, or stopping): connectors "
                       "start with it once it is master")
    try:
        await network.start_connector(name)
    except ConfigError as exc:  # e.g. a TLS file that cannot be read any more
        raise ApiError(409, f"network connector {name!r} cannot start: {exc}") from None
    return reply(connector_document(network, name))
