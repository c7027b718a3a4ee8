"""``/api/health`` and ``/api/stat``: is the broker up, and its figures in one document
(what ``meshmq stat`` prints)."""

from __future__ import annotations

from aiohttp import web

from meshmq.management.api import reply, runtime_of

routes = web.RouteTableDef()


@routes.get("/api/health")
async def health(request: web.Request) -> web.Response:
    return reply({"status": "ok", "broker": runtime_of(request).config.broker_name})


@routes.get("/api/stat")
async def stat(request: web.Request) -> web.Response:
    return reply(runtime_of(request).statistics())
