"""Store fencing: a store shared by master/slave brokers checks, on every write, that the
writer still holds the lease epoch it was given (its fencing token).

The store calls ``begin_write`` before it touches its files (or database) and
``end_write`` after. ``begin_write`` raises ``FencedError`` once another broker took the
lease over; between the two calls a takeover cannot complete, so a write that passed
the check is entirely visible to the next master's recovery.
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

    def begin_write(self) -> None: ...

    def end_write(self) -> None: ...
