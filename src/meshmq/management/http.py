"""A tiny JSON-over-HTTP management endpoint (``meshmq stat`` reads it).

Deliberately minimal (no framework): GET /api/stat, GET /api/health. It binds
to loopback by default; it will grow into the web console. Off loopback every
request needs HTTP Basic credentials (:mod:`meshmq.management.access`); with
``ssl_certfile`` it speaks HTTPS only.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import ssl
from typing import TYPE_CHECKING

from meshmq.config.model import ManagementConfig, management_exposure
from meshmq.core.auth import Principal
from meshmq.errors import ConfigError, describe_bind_failure
from meshmq.management.access import REALM, decide
from meshmq.transport.login import check_password

if TYPE_CHECKING:
    from meshmq.transport.runtime import BrokerRuntime

log = logging.getLogger("meshmq.management")
MAX_REQUEST = 16 * 1024


class ManagementServer:
    def __init__(self, runtime: BrokerRuntime) -> None:
        self.runtime = runtime
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> None:
        config = self.runtime.config
        cfg = config.management
        # The loader refuses this too; a host from `meshmq broker --management` has not
        # been through the loader.
        problem = management_exposure(config)
        if problem is not None:
            raise ConfigError(problem, file=config.source, option="management.host")
        tls = _tls_context(cfg, config.source)
        tries = 21 if cfg.next_free_port and cfg.port else 1
        for offset in range(tries):
            try:
                self._server = await asyncio.start_server(
                    self._handle, cfg.host, cfg.port + offset, reuse_address=True, ssl=tls)
                break
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and offset + 1 < tries:
                    continue
                raise describe_bind_failure(
                    "the management endpoint", cfg.host, cfg.port + offset, exc,
                    "set [management] port (0: the OS chooses) or enabled = false, or "
                    "run with --management HOST:PORT or --management off") from None
        assert self._server is not None
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        self.runtime.addresses["management"] = self.address
        moved = f" ({cfg.port} was in use)" if cfg.port and sock[1] != cfg.port else ""
        scheme = "https" if tls is not None else "http"
        login = "" if cfg.loopback else " (HTTP Basic login required)"
        log.info("management endpoint on %s://%s:%d/api/stat%s%s", scheme, sock[0], sock[1],
                 moved, login)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _authenticate(self, login: str, passcode: str) -> Principal:
        return await check_password(self.runtime.broker.auth, login, passcode)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > MAX_REQUEST:
                raise ValueError("request too large")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) != 3:
                await self._reply(writer, 400, {"error": "malformed request line"})
                return
            method, path, _ = parts
            path = path.split("?", 1)[0]
            decision = await decide(self.runtime.config, method,
                                    _header(head, b"authorization"), self._authenticate)
            if not decision.allowed:
                await self._reply(writer, decision.status, {"error": decision.error})
            elif method != "GET":
                # No operation changes the broker yet; decide() has already required
                # the admin group for any that will.
                await self._reply(writer, 405, {"error": f"method {method} not allowed"})
            elif path == "/api/stat":
                await self._reply(writer, 200, self.runtime.statistics())
            elif path == "/api/health":
                await self._reply(writer, 200, {"status": "ok",
                                                "broker": self.runtime.config.broker_name})
            else:
                await self._reply(writer, 404, {"error": f"no such resource: {path}"})
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError, ValueError, ssl.SSLError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, body: object) -> None:
        data = json.dumps(body, indent=2, default=str).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                  404: "Not Found", 405: "Method Not Allowed"}[status]
        challenge = (f'WWW-Authenticate: Basic realm="{REALM}", charset="UTF-8"\r\n'
                     if status == 401 else "")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"{challenge}Content-Length: {len(data)}\r\nConnection: close\r\n"
                     "\r\n".encode() + data)
        await writer.drain()


def _header(head: bytes, name: bytes) -> str | None:
    """The value of header ``name`` (lower case) in a request head, or None."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


def _tls_context(cfg: ManagementConfig, source: str | None) -> ssl.SSLContext | None:
    if cfg.ssl_certfile is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile)
    except OSError as exc:  # ssl.SSLError too
        key = f" (key {cfg.ssl_keyfile})" if cfg.ssl_keyfile else ""
        raise ConfigError(f"cannot load {cfg.ssl_certfile}{key}: {exc.strerror or exc}",
                          file=source, option="management.ssl_certfile") from None
    return ctx
