"""Who may use the management endpoint: HTTP Basic credentials and the admin group.

Pure decisions, no sockets: :func:`decide` takes the request's method and
``Authorization`` header and returns what to answer. Credentials are checked by the
broker's own authenticator (the users of ``[[auth.users]]``), never here.

- Off loopback every request needs a valid login (401 otherwise).
- On loopback a request without credentials may read; credentials that are sent are
  checked all the same (a typo must not pass silently).
- A request that would change the broker (any method but GET/HEAD) needs a user in
  ``management.admin_group`` (403 otherwise) whenever users are configured. A POST to
  the Jolokia endpoint only reads (it serves ``read`` and ``version`` requests, which
  monitoring tools send as POST bulk requests): it needs what a GET needs.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from meshmq.config.model import BrokerConfig
from meshmq.core.auth import Principal
from meshmq.errors import AuthenticationError

__all__ = ["READ_METHODS", "READ_ONLY_POSTS", "REALM", "Decision", "decide", "parse_basic"]

REALM = "meshmq"
READ_METHODS = frozenset({"GET", "HEAD"})
# Paths whose POST requests only read.
READ_ONLY_POSTS = frozenset({"/api/jolokia", "/api/jolokia/"})

# Checks a user name and password (off the event loop for hashed passwords).
Authenticate = Callable[[str, str], Awaitable[Principal]]


@dataclass(frozen=True, slots=True)
class Decision:
    """``status`` 0: serve the request (as ``principal``, None = local anonymous);
    otherwise answer with that status and ``error``."""

    status: int = 0
    error: str = ""
    principal: Principal | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 0


def parse_basic(header: str) -> tuple[str, str] | None:
    """``Basic base64(user:password)`` -> (user, password); None if malformed."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token.strip():
        return None
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = text.partition(":")
    if not sep or not user:
        return None
    return user, password


async def decide(config: BrokerConfig, method: str, authorization: str | None,
                 authenticate: Authenticate, path: str = "") -> Decision:
    mgmt = config.management
    if not config.auth.has_users:
        # Only possible on loopback (the loader refuses it elsewhere): nothing to check
        # credentials against, as the broker's own listeners with authentication off.
        return Decision()
    principal: Principal | None = None
    if authorization is not None:
        creds = parse_basic(authorization)
        if creds is None:
            return Decision(401, "malformed Authorization header: send HTTP Basic "
                                 "credentials (user name and password)")
        try:
            principal = await authenticate(*creds)
        except AuthenticationError:
            return Decision(401, "invalid user name or password")
        if principal.anonymous:
            return Decision(401, "invalid user name or password")
    elif not mgmt.loopback:
        return Decision(401, "authentication required: send HTTP Basic credentials of a "
                             "configured user")
    reads = method in READ_METHODS or (method == "POST" and path in READ_ONLY_POSTS)
    if not reads:
        if principal is None:
            return Decision(401, f"{method} changes the broker: log in as a user of "
                                 f"group {mgmt.admin_group!r}")
        if mgmt.admin_group not in principal.groups:
            return Decision(403, f"user {principal.user!r} is not in group "
                                 f"{mgmt.admin_group!r} (management.admin_group), which "
                                 f"{method} requests need", principal)
    return Decision(principal=principal)
