"""What a client protocol session (STOMP, MQTT, over TCP or WebSocket) needs from the
broker that hosts it, and nothing more.

Why a Protocol: sessions used to hold the whole runtime (listeners, HA, management,
signals, trace) and could reach anything in it. ``SessionHost`` names each thing they
use; ``BrokerRuntime`` implements it structurally, and a test can host a session with a
small fake. The network of brokers has its own, narrower list (network/host.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

# What the host needs from a protocol session is what the network's host needs from a
# forwarder: one definition, in the lower layer.
from meshmq.network.host import HostedSession as Session

__all__ = ["Session", "SessionHost"]

if TYPE_CHECKING:
    from meshmq.config.model import BrokerConfig
    from meshmq.core.broker import Broker
    from meshmq.transport.durability import Durability
    from meshmq.transport.mqtt_service import MqttService
    from meshmq.transport.push_back import PushBack
    from meshmq.transport.topology import Topology


class SessionHost(Protocol):
    """The broker runtime, as a client session sees it."""

    @property
    def broker(self) -> Broker: ...
    @property
    def config(self) -> BrokerConfig: ...
    @property
    def durability(self) -> Durability:
        """The one "confirm only once durable" path (receipts, MQTT acks)."""
    @property
    def mqtt(self) -> MqttService:
        """MQTT wills and persistent sessions, shared by every MQTT connection."""
    @property
    def push_back(self) -> PushBack:
        """Producers held back by slow consumers (STOMP and MQTT), woken as they drain."""
    @property
    def topology(self) -> Topology:
        """Peer brokers' client URIs, pushed to failover clients on connect."""

    def pushes_topology(self, listener: str | None) -> bool: ...
    def request_pump(self) -> None:
        """Deliver what the core has ready, soon (this loop turn's end)."""
    def pump(self) -> None:
        """Deliver what the core has ready, now."""
    def admit(self, listener: str) -> bool:
        """Count a new connection on ``listener``; False at its max_connections."""
    def release(self, listener: str) -> None: ...
    def accepted(self, session: Session) -> None:
        """A connection was accepted (its timeouts are checked from now on)."""
    def forget(self, session: Session) -> None: ...
    def register(self, session: Session) -> None:
        """Route deliveries of ``session.conn`` to ``session``."""
    def unregister(self, session: Session) -> None: ...
    def mark_flush(self, session: Session) -> None:
        """Flush ``session`` at the end of this pump."""
