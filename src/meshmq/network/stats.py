"""Counters and rates of one bridge, as `meshmq stat` and the advisories show them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_S = 10.0


@dataclass(slots=True)
class RateMeter:
    """Events per second over the last RATE_WINDOW_S seconds (1 s buckets)."""

    buckets: deque[tuple[int, int]] = field(default_factory=deque)

    def add(self, n: int = 1, now: float | None = None) -> None:
        second = int(now if now is not None else time.monotonic())
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1] = (second, self.buckets[-1][1] + n)
        else:
            self.buckets.append((second, n))
        while self.buckets and self.buckets[0][0] <= second - RATE_WINDOW_S:
            self.buckets.popleft()

    def rate(self, now: float | None = None) -> float:
        second = int(now if now is not None else time.monotonic())
        total = sum(n for s, n in self.buckets if s > second - RATE_WINDOW_S)
        return round(total / RATE_WINDOW_S, 1)


@dataclass(slots=True)
class LinkCounters:
    forwarded: int = 0  # messages sent to the remote broker
    acknowledged: int = 0  # ... and settled by it (stored, or a duplicate it already had)
    duplicates: int = 0  # ... of which it already had
    dropped: int = 0  # ... that it could not take and never will (e.g. temp queue gone)
    refused: int = 0  # ... that the link's user may not send there (kept here)
    received: int = 0  # messages the remote broker forwarded to us
    received_duplicates: int = 0
    holds_sent: int = 0  # times this broker asked the remote to hold a destination
    holds_received: int = 0  # times the remote asked this broker to hold one
    forward_rate: RateMeter = field(default_factory=RateMeter)
    receive_rate: RateMeter = field(default_factory=RateMeter)

    def as_dict(self) -> dict[str, object]:
        return {"forwarded": self.forwarded, "acknowledged": self.acknowledged,
                "duplicates": self.duplicates, "dropped": self.dropped,
                "refused": self.refused,
                "received": self.received, "received_duplicates": self.received_duplicates,
                "holds_sent": self.holds_sent, "holds_received": self.holds_received,
                "forward_rate": self.forward_rate.rate(),
                "receive_rate": self.receive_rate.rate()}
