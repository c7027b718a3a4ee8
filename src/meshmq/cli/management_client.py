"""The command line's client for the management API (``meshmq stat`` and the admin
commands): one request helper, and every way a request can fail turned into one line
that says what to change.

Standard-library ``urllib`` on purpose: a command that runs one request and exits
needs no event loop, and the CLI keeps starting fast.
"""

from __future__ import annotations

import base64
import getpass
import http.client
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from meshmq.errors import MeshmqError

DEFAULT_URL = "127.0.0.1:8161"


class ManagementError(MeshmqError):
    """A management request that did not succeed; the message is the whole line to
    print after ``meshmq COMMAND:``, ``status`` the exit status."""

    code = "management"

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def quoted(name: str) -> str:
    """A destination name as one path segment."""
    return quote(name, safe="")


def password_for(user: str | None) -> str | None:
    """The password for ``--user``: $MESHMQ_PASSWORD, else asked for (never an argument,
    which other users of the host could read)."""
    if user is None:
        return None
    env = os.environ.get("MESHMQ_PASSWORD")
    if env is not None:
        return env
    return getpass.getpass(f"password for {user}: ")


class ManagementClient:
    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 cafile: str | None = None, timeout: float = 30.0) -> None:
        base = url if "://" in url else f"http://{url}"
        try:
            parsed = urlparse(base)
            parsed.port  # noqa: B018 (raises ValueError for a port out of range)
        except ValueError:
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ManagementError(f"--url {url!r} is not HOST:PORT, http://HOST:PORT or "
                                  "https://HOST:PORT")
        if cafile is not None and not Path(cafile).is_file():
            raise ManagementError(f"--cafile {cafile}: no such file")
        self.url = url
        self.base = base.rstrip("/")
        self.user = user
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            self.context = ssl.create_default_context(cafile=cafile)
            self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        elif cafile is not None:
            raise ManagementError("--cafile is for an HTTPS endpoint: give --url "
                                  "https://HOST:PORT")
        self._auth: str | None = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            self._auth = f"Basic {token}"

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None,
                body: dict[str, Any] | None = None) -> Any:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        target = self.base + path + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(target, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self.context) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except (http.client.HTTPException, ValueError) as exc:
            # Something answered, but not meshmq's management endpoint (a STOMP port).
            raise ManagementError(
                f"{self.url} is not a meshmq management endpoint ({exc!r}); point --url "
                f"at the broker's management HOST:PORT (default {DEFAULT_URL}; "
                "https://HOST:PORT when it serves HTTPS)") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise ManagementError(
                    f"cannot verify the certificate of the management endpoint at "
                    f"{self.url}: {exc.reason.verify_message}; pass the CA that signed it "
                    "with --cafile FILE") from None
            raise ManagementError(f"cannot reach the management endpoint at {self.url}: "
                                  f"{exc.reason}") from None
        except OSError as exc:
            raise ManagementError(f"cannot reach the management endpoint at {self.url}: "
                                  f"{exc}") from None

    def _refused(self, exc: urllib.error.HTTPError) -> ManagementError:
        try:
            reason = str(json.loads(exc.read()).get("error", exc.reason))
        except (ValueError, AttributeError, OSError):
            reason = str(exc.reason)
        if exc.code == 401 and self.user is None:
            hint = "; pass --user NAME (the password from MESHMQ_PASSWORD, or asked for)"
        elif exc.code == 401:
            hint = f" (user {self.user!r}); check --user and MESHMQ_PASSWORD"
        else:
            hint = ""
        if exc.code in (401, 403):
            return ManagementError(f"the management endpoint at {self.url} refused: "
                                   f"{exc.code} {reason}{hint}")
        # The request reached the broker and the broker said no (no such queue, a bad
        # selector): the message is the broker's own.
        return ManagementError(f"{reason} ({exc.code})", status=1)
