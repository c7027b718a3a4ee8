"""The node's own share of the web console and of ``/api/shards``.

* The console's static files (management/console/) are served by the node itself, not
  passed to shard 0, so the console loads while shard 0 restarts and its Shards page
  can say so. The JSON routes it calls are the node's (summed, or passed to shard 0).
* ``GET /api/shards``: each shard's process, connections, links, owned destinations
  (count, messages in and out, their rates), CPU and journal size, plus the node's
  totals of those columns. Destinations are asked of every shard at once
  (``/api/destinations``: a destination is listed by its owner only).
* Each shard process's CPU seconds are read from ``/proc/<pid>/stat`` every
  ``CPU_SAMPLE_S`` (a file read per shard: nothing asked of the shards), so the share
  of a core is known when someone asks, even the first time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from meshmq.management.api import error_reply, reply
from meshmq.management.routes_console import STATIC
from meshmq.node.aggregate import CpuMeter, shard_rows, shard_totals

if TYPE_CHECKING:
    from meshmq.node.management import NodeManagement

__all__ = ["CPU_SAMPLE_S", "cpu_seconds", "install", "shards_document"]

CPU_SAMPLE_S = 1.0
CPU: web.AppKey[CpuMeter] = web.AppKey("node-cpu-meter")
_FILES = frozenset(p.name for p in STATIC.iterdir() if p.is_file())
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """User plus system CPU seconds of process ``pid`` (Linux); None when unknown."""
    try:
        text = Path(proc, str(pid), "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count fields after its ")".
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return None


def install(app: web.Application, face: NodeManagement) -> None:
    """The console's files and the CPU sampler, on the node's application (before its
    catch-all route to shard 0)."""
    meter = app[CPU] = CpuMeter()

    def sample() -> None:
        now = time.monotonic()
        for row in face.rows():
            seconds = cpu_seconds(row.pid) if row.pid is not None else None
            if row.pid is None or seconds is None:
                meter.forget(row.shard)
            else:
                meter.sample(row.shard, row.pid, now, seconds)

    async def sampling() -> None:
        while True:
            sample()
            await asyncio.sleep(CPU_SAMPLE_S)

    async def sampler(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sampling())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(sampler)
    app.router.add_get("/", _to_console)
    app.router.add_get("/console", _to_console)
    app.router.add_get("/console/", _index)
    app.router.add_get("/console/{name}", _file)


async def _to_console(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def _file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]  # the console's own files by plain name only
    if name not in _FILES:
        return error_reply(404, f"no such resource: {request.path}")
    return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})


async def shards_document(face: NodeManagement, request: web.Request) -> web.Response:
    """``GET /api/shards``."""
    answers, destinations = await asyncio.gather(
        face.ask("/api/broker", request), face.ask("/api/destinations", request))
    meter = request.app.get(CPU)
    rows = [{**row, "management_socket": face.socket_of(row["shard"])}
            for row in shard_rows(face.rows(), answers, destinations, meter)]
    return reply({"broker": face.config.broker_name, "count": face.count,
                  "placement": face.config.sharding.placement,
                  "shards": rows, "totals": shard_totals(rows)})
