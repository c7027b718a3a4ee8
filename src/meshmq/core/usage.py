"""Broker-wide memory accounting for messages held in RAM.

Queues charge an entry's size while it is in memory and refund it when the
entry is acked, expired or paged out. When usage crosses the limit the broker
applies producer flow control; waiters are told when usage falls back below
``resume_ratio`` of the limit (hysteresis avoids pause/resume flapping).
"""

from __future__ import annotations

from collections.abc import Callable


class MemoryUsage:
    __slots__ = ("_waiters", "limit", "peak", "resume_ratio", "used")

    def __init__(self, limit: int, resume_ratio: float = 0.9) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.resume_ratio = resume_ratio
        self._waiters: list[Callable[[], None]] = []

    @property
    def full(self) -> bool:
        return self.limit > 0 and self.used >= self.limit

    @property
    def percent(self) -> float:
        return 0.0 if self.limit <= 0 else 100.0 * self.used / self.limit

    def charge(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def refund(self, size: int) -> None:
        self.used -= size
        if self._waiters and self.used < self.limit * self.resume_ratio:
            waiters, self._waiters = self._waiters, []
            for wake in waiters:
                wake()

    def wait_for_space(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once usage is back under the resume threshold."""
        if not self.full:
            wake()
        else:
            self._waiters.append(wake)

    def cancel_wait(self, wake: Callable[[], None]) -> None:
        try:
            self._waiters.remove(wake)
        except ValueError:
            pass
