"""Users, groups and certificate users kept in Java properties files, in the
formats of ActiveMQ's JAAS login modules:

* users file (``PropertiesLoginModule``): ``user=password``, the password clear
  text or a ``meshmq passwd`` hash;
* groups file: ``group=user1,user2``;
* certificate users file (``TextFileCertificateLoginModule``): ``user=DN``, the DN
  matched as an exact string, or ``user=/regex/`` matched in full.

Reading one raises ``OSError`` when the file cannot be read (the caller names the
option that points to it) and ``ConfigError`` naming the file and line for bad
content. ``CredentialFiles`` is what the broker's authenticator is handed (the core's
``CredentialSource``): the tables of the configured files, re-read when a file's
modification time changes if ``reload_files`` is on.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from meshmq.config.java_properties import Entry, PropertiesError, parse_properties
from meshmq.config.model import AuthConfig
from meshmq.core.passwords import check_hash, is_hashed
from meshmq.errors import ConfigError, MeshmqError

log = logging.getLogger("meshmq.auth")

ENC_ADVICE = ("encrypted passwords (ENC(...), Jasypt) are not supported: write the "
              "password itself or, better, the hash `meshmq passwd` prints")


@dataclass(frozen=True, slots=True)
class PasswordEntry:
    password: str
    line: int


@dataclass(frozen=True, slots=True)
class CertificateUsers:
    exact: dict[str, str] = field(default_factory=dict)  # DN -> user
    patterns: tuple[tuple[re.Pattern[str], str], ...] = ()  # (/regex/, user), file order


def _entries(path: Path) -> list[Entry]:
    text = path.read_text(encoding="latin-1")  # java.util.Properties reads ISO-8859-1
    try:
        return parse_properties(text)
    except PropertiesError as exc:
        raise ConfigError(str(exc), file=str(path), line=exc.line) from None


def read_users(path: Path) -> dict[str, PasswordEntry]:
    users: dict[str, PasswordEntry] = {}
    for e in _entries(path):
        value = e.value
        if value.startswith("ENC(") and value.endswith(")"):
            raise ConfigError(f"user {e.key!r}: {ENC_ADVICE}", file=str(path), line=e.line)
        problem = check_hash(value)
        if problem is not None:
            raise ConfigError(f"user {e.key!r}: {problem}", file=str(path), line=e.line)
        if not e.key:
            raise ConfigError("an entry without a user name", file=str(path), line=e.line)
        users[e.key] = PasswordEntry(value, e.line)
    return users


def cleartext_users(users: dict[str, PasswordEntry]) -> list[tuple[str, int]]:
    return [(name, e.line) for name, e in users.items() if not is_hashed(e.password)]


def read_groups(path: Path) -> dict[str, frozenset[str]]:
    """user -> the groups that list it."""
    members: dict[str, set[str]] = {}
    for e in _entries(path):
        for listed in e.value.split(","):
            user = listed.strip()
            if user:
                members.setdefault(user, set()).add(e.key)
    return {user: frozenset(groups) for user, groups in members.items()}


def read_certificate_users(path: Path) -> CertificateUsers:
    exact: dict[str, str] = {}
    patterns: list[tuple[re.Pattern[str], str]] = []
    for e in _entries(path):
        dn = e.value.strip()
        if len(dn) >= 2 and dn.startswith("/") and dn.endswith("/"):
            try:
                patterns.append((re.compile(dn[1:-1]), e.key))
            except re.error as exc:
                raise ConfigError(f"user {e.key!r}: bad regular expression {dn}: {exc}",
                                  file=str(path), line=e.line) from None
        elif dn:
            exact[dn] = e.key
        else:
            raise ConfigError(f"user {e.key!r} has no certificate DN", file=str(path),
                              line=e.line)
    return CertificateUsers(exact, tuple(patterns))


class CredentialFiles:
    """The users/groups/certificate files of an ``AuthConfig``, re-read on change if
    ``reload_files`` is on (implements ``meshmq.core.auth.CredentialSource``)."""

    def __init__(self, config: AuthConfig) -> None:
        """Read every configured file; ConfigError if one cannot be read or is bad."""
        self.reload = config.reload_files
        self.paths = {"users": config.users_file, "groups": config.groups_file,
                      "cert_users": config.certificate_users_file,
                      "cert_groups": config.certificate_groups_file}
        self.mtimes: dict[str, float] = {}
        self.users: dict[str, PasswordEntry] = {}
        self.user_groups: dict[str, frozenset[str]] = {}
        self.cert_users = CertificateUsers()
        self.cert_groups: dict[str, frozenset[str]] = {}
        self._warned: set[tuple[str, str]] = set()
        try:
            for kind in self.paths:
                self._load(kind)
        except OSError as exc:
            raise ConfigError(f"cannot read {exc.filename}: {exc.strerror}") from None

    # ------------------------------------------------------------ CredentialSource
    def password(self, login: str) -> str | None:
        entry = self.users.get(login)
        return entry.password if entry is not None else None

    def groups(self, login: str) -> frozenset[str]:
        return self.user_groups.get(login, frozenset())

    def passwords(self) -> list[str]:
        return [e.password for e in self.users.values()]

    def certificate_user(self, dn: str) -> str | None:
        table = self.cert_users
        name = table.exact.get(dn)
        if name is None:
            name = next((n for pattern, n in table.patterns if pattern.fullmatch(dn)), None)
        return name

    def certificate_groups(self, name: str) -> frozenset[str]:
        return self.cert_groups.get(name, frozenset())

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

    # ------------------------------------------------------------ reading
    def _load(self, kind: str) -> None:
        path = self.paths[kind]
        if path is None:
            return
        self.mtimes[kind] = path.stat().st_mtime
        if kind == "users":
            self.users = read_users(path)
            for name, line in cleartext_users(self.users):
                self._warn_cleartext(str(path), line, name)
        elif kind == "groups":
            self.user_groups = read_groups(path)
        elif kind == "cert_users":
            self.cert_users = read_certificate_users(path)
        else:
            self.cert_groups = read_groups(path)

    def _warn_cleartext(self, path: str, line: int, name: str) -> None:
        if (path, name) in self._warned:
            return
        self._warned.add((path, name))
        log.warning("%s:%d: user %r has a clear-text password; store the line `meshmq "
                    "passwd` prints instead", path, line, name)


def credential_source(config: AuthConfig) -> CredentialFiles | None:
    """The loaded credential files of ``config``, or None when it names none."""
    if any(p is not None for p in (config.users_file, config.groups_file,
                                   config.certificate_users_file,
                                   config.certificate_groups_file)):
        return CredentialFiles(config)
    return None
