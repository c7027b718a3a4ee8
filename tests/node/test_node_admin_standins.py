"""The node's cross-shard admin routes over stand-in shards (aiohttp apps on Unix
sockets): a merged list names the shard that did not answer, a request whose shard is
down is a 503 naming it, a durable subscription is deleted wherever it is kept, and
logins are checked before any shard is asked."""

from __future__ import annotations

import base64
import itertools
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from meshmq.config.model import AuthConfig, BrokerConfig, ManagementConfig, User
from meshmq.core.destinations import Destination
from meshmq.core.shards import owner
from tests.node.test_node_management import _run

# The stand-in node is named as BrokerConfig names a broker by default.
NODE = BrokerConfig().broker_name


def owned_by(shard: int, prefix: str) -> str:
    for n in itertools.count():
        name = f"{prefix}.{n}"
        if owner(Destination.parse_uri(f"queue://{name}"), 2, node=NODE) == shard:
            return name
    raise AssertionError("unreachable")


def shard_app(shard: int, *, durable: tuple[int, dict[str, Any]] = (404, {"error": "no"}),
              seen: list[tuple[int, str, str | None]] | None = None) -> web.Application:
    async def connections(request: web.Request) -> web.Response:
        return web.json_response({"connections": [
            {"id": "c1", "connected_at": f"2026-01-01T00:00:0{shard}"}]})

    async def destinations(request: web.Request) -> web.Response:
        return web.json_response({"destinations": [
            {"type": "queue", "name": owned_by(shard, "d"), "depth": shard + 1}]})

    async def close(request: web.Request) -> web.Response:
        if seen is not None:
            seen.append((shard, request.path, request.headers.get("Authorization")))
        return web.json_response({"closed": request.match_info["id"]})

    async def drop(request: web.Request) -> web.Response:
        return web.json_response(durable[1], status=durable[0])

    app = web.Application()
    app.router.add_get("/api/connections", connections)
    app.router.add_get("/api/destinations", destinations)
    app.router.add_delete("/api/connections/{id}", close)
    app.router.add_delete("/api/subscriptions/durable/{client}/{name}", drop)
    return app


def test_merged_lists_name_the_shard_that_did_not_answer(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/api/connections") as resp:
            answer = await resp.json()
        assert resp.status == 200
        assert [c["id"] for c in answer["connections"]] == ["s0-c1"]
        assert [s["state"] for s in answer["shards"]] == ["up", "down"]
        async with client.get(f"{url}/api/destinations") as resp:
            answer = await resp.json()
        assert [(d["depth"], d["shard"]) for d in answer["destinations"]] == [(1, 0)]
        assert answer["shards"][1]["state"] == "down" and answer["shards"][1]["error"]

    _run(tmp_path, {0: shard_app(0)}, scenario)


def test_a_request_for_what_a_down_shard_has_is_a_503_naming_it(tmp_path: Path) -> None:
    q1 = owned_by(1, "q")

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.post(f"{url}/api/destinations/queue/{q1}/purge") as resp:
            answer = await resp.json()
        assert resp.status == 503 and answer["shard"] == 1
        assert f"shard 1, which owns queue://{q1}, is not answering" in answer["error"]
        async with client.get(f"{url}/api/queues/{q1}/messages") as resp:
            assert resp.status == 503 and (await resp.json())["shard"] == 1
        async with client.delete(f"{url}/api/connections/s1-c1") as resp:
            assert resp.status == 503 and (await resp.json())["shard"] == 1
        mbean = (f"org.apache.activemq:type=Broker,brokerName={NODE},"
                 f"destinationType=Queue,destinationName={q1}")
        async with client.get(f"{url}/api/jolokia/read/{mbean}/QueueSize") as resp:
            answer = await resp.json()
        assert resp.status == 200  # Jolokia's errors are in the body
        assert (answer["status"], answer["shard"]) == (503, 1)
        async with client.delete(f"{url}/api/subscriptions/durable/cid/sub") as resp:
            assert resp.status == 503  # shard 1 may keep it

    _run(tmp_path, {0: shard_app(0)}, scenario)


def test_a_durable_subscription_is_deleted_on_the_shard_that_keeps_it(
        tmp_path: Path) -> None:
    deleted = {"deleted": {"client_id": "cid", "name": "sub", "messages_dropped": 3}}

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.delete(f"{url}/api/subscriptions/durable/cid/sub") as resp:
            answer = await resp.json()
        assert resp.status == 200
        assert answer["deleted"]["messages_dropped"] == 3 and answer["deleted_on"] == [1]

    _run(tmp_path, {0: shard_app(0), 1: shard_app(1, durable=(200, deleted))}, scenario)


def test_an_active_durable_subscription_names_its_node_wide_connection(
        tmp_path: Path) -> None:
    busy = {"error": "active on connection c4", "connection": "c4"}

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.delete(f"{url}/api/subscriptions/durable/cid/sub") as resp:
            answer = await resp.json()
        assert (resp.status, answer["connection"]) == (409, "s1-c4")

    _run(tmp_path, {0: shard_app(0), 1: shard_app(1, durable=(409, busy))}, scenario)


def test_closing_a_connection_needs_the_admin_group_and_passes_the_login_on(
        tmp_path: Path) -> None:
    config = BrokerConfig(
        management=ManagementConfig(host="127.0.0.1", port=0),
        auth=AuthConfig(users=(User("admin", "secret", ("admins",)),
                               User("reader", "secret"))))
    seen: list[tuple[int, str, str | None]] = []

    def basic(user: str) -> dict[str, str]:
        token = base64.b64encode(f"{user}:secret".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.delete(f"{url}/api/connections/s1-c1",
                                 headers=basic("reader")) as resp:
            assert resp.status == 403
        assert seen == []
        async with client.delete(f"{url}/api/connections/s1-c1",
                                 headers=basic("admin")) as resp:
            assert (resp.status, await resp.json()) == (200, {"closed": "s1-c1"})
        assert seen == [(1, "/api/connections/c1", basic("admin")["Authorization"])]

    _run(tmp_path, {0: shard_app(0, seen=seen), 1: shard_app(1, seen=seen)}, scenario,
         config)
