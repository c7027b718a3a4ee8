"""What the network of brokers needs from the broker that hosts it, and nothing more.

Why a Protocol: the manager, bridges, forwarders, receivers and responders used to
hold the whole runtime and reach into it. ``BrokerHost`` names each thing they use, so
the network package depends on this list, not on ``meshmq.transport.runtime`` (which
implements it structurally), and a test can host the network with a small fake.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from meshmq.config.model import BrokerConfig
    from meshmq.core.auth import Principal
    from meshmq.core.broker import Broker, Connection
    from meshmq.core.destinations import Destination
    from meshmq.core.queue import BrowseEnd, Delivery
    from meshmq.tls import CertificateReloader
    from meshmq.transport.durability import Durability


class HostedSession(Protocol):
    """A session the host pumps deliveries to: a client protocol session (STOMP, MQTT)
    or a forwarder."""

    conn: Connection | None

    def deliver(self, outcome: Delivery | BrowseEnd) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def close_by_admin(self) -> None: ...
    def check_timeouts(self, now: float) -> None: ...


class HoldPeer(Protocol):
    """The receiving half of a link whose forwarder takes hold notes."""

    def note_hold(self, dest: Destination, held: bool) -> None:
        """Ask the forwarder to stop (``held``) or resume forwarding ``dest``."""


class LinkHolds(Protocol):
    """Push-back carried back over bridges (the runtime's, transport/push_back.py):
    after each batch a link brought, the destinations it went to are looked at, and
    while one is slow here its link is noted to hold it."""

    def routed(self, peer: HoldPeer, dests: Iterable[Destination]) -> None: ...
    def link_lost(self, peer: HoldPeer) -> None: ...


class BrokerHost(Protocol):
    """The broker runtime, as the network sees it."""

    @property
    def broker(self) -> Broker: ...
    @property
    def config(self) -> BrokerConfig: ...
    @property
    def addresses(self) -> Mapping[str, tuple[str, int]]:
        """Bound address of each listener (and ``management``), by name."""
    @property
    def tls(self) -> CertificateReloader:
        """Where TLS contexts that present a certificate register for reloading."""
    @property
    def durability(self) -> Durability:
        """The one "confirm only once durable" path (bridge ACKs use it)."""

    @property
    def link_holds(self) -> LinkHolds | None:
        """Push-back over bridges, where the host has it."""

    def request_pump(self) -> None:
        """Deliver what the core has ready, soon (this loop turn's end)."""
    def trace_barrier(self) -> None:
        """With an exact trace: what is traced so far reaches the OS now."""
    def accepted(self, session: HostedSession) -> None: ...
    def register(self, session: HostedSession) -> None:
        """Route deliveries of ``session.conn`` to ``session``."""
    def unregister(self, session: HostedSession) -> None: ...
    def forget(self, session: HostedSession) -> None: ...
    def mark_flush(self, session: HostedSession) -> None:
        """Flush ``session`` at the end of this pump."""
    async def check_password(self, login: str, passcode: str) -> Principal:
        """Authenticate a user (off the event loop); raises AuthenticationError."""
