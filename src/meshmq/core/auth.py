"""Authentication: who a connecting client is.

The rule, in one place:

* **No users configured** (no ``[[auth.users]]``, no ``users_file``) and anonymous
  access on (the default): authentication is off. Any login, whatever it says, is
  accepted as the anonymous user, as ActiveMQ without an authentication plugin
  does (clients configured with ``system``/``manager`` just work).
* **Users exist**: a login that is given must be valid; a wrong one is refused,
  never downgraded to anonymous (a typo must not silently lose a client its rights).
* **Anonymous** access (when on) is for a connection that gives no login at all.
* **Certificates**: when certificate users are configured, a TLS connection that
  presented a verified client certificate is authenticated by it alone (a login it
  also sends is ignored, as ActiveMQ's certificate plugins do); the user is the
  certificate's subject DN, its groups those of the certificate user it matched.
  Connections without a certificate follow the password rules above.

Every refusal reads ``User name [<login>] or password is invalid.``, whether the
user exists or not, and an unknown user costs the same scrypt work as a wrong
password. Checking a hash is slow by design (``core/passwords.py``); ``begin``
returns a ``PendingLogin`` for that work, which the protocol servers run on a
worker thread, and successful checks are remembered under an HMAC of (user,
password) keyed by a per-process random key, so a reconnect storm costs one
scrypt per distinct credential. Failed logins feed ``LoginBackoff``.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from meshmq.config.model import AuthConfig
from meshmq.core.certificates import subject_dn
from meshmq.core.login_backoff import LoginBackoff
from meshmq.core.passwords import ScryptHash, dummy_hash, is_hashed, parse_hash
from meshmq.errors import AuthenticationError, ConfigError

log = logging.getLogger("meshmq.auth")

# Successful hash checks remembered (oldest forgotten first).
VERIFIED_CACHE_SIZE = 10_000


def refusal(login: str | None) -> str:
    """ActiveMQ's words for every failed login."""
    return f"User name [{'null' if login is None else login}] or password is invalid."


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    groups: frozenset[str]
    anonymous: bool = False
    # The broker acting for itself (its own end of a bridge it opened): no rights checked.
    internal: bool = False


@dataclass(frozen=True, slots=True)
class PendingLogin:
    """A password check that needs scrypt work: ``verify`` is pure and thread-safe;
    its answer goes back to ``Authenticator.finish`` on the event loop."""

    login: str
    passcode: str
    stored: str | None  # what the user's password is stored as; None: no such user
    hashed: ScryptHash  # the user's hash, or the dummy one (same cost)
    key: bytes  # HMAC of (user, password): the verified-cache key

    def verify(self) -> bool:
        matched = self.hashed.matches(self.passcode)
        if self.stored is None:
            return False
        if not is_hashed(self.stored):
            # A clear-text user where hashes exist: the scrypt above was for equal cost.
            return hmac.compare_digest(self.stored.encode(), self.passcode.encode())
        return matched


class CredentialSource(Protocol):
    """The users, groups and certificate users kept outside the configuration (files in
    ActiveMQ's formats), as the edge loaded them: config/credential_files.py implements
    it. The core never reads a file; it asks ``refresh`` before each login, and the
    source re-reads what changed (when ``reload_files`` is on), keeping the last good
    contents of a file that turned bad."""

    def refresh(self) -> bool:
        """Re-read what changed; True if anything was re-read."""
        ...

    def password(self, login: str) -> str | None:
        """The stored password (clear text or a hash) of ``login``, or None."""
        ...

    def groups(self, login: str) -> frozenset[str]:
        """The groups that list ``login``."""
        ...

    def passwords(self) -> list[str]:
        """Every stored password (to know whether hashes exist)."""
        ...

    def certificate_user(self, dn: str) -> str | None:
        """The certificate user a subject DN matches (exactly, then by pattern)."""
        ...

    def certificate_groups(self, name: str) -> frozenset[str]:
        """The certificate groups that list certificate user ``name``."""
        ...


def names_files(config: AuthConfig) -> bool:
    """Whether ``config`` keeps users, groups or certificate users in files."""
    return any(p is not None for p in (config.users_file, config.groups_file,
                                       config.certificate_users_file,
                                       config.certificate_groups_file))


