"""Rights checks against the authorization map, with the record of denials.

Owns the question "may this connection do that on this destination": ``may`` (a yes
or no), ``authorize`` (raise ``AuthorizationError``, counting the denial per user,
logging it rate limited and tracing it) and ``readable_filter`` (which topics a
wildcard subscription may carry). The map itself is core/authorization.py; who may
connect at all is core/auth.py. It changes no table but the denial record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from meshmq.core.auth import Principal
from meshmq.core.authorization import AuthorizationMap, DenialRecord, Right, denial_text
from meshmq.core.destinations import Destination
from meshmq.core.message import Message
from meshmq.core.state import Connection, CoreState
from meshmq.errors import AuthorizationError

log = logging.getLogger("meshmq.broker")


class Access:
    """Rights per destination; ``authz`` None: everything is allowed."""

    def __init__(self, state: CoreState) -> None:
        self._state = state
        auth = state.config.auth
        self.authz = (AuthorizationMap(auth.authorization)
                      if auth.authorization is not None else None)
        self.denials = DenialRecord()

    def may(self, principal: Principal, right: Right, dest: Destination) -> bool:
        """Whether ``principal`` holds ``right`` on ``dest`` (always, without a map)."""
        authz = self.authz
        return authz is None or principal.internal or authz.allowed(principal.groups, right,
                                                                    dest)

    def authorize(self, conn: Connection, right: Right, dest: Destination,
                  message: Message | None = None) -> None:
        """Raise AuthorizationError unless the connection's user holds ``right`` on
        ``dest``; a denial is counted per user, logged (rate limited) and traced."""
        principal = conn.principal
        if self.may(principal, right, dest):
            return
        text = denial_text(principal.user, right, dest)
        unlogged = self.denials.note(principal.user, right, dest, self._state.now_ms())
        if unlogged is not None:
            more = f" ({unlogged} more since the last report)" if unlogged else ""
            log.warning("%s (connection %s from %s)%s", text, conn.id, conn.remote or "?", more)
        tracer = self._state.tracer
        if tracer is not None:
            tracer.denied(dest, text, message)
        raise AuthorizationError(text)

    def authorize_send(self, conn: Connection, dest: Destination, message: Message) -> None:
        """Write on ``dest``, and admin when this send creates it (ActiveMQ's rule)."""
        self.authorize(conn, Right.WRITE, dest, message)
        if not dest.is_temporary and not self._state.exists(dest) \
                and not self._state.owned_elsewhere(dest):
            self.authorize(conn, Right.ADMIN, dest, message)
        if len(conn.writable) < 10_000:
            conn.writable.add(dest)

    def readable_filter(self, principal: Principal) -> Callable[[Destination], bool] | None:
        """For a wildcard subscription: which concrete destinations it may carry."""
        authz = self.authz
        if authz is None or principal.internal:
            return None
        groups = principal.groups
        return lambda dest: authz.allowed(groups, Right.READ, dest)
