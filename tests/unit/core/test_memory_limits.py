"""Memory accounting and producer flow control decisions (core/usage.py and the send
path in core/routing.py): when a send is refused, when it is accepted for the
transport to hold the producer, and when persistent messages stay in the store."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker_core import bodies, connect, make_broker, pump, send, sub

from meshmq.config.model import DestinationPolicy, UsageConfig
from meshmq.core import admin
from meshmq.core import destinations as dst
from meshmq.core.usage import MemoryUsage
from meshmq.errors import ResourceLimitError


def test_waiters_wake_only_once_usage_falls_under_the_resume_threshold() -> None:
    usage = MemoryUsage(1000)
    usage.charge(1000)
    woken: list[str] = []
    usage.wait_for_space(lambda: woken.append("a"))
    usage.refund(50)  # 950: under the limit, but not under 90% of it
    assert woken == [] and not usage.full
    usage.refund(51)  # 899
    assert woken == ["a"]
    usage.refund(100)
    assert woken == ["a"]  # woken once


def test_waiting_with_room_wakes_at_once_and_a_cancelled_wait_never_does() -> None:
    usage = MemoryUsage(100)
    woken: list[str] = []
    usage.wait_for_space(lambda: woken.append("now"))
    assert woken == ["now"]
    usage.charge(100)

    def late() -> None:
        woken.append("late")
    usage.wait_for_space(late)
    usage.cancel_wait(late)
    usage.cancel_wait(late)  # twice is harmless
    usage.refund(100)
    assert woken == ["now"]


def test_a_zero_limit_is_never_full_and_peak_remembers_the_highest_use() -> None:
    usage = MemoryUsage(0)
    usage.charge(10**9)
    assert not usage.full and usage.percent == 0.0
    usage.refund(10**9)
    assert usage.peak == 10**9 and usage.used == 0


def test_a_blocking_limit_accepts_the_send_for_the_transport_to_hold() -> None:
    broker, _, _ = make_broker(usage=UsageConfig(memory_limit=1000, on_limit="block"))
    conn = connect(broker)
    send(broker, conn, "q", "x" * 400)
    assert broker.usage.full
    send(broker, conn, "q", "over")  # accepted: the producer is paused, not failed
    assert broker.queues[dst.queue("q")].depth == 2


def test_a_destination_without_producer_flow_control_refuses_at_the_limit() -> None:
    broker, _, _ = make_broker(
        usage=UsageConfig(memory_limit=1000, on_limit="block"),
        policies=(DestinationPolicy(match="queue://fast.>", producer_flow_control=False),
                  DestinationPolicy(match="queue://>")))
    conn = connect(broker)
    send(broker, conn, "slow", "x" * 400)
    with pytest.raises(ResourceLimitError, match="memory limit"):
        send(broker, conn, "fast.a", "m")
    send(broker, conn, "slow", "m")  # the other destination still blocks instead


def test_persistent_messages_are_accepted_at_the_limit_and_stay_in_the_store() -> None:
    broker, _, store = make_broker(usage=UsageConfig(memory_limit=1000, on_limit="fail"))
    conn = connect(broker)
    send(broker, conn, "fill", "x" * 400)
    for i in range(3):
        send(broker, conn, "q", f"p{i}", persistent=True)
    q = broker.queues[dst.queue("q")]
    assert q.depth == 3 and q.in_memory_bytes == 0
    sub(broker, conn, "drain", "fill")
    sub(broker, conn, "c", "q")
    assert sorted(bodies(pump(broker, store))) == ["p0", "p1", "p2", "x" * 400]


def test_consuming_frees_the_memory_and_sends_are_accepted_again() -> None:
    broker, _, store = make_broker(usage=UsageConfig(memory_limit=1000, on_limit="fail"))
    conn = connect(broker)
    send(broker, conn, "q", "x" * 400)
    with pytest.raises(ResourceLimitError):
        send(broker, conn, "q", "refused")
    sub(broker, conn, "c", "q")
    pump(broker, store)
    assert broker.usage.used == 0
    send(broker, conn, "q", "accepted")
    assert bodies(pump(broker, store)) == ["accepted"]


def test_a_full_store_refuses_persistent_sends_and_still_takes_others() -> None:
    broker, _, store = make_broker()
    conn = connect(broker)
    broker.persistent_refusal = "store.max_disk_bytes reached"
    with pytest.raises(ResourceLimitError, match="max_disk_bytes"):
        send(broker, conn, "q", "p", persistent=True)
    with pytest.raises(ResourceLimitError):
        admin.send(broker, dst.queue("q"), b"p", {}, persistent=True)
    send(broker, conn, "q", "np", persistent=False)
    broker.persistent_refusal = None
    send(broker, conn, "q", "p2", persistent=True)
    sub(broker, conn, "c", "q")
    assert bodies(pump(broker, store)) == ["np", "p2"]
    assert broker.statistics()["persistent_refused"] is None


def test_the_statistics_report_memory_use_against_the_limit() -> None:
    broker, _, _ = make_broker(usage=UsageConfig(memory_limit=10_000))
    conn = connect(broker)
    send(broker, conn, "q", "x" * 1800)  # 2500 bytes with the per-message overhead
    memory = broker.statistics()["memory"]
    assert memory == {"used": 2500, "limit": 10_000, "peak": 2500, "percent": 25.0}
