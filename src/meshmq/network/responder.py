"""The accepting end: a broker's tcp:// listener takes links from other brokers'
network connectors, checks who they are, and serves them (receiving, and forwarding
too when the initiator asked for duplex)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from meshmq.errors import AuthenticationError, RemoteProtocolError
from meshmq.network.endpoint import LinkEnd, client_uris_of, mirror_config
from meshmq.network.forwarder import Forwarder
from meshmq.network.interest import DestinationFilter
from meshmq.network.link import WireLink
from meshmq.network.receiver import Receiver
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import (
    FEATURE_MESSAGES_AGAIN,
    FEATURE_REFUSALS,
    FEATURES,
    WIRE_VERSION,
    FrameType,
    WireFrame,
    decode_json,
    encode_json,
)

if TYPE_CHECKING:
    from meshmq.network.manager import NetworkManager

log = logging.getLogger("meshmq.network")


class Responder(LinkEnd):
    def __init__(self, manager: NetworkManager) -> None:
        self.manager = manager
        self.link: WireLink | None = None
        self.remote: str | None = None
        self.connector = ""
        self.duplex = False
        self.counters = LinkCounters()
        self.since = time.time()
        self.ready = False

    def make_link(self) -> WireLink:
        self.link = WireLink(self, initiator=False,
                             heartbeat_s=self.manager.inbound_heartbeat_s)
        return self.link

    def on_frame(self, link: WireLink, frame: WireFrame) -> None:
        if not self.ready:
            if frame.type is not FrameType.HELLO:
                raise RemoteProtocolError(f"expected HELLO, got {frame.type.name}")
            self._hello(link, decode_json(frame))
            return
        self.route(link, frame)

    def _hello(self, link: WireLink, hello: dict[str, Any]) -> None:
        broker = self.manager.broker
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
        refusal = self.manager.refusal()
        if refusal is not None:
            link.refuse(*refusal)
            return
        try:
            user, password = hello.get("username"), hello.get("password")
            broker.authenticate(None if user is None else str(user),
                                None if password is None else str(password))
        except AuthenticationError as exc:
            # Once per remote until it gets in: its bridge retries with backoff.
            if self.manager.note_refusal(remote, "authentication-failed"):
                log.warning("network link from %s (broker %r): %s", link.peer, remote, exc)
            link.refuse("authentication-failed", str(exc))
            return
        self.manager.note_refusal(remote, None)
        config = mirror_config(hello.get("config", {}))
        # Keep-alive at the initiator's pace, so both ends agree on when a link is dead.
        link.heartbeat_s = config.heartbeat_ms / 1000
        flt = DestinationFilter.from_json(hello.get("filter", {}))
        self.remote = remote
        self.connector = str(hello.get("connector", ""))
        self.duplex = bool(hello.get("duplex", False))
        self.ready = True
        self.remote_client_uris = client_uris_of(hello)
        offered = hello.get("features")
        features = [f for f in FEATURES if isinstance(offered, list) and f in offered]
        link.write(encode_json(FrameType.WELCOME, {
            "version": WIRE_VERSION, "broker": broker.name,
            "client_uris": self.manager.client_uris(), "features": features}))
        self.receiver = Receiver(self.manager, link, remote, flt, self.counters,
                                 resync_s=config.interest_resync_ms / 1000,
                                 refusals=FEATURE_REFUSALS in features)
        self.receiver.start()
        if self.duplex:
            static = ()  # the initiator forwards its static destinations itself
            self.forwarder = Forwarder(self.manager, link, config, remote,
                                       f"NC_{self.connector}_{broker.name}_duplex_{remote}",
                                       self.counters, static,
                                       peer_takes_again=FEATURE_MESSAGES_AGAIN in features)
        log.info("network link from broker %r (%s, connector %r%s) accepted", remote,
                 link.peer, self.connector, ", duplex" if self.duplex else "")
        self.manager.inbound_changed(self, up=True)

    def on_lost(self, link: WireLink, cause: str) -> None:
        self.teardown()
        if self.ready:
            log.info("network link from broker %r closed: %s", self.remote, cause)
            self.manager.inbound_changed(self, up=False)
        self.manager.forget_inbound(self)

    def status(self) -> dict[str, Any]:
        fwd = self.forwarder
        return {"connector": self.connector, "name": f"{self.connector}<-{self.remote}",
                "direction": "inbound", "remote_broker": self.remote,
                "state": "forwarding" if self.ready else "handshaking",
                "state_since": round(self.since, 3), "duplex": self.duplex,
                "connected_to": self.link.peer if self.link else None,
                "demand": len(fwd.demands) if fwd is not None else 0,
                "inflight": fwd.inflight if fwd is not None else 0,
                "remote_client_uris": list(self.remote_client_uris),
                **self.counters.as_dict()}
