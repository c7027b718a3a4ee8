"""The reconnect policy: a pure iterator of (endpoint, delay) over a list of endpoints.

No sockets, no clock, no sleeping: the caller asks :meth:`ReconnectSchedule.next_attempt`
for the next endpoint and how long to wait before trying it, tries, and reports back
(:meth:`~ReconnectSchedule.connected`, :meth:`~ReconnectSchedule.lost`). Time only enters
as numbers the caller passes in, randomness through an injected ``random.Random``.

Semantics follow ActiveMQ's failover transport:

* A **pass** tries every endpoint once, back to back (delay 0 between them). After a
  failed pass the next one waits ``delay``: ``initial_delay`` first, then multiplied by
  ``multiplier`` after every failed pass when ``exponential`` (capped at ``max_delay``).
* ``max_attempts`` counts passes after a lost connection: -1 = for ever, 0 = do not
  reconnect (report failure at once), N = N passes. Before the first connection
  ``startup_max_attempts`` applies instead when it is not -1; a connect always makes at
  least one pass.
* The first pass after a lost connection waits ``initial_delay``; the endpoint that was
  just lost goes to the end of that pass.
* ``randomize`` shuffles the list at the start of every pass; ``priority`` endpoints
  always come first (in their given order), the rest follow.
* ``jitter`` (0..1) spreads every non-zero delay uniformly over ``delay * (1 ± jitter)``
  so clients cut off together do not come back together (ActiveMQ has no such knob).
* ``reset_after``: the backoff starts again from ``initial_delay`` only if the lost
  connection lived at least this long (seconds); a connection that flaps faster keeps
  the grown delay. 0 (ActiveMQ's behaviour) resets on every successful connect.

Network bridges use the same class (``network/bridge_state.py``) with their own defaults
(``initial_delay=1.0``, ``max_delay=30.0``, ``multiplier=2.0``, ``jitter=0.1``, the list
in order, ``reset_after=min_connect_time``), so every default is a parameter and -1 /
0 / N mean the same for a client and for a bridge.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Attempt", "ReconnectPolicy", "ReconnectSchedule"]

E = TypeVar("E")

FOREVER = -1


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """The knobs, with ActiveMQ failover's defaults (times in seconds)."""

    initial_delay: float = 0.010
    max_delay: float = 30.0
    exponential: bool = True
    multiplier: float = 2.0
    max_attempts: int = FOREVER
    startup_max_attempts: int = FOREVER
    randomize: bool = True
    jitter: float = 0.0
    reset_after: float = 0.0

    def __post_init__(self) -> None:
        if self.initial_delay < 0:
            raise ValueError(f"initial_delay must be >= 0, got {self.initial_delay}")
        if self.max_delay < 0:
            raise ValueError(f"max_delay must be >= 0, got {self.max_delay}")
        if self.multiplier < 1.0:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if self.max_attempts < FOREVER or self.startup_max_attempts < FOREVER:
            raise ValueError("max_attempts and startup_max_attempts must be >= -1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")
        if self.reset_after < 0:
            raise ValueError(f"reset_after must be >= 0, got {self.reset_after}")


@dataclass(frozen=True, slots=True)
class Attempt(Generic[E]):
    """Wait ``delay`` seconds, then try ``endpoint``. ``pass_number`` counts from 1."""

    endpoint: E
    delay: float
    pass_number: int


