"""The management listener: the admin API, metrics and console over HTTP(S).

Served by aiohttp on the broker's own event loop, so handlers read and change broker
state directly, between two messages, with no locks. This module owns the socket (bind,
the next-free-port fallback, TLS); :mod:`meshmq.management.app` owns what is served.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from typing import TYPE_CHECKING

from aiohttp import web

from meshmq.config.model import ManagementConfig, management_exposure
from meshmq.errors import ConfigError, describe_bind_failure
from meshmq.management.app import build_app

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost

log = logging.getLogger("meshmq.management")

# A console kept open (server-sent events) must not hold a broker's stop back for long.
SHUTDOWN_TIMEOUT_S = 1.0


class ManagementServer:
    """``unix_path``: serve on this Unix socket instead of the configured port (a shard
    of a node, whose supervisor serves the node's port and asks each shard)."""

    def __init__(self, runtime: ManagementHost, *, unix_path: str | None = None) -> None:
        self.runtime = runtime
        self.unix_path = unix_path
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> None:
        config = self.runtime.config
        cfg = config.management
        # The loader refuses this too; a host from `meshmq broker --management` has not
        # been through the loader.
        problem = management_exposure(config)
        if problem is not None:
            raise ConfigError(problem, file=config.source, option="management.host")
        runner = web.AppRunner(build_app(self.runtime), access_log=None,
                               handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        if self.unix_path is not None:
            await runner.setup()
            await web.UnixSite(runner, self.unix_path).start()
            self._runner = runner
            log.info("management for the node's supervisor on %s", self.unix_path)
            return
        tls = tls_context(cfg, config.source)
        sock = bind_socket(cfg)
        await runner.setup()
        site = web.SockSite(runner, sock, ssl_context=tls)
        await site.start()
        self._runner = runner
        name = sock.getsockname()
        self.address = (name[0], name[1])
        self.runtime.addresses["management"] = self.address
        moved = f" ({cfg.port} was in use)" if cfg.port and name[1] != cfg.port else ""
        scheme = "https" if tls is not None else "http"
        login = "" if cfg.loopback else " (HTTP Basic login required)"
        log.info("management endpoint on %s://%s:%d/ (web console; admin API /api/..., "
                 "metrics /metrics)%s%s", scheme, name[0], name[1], moved, login)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def bind_socket(cfg: ManagementConfig) -> socket.socket:
    """A listening socket on the configured address, or on one of the 20 ports above it
    when ``next_free_port`` is on and the port is taken."""
    tries = 21 if cfg.next_free_port and cfg.port else 1
    for offset in range(tries):
        port = cfg.port + offset
        try:
            infos = socket.getaddrinfo(cfg.host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise describe_bind_failure("the management endpoint", cfg.host, port, exc,
                                        _FIX) from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and offset + 1 < tries:
                continue
            raise describe_bind_failure("the management endpoint", cfg.host, port, exc,
                                        _FIX) from None
    raise AssertionError("unreachable")  # the last try returns or raises


_FIX = ("set [management] port (0: the OS chooses) or enabled = false, or run with "
        "--management HOST:PORT or --management off")


def tls_context(cfg: ManagementConfig, source: str | None) -> ssl.SSLContext | None:
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
