"""What the network of brokers may read of the core: a small query API of pure
functions over a ``Broker``.

Why: bridges advertise this broker's consumers to their peers and decide whether a
queue message may go back to a peer. Both need the local interest (which destinations
have which consumers, and over which network path they came), and nothing else. Reading
it here keeps the network package off the broker's internals (its connection, queue
and durable-subscription tables), so those can change shape behind this module.

No I/O, no mutation: each function only looks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshmq.core.selector import message_lookup

if TYPE_CHECKING:
    from meshmq.core.broker import Broker
    from meshmq.core.consumer import Consumer
    from meshmq.core.destinations import Destination
    from meshmq.core.message import Message

__all__ = ["ConsumerInterest", "DurableInterest", "consumer_interest", "durable_interest",
           "has_durable",
           "local_consumer_takes"]


@dataclass(frozen=True, slots=True)
class ConsumerInterest:
    """One open consumer: where it listens, with what selector, and how it came here
    (``network_path`` None: a client of this broker; else the brokers its demand
    crossed, and the consumers at the far end in ``network_origins``)."""

    consumer_id: str
    destinations: tuple[Destination, ...]
    selector: str | None
    network_path: tuple[str, ...] | None
    network_origins: tuple[str, ...]
    durable_key: tuple[str, str] | None  # (client id, subscription name) of a durable one


@dataclass(frozen=True, slots=True)
class DurableInterest:
    """A durable topic subscription with no consumer attached now: its messages keep
    collecting here, so its interest still counts."""

    client_id: str
    subscription_name: str
    patterns: tuple[Destination, ...]
    selector: str | None


def consumer_interest(broker: Broker) -> Iterator[ConsumerInterest]:
    """Every open consumer of ``broker`` that takes messages (browsers do not)."""
    for conn in broker.connections.values():
        for consumer in conn.consumers.values():
            spec = consumer.spec
            if consumer.closed or spec.browser:
                continue
            durable = None
            if spec.subscription_name is not None and conn.client_id is not None:
                durable = (conn.client_id, spec.subscription_name)
            yield ConsumerInterest(consumer.id, tuple(spec.destinations), spec.selector,
                                   spec.network_path, tuple(spec.network_origins), durable)


def durable_interest(broker: Broker, *, skip: set[tuple[str, str]] | frozenset[
        tuple[str, str]] = frozenset()) -> Iterator[DurableInterest]:
    """The durable subscriptions of ``broker`` with no open consumer; ``skip``: keys
    the caller already saw as open consumers."""
    for key, sub in broker.durables.items():
        if key in skip or sub.durable is None:
            continue
        yield DurableInterest(key[0], key[1], tuple(sub.patterns), sub.selector_text)


def local_consumer_takes(broker: Broker, msg: Message, *, selector_aware: bool) -> bool:
    """Would a consumer of this broker's own clients (not another bridge's demand) take
    ``msg`` from its queue? With ``selector_aware``, a consumer whose selector refuses
    it does not count."""
    queue = broker.queues.get(msg.destination)
    if queue is None:
        return False
    consumer: Consumer
    for consumer in queue.consumers:
        if consumer.spec.network_path is not None or consumer.closed:
            continue
        if not selector_aware or consumer.selector is None:
            return True
        if consumer.selector.matches(message_lookup(msg)):
            return True
    return False


def has_durable(broker: Broker, key: tuple[str, str]) -> bool:
    """Is there a durable subscription (client id, subscription name) on ``broker``?"""
    return key in broker.durables
