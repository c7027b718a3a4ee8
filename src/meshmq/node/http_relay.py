"""Passing a shard's HTTP answer on to the client of the node's management endpoint:
status, headers (less those of the hop from the shard) and the body as it streams (a
console's event stream included)."""

from __future__ import annotations

import contextlib

import aiohttp
from aiohttp import web

__all__ = ["relay_response"]

# Response headers that belong to the hop from the shard (aiohttp sets its own).
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                         "content-encoding", "date", "server"})


async def relay_response(request: web.Request, upstream: aiohttp.ClientResponse
                         ) -> web.StreamResponse:
    """Stream ``upstream`` (a shard's answer) to ``request``'s client; the caller
    releases ``upstream``."""
    out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for key, value in upstream.headers.items():
        if key.lower() not in _HOP_BY_HOP:
            out.headers.add(key, value)
    await out.prepare(request)
    with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
    await out.write_eof()
    return out