class ReconnectSchedule(Generic[E]):
    """The reconnect state of one logical connection over ``endpoints``.

    Iterate (or call :meth:`next_attempt`) until an attempt succeeds; ``None`` /
    the end of iteration means the attempt budget is spent: report failure. After
    :meth:`connected` the schedule yields nothing until :meth:`lost` starts a new
    reconnect cycle.
    """

    def __init__(self, endpoints: Sequence[E], policy: ReconnectPolicy | None = None, *,
                 priority: Sequence[E] = (), rng: random.Random | None = None) -> None:
        if not endpoints:
            raise ValueError("a reconnect schedule needs at least one endpoint")
        self.policy = policy or ReconnectPolicy()
        self._rng = rng or random.Random()
        self._endpoints: list[E] = list(endpoints)
        self._priority: list[E] = [p for p in priority if p in self._endpoints]
        self._delay = self.policy.initial_delay
        self._ever_connected = False
        self._connected_at: float | None = None
        self._last_lost: E | None = None
        self._current: E | None = None
        self._failed_passes = 0
        self._pass: list[E] = []
        self._pass_number = 0
        self._pending_delay = 0.0
        self._active = True  # a cycle is running (startup, or after lost())
        self._exhausted = False

    # ------------------------------------------------------------------ queries

    @property
    def endpoints(self) -> tuple[E, ...]:
        return tuple(self._endpoints)

    @property
    def current(self) -> E | None:
        """The endpoint of the live connection, if any."""
        return self._current

    @property
    def ever_connected(self) -> bool:
        return self._ever_connected

    @property
    def exhausted(self) -> bool:
        """True once the attempt budget of the running cycle is spent."""
        return self._exhausted

    def is_priority(self, endpoint: E) -> bool:
        return endpoint in self._priority

    @property
    def current_delay(self) -> float:
        """The (un-jittered) delay the next failed pass will wait."""
        return self._delay

    # ----------------------------------------------------------------- iteration

    def __iter__(self) -> Iterator[Attempt[E]]:
        while (attempt := self.next_attempt()) is not None:
            yield attempt

    def next_attempt(self) -> Attempt[E] | None:
        if not self._active or self._exhausted:
            return None
        if not self._pass:
            if self._pass_number > 0:
                # The previous pass tried every endpoint and none answered.
                self._failed_passes += 1
                limit = self._limit()
                if limit != FOREVER and self._failed_passes >= max(limit, 1):
                    self._exhausted = True
                    return None
                self._pending_delay = self._grow()
            self._pass = self._ordered()
            self._pass_number += 1
        endpoint = self._pass.pop(0)
        delay, self._pending_delay = self._pending_delay, 0.0
        return Attempt(endpoint, self._jittered(delay), self._pass_number)

    def _limit(self) -> int:
        if not self._ever_connected and self.policy.startup_max_attempts != FOREVER:
            return self.policy.startup_max_attempts
        return self.policy.max_attempts

    def _grow(self) -> float:
        delay = self._delay
        if self.policy.exponential:
            self._delay = min(self._delay * self.policy.multiplier, self.policy.max_delay)
        return min(delay, self.policy.max_delay)

    def _jittered(self, delay: float) -> float:
        if delay <= 0 or self.policy.jitter == 0:
            return delay
        return max(0.0, delay * (1 + self.policy.jitter * (2 * self._rng.random() - 1)))

    def _ordered(self) -> list[E]:
        rest = [e for e in self._endpoints if e not in self._priority]
        if self.policy.randomize:
            self._rng.shuffle(rest)
        order = [e for e in self._priority if e in self._endpoints] + rest
        if self._last_lost is not None and self._last_lost in order and len(order) > 1:
            order.remove(self._last_lost)
            order.append(self._last_lost)
        return order

    # ---------------------------------------------------------------- feedback

    def connected(self, endpoint: E, now: float) -> None:
        """An attempt at ``endpoint`` succeeded at time ``now``."""
        self._current = endpoint
        self._connected_at = now
        self._ever_connected = True
        self._active = False
        self._pass = []
        self._pass_number = 0
        self._failed_passes = 0
        self._last_lost = None
        if self.policy.reset_after == 0:
            self._delay = self.policy.initial_delay

    def lost(self, now: float) -> None:
        """The live connection dropped at ``now``: start a reconnect cycle."""
        lived = 0.0 if self._connected_at is None else now - self._connected_at
        if self.policy.reset_after > 0 and lived >= self.policy.reset_after:
            self._delay = self.policy.initial_delay
        self._last_lost = self._current
        self._current = None
        self._connected_at = None
        self._active = True
        self._exhausted = False
        self._pass = []
        self._pass_number = 0
        self._failed_passes = 0
        if self.policy.max_attempts == 0:
            self._exhausted = True  # maxReconnectAttempts=0: report the loss, no retry
            return
        # The first pass after a loss waits the current delay (ActiveMQ's doDelay).
        self._pending_delay = self._grow()

    def abandon_pass(self) -> None:
        """Give up on the rest of this pass (an endpoint answered, and its answer holds
        for the whole list, e.g. bad credentials): the next attempt starts a new pass,
        after the backoff delay."""
        self._pass = []

    def restart(self) -> None:
        """Start a fresh cycle after an exhausted one (an explicit new connect call)."""
        self._active = True
        self._exhausted = False
        self._pass = []
        self._pass_number = 0
        self._failed_passes = 0
        self._pending_delay = 0.0

    def update_endpoints(self, endpoints: Sequence[E]) -> None:
        """Replace the list (topology push, updateURIsURL); takes effect at the next pass."""
        if not endpoints:
            raise ValueError("a reconnect schedule needs at least one endpoint")
        self._endpoints = list(dict.fromkeys(endpoints))
        self._pass = [e for e in self._pass if e in self._endpoints]
