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


def test_an_idle_window_reads_zero_and_keeps_one_baseline() -> None:
    queue = dst.queue("orders")
    q = FakeQueue()
    sampler = RateSampler()
    for second in range(6):  # busy for five seconds
        sampler.sample(second * 1000, {queue: q}, {})  # type: ignore[dict-item]
        q.stats.enqueued += 40
        q.stats.dequeued += 40
    assert sampler.rates(queue) == (40.0, 40.0)
    for second in range(6, 40):  # then idle: the counters stop moving
        sampler.sample(second * 1000, {queue: q}, {})  # type: ignore[dict-item]
    assert sampler.rates(queue) == (0.0, 0.0)
    # The baseline is the newest sample at least a window old, and no older one is kept.
    oldest, newest = sampler._samples[0][0], sampler._samples[-1][0]
    assert newest - oldest >= 10_000 and sampler._samples[1][0] > newest - 10_000


def test_a_gap_between_ticks_spreads_the_count_over_the_gap() -> None:
    queue = dst.queue("orders")
    q = FakeQueue()
    sampler = RateSampler()
    sampler.sample(0, {queue: q}, {})  # type: ignore[dict-item]
    sampler.sample(500, {queue: q}, {})  # type: ignore[dict-item]  # under a second: skipped
    assert sampler.rates(queue) == (0.0, 0.0)
    q.stats.enqueued += 120
    sampler.sample(60_000, {queue: q}, {})  # type: ignore[dict-item]  # a minute of no ticks
    assert sampler.rates(queue) == (2.0, 0.0)  # 120 over 60 s, not over 10 s


def test_a_new_destination_counts_from_zero_and_a_reset_counter_reads_zero() -> None:
    old, new = dst.queue("old"), dst.queue("new")
    q_old, q_new = FakeQueue(), FakeQueue()
    q_old.stats.enqueued = 500
    sampler = RateSampler()
    sampler.sample(0, {old: q_old}, {})  # type: ignore[dict-item]
    q_new.stats.enqueued = 30
    fresh = FakeQueue()  # "old" deleted and created again: its counters start over
    fresh.stats.enqueued = 10
    sampler.sample(10_000, {old: fresh, new: q_new}, {})  # type: ignore[dict-item]
    assert sampler.rates(new) == (3.0, 0.0)
    assert sampler.rates(old) == (0.0, 0.0)
