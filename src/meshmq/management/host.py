"""What the management listener (admin API, Jolokia, /metrics, console, network map)
needs from the broker it serves, and nothing more.

Why a Protocol: the routes used to take the whole runtime and could reach its
listeners, pump internals and lifecycle. ``ManagementHost`` names each thing they use;
the composition root (``meshmq.transport.runtime.BrokerRuntime``) implements it
structurally, so management depends on this list, not on the transport package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from meshmq.config.model import BrokerConfig
    from meshmq.core.broker import Broker
    from meshmq.ha.controller import HaController
    from meshmq.ha.replication import ReplicatedHa
    from meshmq.network.manager import NetworkManager
    from meshmq.store.base import Store


class ManagementHost(Protocol):
    """The broker, as its management listener sees it."""

    @property
    def broker(self) -> Broker: ...
    @property
    def config(self) -> BrokerConfig: ...
    @property
    def store(self) -> Store:
        """For its usage figures and a sync after an operator's change."""
    @property
    def ha(self) -> HaController | ReplicatedHa | None:
        """Master/slave status (None: a standalone broker)."""
    @property
    def network(self) -> NetworkManager:
        """Bridges' status; connectors started and stopped by an operator."""
    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """Bound address of each listener; the management listener adds its own."""
    @property
    def started(self) -> bool:
        """Serving clients (a slave, or a broker still starting, is not)."""
    @property
    def sync_seconds(self) -> Histogram:
        """Store sync latencies, for /metrics."""
    @property
    def trace_events_written(self) -> int: ...
    @property
    def trace_events_dropped(self) -> int: ...

    def shard_handoffs(self) -> dict[str, int] | None:
        """A shard's connection handoff counters (transport/handoff.py); None: none."""

    def shard_links(self) -> list[dict[str, object]] | None:
        """A shard's links to the other shards of its node (None: not a shard)."""
    def statistics(self) -> dict[str, object]:
        """``/api/stat``: the core's figures plus HA, network and build."""
    def connections_by_listener(self) -> dict[str, int]: ...
    def close_connection(self, connection_id: str) -> bool:
        """Close a client connection for an operator; False when none is open."""
    def write_ops(self) -> None:
        """Write the store operations an operator's change produced, now."""
    async def sync_with_owners(self) -> None:
        """Make what the core has queued durable: the store sync and, on a shard of
        several, the owning shards' ``STORED`` for the messages routed to them."""
    def request_pump(self) -> None:
        """Deliver what the core has ready, soon (this loop turn's end)."""
    def pump(self) -> None:
        """Deliver what the core has ready, now."""
