"""``/api/queues/{name}/...``: browse a queue's messages (paging, a JMS selector), view,
delete, move or copy them, and retry dead-lettered ones (docs/operations.md,
"Messages"). Changes are durable before the answer (routes_destinations.commit)."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from meshmq.core import admin
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.errors import StoreError
from meshmq.management.api import ApiError, json_body, reply, runtime_of
from meshmq.management.routes_destinations import commit, core_errors, text_field

routes = web.RouteTableDef()

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
PREVIEW_CHARS = 200
MAX_VIEW_BYTES = 1024 * 1024  # a message's body shown in full up to this size


def queue_of(request: web.Request) -> Destination:
    with core_errors():
        return admin.destination("queue", request.match_info["name"])


def headers_of(msg: Message) -> dict[str, object]:
    """The JMS headers that are set, then the message's properties."""
    fields: dict[str, object] = {
        "JMSCorrelationID": msg.correlation_id,
        "JMSReplyTo": str(msg.reply_to) if msg.reply_to is not None else None,
        "JMSType": msg.type,
        "JMSExpiration": msg.expiration or None,
        "JMSXGroupID": msg.group_id,
        "JMSXGroupSeq": msg.group_seq if msg.group_id is not None else None,
        "JMSXUserID": msg.user_id,
        "content-type": msg.content_type,
        "originalDestination": (str(msg.original_destination)
                                if msg.original_destination is not None else None),
    }
    out: dict[str, object] = {k: v for k, v in fields.items() if v is not None}
    out.update(msg.properties)
    return out


def _text(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def summary(item: admin.Queued) -> dict[str, object]:
    msg = item.message
    text = _text(msg.body)
    if text is not None:
        preview, encoding = text[:PREVIEW_CHARS], "utf-8"
    else:
        preview = base64.b64encode(msg.body[:PREVIEW_CHARS * 3 // 4]).decode()
        encoding = "base64"
    return {"message_id": msg.message_id, "timestamp": msg.timestamp,
            "priority": msg.priority, "persistent": msg.persistent,
            "redelivered": item.delivery_count > 0, "delivery_count": item.delivery_count,
            "in_flight": item.in_flight, "size": len(msg.body), "headers": headers_of(msg),
            "body_preview": preview, "body_encoding": encoding}


def detail(item: admin.Queued) -> dict[str, object]:
    view = summary(item)
    body = item.message.body
    truncated = len(body) > MAX_VIEW_BYTES
    if view["body_encoding"] == "utf-8":
        # Cut on a character boundary: a partial multi-byte character is dropped.
        shown = body[:MAX_VIEW_BYTES].decode("utf-8", errors="ignore")
    else:
        shown = base64.b64encode(body[:MAX_VIEW_BYTES]).decode()
    view.update(body=shown, truncated=truncated)
    return view


def int_query(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}={raw!r} is not a whole number") from None
    if not 0 <= value <= maximum:
        raise ApiError(400, f"{name}={value} is out of range: use 0 to {maximum}")
    return value


@routes.get("/api/queues/{name}/messages")
async def browse(request: web.Request) -> web.Response:
    dest = queue_of(request)
    offset = int_query(request, "offset", 0, 1 << 62)
    limit = int_query(request, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    with core_errors():
        total, page = admin.browse(runtime_of(request).broker, dest, offset, limit,
                                   request.query.get("selector"))
    return reply({"total": total, "offset": offset, "limit": limit,
                  "messages": [summary(item) for item in page]})


@routes.get("/api/queues/{name}/messages/{message_id}")
async def view(request: web.Request) -> web.Response:
    dest = queue_of(request)
    with core_errors():
        item = admin.find(runtime_of(request).broker, dest, request.match_info["message_id"])
    return reply(detail(item))


@routes.delete("/api/queues/{name}/messages/{message_id}")
async def delete(request: web.Request) -> web.Response:
    dest = queue_of(request)
    message_id = request.match_info["message_id"]
    with core_errors():
        admin.delete_message(runtime_of(request).broker, dest, message_id)
    await commit(request)
    return reply({"deleted": message_id})


def selection(body: dict[str, Any]) -> tuple[str | None, list[str] | None]:
    selector = text_field(body, "selector")
    ids = body.get("message_ids")
    if ids is not None and (not isinstance(ids, list)
                            or not all(isinstance(i, str) for i in ids)):
        raise ApiError(400, "'message_ids' must be a list of message id strings")
    return selector, ids


async def remove_once_stored(request: web.Request, dest: Destination,
                             message_ids: list[str]) -> None:
    """A move or retry on a shard of several: the copies were routed (those for
    destinations other shards own, to them); once every owner has stored its copies, the
    originals go. A crash in between leaves a message twice, never nowhere."""
    runtime = runtime_of(request)
    runtime.write_ops()
    try:
        await runtime.sync_with_owners()
    except StoreError as exc:
        raise ApiError(503, f"the store failed to make the change durable: {exc.message}"
                       ) from None
    with core_errors():
        admin.remove_messages(runtime.broker, dest, message_ids)


@routes.post("/api/queues/{name}/move")
async def move(request: web.Request) -> web.Response:
    dest = queue_of(request)
    body = await json_body(request)
    to = text_field(body, "to", required=True)
    assert to is not None
    selector, ids = selection(body)
    copy = body.get("copy", False)
    if not isinstance(copy, bool):
        raise ApiError(400, "'copy' must be true or false")
    runtime = runtime_of(request)
    staged = not copy and runtime.shard_links() is not None
    with core_errors():
        result = admin.transfer(runtime.broker, dest, to=admin.target(to), selector=selector,
                                message_ids=ids, copy=copy or staged, flush=runtime.write_ops)
    if staged:
        await remove_once_stored(request, dest, result.ids)
    await commit(request)
    return reply({"copied" if copy else "moved": result.done})


@routes.post("/api/queues/{name}/retry")
async def retry(request: web.Request) -> web.Response:
    dest = queue_of(request)
    selector, ids = selection(await json_body(request))
    runtime = runtime_of(request)
    staged = runtime.shard_links() is not None
    with core_errors():
        result = admin.transfer(runtime.broker, dest, to=None, selector=selector,
                                message_ids=ids, copy=staged, flush=runtime.write_ops)
    if staged:
        await remove_once_stored(request, dest, result.ids)
    await commit(request)
    return reply({"retried": result.done, "skipped": result.skipped})
