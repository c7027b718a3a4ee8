"""Recovery: the broker's tables rebuilt from what the store holds, before any listener
opens.

Owns turning a store ``Recovery`` into live state: queues (with their stored counts and
dispatch marks, paging from the store), streams (their offsets and retention index),
retained messages and records (one reference each), durable subscriptions with their
queues; refusing keys it cannot place (unknown ones are logged, stored non-queue ones
dropped). Also, right after that, the two reads of stored messages that only make
sense at start: the duplicate window refilled with what came over bridges, and the
trace's ``recovered`` events.

These are the core's only synchronous store reads besides management operations:
they run at start, when nothing else is waiting on the loop.
"""

from __future__ import annotations

import logging

from meshmq.config.model import StreamPolicy
from meshmq.core import destinations as dst
from meshmq.core.dedup import network_key
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.queue import Queue
from meshmq.core.routing import RECORD_PREFIX, RETAINED_PREFIX
from meshmq.core.state import CoreState, TopicSubscription
from meshmq.core.stream import STREAM_PREFIX, StreamQueue
from meshmq.core.trace import RECOVERED
from meshmq.errors import MeshmqError
from meshmq.store.base import DropKey, Recovery

log = logging.getLogger("meshmq.broker")


def recover(state: CoreState, recovery: Recovery) -> None:
    """Rebuild queues and durable subscriptions from what the store holds."""
    store = state.store
    durable_keys = {d.key for d in recovery.durable_subscriptions}
    for key, info in recovery.keys.items():
        if key in durable_keys:
            continue
        if key.startswith(STREAM_PREFIX):
            sdest = dst.queue(key[len(STREAM_PREFIX):])
            state.queues[sdest] = StreamQueue(
                sdest, state.policy_for(sdest),
                state.stream_policy_for(sdest) or StreamPolicy(match=str(sdest)), state,
                store, first_seq=info.first_seq, last_seq=info.last_seq)
            continue
        if key.startswith((RETAINED_PREFIX, RECORD_PREFIX)):
            state.single_seq[key] = info.last_seq
            for entry in store.load(key, 0, 10):
                if key.startswith(RECORD_PREFIX):
                    state.records[key[len(RECORD_PREFIX):]] = (entry.seq, entry.message.body)
                else:
                    state.retained[entry.message.destination] = (entry.seq, entry.message)
            continue
        try:
            dest = Destination.parse_uri(key)
        except MeshmqError:
            log.warning("store holds unknown key %r; ignored", key)
            continue
        if dest.kind is not DestKind.QUEUE:
            log.warning("store holds non-queue key %r; dropped", key)
            state.ops.append(DropKey(key))
            continue
        state.queues[dest] = Queue(dest, key, state.policy_for(dest), state, store,
                                   last_seq=info.last_seq, stored_count=info.count,
                                   dispatched=info.dispatched)
        state.mark_dirty(state.queues[dest])
    for record in recovery.durable_subscriptions:
        stored = recovery.keys.get(record.key)
        patterns = tuple(Destination.parse_uri(u) for u in record.destination.split(","))
        queue = Queue(patterns[0], record.key, state.policy_for(patterns[0]), state,
                      store, last_seq=stored.last_seq if stored else 0,
                      stored_count=stored.count if stored else 0, prefiltered=True,
                      dispatched=stored.dispatched if stored else 0)
        sub = TopicSubscription(patterns, queue, selector_text=record.selector,
                                no_local=record.no_local, connection_id=None,
                                durable=record)
        state.durables[(record.client_id, record.subscription_name)] = sub
        state.durable_names.setdefault(record.client_id, set()).add(record.subscription_name)
        state.topic_index.add(sub)


def remember_stored_sends(state: CoreState, recovery: Recovery) -> int:
    """Put the newest stored messages that came over a bridge or carry a producer's
    ``dedup-id`` into the duplicate window, up to its capacity, right after
    ``recover``; returns how many.

    A bridge (or another shard of the node) re-sends what it never saw acknowledged,
    and a failover producer what it never saw confirmed (the broker died between
    storing and the RECEIPT or PUBACK): those are the messages this broker received
    last. Found here, they are confirmed as duplicates and not stored twice, so a
    producer's re-send after a crash stays exactly once while the original is stored.
    (Paging in re-adds them too, but a queue deeper than its page size pages the
    newest ones in only after a long while.) An original already consumed and
    acknowledged before the crash is gone from the store, and its re-send is stored
    again: at least once, as documented."""
    budget = state.dedup.capacity
    found = 0
    for key, info in recovery.keys.items():
        if budget <= 0:
            break
        if not info.count or key.startswith((STREAM_PREFIX, RETAINED_PREFIX, RECORD_PREFIX)):
            continue
        want = min(info.count, budget)
        entries = state.store.load(key, max(0, info.last_seq - want), want)
        budget -= len(entries)
        # A shard of several: another shard re-sends what it never saw STORED, and
        # those carry no broker path (the node is one broker).
        every = state.shard is not None
        for entry in entries:
            if every and not entry.message.broker_path:
                # Another shard's re-send is recognised by its network key.
                state.dedup.remember(network_key(entry.message))
                state.remember_stored(entry.message)
                found += 1
            elif state.remember_stored(entry.message):
                found += 1
    return found


def trace_recovered(state: CoreState, page: int) -> int:
    """Record a ``recovered`` event for every stored message (after ``recover``);
    lets the audit tell messages that survived a crash from lost ones."""
    tracer = state.tracer
    if tracer is None:
        return 0
    count = 0
    queues = [q for q in state.queues.values() if q.key is not None and not q.retains_all]
    queues += [sub.queue for sub in state.durables.values()]
    for queue in queues:
        if not queue.depth or queue.key is None:
            continue
        after = 0
        while True:
            entries = state.store.load(queue.key, after, page)
            for entry in entries:
                tracer.message(RECOVERED, entry.message, queue.destination,
                               delivery_count=entry.delivery_count)
                after = entry.seq
            count += len(entries)
            if len(entries) < page:
                break
    return count
