"""The management API of a memory broker, called without a socket.

``MemoryManagement`` builds the real aiohttp application (``build_app(broker.runtime)``)
on the memory broker's event loop and serves it through aiohttp's own public serving
stack, ``web.AppRunner`` and its ``Server``: the ``RequestHandler`` protocol that a
listening socket would get is connected to an in-memory transport instead
(``MemoryBroker.connect``). A request is written as HTTP/1.1 bytes and parsed by
aiohttp's HTTP parser; it then goes through the real router, the ``errors_as_json`` and
``login`` middlewares and the handler, and the bytes the handler writes back are read
with ``http.client``. Only the socket is missing, so error bodies, 404/405 refusals,
Basic credentials and body limits behave as over HTTP.

Its ``call``/``ok``/``get``/``all_ids`` mirror ``tests/management/http.py`` with the
broker object in place of a port. ``memory_management(config)`` starts a broker of its
own; ``management_of(broker)`` serves the app of one that already exists (a
``NetworkBroker`` of a ``MemoryNetwork``, say) and leaves it running.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from aiohttp import web

from meshmq.config.model import BrokerConfig
from meshmq.management.app import build_app
from meshmq.store.base import Store
from tests.management.http import basic, q
from tests.support.memory_broker import (
    DEFAULT_TIMEOUT_S,
    MemoryBroker,
    MemoryTransport,
    memory_broker,
)

T = TypeVar("T")


class _Replay:
    """What ``http.client.HTTPResponse`` reads a response from: the bytes written."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str, *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))  # type: ignore[arg-type]


class Reply:
    """One HTTP answer: status, headers, raw body (and its JSON, when it is JSON)."""

    def __init__(self, raw: bytes) -> None:
        resp = http.client.HTTPResponse(_Replay(raw))  # type: ignore[arg-type]
        resp.begin()
        self.status = resp.status
        self.headers = resp.headers
        self.body = resp.read()

    @property
    def content_type(self) -> str:
        return self.headers.get_content_type()

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class MemoryManagement:
    """The management application of ``broker``, served over in-memory connections."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.app = build_app(broker.runtime)
        self.runner = web.AppRunner(self.app, handle_signals=False)
        broker.loop.run_until_complete(self.runner.setup())

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None,
                timeout: float = DEFAULT_TIMEOUT_S) -> Reply:
        """``method path`` on one new connection (closed after the answer)."""
        server = self.runner.server
        assert server is not None
        protocol = server()
        transport = MemoryTransport(self.broker.loop, protocol, ("127.0.0.1", 39999))
        self.broker.call(lambda: protocol.connection_made(transport))  # type: ignore[arg-type]
        head = {"Host": "management.test", "Connection": "close",
                "Content-Length": str(len(body or b"")), **(headers or {})}
        raw = f"{method} {path} HTTP/1.1\r\n".encode() + b"".join(
            f"{k}: {v}\r\n".encode("latin-1") for k, v in head.items()) + b"\r\n" + (body or b"")
        self.broker.call(lambda: protocol.data_received(raw))
        self.broker.wait_for(lambda: transport.closed, timeout,
                             f"the answer to {method} {path}")
        return Reply(bytes(transport.written))

    def call(self, method: str, path: str, body: object | None = None,
             headers: dict[str, str] | None = None, *, user: str | None = None,
             password: str = "") -> tuple[int, Any]:
        """Like ``tests.management.http.call``: the status and the decoded JSON answer."""
        data = json.dumps(body).encode() if body is not None else None
        reply = self.request(method, path, data, {
            **({"Content-Type": "application/json"} if data is not None else {}),
            **(basic(user, password) if user is not None else {}),
            **(headers or {})})
        return reply.status, reply.json()

    def get(self, path: str) -> Any:
        """A GET that must succeed: its JSON answer."""
        status, answer = self.call("GET", path)
        assert status == 200, (path, status, answer)
        return answer

    def ok(self, method: str, path: str, body: object = None, status: int = 200,
           **kw: Any) -> Any:
        """``call`` that must answer ``status``: its JSON answer."""
        got, answer = self.call(method, path, body, **kw)
        assert got == status, (method, path, got, answer)
        return answer

    def all_ids(self, queue: str) -> list[str]:
        """Every message id of ``queue``, browsing page by page."""
        ids: list[str] = []
        offset = 0
        while True:
            page = self.ok("GET", f"/api/queues/{q(queue)}/messages?offset={offset}&limit=1000")
            ids += [m["message_id"] for m in page["messages"]]
            offset += len(page["messages"])
            if not page["messages"] or offset >= page["total"]:
                return ids

    def poll(self, fn: Callable[[], T], timeout: float = DEFAULT_TIMEOUT_S,
             what: str = "the condition") -> T:
        """Call ``fn`` (which may make requests) until it returns something truthy, letting
        the loop run between calls; its result. Fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = fn()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self.broker.turn()

    def close(self) -> None:
        if not self.broker.loop.is_closed():
            self.broker.loop.run_until_complete(self.runner.cleanup())


@contextlib.contextmanager
def memory_management(config: BrokerConfig | None = None,
                      store: Store | None = None) -> Iterator[MemoryManagement]:
    """A memory broker (``memory_config`` when no config) and its management app;
    ``api.broker`` is the ``MemoryBroker``."""
    with memory_broker(config, store) as broker:
        api = MemoryManagement(broker)
        try:
            yield api
        finally:
            api.close()


@contextlib.contextmanager
def management_of(broker: MemoryBroker) -> Iterator[MemoryManagement]:
    """The management app of ``broker``, which already exists (one of a
    ``MemoryNetwork``'s brokers, say), served for the block; the broker is left as it
    was: whoever made it stops it."""
    api = MemoryManagement(broker)
    try:
        yield api
    finally:
        api.close()
