"""What a link has sent and the remote has not answered yet, by sequence number.

A forwarder numbers the records of its link one after another, and the remote answers
mostly in runs (ACK_RANGES) and mostly in order. So the held items sit in a list by
position (``seq - base``): adding one is an append, and settling a run from the front is
one slice, where a dict keyed by sequence number costs a hash insert and a hash delete of
a boxed integer per message on the bridge's hot path. An item settled out of order
leaves a hole (None) until everything before it is settled too; sequence numbers never
held (a record settled locally, not waiting for the remote) are holes from the start.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

T = TypeVar("T")

# Settled slots at the front are dropped from the list once there are this many and
# they are at least half of it (amortised O(1) per item, no copying per answer).
_COMPACT_AT: Final = 1024


class InFlight(Generic[T]):
    """Items by sequence number; ``len()`` counts those still held."""

    __slots__ = ("_base", "_head", "_items", "_live")

    def __init__(self) -> None:
        self._items: list[T | None] = []
        self._head = 0  # index of the first slot still in use
        self._base = 0  # the sequence number of ``_items[_head]``
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def add(self, seq: int, item: T | None) -> None:
        """Hold ``item`` under ``seq`` (None: ``seq`` is never held, a hole). Sequence
        numbers must rise; one skipped is a hole, one not above the last is refused."""
        items = self._items
        if self._live == 0:
            # Nothing held: start again at ``seq`` (holes need no place of their own).
            if item is None:
                return
            items.clear()
            self._head = 0
            self._base = seq
            items.append(item)
            self._live = 1
            return
        nxt = self._base + len(items) - self._head
        if seq != nxt:
            if seq < nxt:
                raise ValueError(f"sequence {seq} already given (next is {nxt})")
            items.extend([None] * (seq - nxt))
        items.append(item)
        if item is not None:
            self._live += 1

    def pop(self, seq: int) -> T | None:
        """The item held under ``seq``, no longer held (None if it was not)."""
        index = seq - self._base + self._head
        items = self._items
        if index < self._head or index >= len(items):
            return None
        item = items[index]
        if item is not None:
            items[index] = None
            self._live -= 1
            self._trim()
        return item

    def pop_range(self, first: int, last: int) -> list[T]:
        """The items held under ``first..last`` (inclusive), in order, no longer held."""
        head = self._head
        items = self._items
        lo = max(first - self._base, 0) + head
        hi = min(last - self._base + 1 + head, len(items))
        if lo >= hi:
            return []
        chunk = items[lo:hi]
        taken = [x for x in chunk if x is not None]
        if not taken:
            return taken
        if lo == head:
            self._base += hi - head
            self._head = hi
        else:
            items[lo:hi] = [None] * (hi - lo)
        self._live -= len(taken)
        self._trim()
        return taken

    def items(self) -> list[T]:
        """Every item still held, in sequence order."""
        return [x for x in self._items[self._head:] if x is not None]

    def clear(self) -> None:
        self._items.clear()
        self._head = 0
        self._live = 0

    def _trim(self) -> None:
        items = self._items
        if self._live == 0:
            items.clear()
            self._head = 0
            return
        head = self._head
        n = len(items)
        start = head
        while head < n and items[head] is None:
            head += 1
        self._base += head - start
        if head >= _COMPACT_AT and head * 2 >= n:
            del items[:head]
            head = 0
        self._head = head
