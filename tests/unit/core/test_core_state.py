"""core/state.py: the shared tables and the decision queues, without sockets."""

from __future__ import annotations

from meshmq.config.model import BrokerConfig, DestinationPolicy, StreamPolicy
from meshmq.core import destinations as dst
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.state import CoreState
from meshmq.core.stream import StreamQueue
from meshmq.store.base import RemoveRef
from meshmq.store.memory import MemoryStore


def make_state(**fields: object) -> CoreState:
    config = BrokerConfig(broker_name="unit", **fields)  # type: ignore[arg-type]
    return CoreState(config, MemoryStore(), lambda: 5_000)


def test_a_new_queue_joins_the_wildcard_consumers_that_match_it() -> None:
    state = make_state()
    spec = ConsumerSpec(destinations=(dst.queue("orders.>"),))
    consumer = Consumer("c1:s", "c1", "s", spec, 10, None)
    state.queue_wildcards.append(consumer)
    orders = state.get_queue(dst.queue("orders.eu"))
    other = state.get_queue(dst.queue("billing"))
    assert consumer.sources == [orders]
    assert consumer in orders.consumers and consumer not in other.consumers
    assert state.get_queue(dst.queue("orders.eu")) is orders  # created once


def test_policies_streams_and_message_ids() -> None:
    slow = DestinationPolicy(match="queue://slow.>", queue_prefetch=1)
    state = make_state(policies=(slow,), streams=(StreamPolicy(match="queue://log.>"),))
    assert state.policy_for(dst.queue("slow.a")) is slow
    assert state.policy_for(dst.queue("fast")) is state.default_policy
    assert isinstance(state.get_queue(dst.queue("log.a")), StreamQueue)
    assert state.stream_policy_for(dst.topic("log.a")) is None  # topics are never streams
    first, second = state.new_message_id("c1"), state.new_message_id("c1")
    assert first != second and first.startswith("ID:unit-")


def test_decisions_accumulate_until_taken() -> None:
    state = make_state()
    queue = state.get_queue(dst.queue("q"))
    state.store_op(RemoveRef("queue://q", 1))
    state.mark_dirty(queue)
    state.defer(queue)
    assert state.ops == [RemoveRef("queue://q", 1)]
    assert list(state.dirty) == [queue] and list(state.deferred) == [queue]
    state.dispatch_dirty()  # deferred queues join the dirty ones, then all dispatch
    assert not state.dirty and not state.deferred


def test_temporary_and_plain_existence() -> None:
    state = make_state()
    temp = dst.Destination(dst.DestKind.TEMP_QUEUE, "ID:x")
    assert not state.temp_exists(temp)
    state.get_queue(temp)
    assert state.temp_exists(temp) and state.exists(temp)
    assert not state.exists(dst.topic("t"))
