"""The accepting end: a broker's tcp:// listener takes links from other brokers'
network connectors, checks who they are, and serves them (receiving, and forwarding
too when the initiator asked for duplex)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

from meshmq.core.auth import Principal
from meshmq.errors import AuthenticationError, RemoteProtocolError
from meshmq.network.endpoint import LinkEnd, client_uris_of, management_url_of, mirror_config
from meshmq.network.forwarder import Forwarder
from meshmq.network.interest import DestinationFilter
from meshmq.network.link import WireLink
from meshmq.network.receiver import Receiver
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import (
    FEATURE_ACK_RANGES,
    FEATURE_HOLDS,
    FEATURE_MESSAGES_AGAIN,
    FEATURE_REFUSALS,
    FEATURES,
    WIRE_VERSION,
    FrameType,
    WireFrame,
    decode_json,
    encode_json,
)
from meshmq.tls import verified_peer

if TYPE_CHECKING:
    from meshmq.config.model import ListenerConfig
    from meshmq.network.services import ResponderServices

log = logging.getLogger("meshmq.network")

# Frames a peer may pipeline behind its HELLO before it is admitted.
MAX_HELD_FRAMES = 1000


class Responder(LinkEnd):
    def __init__(self, services: ResponderServices, listener: ListenerConfig | None = None,
                 ctx: ssl.SSLContext | None = None) -> None:
        self.services = services
        self.listener = listener
        self.ctx = ctx  # the listener's TLS context (None: plaintext)
        self.principal: Principal | None = None
        self.link: WireLink | None = None
        self.remote: str | None = None
        self.connector = ""
        self.duplex = False
        self.counters = LinkCounters()
        self.since = time.time()
        self.ready = False
        # The HELLO's credentials being checked (scrypt runs off the event loop), and
        # the frames a peer sent behind its HELLO meanwhile (handled once admitted).
        self._admission: asyncio.Task[None] | None = None
        self._held: list[WireFrame] = []

    def make_link(self) -> WireLink:
        self.link = WireLink(self, initiator=False,
                             heartbeat_s=self.services.inbound_heartbeat_s)
        return self.link

    def on_frame(self, link: WireLink, frame: WireFrame) -> None:
        if not self.ready:
            if self._admission is not None:
                if len(self._held) >= MAX_HELD_FRAMES:
                    raise RemoteProtocolError(f"more than {MAX_HELD_FRAMES} frames sent "
                                              "before WELCOME")
                self._held.append(frame)
                return
            if frame.type is not FrameType.HELLO:
                raise RemoteProtocolError(f"expected HELLO, got {frame.type.name}")
            self._hello(link, decode_json(frame))
            return
        self.route(link, frame)

    def _hello(self, link: WireLink, hello: dict[str, Any]) -> None:
        broker = self.services.host.broker
        versions = hello.get("versions")
        if not isinstance(versions, list) or WIRE_VERSION not in versions:
            link.refuse("version-mismatch", f"this broker speaks wire version {WIRE_VERSION}, "
                                            f"the peer offers {versions!r}")
            return
        remote = hello.get("broker")
        if not isinstance(remote, str) or not remote:
            raise RemoteProtocolError("HELLO without a broker name")
        if remote == broker.name:
            link.refuse("loop", f"broker {remote!r} connected to itself (or two brokers "
                                "share a name: broker names must be unique in a network)")
            return
        refusal = self.services.refusal()
        if refusal is not None:
            link.refuse(*refusal)
            return
        self._admission = asyncio.get_running_loop().create_task(
            self._admit_safely(link, hello, remote))

    async def _admit_safely(self, link: WireLink, hello: dict[str, Any], remote: str) -> None:
        try:
            await self._admit(link, hello, remote)
        except asyncio.CancelledError:
            raise
        except RemoteProtocolError as exc:  # as from on_frame: the peer's fault
            link.abort(f"protocol error: {exc}")
        except Exception:
            log.exception("network link from %s (broker %r): internal error", link.peer,
                          remote)
            link.abort("internal error")

    async def _admit(self, link: WireLink, hello: dict[str, Any], remote: str) -> None:
        broker = self.services.host.broker
        # Keyed by address and name: a stranger gets one log line, not one per attempt.
        key = f"{link.peer.rpartition(':')[0]} {remote}"
        try:
            principal = await self._authenticate(link, hello)
        except AuthenticationError as exc:
            if link.closed:
                return
            # Once per remote until it gets in: its bridge retries with backoff.
            if self.services.note_refusal(key, str(exc)):
                log.warning("network link from %s (broker %r) refused: %s", link.peer,
                            remote, exc)
            link.refuse("authentication-failed", f"refused by broker {broker.name!r}: {exc}")
            return
        if link.closed:
            return  # it went away while its credentials were checked
        self.services.note_refusal(key, None)
        self.principal = principal
        config = mirror_config(hello.get("config", {}))
        # Keep-alive at the initiator's pace, so both ends agree on when a link is dead.
        link.heartbeat_s = config.heartbeat_ms / 1000
        flt = DestinationFilter.from_json(hello.get("filter", {}))
        self.remote = remote
        self.connector = str(hello.get("connector", ""))
        self.duplex = bool(hello.get("duplex", False))
        self.ready = True
        self.remote_client_uris = client_uris_of(hello)
        self.remote_management_url = management_url_of(hello)
        offered = hello.get("features")
        features = [f for f in FEATURES if isinstance(offered, list) and f in offered]
        link.write(encode_json(FrameType.WELCOME, {
            "version": WIRE_VERSION, "broker": broker.name,
            "client_uris": self.services.client_uris(), "features": features,
            "management_url": self.services.management_url()}))
        self.receiver = Receiver(self.services.routes, link, remote, flt, self.counters,
                                 resync_s=config.interest_resync_ms / 1000,
                                 refusals=FEATURE_REFUSALS in features,
                                 ack_ranges=FEATURE_ACK_RANGES in features,
                                 hold_notes=FEATURE_HOLDS in features,
                                 principal=principal)
        self.receiver.start()
        if self.duplex:
            static = ()  # the initiator forwards its static destinations itself
            self.forwarder = Forwarder(self.services.routes, link, config, remote,
                                       f"NC_{self.connector}_{broker.name}_duplex_{remote}",
                                       self.counters, static,
                                       peer_takes_again=FEATURE_MESSAGES_AGAIN in features,
                                       principal=principal)
        log.info("network link from broker %r (%s, connector %r%s) accepted as %s", remote,
                 link.peer, self.connector, ", duplex" if self.duplex else "",
                 principal.user)
        self.services.inbound_changed(self, up=True)
        held, self._held = self._held, []
        for frame in held:  # (a link closed meanwhile ignores what is written to it)
            self.route(link, frame)

    async def _authenticate(self, link: WireLink, hello: dict[str, Any]) -> Principal:
        """Who the linking broker is. Links are never anonymous (unlike client ports, and
        whatever ``auth.anonymous_access`` says): a configured user's credentials, or a
        client certificate this listener's ``ssl_cafile`` verified, or the listener's
        explicit ``allow_anonymous_links``."""
        broker = self.services.host.broker
        user, password = hello.get("username"), hello.get("password")
        if (user is not None and not isinstance(user, str)) or \
                (password is not None and not isinstance(password, str)):
            raise AuthenticationError("username and password must be strings")
        if user:
            try:
                # Constant time; a hashed password is checked off the event loop.
                principal = await self.services.host.check_password(user, password or "")
            except AuthenticationError:
                raise AuthenticationError(
                    f"authentication failed for user {user!r}: set username/password on "
                    f"the network connector to a user of broker {broker.name!r}, or use "
                    "mutual TLS") from None
            if principal.anonymous:  # no users configured: any login would pass
                raise AuthenticationError(
                    f"broker {broker.name!r} has no users, and broker links need a "
                    f"configured user or a client certificate: add a user to [auth] of "
                    f"broker {broker.name!r} and set it as username/password on the "
                    "network connector, or use mutual TLS")
            return principal
        cert = verified_peer(self.ctx, link.peercert)
        if cert is not None:
            return broker.auth.certificate_principal(cert)
        if self.listener is not None and self.listener.allow_anonymous_links:
            return Principal(f"network:{hello.get('broker')}", frozenset({"network"}),
                             anonymous=True)
        raise AuthenticationError(
            f"broker links need credentials: set username/password on the network "
            f"connector to a user of broker {broker.name!r}, or use mutual TLS")

    def cancel_admission(self) -> None:
        """Stop checking the HELLO's credentials (the link or the broker is going)."""
        if self._admission is not None and not self._admission.done():
            self._admission.cancel()

    def on_lost(self, link: WireLink, cause: str) -> None:
        self.cancel_admission()
        self.teardown()
        if self.ready:
            log.info("network link from broker %r closed: %s", self.remote, cause)
            self.services.inbound_changed(self, up=False)
        self.services.forget_inbound(self)

    def status(self) -> dict[str, Any]:
        fwd = self.forwarder
        return {"connector": self.connector, "name": f"{self.connector}<-{self.remote}",
                "direction": "inbound", "remote_broker": self.remote,
                "state": "forwarding" if self.ready else "handshaking",
                "state_since": round(self.since, 3), "duplex": self.duplex,
                "connected_to": self.link.peer if self.link else None,
                "demand": len(fwd.demands) if fwd is not None else 0,
                "inflight": fwd.inflight if fwd is not None else 0,
                "held": sorted(map(str, fwd.held)) if fwd is not None else [],
                "remote_client_uris": list(self.remote_client_uris),
                **self.counters.as_dict()}
