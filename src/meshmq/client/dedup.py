"""Consumer-side duplicate suppression: the last N message keys seen (pure)."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DuplicateFilter"]


class DuplicateFilter:
    """Remembers the last ``window`` keys; ``seen(key)`` is True for a repeat.

    The key is the message's ``dedup-id`` (stable across producer resends) when present,
    else its ``message-id``. A message is *remembered* once it is done with: on
    delivery for auto-ack subscriptions, when the application acks it otherwise; so a
    redelivery of a message the application has not acked yet still reaches it.
    """

    __slots__ = ("_held", "_keys", "window")

    def __init__(self, window: int = 2048) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        self.window = window
        self._keys: OrderedDict[str, None] = OrderedDict()
        # Keys of messages handed to the application and not acked yet: another copy of
        # one (same key, not flagged redelivered) is a duplicate too.
        self._held: OrderedDict[str, None] = OrderedDict()

    def hold(self, key: str | None) -> None:
        if key is None or self.window == 0:
            return
        self._held[key] = None
        if len(self._held) > self.window:
            self._held.popitem(last=False)

    def release(self, key: str | None) -> None:
        if key is not None:
            self._held.pop(key, None)

    def is_duplicate(self, key: str | None, redelivered: bool) -> bool:
        """A copy of something done with, or a second copy of something in hand (a
        broker's redelivery of the message in hand is not a duplicate: it may be the
        only copy left after a failover)."""
        if key is None or self.window == 0:
            return False
        return key in self._keys or (key in self._held and not redelivered)

    def seen(self, key: str | None) -> bool:
        if key is None or self.window == 0:
            return False
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        self._keys[key] = None
        if len(self._keys) > self.window:
            self._keys.popitem(last=False)
        return False

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str | None) -> None:
        if key is None or self.window == 0:
            return
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self.window:
            self._keys.popitem(last=False)

    def forget(self, key: str | None) -> None:
        if key is not None:
            self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)
