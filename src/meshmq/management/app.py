"""What the management listener serves: one aiohttp application.

Every answer is JSON, errors included (``{"error": "..."}`` with a 4xx or 5xx status),
so scripts never parse an HTML error page. Two middlewares wrap every route:

- :func:`errors_as_json` turns aiohttp's own refusals (404, 405, 413) and a handler's
  :class:`ApiError` into JSON bodies, and a handler's bug into a logged 500 that leaves the
  broker running;
- :func:`login` applies :func:`meshmq.management.access.decide` (HTTP Basic credentials,
  the admin group for anything but GET/HEAD) before any handler runs.

Route tables live in one module per resource (``routes_*.py``); :data:`ROUTE_MODULES`
lists them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from meshmq.core.auth import Authenticator, Principal
from meshmq.errors import AuthenticationError
from meshmq.management import (
    routes_broker,
    routes_connections,
    routes_console,
    routes_core,
    routes_destinations,
    routes_ha,
    routes_jolokia,
    routes_messages,
    routes_metrics,
    routes_network,
)
from meshmq.management.access import Decision, decide
from meshmq.management.api import PRINCIPAL, RUNTIME, ApiError, error_reply, runtime_of
from meshmq.transport.login import check_password

if TYPE_CHECKING:
    from meshmq.config.model import BrokerConfig
    from meshmq.management.host import ManagementHost

log = logging.getLogger("meshmq.management")

MAX_REQUEST_BODY = 16 * 1024 * 1024

ROUTE_MODULES = (routes_core, routes_broker, routes_destinations, routes_messages,
                 routes_connections, routes_network, routes_ha, routes_jolokia,
                 routes_metrics, routes_console)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_reply(exc.status, exc.message, **exc.extra)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects
        if exc.status == 404:
            return error_reply(404, f"no such resource: {request.path}")
        if exc.status == 405:
            return error_reply(405, f"method {request.method} not allowed on {request.path}",
                               allowed=sorted(getattr(exc, "allowed_methods", ())))
        return error_reply(exc.status, exc.reason)
    except Exception:
        log.exception("management request %s %s failed", request.method, request.path)
        return error_reply(500, "internal error; the broker log has the details")


async def login_decision(config: BrokerConfig, auth: Authenticator,
                         request: web.Request) -> Decision:
    """Whether ``request`` may be served, and as whom: the one login check of every
    management endpoint (a broker's, a node's). A refused password is counted with the
    client listeners' failures and held back the same way, so the endpoint is no faster
    a place to guess passwords."""
    async def authenticate(user: str, password: str) -> Principal:
        try:
            return await check_password(auth, user, password)
        except AuthenticationError:
            delay = auth.refused(f"{request.remote or '?'}:0")
            if delay > 0:
                await asyncio.sleep(delay)
            raise

    return await decide(config, request.method, request.headers.get("Authorization"),
                        authenticate, request.path)


@web.middleware
async def login(request: web.Request, handler: Handler) -> web.StreamResponse:
    runtime = runtime_of(request)
    decision = await login_decision(runtime.config, runtime.broker.auth, request)
    if not decision.allowed:
        return error_reply(decision.status, decision.error)
    request[PRINCIPAL] = decision.principal
    return await handler(request)


def build_app(runtime: ManagementHost) -> web.Application:
    app = web.Application(middlewares=[errors_as_json, login],
                          client_max_size=MAX_REQUEST_BODY)
    app[RUNTIME] = runtime
    for module in ROUTE_MODULES:
        app.add_routes(module.routes)
    routes_console.install(app)
    return app
