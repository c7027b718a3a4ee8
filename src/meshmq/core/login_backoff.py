"""How long to hold back the refusal of a failed login, per client address.

A pure policy with an injected clock: the protocol servers ask ``failed(address)``
for the delay before answering a refused login, and wait it out with a timer, so
a guesser is slowed while other clients (and the event loop) are not. The first
``after`` failures are answered at once; each later one waits twice as long as
the one before, from ``base`` up to ``max_delay``. An address is forgotten once
it has been quiet for ``quiet`` seconds; at most ``max_addresses`` are remembered
(the longest-quiet go first), so a spray of addresses cannot exhaust memory.
A successful login does not wipe the slate: a guesser sharing an address with a
working client (NAT) must not be reset by it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Record:
    failures: int
    last: float


class LoginBackoff:
    def __init__(self, *, after: int = 3, base: float = 0.5, max_delay: float = 5.0,
                 quiet: float = 60.0, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.after = after
        self.base = base
        self.max_delay = max_delay
        self.quiet = quiet
        self.max_addresses = max_addresses
        self.clock = clock
        self.failed_total = 0
        self._records: collections.OrderedDict[str, _Record] = collections.OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_delay > 0

    def failed(self, address: str) -> float:
        """Record a failed login from ``address``; return the seconds its refusal waits."""
        self.failed_total += 1
        if not self.enabled:
            return 0.0
        now = self.clock()
        self._expire(now)
        rec = self._records.pop(address, None)
        if rec is None:
            rec = _Record(0, now)
        rec.failures += 1
        rec.last = now
        self._records[address] = rec  # most recent last
        while len(self._records) > self.max_addresses:
            self._records.popitem(last=False)
        excess = rec.failures - self.after
        if excess <= 0:
            return 0.0
        return float(min(self.max_delay, self.base * 2.0 ** min(excess - 1, 32)))

    def slowed(self) -> int:
        """Addresses whose next refusal will be held back."""
        self._expire(self.clock())
        return sum(1 for r in self._records.values() if r.failures >= self.after)

    def _expire(self, now: float) -> None:
        records = self._records
        while records:
            address, rec = next(iter(records.items()))
            if now - rec.last < self.quiet:
                break
            del records[address]
