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
from typing import Any

from meshmq.config.credential_files import (
    CertificateUsers,
    PasswordEntry,
    cleartext_users,
    read_certificate_users,
    read_groups,
    read_users,
)
from meshmq.config.model import AuthConfig
from meshmq.core.certificates import subject_dn
from meshmq.core.login_backoff import LoginBackoff
from meshmq.core.passwords import ScryptHash, dummy_hash, is_hashed, parse_hash
from meshmq.errors import AuthenticationError, ConfigError, MeshmqError

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


class _Files:
    """The users/groups/certificate files of the config, re-read on change if asked."""

    def __init__(self, config: AuthConfig, warned: set[tuple[str, str]]) -> None:
        self.reload = config.reload_files
        self.paths = {"users": config.users_file, "groups": config.groups_file,
                      "cert_users": config.certificate_users_file,
                      "cert_groups": config.certificate_groups_file}
        self.mtimes: dict[str, float] = {}
        self.users: dict[str, PasswordEntry] = {}
        self.groups: dict[str, frozenset[str]] = {}
        self.cert_users = CertificateUsers()
        self.cert_groups: dict[str, frozenset[str]] = {}
        self._warned = warned
        for kind in self.paths:
            self._load(kind)

    def _load(self, kind: str) -> None:
        path = self.paths[kind]
        if path is None:
            return
        self.mtimes[kind] = path.stat().st_mtime
        if kind == "users":
            self.users = read_users(path)
            for name, line in cleartext_users(self.users):
                _warn_cleartext(self._warned, f"{path}:{line}", name)
        elif kind == "groups":
            self.groups = read_groups(path)
        elif kind == "cert_users":
            self.cert_users = read_certificate_users(path)
        else:
            self.cert_groups = read_groups(path)

    def refresh(self) -> bool:
        """Re-read changed files (``reload_files``); True if one was re-read. A file
        that has become unreadable or invalid is logged and its last contents kept."""
        if not self.reload:
            return False
        changed = False
        for kind, path in self.paths.items():
            if path is None:
                continue
            try:
                if path.stat().st_mtime == self.mtimes.get(kind):
                    continue
                self._load(kind)
                changed = True
                log.info("re-read %s", path)
            except OSError as exc:
                log.error("cannot re-read %s (keeping what was read before): %s", path,
                          exc.strerror)
                self.mtimes[kind] = -1.0  # try again next time
            except MeshmqError as exc:
                log.error("%s (keeping what was read before)", exc)
                self.mtimes[kind] = path.stat().st_mtime  # until it changes again
        return changed


def _warn_cleartext(warned: set[tuple[str, str]], where: str, name: str) -> None:
    if (where.rsplit(":", 1)[0], name) in warned:
        return
    warned.add((where.rsplit(":", 1)[0], name))
    log.warning("%s: user %r has a clear-text password; store the line `meshmq passwd` "
                "prints instead", where, name)


class Authenticator:
    def __init__(self, config: AuthConfig, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._config = config
        self._inline = {u.name: u for u in config.users}
        self._warned: set[tuple[str, str]] = set()
        has_files = any(p is not None for p in (
            config.users_file, config.groups_file, config.certificate_users_file,
            config.certificate_groups_file))
        try:
            self._files = _Files(config, self._warned) if has_files else None
        except OSError as exc:
            raise ConfigError(f"cannot read {exc.filename}: {exc.strerror}") from None
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
        file_groups = self._files.groups.get(login, frozenset()) if self._files else frozenset()
        if user is not None:
            return user.password, frozenset(user.groups) | file_groups
        entry = self._files.users.get(login) if self._files else None
        return (entry.password if entry else None), file_groups

    def _any_hashed(self) -> bool:
        if any(is_hashed(u.password) for u in self._inline.values()):
            return True
        return self._files is not None and any(is_hashed(e.password)
                                               for e in self._files.users.values())

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
            groups |= self._files.cert_groups.get(name, frozenset())
        return Principal(dn, groups)

    def _certificate_user(self, dn: str) -> tuple[str | None, frozenset[str]]:
        user = self._cert_exact.get(dn)
        if user is None:
            user = next((u for pattern, u in self._cert_patterns if pattern.fullmatch(dn)),
                        None)
        if user is not None:
            return user.name, frozenset(user.groups)
        if self._files is not None:
            table = self._files.cert_users
            name = table.exact.get(dn)
            if name is None:
                name = next((n for pattern, n in table.patterns if pattern.fullmatch(dn)),
                            None)
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
