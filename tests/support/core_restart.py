"""A broker core restarted over the same memory store: what a restart would recover
from a store that kept everything written to it, without files or a loop."""

from __future__ import annotations

from collections.abc import Callable

from meshmq.config.model import BrokerConfig
from meshmq.core.broker import Broker
from meshmq.store.base import Recovery
from meshmq.store.memory import MemoryStore


def restart(config: BrokerConfig, store: MemoryStore,
            clock: Callable[[], int] | None = None) -> Broker:
    """A new broker recovered from everything ``store`` holds now."""
    broker = Broker(config, store, clock=clock)
    broker.recover(Recovery(keys=store.keys(),
                            durable_subscriptions=store.durable_subscriptions()))
    return broker
