"""Real HTTP requests to a test broker's management listener (JSON in, JSON out)."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any


def basic(user: str, password: str) -> dict[str, str]:
    """An HTTP Basic Authorization header."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def call(port: int, method: str, path: str, body: object | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """``method path`` on 127.0.0.1:``port``; the status and the decoded JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers={
            **({"Content-Type": "application/json"} if data is not None else {}),
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
