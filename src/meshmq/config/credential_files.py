"""Users, groups and certificate users kept in Java properties files, in the
formats of ActiveMQ's JAAS login modules:

* users file (``PropertiesLoginModule``): ``user=password``, the password clear
  text or a ``meshmq passwd`` hash;
* groups file: ``group=user1,user2``;
* certificate users file (``TextFileCertificateLoginModule``): ``user=DN``, the DN
  matched as an exact string, or ``user=/regex/`` matched in full.

Reading one raises ``OSError`` when the file cannot be read (the caller names the
option that points to it) and ``ConfigError`` naming the file and line for bad
content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from meshmq.config.java_properties import Entry, PropertiesError, parse_properties
from meshmq.core.passwords import check_hash, is_hashed
from meshmq.errors import ConfigError

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
