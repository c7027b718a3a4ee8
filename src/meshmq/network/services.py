"""What each part of the network uses from the rest, named, as ``host.py`` names what
the network uses from the runtime.

Why: the bridge, the responder and the two halves of a link used to hold the whole
``NetworkManager`` and call back into it. Each now takes the narrow interface below;
the manager implements the ends' interfaces and owns a ``routes.NetworkRoutes`` (the
halves'), and wires the parts together. A forwarder/receiver pair needs only a
``NetworkRoutes``, and a bridge driver only a ``BridgeServices``.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.connector_uri import Endpoint
    from meshmq.core.message import Message
    from meshmq.network.bridge import Bridge
    from meshmq.network.forwarder import Forwarder
    from meshmq.network.host import BrokerHost
    from meshmq.network.interest import Demand
    from meshmq.network.link import WireLink
    from meshmq.network.responder import Responder

#: Opens the connection of ``link`` (a bridge's, not yet connected) to ``endpoint``,
#: over TLS when a context is given, within ``timeout`` seconds; raises OSError or
#: ssl.SSLError as a socket would. ``link.dial_tcp`` is the real one.
Dialer = Callable[["WireLink", "Endpoint", "ssl.SSLContext | None", float], Awaitable[None]]


class ForwarderServices(Protocol):
    """What a forwarding half uses besides its link."""

    @property
    def host(self) -> BrokerHost: ...
    def may_return(self, msg: Message, config: NetworkConnectorConfig,
                   forwarder: Forwarder) -> bool: ...
    def suppress_duplicates(self, forwarder: Forwarder, plan: dict[str, Demand]
                            ) -> dict[str, Demand]: ...
    def demand_changed(self, origin: Forwarder) -> None: ...


class ReceiverServices(Protocol):
    """What a receiving half uses besides its link."""

    @property
    def host(self) -> BrokerHost: ...
    def arrived(self, message_ids: list[str]) -> None:
        """These messages arrived over a bridge now (one call per batch)."""


class LinkServices(ForwarderServices, ReceiverServices, Protocol):
    """What both halves of a link use (``routes.NetworkRoutes``)."""


class EndServices(Protocol):
    """What both ends of a link (bridge, responder) use."""

    @property
    def host(self) -> BrokerHost: ...
    @property
    def routes(self) -> LinkServices: ...
    def client_uris(self) -> list[str]: ...
    def management_url(self) -> str | None: ...
    def track(self, link: WireLink) -> WireLink: ...


class BridgeServices(EndServices, Protocol):
    """What a bridge (the dialing end) uses."""

    def is_self(self, endpoint: Endpoint) -> bool: ...
    def client_tls(self, config: NetworkConnectorConfig,
                   verify_hostname: bool | None = None) -> ssl.SSLContext: ...
    def dial(self, link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
             timeout: float) -> Awaitable[None]: ...
    def bridge_changed(self, bridge: Bridge) -> None: ...


class ResponderServices(EndServices, Protocol):
    """What a responder (the accepting end) uses."""

    @property
    def inbound_heartbeat_s(self) -> float: ...
    def refusal(self) -> tuple[str, str] | None: ...
    def note_refusal(self, remote: str, kind: str | None) -> bool: ...
    def inbound_changed(self, responder: Responder, *, up: bool) -> None: ...
    def forget_inbound(self, responder: Responder) -> None: ...
