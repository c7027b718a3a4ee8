"""Acknowledgements: settling entries out of a consumer's window.

Owns ACK and NACK: which window entries a tag names (one, or everything up to it for
cumulative modes), and settling them -- consumed (the queue removes it and its store
reference) or returned (the queue redelivers it, or dead-letters it after too many
attempts). A transactional ACK/NACK is only recorded on its transaction here;
core/transactions.py applies it at COMMIT.

It does not dispatch: the consumer's queues are marked dirty, and the runtime's next
pump fills the window again.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshmq.core.consumer import Consumer
from meshmq.core.state import Connection, CoreState, find_transaction
from meshmq.errors import ProtocolError


def select(consumer: Consumer, tag: int, cumulative: bool) -> list[int]:
    """The window tags that ``tag`` settles; ProtocolError if it names nothing."""
    if tag not in consumer.dispatched:
        raise ProtocolError(f"unexpected ACK/NACK: no unacknowledged message with that "
                            f"id on subscription {consumer.subscription_id!r}",
                            code="unknown-ack")
    if not cumulative:
        return [tag]
    tags = []
    for t in consumer.dispatched:
        tags.append(t)
        if t == tag:
            break
    return tags


def select_lenient(consumer: Consumer, tag: int, cumulative: bool) -> list[int]:
    """As ``select``, but nothing (no error) once the tag has left the window."""
    if tag not in consumer.dispatched:
        return []
    return select(consumer, tag, cumulative)


class Acks:
    """ACK and NACK (see the module docstring)."""

    def __init__(self, state: CoreState) -> None:
        self._state = state

    def ack(self, conn: Connection, consumer: Consumer, tag: int, cumulative: bool,
            txn: str | None) -> bool:
        tags = select(consumer, tag, cumulative)
        if txn is not None:
            find_transaction(conn, txn).acks.append((consumer, tag, cumulative))
            return False
        return self.settle(consumer, tags, True)

    def nack(self, conn: Connection, consumer: Consumer, tag: int, cumulative: bool,
             txn: str | None) -> bool:
        tags = select(consumer, tag, cumulative)
        if txn is not None:
            find_transaction(conn, txn).nacks.append((consumer, tag, cumulative))
            return False
        return self.settle(consumer, tags, False)

    def settle(self, consumer: Consumer, tags: Iterable[int], acked: bool) -> bool:
        """Take entries out of the consumer's window: consumed (ack) or returned (nack).
        True when a stored message was settled (the confirmation waits for a sync)."""
        persisted = False
        dispatched, by_id = consumer.dispatched, consumer.by_message_id
        for t in tags:
            entry = dispatched.pop(t, None)
            if entry is None:
                continue
            if by_id:  # (a bridge's demand keeps none)
                by_id.pop(entry.message.message_id, None)
            persisted |= entry.persisted
            if acked:
                consumer.acked_count += 1
                entry.queue.ack_entry(entry)
            else:
                entry.queue.release(entry, cause="message was rejected (NACK) too many times",
                                    reason="rejected (NACK)")
        state = self._state
        for queue in consumer.sources:
            state.mark_dirty(queue)
        return persisted
