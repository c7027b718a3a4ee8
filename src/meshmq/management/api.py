"""What every route module shares: the runtime a request acts on, its logged-in user,
JSON answers and errors, and reading a JSON body."""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from meshmq.core.auth import Principal
from meshmq.management.access import REALM

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost

RUNTIME: web.AppKey[ManagementHost] = web.AppKey("runtime")
# The logged-in user of a request (None: anonymous on loopback, or no users configured).
PRINCIPAL: web.RequestKey[Principal | None] = web.RequestKey("principal")


class ApiError(Exception):
    """A request the API refuses: answered with ``status`` and ``{"error": message}`` plus
    any ``extra`` fields."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


_dumps = partial(json.dumps, indent=2, default=str)


def reply(body: object, status: int = 200) -> web.Response:
    """A JSON answer."""
    return web.json_response(body, status=status, dumps=_dumps)


def error_reply(status: int, message: str, **extra: Any) -> web.Response:
    response = reply({"error": message, **extra}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}", charset="UTF-8"'
    return response


def runtime_of(request: web.Request) -> ManagementHost:
    return request.app[RUNTIME]


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body ({} when empty); 400 when it is not an object."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body
