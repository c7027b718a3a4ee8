"""Operators' changes to queues (core/admin.py) on a running broker with small pages, so
most messages live only in the store: purging paged-out messages, moving and copying by
selector and by id together, retrying from a dead-letter queue, and the store batches a
large transfer hands over."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.memory_broker import MemoryBroker, memory_broker, memory_config

from meshmq.config.model import DestinationPolicy
from meshmq.core import admin
from meshmq.core import destinations as dst

SMALL_PAGES = (DestinationPolicy(match="queue://>", page_size=10),)


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    with memory_broker(memory_config(persistent=True, policies=SMALL_PAGES)) as broker:
        yield broker


def fill(broker: MemoryBroker, name: str, count: int) -> list[str]:
    """``count`` persistent messages, written to the store (as the admin API does)."""
    sent = [admin.send(broker.broker, dst.queue(name), f"m{i}".encode(), {"n": i},
                       persistent=True).message_id for i in range(count)]
    broker.runtime.write_ops()
    broker.turn()
    return sent


def ids(broker: MemoryBroker, name: str) -> list[str]:
    return [item.message.message_id for item in admin.queued(broker.broker, dst.queue(name))]


def test_a_purge_removes_paged_out_messages_from_the_store_too(broker: MemoryBroker) -> None:
    fill(broker, "work", 35)
    assert admin.purge(broker.broker, dst.queue("work")) == 35
    broker.runtime.write_ops()
    assert ids(broker, "work") == []
    # Nothing is paged back in from the store afterwards.
    assert admin.browse(broker.broker, dst.queue("work"), 0, 100, None)[0] == 0
    kept = fill(broker, "work", 3)
    assert ids(broker, "work") == kept


def test_a_selector_and_ids_together_move_only_what_both_pick(broker: MemoryBroker) -> None:
    sent = fill(broker, "src", 30)
    picked = [sent[3], sent[14], sent[25], sent[28]]  # n < 20 keeps two of them
    moved = admin.transfer(broker.broker, dst.queue("src"), to=dst.queue("dst"),
                           selector="n < 20", message_ids=picked)
    broker.runtime.write_ops()
    assert moved.done == 2
    assert ids(broker, "dst") == [sent[3], sent[14]]
    assert ids(broker, "src") == [i for i in sent if i not in (sent[3], sent[14])]
    copied = admin.transfer(broker.broker, dst.queue("src"), to=dst.queue("copy"),
                            selector="n >= 27", copy=True)
    broker.runtime.write_ops()
    assert copied.done == 3 and ids(broker, "copy") == sent[27:]
    assert len(ids(broker, "src")) == 28


def test_retry_from_a_dlq_returns_to_the_original_and_skips_the_rest(
        broker: MemoryBroker) -> None:
    dlq = dst.queue("ActiveMQ.DLQ")
    core = broker.broker
    for i, original in enumerate((dst.queue("jobs"), dst.topic("news"), None, dlq)):
        msg = admin.send(core, dst.queue("scratch"), f"m{i}".encode(), {"n": i},
                         persistent=True)
        core.route_admin(msg.copy_to(dlq, original_destination=original,
                                     properties={"n": i, admin.DLQ_CAUSE: "poison"}))
    result = admin.transfer(core, dlq, to=None)
    # No original destination, or the DLQ itself as the original: left where they are.
    assert (result.done, result.skipped) == (2, 2)
    assert [item.message.properties["n"] for item in admin.queued(core, dlq)] == [2, 3]
    back = [item.message for item in admin.queued(core, dst.queue("jobs"))]
    assert [m.body for m in back] == [b"m0"]
    assert back[0].original_destination is None
    assert admin.DLQ_CAUSE not in back[0].properties


def test_a_large_move_hands_the_store_a_batch_per_thousand(
        broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "BATCH", 7)
    fill(broker, "big", 30)
    flushes: list[int] = []

    def flush() -> None:
        broker.runtime.write_ops()
        flushes.append(len(ids(broker, "moved")))
    moved = admin.transfer(broker.broker, dst.queue("big"), to=dst.queue("moved"), flush=flush)
    assert moved.done == 30
    assert flushes == [7, 14, 21, 28]
