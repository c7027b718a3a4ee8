"""Per-destination rates from counters sampled on the broker's tick (core/rates.py)."""

from __future__ import annotations

from meshmq.core import destinations as dst
from meshmq.core.broker import TopicStats
from meshmq.core.queue import QueueStats
from meshmq.core.rates import RateSampler


class FakeQueue:
    def __init__(self) -> None:
        self.stats = QueueStats()


def test_rates_cover_about_the_last_ten_seconds() -> None:
    queue, topic = dst.queue("orders"), dst.topic("prices")
    q = FakeQueue()
    t = TopicStats()
    sampler = RateSampler()
    sampler.sample(0, {queue: q}, {topic: t})  # type: ignore[dict-item]
    assert sampler.rates(queue) == (0.0, 0.0)  # one sample: no rate yet
    for second in range(1, 31):
        q.stats.enqueued += 100
        q.stats.dequeued += 50 if second <= 20 else 0
        t.enqueued += 10
        t.dispatched += 20
        sampler.sample(second * 1000, {queue: q}, {topic: t})  # type: ignore[dict-item]
        sampler.sample(second * 1000 + 400, {queue: q}, {topic: t})  # type: ignore[dict-item]
        if second == 5:
            assert sampler.rates(queue) == (100.0, 50.0)
    # The last 10 s: 100 enqueued per second, and nothing dequeued since second 20.
    assert sampler.rates(queue) == (100.0, 0.0)
    assert sampler.rates(topic) == (10.0, 20.0)
    assert sampler.rates(dst.queue("unknown")) == (0.0, 0.0)
    assert len(sampler._samples) <= 12  # memory stays bounded
