"""Expiry and dead letters: what happens to a message no consumer may have.

Owns the policy applied when a queue gives a message up: an expired message (its
MessageExpired advisory, trace, and the dead-letter queue when the destination's
policy sends expired persistent messages there), a message that failed delivery too
often (non-persistent ones are dropped unless the policy says otherwise), the choice of
dead-letter queue (``ActiveMQ.DLQ`` or an individual ``<prefix><name>``), the DLQ copy
and its ``dlqDeliveryFailureCause``, and the periodic expiry sweep over all queues.

Queues decide *that* an entry expired or failed (core/queue.py); this module decides
*where* it goes, and routes the copy through core/routing.py. A message failing in the
dead-letter queue itself is dropped, never looped.
"""

from __future__ import annotations

import logging

from meshmq.core import destinations as dst
from meshmq.core.advisories import advisory_topic
from meshmq.core.message import PropertyValue
from meshmq.core.queue import Entry, Queue
from meshmq.core.routing import Router
from meshmq.core.state import CoreState
from meshmq.core.trace import DLQ, DROPPED, EXPIRED

log = logging.getLogger("meshmq.broker")


class DeadLetters:
    """Expired and undeliverable messages (``DeadLetterPolicy`` of core/state.py)."""

    def __init__(self, state: CoreState, router: Router) -> None:
        self._state = state
        self._router = router

    def sweep(self) -> None:
        """Expire what is due in every queue and topic subscription."""
        state = self._state
        for queue in list(state.queues.values()):
            queue.expire_pending()
        for sub in state.topic_index.all():
            sub.queue.expire_pending()

    def expired(self, queue: Queue, entry: Entry) -> None:
        queue.remove_entry(entry)
        msg = entry.message
        tracer = self._state.tracer
        if tracer is not None:
            tracer.message(EXPIRED, msg, queue.destination, delivery_count=entry.delivery_count)
        self._router.advise(advisory_topic("Expired", queue.destination), "MessageExpired",
                            {"messageId": msg.message_id,
                             "destination": str(queue.destination)})
        if queue.policy.expired_to_dlq and msg.persistent:
            self._to_dlq(queue, entry, "message expired")

    def dead_letter(self, queue: Queue, entry: Entry, cause: str) -> None:
        queue.remove_entry(entry)
        msg = entry.message
        if not msg.persistent and not queue.policy.non_persistent_to_dlq:
            log.info("dropping non-persistent message %s from %s: %s",
                     msg.message_id, queue.destination, cause)
            tracer = self._state.tracer
            if tracer is not None:
                tracer.message(DROPPED, msg, queue.destination, reason=cause)
            return
        self._to_dlq(queue, entry, cause)

    def _to_dlq(self, queue: Queue, entry: Entry, cause: str) -> None:
        policy = queue.policy
        msg = entry.message
        tracer = self._state.tracer
        if policy.individual_dlq_prefix is not None:
            name = policy.individual_dlq_prefix + queue.destination.name
        else:
            name = policy.dead_letter_queue
        dlq = dst.queue(name)
        if queue.destination == dlq:
            log.warning("message %s failed in the dead letter queue %s itself; dropped",
                        msg.message_id, name)
            if tracer is not None:
                tracer.message(DROPPED, msg, dlq, reason=f"failed in the DLQ: {cause}")
            return
        queue.stats.dead_lettered += 1
        if tracer is not None:
            tracer.message(DLQ, msg, queue.destination, reason=f"{cause} -> {name}",
                           delivery_count=entry.delivery_count)
        props: dict[str, PropertyValue] = dict(msg.properties)
        props["dlqDeliveryFailureCause"] = cause
        copy = msg.copy_to(dlq, properties=props, expiration=0,
                           original_destination=msg.original_destination or msg.destination)
        self._router.route_queue(self._state.get_queue(dlq), copy)
        self._router.advise(advisory_topic("MessageDLQd", queue.destination), "MessageDLQd",
                            {"messageId": msg.message_id,
                             "destination": str(queue.destination), "cause": cause})
