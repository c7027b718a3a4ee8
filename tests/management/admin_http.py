"""A JSON HTTP client for the management API tests (real requests over loopback)."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any
from urllib.parse import quote


def call(port: int, method: str, path: str, body: object = None, *,
         user: str | None = None, password: str = "",
         timeout: float = 30.0) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ok(port: int, method: str, path: str, body: object = None, status: int = 200,
       **kw: Any) -> Any:
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
