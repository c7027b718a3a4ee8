"""Enqueue and dequeue rates per destination for the management API, without per-message
work: the broker's periodic tick samples each destination's counters at most once a
second, and a rate is the difference between the newest sample and one about
:data:`WINDOW_MS` older, divided by the time between them."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from meshmq.core.destinations import Destination

if TYPE_CHECKING:
    from meshmq.core.broker import TopicStats
    from meshmq.core.queue import Queue

WINDOW_MS = 10_000
SAMPLE_EVERY_MS = 1_000

Counters = dict[Destination, tuple[int, int]]  # destination -> (enqueued, dequeued)


class RateSampler:
    def __init__(self) -> None:
        # (time in ms, counters) oldest first, spanning a little more than the window.
        self._samples: deque[tuple[int, Counters]] = deque()

    def sample(self, now_ms: int, queues: Mapping[Destination, Queue],
               topics: Mapping[Destination, TopicStats]) -> None:
        """Take a sample when the last one is at least a second old (called on tick)."""
        samples = self._samples
        if samples and now_ms - samples[-1][0] < SAMPLE_EVERY_MS:
            return
        counters: Counters = {d: (q.stats.enqueued, q.stats.dequeued)
                              for d, q in queues.items()}
        for d, t in topics.items():
            counters[d] = (t.enqueued, t.dispatched)
        samples.append((now_ms, counters))
        # Keep the newest sample that is at least a window old as the baseline.
        while len(samples) > 2 and now_ms - samples[1][0] >= WINDOW_MS:
            samples.popleft()

    def rates(self, dest: Destination) -> tuple[float, float]:
        """(enqueue, dequeue) in messages per second over the last ~10 s; zeros until two
        samples exist."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        t0, old = self._samples[0]
        t1, new = self._samples[-1]
        now = new.get(dest)
        if now is None or t1 <= t0:
            return 0.0, 0.0
        before = old.get(dest, (0, 0))
        seconds = (t1 - t0) / 1000
        return (round(max(0, now[0] - before[0]) / seconds, 2),
                round(max(0, now[1] - before[1]) / seconds, 2))
