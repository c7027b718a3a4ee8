"""The idempotent-producer window: message ids the broker has accepted recently.

A producer that fails over re-sends what it never saw confirmed. When such a send
carries a stable id (STOMP header / MQTT 5 user property ``dedup-id``) that is still in
the window, the broker confirms it again and does not store it twice. Bridges use the
same window, keyed by message id, to drop a message re-forwarded after a link failure.

The window is bounded by count (``broker.duplicate_window``, N below) and kept in two
generations of plain dicts: new ids go into the current one; when it holds N ids it
becomes the previous one and the previous one is dropped whole. So an id is remembered
while fewer than N newer ids have been added after it (the guarantee: at least the
configured window, as an exact oldest-first eviction would give) and forgotten by the
time 2N - 1 newer ones have; between N and 2N ids are held once N have arrived,
~100 bytes each, whatever the traffic. A dict store per arrival replaces an ordered
dict's eviction per arrival, a noticeable part of a bridge's receiving cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from meshmq.core.message import Message

DEDUP_PROPERTY: Final = "dedup-id"


def network_key(message: Message) -> str:
    """The window key of a message that arrived over a bridge. A topic message reaches
    a broker once whatever its route; a queue message may come back later on purpose
    (redistribution), with a longer path, and must then be accepted."""
    if message.destination.is_topic:
        return f"net:{message.message_id}"
    return f"net:{message.message_id}@{','.join(message.broker_path)}"


class DuplicateWindow:
    __slots__ = ("_ids", "_older", "capacity", "duplicates")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: dict[str, None] = {}  # the current generation (fewer than capacity)
        self._older: dict[str, None] = {}  # the previous one (capacity ids, or none)
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._ids) + len(self._older)

    def __contains__(self, key: str) -> bool:
        return key in self._ids or key in self._older

    def check_and_add(self, key: str) -> bool:
        """True when ``key`` was seen within the window (a duplicate); otherwise
        remember it and return False. A zero capacity disables the window."""
        ids = self._ids
        if key in ids or key in self._older:
            self.duplicates += 1
            return True
        if self.capacity <= 0:
            return False
        ids[key] = None
        if len(ids) >= self.capacity:
            self._older, self._ids = ids, {}
        return False

    def remember(self, key: str) -> None:
        """Add ``key`` without counting anything (rebuilding the window on recovery)."""
        if self.capacity > 0 and key not in self:
            ids = self._ids
            ids[key] = None
            if len(ids) >= self.capacity:
                self._older, self._ids = ids, {}

    def forget(self, key: str) -> None:
        """Drop ``key`` (its send failed, so a retry must be accepted)."""
        self._ids.pop(key, None)
        self._older.pop(key, None)
