"""Real HTTP requests to a test broker's management listener (JSON in, JSON out)."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any
from urllib.parse import quote


def basic(user: str, password: str) -> dict[str, str]:
    """An HTTP Basic Authorization header."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def call(port: int, method: str, path: str, body: object | None = None,
         headers: dict[str, str] | None = None, *, user: str | None = None,
         password: str = "", timeout: float = 30.0) -> tuple[int, Any]:
    """``method path`` on 127.0.0.1:``port`` (as ``user`` when given); the status and the
    decoded JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers={
            **({"Content-Type": "application/json"} if data is not None else {}),
            **(basic(user, password) if user is not None else {}),
            **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def get(port: int, path: str) -> Any:
    """A GET that must succeed: its JSON answer."""
    status, body = call(port, "GET", path)
    assert status == 200, (path, status, body)
    return body


def ok(port: int, method: str, path: str, body: object = None, status: int = 200,
       **kw: Any) -> Any:
    """``call`` that must answer ``status``: its JSON answer."""
    got, answer = call(port, method, path, body, **kw)
    assert got == status, (method, path, got, answer)
    return answer


def q(name: str) -> str:
    """A destination name as a path segment."""
    return quote(name, safe="")


def all_ids(port: int, queue: str) -> list[str]:
    """Every message id of ``queue``, browsing page by page."""
    ids: list[str] = []
    offset = 0
    while True:
        page = ok(port, "GET", f"/api/queues/{q(queue)}/messages?offset={offset}&limit=1000")
        ids += [m["message_id"] for m in page["messages"]]
        offset += len(page["messages"])
        if not page["messages"] or offset >= page["total"]:
            return ids
