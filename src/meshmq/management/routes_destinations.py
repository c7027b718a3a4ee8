"""``/api/destinations``: list, inspect, create, delete and purge queues and topics, and
send a test message (docs/operations.md, "Destinations").

Handlers act on the core through :mod:`meshmq.core.admin`; whatever changes stored
messages is written to the store and synced before the answer (:func:`commit`), so an
answered purge or delete survives kill -9.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from meshmq.core import admin
from meshmq.core.destinations import Destination
from meshmq.core.message import PropertyValue
from meshmq.errors import DestinationError, ResourceLimitError, SelectorError, StoreError
from meshmq.management.api import ApiError, json_body, reply, runtime_of

routes = web.RouteTableDef()


@contextmanager
def core_errors() -> Iterator[None]:
    """The core's refusals as API errors: bad input 400, absent 404, conflicts 409, a
    store that takes no persistent message 503."""
    try:
        yield
    except SelectorError as exc:
        raise ApiError(400, f"invalid selector: {exc.message}") from None
    except DestinationError as exc:
        raise ApiError(400, exc.message) from None
    except admin.NotFoundError as exc:
        raise ApiError(404, exc.message) from None
    except admin.ConflictError as exc:
        raise ApiError(409, exc.message) from None
    except ResourceLimitError as exc:
        raise ApiError(503, exc.message) from None


async def commit(request: web.Request) -> None:
    """Write the store operations the handler's change queued and wait until they are
    durable (as a receipted send or an acknowledgement does), then let the broker
    dispatch again."""
    runtime = runtime_of(request)
    runtime.write_ops()
    try:
        await runtime.store.sync()
    except StoreError as exc:
        raise ApiError(503, f"the store failed to make the change durable: {exc.message}"
                       ) from None
    finally:
        runtime.request_pump()


def path_destination(request: web.Request) -> Destination:
    with core_errors():
        return admin.destination(request.match_info["type"], request.match_info["name"])


def text_field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"the request body needs a {name!r} field (a string)")
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name!r} must be a string, not {type(value).__name__}")
    return value


@routes.get("/api/destinations")
async def list_destinations(request: web.Request) -> web.Response:
    kind = request.query.get("type")
    if kind is not None and kind not in ("queue", "topic"):
        raise ApiError(400, f"type={kind!r}: use type=queue or type=topic (or leave it out)")
    broker = runtime_of(request).broker
    # A shard of a node adds its clients' sends to other shards' destinations, which the
    # node adds to the owners' producer counts.
    return reply({"destinations": admin.list_destinations(broker, kind,
                                                          request.query.get("filter")),
                  **broker.producers_elsewhere()})


@routes.post("/api/destinations")
async def create_destination(request: web.Request) -> web.Response:
    body = await json_body(request)
    kind = text_field(body, "type", required=True)
    name = text_field(body, "name", required=True)
    assert kind is not None and name is not None
    broker = runtime_of(request).broker
    with core_errors():
        dest = admin.destination(kind, name)
        admin.create_destination(broker, dest)
        return reply(admin.describe(broker, dest), 201)


@routes.get("/api/destinations/{type}/{name}")
async def get_destination(request: web.Request) -> web.Response:
    dest = path_destination(request)
    with core_errors():
        return reply(admin.describe(runtime_of(request).broker, dest))


@routes.delete("/api/destinations/{type}/{name}")
async def delete_destination(request: web.Request) -> web.Response:
    dest = path_destination(request)
    with core_errors():
        count = admin.delete_destination(runtime_of(request).broker, dest)
    await commit(request)
    return reply({"deleted": dest.name, "messages": count})


@routes.post("/api/destinations/{type}/{name}/purge")
async def purge(request: web.Request) -> web.Response:
    dest = path_destination(request)
    with core_errors():
        count = admin.purge(runtime_of(request).broker, dest)
    await commit(request)
    return reply({"purged": count})


@routes.post("/api/destinations/{type}/{name}/send")
async def send(request: web.Request) -> web.Response:
    dest = path_destination(request)
    body = await json_body(request)
    text = text_field(body, "body") or ""
    headers = body.get("headers") or {}
    if not isinstance(headers, dict):
        raise ApiError(400, "'headers' must be an object of property names and values")
    properties: dict[str, PropertyValue] = {}
    for key, value in headers.items():
        if not isinstance(value, str | int | float | bool):
            raise ApiError(400, f"header {key!r}: a value must be a string, number or "
                                f"boolean, not {type(value).__name__}")
        properties[key] = value
    persistent = body.get("persistent", True)
    if not isinstance(persistent, bool):
        raise ApiError(400, "'persistent' must be true or false")
    with core_errors():
        message = admin.send(runtime_of(request).broker, dest, text.encode(), properties,
                             persistent=persistent)
    await commit(request)
    return reply({"message_id": message.message_id}, 201)
