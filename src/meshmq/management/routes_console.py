"""The web console and what it alone needs: its static files under ``/console/`` (``/``
redirects there), this broker's links (``/api/peers``), the map of the whole network
(``/api/network/map``) and a live feed of both (``/api/events``, server-sent events).

The event feed pushes a snapshot every second until the browser goes or the broker
stops: :func:`install` ends every open feed in the application's shutdown, so a console
left open never holds a broker's stop beyond the runner's shutdown timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from meshmq.management.api import ApiError, reply, runtime_of
from meshmq.management.topology import RateMeter, network_map, peers

routes = web.RouteTableDef()
T = TypeVar("T")

STATIC = Path(__file__).with_name("console")
EVENT_INTERVAL_S = 1.0

CLOSING: web.AppKey[asyncio.Event] = web.AppKey("console-closing")
METER: web.AppKey[RateMeter] = web.AppKey("console-rates")
# One client for every map: connections to the peers stay open between snapshots.
PEERS: web.AppKey[aiohttp.ClientSession] = web.AppKey("console-peer-client")


def install(app: web.Application) -> None:
    """What the console's routes keep per application: the rate meter of the map and
    the signal that ends open event feeds when the listener shuts down."""
    app[CLOSING] = asyncio.Event()
    app[METER] = RateMeter()

    async def end_feeds(app: web.Application) -> None:
        app[CLOSING].set()

    app.on_shutdown.append(end_feeds)

    async def peer_client(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            app[PEERS] = session
            yield

    app.cleanup_ctx.append(peer_client)


@routes.get("/")
async def root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


@routes.get("/console")
async def console_bare(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


@routes.get("/console/")
async def console_index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@routes.get("/console/{name}")
async def console_file(request: web.Request) -> web.StreamResponse:
    # Only the console's own files by their plain names (no paths, so nothing else of
    # the package is reachable); anything else is the usual JSON 404.
    name = request.match_info["name"]
    if name not in _FILES:
        raise ApiError(404, f"no such resource: {request.path}")
    return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})


_FILES = frozenset(p.name for p in STATIC.iterdir() if p.is_file())


@routes.get("/api/peers")
async def api_peers(request: web.Request) -> web.Response:
    return reply({"peers": peers(runtime_of(request))})


@routes.get("/api/network/map")
async def api_network_map(request: web.Request) -> web.Response:
    return reply(await network_map(runtime_of(request), request.app[METER],
                                   request.headers.get("Authorization"),
                                   session=request.app[PEERS]))


@routes.get("/api/events")
async def api_events(request: web.Request) -> web.StreamResponse:
    """``event: snapshot`` every second: ``{"stat": /api/stat, "map": /api/network/map}``.
    ``?map=0`` leaves the map out (pages that do not draw it)."""
    runtime = runtime_of(request)
    closing = request.app[CLOSING]
    with_map = request.query.get("map", "1") != "0"
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    authorization = request.headers.get("Authorization")
    try:
        while not closing.is_set():
            stat = runtime.statistics()
            snapshot: dict[str, object] = {"stat": stat}
            if with_map:
                snapshot["map"] = await _until_closing(
                    network_map(runtime, request.app[METER], authorization,
                                session=request.app[PEERS], stat=stat), closing)
                if closing.is_set():
                    break
            data = json.dumps(snapshot, default=str)
            await response.write(f"event: snapshot\ndata: {data}\n\n".encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), EVENT_INTERVAL_S)
    except ConnectionError:
        pass  # the browser went away
    return response


async def _until_closing(work: Coroutine[Any, Any, T], closing: asyncio.Event) -> T | None:
    """``work``'s result, or None once the listener is shutting down (then it is
    cancelled: peers that do not answer must not hold the stop)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(closing.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
