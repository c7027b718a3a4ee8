"""``GET /api/broker``: who this broker is and how full it is (name, version, uptime,
master/slave role, store and memory use against their limits, the configured limits).

Everything is read from the runtime's own figures (``Broker.statistics()``, the store's
``stats()``, the HA status), so the numbers match ``meshmq stat`` and ``/metrics``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from meshmq import __version__
from meshmq.build import describe
from meshmq.core.state import LINK_PROTOCOLS
from meshmq.management.api import reply, runtime_of

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost

routes = web.RouteTableDef()


def iso_ms(epoch_ms: int) -> str:
    """An epoch time in milliseconds as ISO 8601 (UTC, millisecond precision)."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def percent(used: int, limit: int) -> float:
    """``used`` as a percentage of ``limit`` (0 when there is no limit)."""
    return round(100 * used / limit, 1) if limit > 0 else 0.0


def role_of(runtime: ManagementHost) -> str:
    return str(runtime.ha.status()["role"]) if runtime.ha is not None else "standalone"


def store_usage(runtime: ManagementHost) -> dict[str, Any]:
    stats = runtime.store.stats()
    used = int(stats.get("disk_bytes", 0))  # only the journal measures its size on disk
    limit = runtime.config.store.max_disk_bytes
    return {"kind": stats.get("kind", runtime.config.store.kind), "bytes": used,
            "limit_bytes": limit, "percent": percent(used, limit)}


def memory_usage(runtime: ManagementHost) -> dict[str, Any]:
    usage = runtime.broker.usage
    return {"bytes": usage.used, "limit_bytes": usage.limit,
            "percent": percent(usage.used, usage.limit)}


def client_connections(runtime: ManagementHost) -> int:
    """Open client connections (not broker links, not those being taken apart)."""
    return sum(1 for c in runtime.broker.connections.values()
               if not c.closed and c.protocol not in LINK_PROTOCOLS)


def broker_document(runtime: ManagementHost) -> dict[str, Any]:
    broker = runtime.broker
    config = runtime.config
    stat = broker.statistics()
    dests: list[dict[str, Any]] = stat["destinations"]  # type: ignore[assignment]
    links = runtime.shard_links()
    handoffs = runtime.shard_handoffs()
    return {
        **({"shard_links": links} if links is not None else {}),
        **({"handoffs": handoffs} if handoffs is not None else {}),
        "name": config.broker_name,
        "version": __version__,
        "build": describe(),
        "uptime_ms": broker.now_ms() - broker.started_ms,
        "started_at": iso_ms(broker.started_ms),
        "role": role_of(runtime),
        "store": store_usage(runtime),
        "memory": memory_usage(runtime),
        "connections": client_connections(runtime),
        "destinations": len(dests),
        "limits": {
            "memory_bytes": config.usage.memory_limit,
            "memory_on_limit": config.usage.on_limit,
            "store_bytes": config.store.max_disk_bytes,
            "store_min_free_disk_bytes": config.store.min_free_disk,
            "max_connections": {lst.name: lst.max_connections for lst in config.listeners},
            "max_subscriptions_per_connection": config.max_subscriptions_per_connection,
            "stomp_max_frame_bytes": config.stomp.max_frame_size,
            "mqtt_max_packet_bytes": config.mqtt.max_packet_size,
        },
    }


@routes.get("/api/broker")
async def broker_info(request: web.Request) -> web.Response:
    return reply(broker_document(runtime_of(request)))
