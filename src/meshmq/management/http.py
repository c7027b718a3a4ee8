"""A tiny JSON-over-HTTP management endpoint (``meshmq stat`` reads it).

Deliberately minimal (no framework): GET /api/stat, GET /api/health. It binds
to loopback by default; it will grow into the web console.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from typing import TYPE_CHECKING

from meshmq.errors import describe_bind_failure

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
        cfg = self.runtime.config.management
        tries = 21 if cfg.next_free_port and cfg.port else 1
        for offset in range(tries):
            try:
                self._server = await asyncio.start_server(
                    self._handle, cfg.host, cfg.port + offset, reuse_address=True)
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
        log.info("management endpoint on http://%s:%d/api/stat%s", sock[0], sock[1], moved)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

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
            if method != "GET":
                await self._reply(writer, 405, {"error": f"method {method} not allowed"})
            elif path == "/api/stat":
                await self._reply(writer, 200, self.runtime.statistics())
            elif path == "/api/health":
                await self._reply(writer, 200, {"status": "ok",
                                                "broker": self.runtime.config.broker_name})
            else:
                await self._reply(writer, 404, {"error": f"no such resource: {path}"})
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, body: object) -> None:
        data = json.dumps(body, indent=2, default=str).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found",
                  405: "Method Not Allowed"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                     + data)
        await writer.drain()
