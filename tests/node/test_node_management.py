"""The node's management endpoint over stand-in shards (aiohttp apps on Unix sockets):
a shard that is missing or too slow is shown down, never a 500; other routes are
passed to shard 0 as they came; logins are checked before any shard is asked."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from meshmq.config.model import AuthConfig, BrokerConfig, ManagementConfig, User
from meshmq.node import management as node_management
from meshmq.node.aggregate import ShardRow
from meshmq.node.management import NodeManagement


def _stat(connections: int) -> dict[str, Any]:
    return {"broker": "node", "uptime_ms": 5, "connections": connections,
            "destinations": [{"name": "q", "type": "queue", "depth": connections}],
            "durable_subscriptions": [], "memory": {"used": 1, "limit": 10, "peak": 1}}


def _metrics_text(connections: int) -> str:
    return ("# TYPE meshmq_messages_enqueued counter\n"
            f"meshmq_messages_enqueued_total {10 * connections}\n"
            "# TYPE meshmq_connections gauge\n"
            f'meshmq_connections{{listener="stomp",protocol="stomp"}} {connections}\n'
            "# EOF\n")


def _shard_app(connections: int, *, hang: bool = False,
               metrics: str | None = None) -> web.Application:
    async def stat(request: web.Request) -> web.Response:
        if hang:
            await asyncio.sleep(30)
        return web.json_response(_stat(connections))

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"method": request.method, "path": request.path_qs,
             "body": (await request.read()).decode(),
             "authorization": request.headers.get("Authorization")},
            status=202, headers={"X-Shard": "0"})

    async def scrape(request: web.Request) -> web.Response:
        if hang:
            await asyncio.sleep(30)
        text = _metrics_text(connections) if metrics is None else metrics
        return web.Response(text=text, content_type="application/openmetrics-text")

    app = web.Application()
    app.router.add_get("/api/stat", stat)
    app.router.add_get("/metrics", scrape)
    app.router.add_route("*", "/api/echo", echo)
    return app


# Long enough for the healthy shard's stand-in to answer on a loaded machine; the hung
# one never answers, so the wait is the test's only cost.
HUNG_SHARD_TIMEOUT_S = 2.0

Scenario = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


def _run(tmp_path: Path, shards: dict[int, web.Application], scenario: Scenario,
         config: BrokerConfig | None = None) -> None:
    config = config or BrokerConfig(management=ManagementConfig(host="127.0.0.1", port=0))

    def socket_of(index: int) -> str:
        return str(tmp_path / f"shard-{index}.mgmt.sock")

    def rows() -> list[ShardRow]:
        return [ShardRow(k, 100 + k, "running", 0, 1) for k in range(2)]

    async def main() -> None:
        runners = []
        for index, app in shards.items():
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            await web.UnixSite(runner, socket_of(index)).start()
            runners.append(runner)
        face = NodeManagement(config, 2, socket_of, rows)
        await face.start()
        assert face.address is not None
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://127.0.0.1:{face.address[1]}")
        finally:
            await face.stop()
            for runner in runners:
                await runner.cleanup()

    asyncio.run(main())


def test_a_missing_shard_is_shown_down_and_the_others_are_summed(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/api/stat") as resp:
            assert resp.status == 200
            stat = await resp.json()
        assert stat["connections"] == 3 and stat["destinations"][0]["depth"] == 3
        assert [s["state"] for s in stat["shards"]] == ["up", "down"]
        async with client.get(f"{url}/api/shards") as resp:
            doc = await resp.json()
        assert (doc["count"], doc["placement"]) == (2, "hash")
        assert [(s["pid"], s["answering"]) for s in doc["shards"]] == [(100, False),
                                                                       (101, False)]

    _run(tmp_path, {0: _shard_app(3)}, scenario)


def test_a_shard_too_slow_to_answer_is_shown_down(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_management, "ASK_TIMEOUT_S", HUNG_SHARD_TIMEOUT_S)

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/api/stat") as resp:
            assert resp.status == 200
            stat = await resp.json()
        assert stat["connections"] == 4
        assert [s["state"] for s in stat["shards"]] == ["down", "up"]

    _run(tmp_path, {0: _shard_app(3, hang=True), 1: _shard_app(4)}, scenario)


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def test_metrics_show_a_shard_that_does_not_answer_as_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_management, "ASK_TIMEOUT_S", HUNG_SHARD_TIMEOUT_S)

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            found = _families(await resp.text())
        assert found["meshmq_shard_up"] == [({"shard": "0"}, 0.0), ({"shard": "1"}, 1.0)]
        # The sums hold the shards that answered; per-shard series only theirs.
        assert found["meshmq_messages_enqueued"] == [({}, 40.0)]
        assert found["meshmq_connections"] == [
            ({"listener": "stomp", "protocol": "stomp", "shard": "1"}, 4.0)]

    _run(tmp_path, {0: _shard_app(3, hang=True), 1: _shard_app(4)}, scenario)


@pytest.mark.parametrize("text", ["not metrics at all", "# TYPE x counter\nx_total 1\n"])
def test_metrics_a_shard_cannot_be_read_from_count_it_down(tmp_path: Path,
                                                           text: str) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/metrics") as resp:
            found = _families(await resp.text())
        assert found["meshmq_shard_up"] == [({"shard": "0"}, 1.0), ({"shard": "1"}, 0.0)]
        assert found["meshmq_messages_enqueued"] == [({}, 30.0)]

    _run(tmp_path, {0: _shard_app(3), 1: _shard_app(4, metrics=text)}, scenario)


def test_one_shards_stat_is_its_own_503_while_it_does_not_answer(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/api/shards/0/stat") as resp:
            assert resp.status == 200
            assert await resp.json() == {**_stat(3), "shard": 0}
        async with client.get(f"{url}/api/shards/1/stat") as resp:
            assert resp.status == 503
            assert "shard 1 is not answering" in (await resp.json())["error"]
        async with client.get(f"{url}/api/shards/2/stat") as resp:
            assert resp.status == 404 and "0 to 1" in (await resp.json())["error"]

    _run(tmp_path, {0: _shard_app(3)}, scenario)


def test_other_routes_go_to_shard_0_as_they_came(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.post(f"{url}/api/echo?x=1", data=b"payload",
                               headers={"Content-Type": "text/plain"}) as resp:
            assert resp.status == 202 and resp.headers["X-Shard"] == "0"
            assert await resp.json() == {"method": "POST", "path": "/api/echo?x=1",
                                         "body": "payload", "authorization": None}

    _run(tmp_path, {0: _shard_app(1), 1: _shard_app(2)}, scenario)


def test_while_shard_0_is_down_other_routes_are_503_in_json(tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.get(f"{url}/api/echo") as resp:
            assert resp.status == 503
            assert "shard 0" in (await resp.json())["error"]
        async with client.get(f"{url}/api/health") as resp:
            assert (await resp.json())["shards"] == {"running": 2, "count": 2}

    _run(tmp_path, {1: _shard_app(2)}, scenario)


def test_logins_are_checked_before_any_shard_is_asked(tmp_path: Path) -> None:
    config = BrokerConfig(
        management=ManagementConfig(host="127.0.0.1", port=0),
        auth=AuthConfig(users=(User("admin", "secret", ("admins",)),
                               User("reader", "secret"))))

    def basic(user: str) -> dict[str, str]:
        token = base64.b64encode(f"{user}:secret".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.post(f"{url}/api/echo") as resp:
            assert resp.status == 401  # a change needs a login
        async with client.post(f"{url}/api/echo", headers=basic("reader")) as resp:
            assert resp.status == 403  # ... of the admin group
        async with client.get(f"{url}/api/stat", headers={
                "Authorization": "Basic " + base64.b64encode(b"admin:wrong").decode()}
                ) as resp:
            assert resp.status == 401
        async with client.post(f"{url}/api/echo", headers=basic("admin")) as resp:
            assert resp.status == 202
            assert (await resp.json())["authorization"] == basic("admin")["Authorization"]

    _run(tmp_path, {0: _shard_app(1), 1: _shard_app(2)}, scenario, config)
