"""``GET /api/ha``: this broker's master/slave state, as the HA controller (shared lease)
or the replication node (replicated journal) reports it, with ``mode``, ``role`` and
``epoch`` always present so a script can tell a master from a slave without knowing
which HA mode is configured."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from meshmq.management.api import reply, runtime_of

routes = web.RouteTableDef()


@routes.get("/api/ha")
async def ha_status(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    body: dict[str, Any]
    if runtime.ha is None:
        body = {"mode": "none", "role": "standalone", "epoch": 0}
    else:
        body = dict(runtime.ha.status())
        body.setdefault("epoch", 0)
    body["broker"] = runtime.config.broker_name
    body["serving"] = runtime.started  # listeners open: a master that took over
    return reply(body)
