"""Store fencing: a store shared by master/slave brokers checks, on every write, that the
writer still holds the lease epoch it was given (its fencing token).

The store calls ``begin_write`` before it touches its files (or database) and
``end_write`` once what it wrote is durable, before it confirms any of it or deletes
anything. Both raise ``FencedError`` once another broker took the lease over. A fence
holds no lock across the write (a paused process would keep it): ``end_write`` passing
proves the takeover came later, so the next master's recovery sees the write; a write
that fails it is never confirmed. (The PostgreSQL store checks inside its transactions
instead, and its fence does nothing.)
"""

from __future__ import annotations

from typing import Protocol

from meshmq.errors import StoreError


class FencedError(StoreError):
    """This broker is no longer the master: its store refuses to write."""

    code = "store-fenced"


class WriteFence(Protocol):
    @property
    def epoch(self) -> int:
        """The lease epoch this broker writes under (0 before it became master)."""
        ...

    def begin_write(self) -> None:
        """Raise ``FencedError`` if this broker may no longer write."""
        ...

    def end_write(self) -> None:
        """Raise ``FencedError`` if what was just made durable may not be confirmed."""
        ...
