"""Authentication against the users and groups of the configuration.

With no users configured and anonymous access on (the default), authentication is off:
any login is accepted as anonymous, as ActiveMQ without an authentication plugin does
(clients configured with ``system``/``manager`` just work). Once one user is configured,
a login that is given must be valid.

Authorization by destination comes later; ``Principal.groups`` is what it will use.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from meshmq.config.model import AuthConfig
from meshmq.errors import AuthenticationError


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    groups: frozenset[str]
    anonymous: bool = False


class Authenticator:
    def __init__(self, config: AuthConfig) -> None:
        self._config = config
        self._users = {u.name: u for u in config.users}
        #: No users and anonymous access: every login, whatever it says, is anonymous.
        self.open = config.anonymous_access and not config.users

    def authenticate(self, login: str | None, passcode: str | None) -> Principal:
        """Return who connected, or raise ``AuthenticationError``.

        No login at all means anonymous access, if allowed. A login that is given
        must be valid even when anonymous access is on (a typo must not silently
        downgrade a client to anonymous) -- unless no users are configured at all
        (``open``): then there is nothing to check it against and it is accepted.
        """
        if not login or self.open:
            if self._config.anonymous_access:
                return Principal(self._config.anonymous_user,
                                 frozenset(self._config.anonymous_groups), anonymous=True)
            raise AuthenticationError("Authentication failed: credentials required")
        user = self._users.get(login)
        supplied = (passcode or "").encode()
        expected = user.password.encode() if user is not None else b"\x00invalid"
        # compare_digest even for unknown users, so timing does not reveal user names.
        if not hmac.compare_digest(supplied, expected) or user is None:
            raise AuthenticationError("Authentication failed")
        return Principal(user.name, frozenset(user.groups))

    def certificate_principal(self, cert: dict[str, Any]) -> Principal:
        """The principal of a peer whose certificate TLS verified (broker links over
        mutual TLS): its subject DN in Java's form, most specific first, e.g.
        "CN=b, OU=brokers, O=meshmq"; no groups. A minimal form: certificate
        authentication of clients maps DNs to users and groups on top of this."""
        names = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O",
                 "localityName": "L", "stateOrProvinceName": "ST", "countryName": "C",
                 "emailAddress": "EMAILADDRESS", "domainComponent": "DC"}
        # getpeercert() lists RDNs from the root down; Java's getName() goes leaf first.
        parts = [f"{names.get(k, k)}={v}" for rdn in reversed(cert.get("subject", ()))
                 for k, v in rdn]
        return Principal(", ".join(parts), frozenset())
