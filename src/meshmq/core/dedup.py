"""The idempotent-producer window: message ids the broker has accepted recently.

A producer that fails over re-sends what it never saw confirmed. When such a send
carries a stable id (STOMP header / MQTT 5 user property ``dedup-id``) that is still in
the window, the broker confirms it again and does not store it twice. Bridges use the
same window, keyed by message id, to drop a message re-forwarded after a link failure.

The window is bounded by count (``broker.duplicate_window``), oldest ids leaving first,
so memory stays fixed whatever the traffic: ~100 bytes per remembered id.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshmq.core.message import Message

DEDUP_PROPERTY = "dedup-id"


def network_key(message: Message) -> str:
    """The window key of a message that arrived over a bridge. A topic message reaches
    a broker once whatever its route; a queue message may come back later on purpose
    (redistribution), with a longer path, and must then be accepted."""
    if message.destination.is_topic:
        return f"net:{message.message_id}"
    return f"net:{message.message_id}@{','.join(message.broker_path)}"


class DuplicateWindow:
    __slots__ = ("_ids", "capacity", "duplicates")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # Oldest first. OrderedDict, not dict: evicting a dict's first key is O(size)
        # once deletions pile up at its front (CPython scans the dead slots).
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def check_and_add(self, key: str) -> bool:
        """True when ``key`` was seen within the window (a duplicate); otherwise
        remember it and return False. A zero capacity disables the window."""
        if self.capacity <= 0:
            return False
        ids = self._ids
        if key in ids:
            self.duplicates += 1
            return True
        ids[key] = None
        if len(ids) > self.capacity:
            ids.popitem(last=False)
        return False

    def remember(self, key: str) -> None:
        """Add ``key`` without counting anything (rebuilding the window on recovery)."""
        if self.capacity > 0 and key not in self._ids:
            self._ids[key] = None
            if len(self._ids) > self.capacity:
                self._ids.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drop ``key`` (its send failed, so a retry must be accepted)."""
        self._ids.pop(key, None)