class Authenticator:
    def __init__(self, config: AuthConfig, *, clock: Callable[[], float] = time.monotonic,
                 credentials: CredentialSource | None = None) -> None:
        """``credentials``: the tables of the files ``config`` names (required when it
        names any; whoever builds the broker loads them at the edge)."""
        self._config = config
        self._inline = {u.name: u for u in config.users}
        if credentials is None and names_files(config):
            raise ConfigError("the authentication configuration names credential files, "
                              "but they were not loaded")
        self._files = credentials
        #: No users and anonymous access: every password login, whatever it says, is
        #: anonymous.
        self.open = config.anonymous_access and not config.users and config.users_file is None
        #: Certificate authentication is configured: a verified client certificate
        #: decides who a TLS connection is.
        self.certificates = bool(config.certificate_users or config.certificate_users_file)
        self._cert_patterns = [(re.compile(u.dn_regex), u) for u in config.certificate_users
                               if u.dn_regex is not None]
        self._cert_exact = {u.dn: u for u in config.certificate_users if u.dn is not None}
        self._key = os.urandom(32)
        self._verified: dict[bytes, str] = {}
        self._hashes_exist = self._any_hashed()
        self.backoff = LoginBackoff(after=config.login_backoff_after,
                                    max_delay=config.login_backoff_max_ms / 1000, clock=clock)

    # -------------------------------------------------------------- passwords
    def _stored(self, login: str) -> tuple[str | None, frozenset[str]]:
        user = self._inline.get(login)
        files = self._files
        file_groups = files.groups(login) if files is not None else frozenset()
        if user is not None:
            return user.password, frozenset(user.groups) | file_groups
        return (files.password(login) if files is not None else None), file_groups

    def _any_hashed(self) -> bool:
        if any(is_hashed(u.password) for u in self._inline.values()):
            return True
        return self._files is not None and any(is_hashed(p) for p in self._files.passwords())

    def _anonymous(self) -> Principal:
        if self._config.anonymous_access:
            return Principal(self._config.anonymous_user,
                             frozenset(self._config.anonymous_groups), anonymous=True)
        raise AuthenticationError(refusal(None))

    def begin(self, login: str | None, passcode: str | None) -> Principal | PendingLogin:
        """Decide at once, or return the scrypt work that decides (``finish`` takes its
        answer). Raises ``AuthenticationError`` for a refusal decided at once."""
        if self._files is not None and self._files.refresh():
            self._verified.clear()
            self._hashes_exist = self._any_hashed()
        if not login or self.open:
            return self._anonymous()
        passcode = passcode or ""
        stored, groups = self._stored(login)
        key = hmac.new(self._key, f"{len(login)}:{login}:{passcode}".encode(),
                       "sha256").digest()
        if stored is not None and is_hashed(stored):
            if self._verified.get(key) == stored:
                return Principal(login, groups)
            return PendingLogin(login, passcode, stored, parse_hash(stored), key)
        if self._hashes_exist:
            # Unknown or clear-text users cost the same scrypt as hashed ones.
            return PendingLogin(login, passcode, stored, dummy_hash(), key)
        if stored is None or not hmac.compare_digest(stored.encode(), passcode.encode()):
            raise AuthenticationError(refusal(login))
        return Principal(login, groups)

    def finish(self, pending: PendingLogin, matched: bool) -> Principal:
        if not matched or pending.stored is None:
            raise AuthenticationError(refusal(pending.login))
        stored, groups = self._stored(pending.login)
        if stored != pending.stored:  # the files changed while it was checked
            raise AuthenticationError(refusal(pending.login))
        if is_hashed(stored):
            if len(self._verified) >= VERIFIED_CACHE_SIZE:
                del self._verified[next(iter(self._verified))]
            self._verified[pending.key] = stored
        return Principal(pending.login, groups)

    def authenticate(self, login: str | None, passcode: str | None) -> Principal:
        """Return who connected, or raise ``AuthenticationError``; any scrypt work runs
        here, on the caller's thread (the protocol servers use ``begin`` instead)."""
        decided = self.begin(login, passcode)
        if isinstance(decided, Principal):
            return decided
        return self.finish(decided, decided.verify())

    # -------------------------------------------------------------- certificates
    def certificate_principal(self, cert: Mapping[str, Any]) -> Principal:
        """The principal of a verified peer certificate (``getpeercert()``): its subject
        DN is the user, its groups those of the certificate user it matches. With no
        certificate users configured the DN is the user, with no groups; configured but
        unmatched, the DN is logged and ``AuthenticationError`` raised."""
        dn = subject_dn(cert)
        if not self.certificates:
            return Principal(dn, frozenset())
        if self._files is not None:
            self._files.refresh()
        name, groups = self._certificate_user(dn)
        if name is None:
            log.warning("No user for client certificate: %s", dn)
            raise AuthenticationError(refusal(None))
        if self._files is not None:
            groups |= self._files.certificate_groups(name)
        return Principal(dn, groups)

    def _certificate_user(self, dn: str) -> tuple[str | None, frozenset[str]]:
        user = self._cert_exact.get(dn)
        if user is None:
            user = next((u for pattern, u in self._cert_patterns if pattern.fullmatch(dn)),
                        None)
        if user is not None:
            return user.name, frozenset(user.groups)
        if self._files is not None:
            name = self._files.certificate_user(dn)
            if name is not None:
                return name, frozenset()
        return None, frozenset()

    def login(self, login: str | None, passcode: str | None,
              cert: Mapping[str, Any] | None) -> Principal | PendingLogin:
        """``begin`` for a protocol connection: a verified client certificate decides
        when certificate authentication is configured; the refusal names the login
        the client gave, never the certificate's DN."""
        if cert and self.certificates:
            try:
                return self.certificate_principal(cert)
            except AuthenticationError:
                raise AuthenticationError(refusal(login)) from None
        return self.begin(login, passcode)

    # -------------------------------------------------------------- refusals
    def refused(self, remote: str) -> float:
        """Count a failed login from ``remote`` (``host:port``); the seconds its refusal
        is held back."""
        return self.backoff.failed(remote.rsplit(":", 1)[0])

    def statistics(self) -> dict[str, int]:
        return {"failed_logins": self.backoff.failed_total,
                "login_slowed_addresses": self.backoff.slowed()}
