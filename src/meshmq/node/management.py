"""The node's one management endpoint, served by the supervisor.

Each shard runs its unchanged management app on a Unix socket in the node's private run
directory; this endpoint is the node's address (``[management]`` host and port, TLS and
logins as a broker's). It stays up while shards restart:

* ``GET /api/stat`` and ``GET /api/broker`` ask every shard at once and sum the answers
  (node/aggregate.py); a shard that does not answer within ``ASK_TIMEOUT_S`` is shown
  as down, the request never fails for it;
* ``GET /metrics`` asks every shard at once too and serves their series as one
  broker's (node/metrics.py), with ``meshmq_shard_up`` 0 for a shard that did not answer;
* ``GET /api/shards``: each shard's process (pid, state, restarts, uptime), its
  client connections, links, owned destinations, CPU and journal size
  (node/console.py, which also serves the console's files);
  ``GET /api/shards/{k}/stat``: shard k's own
  ``/api/stat`` (404 for a shard the node does not have, 503 while it does not answer);
* ``GET /api/health``: the node's own answer, with how many shards are up;
* destinations, messages, connections, subscriptions and Jolokia reads are one
  broker's: routed to the owning shard or merged from every shard
  (node/admin_routes.py);
* every other request is passed to the front shard (shard 0) as it came, its answer
  streamed back (the console's event stream too); 503 while shard 0 is down.

Logins are checked here as a broker checks them (management/access.py) and the
``Authorization`` header is passed on, so a shard applies the same rules again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from meshmq.config.credential_files import credential_source
from meshmq.config.model import BrokerConfig, management_exposure
from meshmq.core.auth import Authenticator
from meshmq.errors import ConfigError
from meshmq.management.api import error_reply, reply
from meshmq.management.app import login_decision
from meshmq.management.server import SHUTDOWN_TIMEOUT_S, bind_socket, tls_context
from meshmq.node import admin_routes
from meshmq.node import console as node_console
from meshmq.node.aggregate import ShardAnswer, ShardRow, node_broker, node_ha, node_stat
from meshmq.node.http_relay import relay_response
from meshmq.node.metrics import (
    ACCEPT,
    FixedCollector,
    ShardMetrics,
    merge,
    node_figures,
    process_figures,
)

__all__ = ["ASK_TIMEOUT_S", "NodeManagement"]

log = logging.getLogger("meshmq.node")

ASK_TIMEOUT_S = 3.0
# Request headers a shard needs; the rest (Host, Connection, ...) belong to this hop.
_FORWARD_REQUEST = ("Authorization", "Content-Type", "Accept", "Last-Event-ID")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class NodeManagement:
    """``rows`` says what the supervisor knows of each shard process;
    ``socket_of(k)`` is shard k's management socket."""

    def __init__(self, config: BrokerConfig, count: int, socket_of: Callable[[int], str],
                 rows: Callable[[], Sequence[ShardRow]], *,
                 ha_status: Callable[[], dict[str, object]] | None = None) -> None:
        self.config = config
        # The node's master/slave role (the supervisor's lease), shown as a broker's.
        self.ha_status = ha_status
        self.count = count
        self.socket_of = socket_of
        self.rows = rows
        self.auth = Authenticator(config.auth, credentials=credential_source(config.auth))
        self.started_ms = int(time.time() * 1000)
        self.address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self._sessions: dict[int, aiohttp.ClientSession] = {}

    # ------------------------------------------------------------ start and stop
    async def start(self) -> None:
        cfg = self.config.management
        problem = management_exposure(self.config)
        if problem is not None:
            raise ConfigError(problem, file=self.config.source, option="management.host")
        tls = tls_context(cfg, self.config.source)
        sock = bind_socket(cfg)
        app = web.Application(middlewares=[self._errors, self._login])
        app.router.add_get("/api/health", self._health)
        app.router.add_get("/api/stat", self._stat)
        app.router.add_get("/api/broker", self._broker)
        app.router.add_get("/api/shards", self._shards)
        app.router.add_get("/api/shards/{shard}/stat", self._shard_stat)
        app.router.add_get("/metrics", self._metrics)
        admin_routes.install(app, self)  # destinations, connections, Jolokia: by shard
        node_console.install(app, self)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=tls).start()
        self._runner = runner
        name = sock.getsockname()
        self.address = (name[0], name[1])
        scheme = "https" if tls is not None else "http"
        log.info("management endpoint of the node on %s://%s:%d/ (%d shards)", scheme,
                 name[0], name[1], self.count)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    def _session(self, shard: int) -> aiohttp.ClientSession:
        session = self._sessions.get(shard)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_of(shard)),
                auto_decompress=False)
            self._sessions[shard] = session
        return session

    # ------------------------------------------------------------ asking the shards
    async def _ask_one(self, shard: int, path: str, headers: dict[str, str]) -> ShardAnswer:
        try:
            async with self._session(shard).get(
                    f"http://shard{path}", headers=headers,
                    timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(body, dict):
                    error = body.get("error") if isinstance(body, dict) else None
                    return ShardAnswer(shard, error=f"HTTP {resp.status}: {error or ''}")
                return ShardAnswer(shard, body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            return ShardAnswer(shard, error=str(exc) or type(exc).__name__)

    async def _metrics_of(self, shard: int, headers: dict[str, str]) -> ShardMetrics:
        try:
            async with self._session(shard).get(
                    "http://shard/metrics", headers={**headers, "Accept": ACCEPT},
                    timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as resp:
                text = await resp.text()
                if resp.status != 200:
                    return ShardMetrics(shard, error=f"HTTP {resp.status}")
                return ShardMetrics(shard, text)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            return ShardMetrics(shard, error=str(exc) or type(exc).__name__)

    async def ask(self, path: str, request: web.Request) -> list[ShardAnswer]:
        headers = {k: v for k, v in request.headers.items() if k in _FORWARD_REQUEST}
        return list(await asyncio.gather(*(self._ask_one(k, path, headers)
                                           for k in range(self.count))))

    # ------------------------------------------------------------ routes
    async def _health(self, request: web.Request) -> web.Response:
        rows = self.rows()
        up = sum(1 for r in rows if r.state == "running")
        body: dict[str, object] = {"status": "ok" if up == self.count else "degraded",
                                   "broker": self.config.broker_name,
                                   "shards": {"running": up, "count": self.count}}
        if self.ha_status is not None:
            body["ha"] = self.ha_status()
        return reply(body)

    async def _stat(self, request: web.Request) -> web.Response:
        answers = await self.ask("/api/stat", request)
        stat = node_stat(self.config.broker_name, answers)
        if self.ha_status is not None:
            stat["ha"] = node_ha(self.ha_status(), answers)
        return reply(stat)

    async def _broker(self, request: web.Request) -> web.Response:
        answers = await self.ask("/api/broker", request)
        now_ms = int(time.time() * 1000)
        started = datetime.fromtimestamp(self.started_ms / 1000, UTC).isoformat(
            timespec="milliseconds")
        return reply(node_broker(self.config.broker_name, answers,
                                 now_ms - self.started_ms, started))

    async def _shards(self, request: web.Request) -> web.Response:
        return await node_console.shards_document(self, request)

    async def _shard_stat(self, request: web.Request) -> web.Response:
        text = request.match_info["shard"]
        shard = int(text) if text.isdigit() else -1
        if not 0 <= shard < self.count:
            return error_reply(404, f"the node has no shard {text!r}: its shards are 0 to "
                                    f"{self.count - 1} (GET /api/shards lists them)")
        headers = {k: v for k, v in request.headers.items() if k in _FORWARD_REQUEST}
        answer = await self._ask_one(shard, "/api/stat", headers)
        if answer.body is None:
            return error_reply(503, f"shard {shard} is not answering ({answer.error}); it "
                                    "is restarting or stopped: GET /api/shards says which")
        return reply({**answer.body, "shard": shard})

    async def _metrics(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
        answers = await asyncio.gather(*(self._metrics_of(k, headers)
                                         for k in range(self.count)))
        families, up = merge(answers)
        rows = self.rows()
        uptime_s = time.time() - self.started_ms / 1000
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FixedCollector(
            [*node_figures(rows, up, uptime_s), *families, *process_figures(rows)]))
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(registry), headers={"Content-Type": content_type})

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k in _FORWARD_REQUEST}
        body = await request.read() if request.can_read_body else None
        try:
            upstream = await self._session(0).request(
                request.method, f"http://shard{request.path_qs}", headers=headers,
                data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(sock_connect=ASK_TIMEOUT_S))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return error_reply(503, f"shard 0, which answers {request.path}, is not "
                                    f"answering ({exc or type(exc).__name__}); it is "
                                    "restarting or stopped: GET /api/shards says which")
        try:
            return await relay_response(request, upstream)
        finally:
            upstream.release()

    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_reply(exc.status, exc.reason)
        except Exception:
            log.exception("management request %s %s failed", request.method, request.path)
            return error_reply(500, "internal error; the node's log has the details")

    @web.middleware
    async def _login(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        decision = await login_decision(self.config, self.auth, request)
        if not decision.allowed:
            return error_reply(decision.status, decision.error)
        return await handler(request)
