"""Who may read, write and create which destination: ActiveMQ's authorization map.

Semantics, as ActiveMQ's ``DefaultAuthorizationMap`` (docs/security.md):

- An entry names a queue or topic pattern (``*`` one segment, ``>`` the rest; an entry
  ``FOO.>`` also covers ``FOO`` itself) and three group lists: read, write, admin. The
  group ``*`` means everybody.
- Rights add up: the groups of *every* matching entry count, plus those of the
  default entry, which always counts. A destination no entry covers is denied.
- Temporary destinations use the temp entry alone; without one they are open to all.
- Sending needs write, subscribing and browsing need read, and the send or
  subscription that creates a destination needs admin as well.

Where ActiveMQ is a trap, this map does better (and says so in docs/security.md):

- A wildcard subscription is allowed when the user may read some destination it can
  match (ActiveMQ demands an entry covering the wildcard pattern itself); what it then
  delivers is filtered per concrete destination, so it still carries only what the
  user may read.
- The broker's own messages (advisories, ``$SYS``) are never checked: ActiveMQ sends
  advisories with the *user's* rights, so every user needs admin on them.

The map is pure: no I/O, no clock. Decisions are cached per (groups, right,
destination), since a connection's groups do not change and the map is immutable.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from meshmq.config.model import AuthorizationConfig, AuthorizationEntry, AuthorizationRights
from meshmq.core.destinations import ANY_CHILD, ANY_DESCENDANT, SEPARATOR, Destination

EVERYONE = "*"
# Bounds memory when clients use very many distinct destination names.
CACHE_LIMIT = 50_000


class Right(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def verb(self) -> str:
        """How ActiveMQ words a denial: "not authorized to <verb>: queue://X"."""
        return _VERBS[self]


_VERBS = {Right.READ: "read from", Right.WRITE: "write to", Right.ADMIN: "create"}


def denial_text(user: str, right: Right, dest: Destination) -> str:
    """ActiveMQ's text, so scripts and operators that match on it keep working."""
    text = f"User {user} is not authorized to {right.verb}: {dest}"
    if right is Right.ADMIN:
        text += " (creating a destination on first use needs the admin right)"
    return text


@dataclass(frozen=True, slots=True)
class _Entry:
    queue: bool  # the family: queue or topic
    segments: tuple[str, ...]
    read: frozenset[str]
    write: frozenset[str]
    admin: frozenset[str]

    def groups(self, right: Right) -> frozenset[str]:
        return self.read if right is Right.READ else (
            self.write if right is Right.WRITE else self.admin)


def _groups(entry: AuthorizationEntry | AuthorizationRights, right: Right) -> frozenset[str]:
    return frozenset(g.strip() for g in getattr(entry, right.value) if g.strip())


def _compile(entry: AuthorizationEntry) -> _Entry:
    pattern = entry.queue if entry.queue is not None else entry.topic
    assert pattern is not None, "the config loader requires queue or topic"
    return _Entry(entry.queue is not None, tuple(pattern.split(SEPARATOR)),
                  _groups(entry, Right.READ), _groups(entry, Right.WRITE),
                  _groups(entry, Right.ADMIN))


def _lengths(segments: tuple[str, ...], *, entry: bool) -> tuple[int, bool]:
    """(shortest name length matched, whether longer ones match too). An entry's
    trailing ``>`` matches zero segments as well (``FOO.>`` covers ``FOO``); a
    destination's needs at least one (meshmq's and ActiveMQ's subscription rule)."""
    if segments and segments[-1] == ANY_DESCENDANT:
        fixed = len(segments) - 1
        return (fixed if entry else fixed + 1), True
    return len(segments), False


def overlaps(entry: tuple[str, ...], dest: tuple[str, ...]) -> bool:
    """Whether some concrete name matches both the entry pattern and the (possibly
    wildcard) destination pattern ``dest``."""
    e_min, e_open = _lengths(entry, entry=True)
    d_min, d_open = _lengths(dest, entry=False)
    if e_open and d_open:
        n = max(e_min, d_min)
    elif e_open:
        n = d_min if d_min >= e_min else -1
    elif d_open:
        n = e_min if e_min >= d_min else -1
    else:
        n = e_min if e_min == d_min else -1
    if n < 0:
        return False
    for i in range(n):
        a = entry[i] if i < len(entry) else ANY_DESCENDANT
        b = dest[i] if i < len(dest) else ANY_DESCENDANT
        if a in (ANY_CHILD, ANY_DESCENDANT) or b in (ANY_CHILD, ANY_DESCENDANT):
            continue
        if a != b:
            return False
    return True


def covers(entry: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """Whether the entry pattern covers the concrete name."""
    for i, seg in enumerate(entry):
        if seg == ANY_DESCENDANT:
            return len(name) >= i  # zero or more remaining segments
        if i >= len(name) or (seg != ANY_CHILD and seg != name[i]):
            return False
    return len(entry) == len(name)


class AuthorizationMap:
    def __init__(self, config: AuthorizationConfig) -> None:
        self._entries = tuple(_compile(e) for e in config.entries)
        self._default = config.default
        self._temp = config.temp
        self._cache: dict[tuple[frozenset[str], Right, Destination], bool] = {}

    def allowed(self, groups: frozenset[str], right: Right, dest: Destination) -> bool:
        key = (groups, right, dest)
        hit = self._cache.get(key)
        if hit is None:
            allowed = self.granted(right, dest)
            hit = allowed is None or EVERYONE in allowed or not groups.isdisjoint(allowed)
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def granted(self, right: Right, dest: Destination) -> frozenset[str] | None:
        """The groups that hold ``right`` on ``dest`` (None: everybody, for temporary
        destinations when no temp entry is configured). For a wildcard destination:
        the groups that may read *some* destination it matches."""
        if dest.is_temporary:
            return None if self._temp is None else _groups(self._temp, right)
        found: set[str] = set()
        if self._default is not None:
            found |= _groups(self._default, right)
        name = tuple(dest.name.split(SEPARATOR))
        wildcard = dest.is_wildcard
        family = dest.is_queue
        for entry in self._entries:
            if entry.queue is not family:
                continue
            if overlaps(entry.segments, name) if wildcard else covers(entry.segments, name):
                found |= entry.groups(right)
        return frozenset(found)

    def all_groups(self) -> Iterable[str]:
        """Every group the map names (for configuration checks and documentation)."""
        for entry in self._entries:
            yield from entry.read | entry.write | entry.admin


# A denial is logged again at most this often per (user, right, destination).
LOG_INTERVAL_MS = 60_000
_LOG_KEYS_LIMIT = 10_000


class DenialRecord:
    """Counts denials per user and says which ones to log: the first of each
    (user, right, destination), then at most one a minute with the number left
    unlogged, so a client retrying in a loop cannot flood the log."""

    __slots__ = ("_last", "by_user", "total")

    def __init__(self) -> None:
        self.by_user: dict[str, int] = {}
        self.total = 0
        # (user, right, destination) -> (when last logged, denials since)
        self._last: dict[tuple[str, Right, Destination], tuple[int, int]] = {}

    def note(self, user: str, right: Right, dest: Destination, now_ms: int) -> int | None:
        """Count one denial; the number of earlier denials not logged, or None when
        this one should not be logged either."""
        self.total += 1
        self.by_user[user] = self.by_user.get(user, 0) + 1
        key = (user, right, dest)
        last = self._last.get(key)
        if last is not None and now_ms - last[0] < LOG_INTERVAL_MS:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= _LOG_KEYS_LIMIT:
            self._last.clear()
        self._last[key] = (now_ms, 0)
        return 0 if last is None else last[1]
