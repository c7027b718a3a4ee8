"""The node's admin routes that span shards: destinations, messages, connections,
subscriptions and Jolokia reads, served as one broker's (docs/shards.md, "Management").

A request about one destination goes to its owning shard, one about a connection to the
shard that has it, and the answer comes back as that shard gave it; a list asks every
shard at once and merges (node/admin_merge.py: pure). A shard that does not answer within
the node's timeout is listed as down under ``shards`` in a merged answer; a request whose
shard does not answer is a 503 naming it. The node has checked the login (its
middleware) before any route here runs, and passes the ``Authorization`` header on, so
the shard applies the same rules again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from meshmq.core.shards import PLACEMENTS
from meshmq.management.api import error_reply, reply
from meshmq.management.routes_jolokia import _uptime_text, split_path
from meshmq.node.admin_merge import (
    UNAVAILABLE,
    Answer,
    NodeFigures,
    connection_shard,
    destination_owner,
    jolokia_error,
    jolokia_merge,
    jolokia_plan,
    merge_connections,
    merge_destinations,
    merge_subscriptions,
    node_connection_id,
    queue_owner,
    shard_states,
)
from meshmq.node.http_relay import relay_response

if TYPE_CHECKING:
    from meshmq.node.management import NodeManagement

__all__ = ["install"]

# What a request that names no valid destination is, in a 503 (the front shard words it).
FRONT_SHARD_NOTE = "answers what names no destination"


def _ask_timeout() -> float:
    from meshmq.node import management  # the node's one timeout (tests lower it)

    return management.ASK_TIMEOUT_S


def _headers(request: web.Request) -> dict[str, str]:
    from meshmq.node import management

    return {k: v for k, v in request.headers.items() if k in management._FORWARD_REQUEST}


def _down(shard: int, what: str, error: str) -> web.Response:
    return error_reply(503, f"shard {shard}, which {what}, is not answering ({error}); it "
                            "is restarting or stopped: GET /api/shards says which",
                       shard=shard)


class NodeAdmin:
    def __init__(self, face: NodeManagement) -> None:
        self.face = face

    @property
    def count(self) -> int:
        return self.face.count

    @property
    def node(self) -> str:
        return self.face.config.broker_name

    @property
    def placement(self) -> str:
        return PLACEMENTS[self.face.config.sharding.placement]

    # ------------------------------------------------------------ asking shards
    async def call(self, shard: int, method: str, path: str, headers: dict[str, str],
                   body: bytes | None = None) -> Answer:
        """One shard's JSON answer (``status`` 0 when it gave none in time)."""
        try:
            async with self.face._session(shard).request(
                    method, f"http://shard{path}", headers=headers, data=body,
                    timeout=aiohttp.ClientTimeout(total=_ask_timeout())) as resp:
                try:
                    parsed = await resp.json(content_type=None)
                except ValueError:
                    parsed = None
                return Answer(shard, resp.status, parsed)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return Answer(shard, error=str(exc) or type(exc).__name__)

    async def every(self, method: str, path: str, request: web.Request,
                    body: bytes | None = None) -> list[Answer]:
        headers = _headers(request)
        return list(await asyncio.gather(*(self.call(k, method, path, headers, body)
                                           for k in range(self.count))))

    async def forward(self, shard: int, request: web.Request, what: str,
                      body: bytes | None = None) -> web.StreamResponse:
        """``request`` as it came, to ``shard``; its answer streamed back."""
        if body is None and request.can_read_body:
            body = await request.read()
        try:
            upstream = await self.face._session(shard).request(
                request.method, f"http://shard{request.raw_path}", headers=_headers(request),
                data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(sock_connect=_ask_timeout()))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return _down(shard, what, str(exc) or type(exc).__name__)
        try:
            return await relay_response(request, upstream)
        finally:
            upstream.release()

    def _merged_error(self, answers: list[Answer]) -> web.Response | None:
        """A refusal every shard gives alike (a bad query): answered as one broker's."""
        for answer in answers:
            if answer.up and answer.status != 200:
                body = answer.body if isinstance(answer.body, Mapping) else {}
                return reply(dict(body) or {"error": f"HTTP {answer.status}"}, answer.status)
        return None

    # ------------------------------------------------------------ destinations
    async def list_destinations(self, request: web.Request) -> web.Response:
        answers = await self.every("GET", request.raw_path, request)
        refused = self._merged_error(answers)
        if refused is not None:
            return refused
        merged = merge_destinations(answers, self.count, self.node, self.placement)
        return reply({"destinations": merged,
                      "shards": shard_states(answers)})

    async def create_destination(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else b""
        try:
            fields = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            fields = None
        shard: int | None = None
        if isinstance(fields, dict) and isinstance(fields.get("type"), str) \
                and isinstance(fields.get("name"), str):
            shard = destination_owner(fields["type"], fields["name"], self.count, self.node,
                                      self.placement)
        if shard is None:  # a body one broker refuses: the front shard words it
            return await self.forward(0, request, FRONT_SHARD_NOTE, body)
        return await self.forward(shard, request,
                                  f"owns {fields['type']}://{fields['name']}", body)

    async def destination(self, request: web.Request) -> web.StreamResponse:
        kind, name = request.match_info["type"], request.match_info["name"]
        shard = destination_owner(kind, name, self.count, self.node, self.placement)
        if shard is None:
            return await self.forward(0, request, FRONT_SHARD_NOTE)
        return await self.forward(shard, request, f"owns {kind}://{name}")

    async def queue(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        shard = queue_owner(name, self.count, self.node, self.placement)
        if shard is None:
            return await self.forward(0, request, FRONT_SHARD_NOTE)
        return await self.forward(shard, request, f"owns queue://{name}")

    # ------------------------------------------------------------ connections
    async def list_connections(self, request: web.Request) -> web.Response:
        answers = await self.every("GET", "/api/connections", request)
        return reply({"connections": merge_connections(answers),
                      "shards": shard_states(answers)})

    async def close_connection(self, request: web.Request) -> web.Response:
        node_id = request.match_info["id"]
        found = connection_shard(node_id, self.count)
        if found is None:
            return error_reply(404, f"no open client connection {node_id!r}: a node's "
                                    "connection ids name their shard (s1-c3 is shard 1's "
                                    "c3); GET /api/connections lists the open ones")
        shard, local = found
        answer = await self.call(shard, "DELETE", f"/api/connections/{quote(local, safe='')}",
                                 _headers(request))
        if not answer.up:
            return _down(shard, f"has connection {node_id}", answer.error)
        body = dict(answer.body) if isinstance(answer.body, Mapping) else {}
        if answer.status == 200:
            body["closed"] = node_id
        return reply(body, answer.status)

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        answers = await self.every("GET", "/api/subscriptions", request)
        return reply({"subscriptions": merge_subscriptions(answers),
                      "shards": shard_states(answers)})

    async def delete_durable(self, request: web.Request) -> web.Response:
        """Every shard is asked: a durable subscription is kept by its topic's owner (the
        name does not say which), a wildcard one by every shard."""
        answers = await self.every("DELETE", request.raw_path, request)
        done = [a for a in answers if a.status == 200 and isinstance(a.body, Mapping)]
        if done:
            deleted = dict(done[0].body["deleted"])
            deleted["messages_dropped"] = sum(
                int(a.body["deleted"].get("messages_dropped", 0)) for a in done)
            return reply({"deleted": deleted, "shards": shard_states(answers),
                          "deleted_on": [a.shard for a in done]})
        for answer in answers:
            if answer.status not in (0, 404) and isinstance(answer.body, Mapping):
                body = dict(answer.body)
                if isinstance(body.get("connection"), str):
                    body["connection"] = node_connection_id(answer.shard, body["connection"])
                return reply(body, answer.status)
        down = [a for a in answers if not a.up]
        if down:
            names = ", ".join(str(a.shard) for a in down)
            return error_reply(503, f"no answering shard has this durable subscription, and "
                                    f"shard {names} is not answering: it may keep it; ask "
                                    "again once GET /api/shards shows it running",
                               shards=shard_states(answers))
        first = answers[0].body if answers and isinstance(answers[0].body, Mapping) else {}
        return reply(dict(first) or {"error": "no such durable subscription"}, 404)

    # ------------------------------------------------------------ Jolokia
    async def jolokia_one(self, request: web.Request, asked: Mapping[str, Any]
                          ) -> dict[str, Any]:
        plan = jolokia_plan(asked, self.count, self.node, self.placement)
        headers = _headers(request)
        headers["Content-Type"] = "application/json"
        if plan.shard is not None:
            answer = await self.call(plan.shard, "POST", "/api/jolokia", headers,
                                     json.dumps(asked).encode())
            if isinstance(answer.body, dict):
                return answer.body
            return {**jolokia_error(asked, 503, UNAVAILABLE,
                                    f"{UNAVAILABLE} : shard {plan.shard}, which answers "
                                    "this mbean, is "
                                    f"not answering ({answer.error or answer.status}); "
                                    "GET /api/shards says which"), "shard": plan.shard}
        each = {k: v for k, v in asked.items() if k != "attribute" or plan.merge not in (
            "broker", "read")}
        answers = list(await asyncio.gather(*(
            self.call(k, "POST", "/api/jolokia", headers, json.dumps(each).encode())
            for k in range(self.count))))
        uptime_ms = int(time.time() * 1000) - self.face.started_ms
        figures = NodeFigures(uptime_ms, _uptime_text(uptime_ms),
                              str(self.face.config.data_directory))
        return jolokia_merge(asked, plan, answers, count=self.count, node=self.node,
                             placement=self.placement,
                             figures=figures, timestamp=int(time.time()))

    async def jolokia_read(self, request: web.Request) -> web.Response:
        parts = split_path(request.match_info["path"])
        asked: dict[str, Any] = {"type": "read", "mbean": parts[0]}
        if len(parts) > 1:
            asked["attribute"] = parts[1]
        return reply(await self.jolokia_one(request, asked))

    async def jolokia_post(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else b""
        try:
            asked = json.loads(body or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            asked = None
        if isinstance(asked, list) and asked and all(isinstance(r, dict) for r in asked):
            return reply(list(await asyncio.gather(*(self.jolokia_one(request, r)
                                                     for r in asked))))
        if isinstance(asked, dict):
            return reply(await self.jolokia_one(request, asked))
        return await self.forward(0, request, FRONT_SHARD_NOTE, body)  # it words the error


def install(app: web.Application, face: NodeManagement) -> None:
    """Add the node's cross-shard admin routes to ``app`` (before its catch-all)."""
    admin = NodeAdmin(face)
    router = app.router
    router.add_get("/api/destinations", admin.list_destinations)
    router.add_post("/api/destinations", admin.create_destination)
    router.add_route("*", "/api/destinations/{type}/{name}", admin.destination)
    router.add_route("*", "/api/destinations/{type}/{name}/{op}", admin.destination)
    router.add_route("*", "/api/queues/{name}/{tail:.*}", admin.queue)
    router.add_get("/api/connections", admin.list_connections)
    router.add_delete("/api/connections/{id}", admin.close_connection)
    router.add_get("/api/subscriptions", admin.list_subscriptions)
    router.add_delete("/api/subscriptions/durable/{client_id}/{name}", admin.delete_durable)
    router.add_get("/api/jolokia/read/{path:.+}", admin.jolokia_read)
    router.add_post("/api/jolokia", admin.jolokia_post)
