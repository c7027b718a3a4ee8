"""The initiating end of a network connector: one bridge, its lifecycle, its status.

``run()`` drives the state machine of ``bridge_state``: connect to the first broker of
the target list that accepts, handshake, wait for the remote's interest, forward until
the link fails — then back off and start again from the top of the list. Every failure
(refused, timeout, authentication, remote is a slave, protocol error, link lost) takes
the same road, so no failure can leave a bridge dead. Identical failures in a row are
logged once; the state and the last error with its cause are always in ``status()``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

from meshmq import __version__
from meshmq.core import destinations as dst
from meshmq.errors import ConfigError
from meshmq.network.bridge_state import BridgeEvent, BridgeState, ReconnectPolicy, transition
from meshmq.network.endpoint import (
    BYE_CAUSE,
    LinkEnd,
    client_uris_of,
    management_url_of,
    mirror_json,
)
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
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.network.manager import NetworkManager
    from meshmq.network.targets import Endpoint

log = logging.getLogger("meshmq.network")

ADVISORY_TOPIC = dst.topic("ActiveMQ.Advisory.NetworkBridge")


class Bridge(LinkEnd):
    def __init__(self, manager: NetworkManager, config: NetworkConnectorConfig,
                 endpoints: tuple[Endpoint, ...]) -> None:
        self.manager = manager
        self.config = config
        self.endpoints = endpoints
        self.state = BridgeState.STOPPED
        self.state_since = time.time()
        self.policy = ReconnectPolicy(
            initial_delay_s=config.initial_reconnect_delay_ms / 1000,
            max_delay_s=config.max_reconnect_delay_ms / 1000,
            exponential=config.use_exponential_backoff,
            multiplier=config.backoff_multiplier,
            max_attempts=config.max_reconnect_attempts,
            min_connect_time_s=config.min_connect_time_ms / 1000)
        self.counters = LinkCounters()
        self.link: WireLink | None = None
        self.remote: str | None = None
        self.connected_to: Endpoint | None = None
        self.last_error: dict[str, Any] | None = None
        self.attempts = 0
        self.connects = 0
        self._logged: tuple[str, str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._handshake: asyncio.Future[tuple[str, str]] | None = None
        self._synced: asyncio.Event = asyncio.Event()
        self._stopping = False
        # Why the last established link ended (kept while retries fail for other reasons).
        self.link_ended: dict[str, Any] | None = None
        # Exclusions win over static inclusion too (as ActiveMQ checks them first).
        excluded = DestinationFilter.of(config).excluded
        self.static = tuple(d for d in (dst.Destination.parse_uri(u)
                                        for u in config.statically_included_destinations)
                            if not any(dst.matches(p, d) for p in excluded))

    def stopping(self) -> bool:
        return self._stopping

    @property
    def name(self) -> str:
        return f"{self.config.name}:{','.join(str(e) for e in self.endpoints)}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"bridge {self.name}")

    async def stop(self) -> None:
        self._stopping = True
        link = self.link
        if link is not None and not link.closed:
            link.write(encode_json(FrameType.BYE, {"reason": "broker stopping"}))
            link.close("bridge stopped")
        self.teardown()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._fire(BridgeEvent.STOP)

    def _fire(self, event: BridgeEvent, error: tuple[str, str] | None = None) -> None:
        old = self.state
        self.state = transition(old, event)
        if self.state is not old:
            self.state_since = time.time()
        if error is not None:
            kind, message = error
            self.last_error = {"kind": kind, "message": message, "at": time.time()}
        self._log(old, event, error)
        if self.state is not old:
            self.manager.bridge_changed(self)

    def _log(self, old: BridgeState, event: BridgeEvent, error: tuple[str, str] | None) -> None:
        if error is not None:
            # Once per change of (state, failure kind): a broker down for an hour
            # gives one line, not one per retry.
            key = (old.value, error[0])
            if key != self._logged:
                self._logged = key
                level = logging.INFO if error[0] == "remote-shutdown" else logging.WARNING
                log.log(level, "bridge %s: %s (%s); retrying with backoff", self.name,
                        error[1], error[0])
            else:
                log.debug("bridge %s: %s again", self.name, error[0])
        elif self.state is BridgeState.FORWARDING:
            self._logged = None
            log.info("bridge %s: forwarding to broker %r at %s", self.name, self.remote,
                     self.connected_to)
        elif self.state is not old:
            log.debug("bridge %s: %s -> %s", self.name, old, self.state)

    async def _run(self) -> None:
        self._fire(BridgeEvent.START)
        while not self.stopping():
            error = await self._attempt()
            if self.stopping():
                return
            self._fire(BridgeEvent.FAILED, error)
            delay = self.policy.next_delay()
            if delay is None:
                log.error("bridge %s: giving up after %d attempts (max_reconnect_attempts)",
                          self.name, self.attempts)
                self._fire(BridgeEvent.GIVE_UP)
                return
            await asyncio.sleep(delay)  # the backoff itself
            self._fire(BridgeEvent.RETRY)

    async def _attempt(self) -> tuple[str, str]:
        """One pass over the target list; returns why the bridge is not (or no longer)
        up. The first broker that accepts the handshake wins."""
        loop = asyncio.get_running_loop()
        error = ("no-target", "no broker to connect to")
        timeout = self.config.handshake_timeout_ms / 1000
        for endpoint in self.endpoints:
            if self.manager.is_self(endpoint):
                error = ("self", f"{endpoint} is this broker")
                continue
            self.attempts += 1
            if self.state is not BridgeState.CONNECTING:
                self._fire(BridgeEvent.NEXT_TARGET)
            ctx: ssl.SSLContext | None = None
            if endpoint.tls:  # ssl:// is TLS or nothing: never a plaintext fallback
                try:
                    ctx = self.manager.client_tls(self.config, endpoint.verify_hostname)
                except ConfigError as exc:
                    error = ("tls-config", f"{endpoint}: {exc}")
                    continue
            try:
                link = await asyncio.wait_for(self._connect(endpoint, ctx, timeout), timeout)
            except ssl.SSLCertVerificationError as exc:
                error = ("tls-verify-failed",
                         f"{endpoint}: the remote's certificate is not trusted "
                         f"({exc.verify_message}): set ssl_cafile of the network connector "
                         "to the CA that signed it" + (
                             ", or verify_hostname = false" if exc.verify_code == 62 else ""))
                continue
            except ssl.SSLError as exc:
                error = ("tls-failed", f"{endpoint}: TLS handshake failed ({exc.reason}): "
                         "ssl:// needs an ssl listener on the remote broker (is it a "
                         "plaintext tcp:// port?)")
                continue
            except ConnectionRefusedError:
                error = ("connection-refused", f"{endpoint}: connection refused")
                continue
            except TimeoutError:
                error = ("connect-timeout", f"{endpoint}: no answer within {timeout:g}s")
                continue
            except OSError as exc:
                error = ("unreachable", f"{endpoint}: {exc.strerror or exc}")
                continue
            self.link = link
            self.connected_to = endpoint
            self._handshake = loop.create_future()
            self._synced = asyncio.Event()
            self._fire(BridgeEvent.CONNECTED)
            flt = DestinationFilter.of(self.config)
            link.write(encode_json(FrameType.HELLO, {
                "protocol": "meshmq", "versions": [WIRE_VERSION], "software": __version__,
                "features": list(FEATURES),
                "broker": self.manager.broker.name, "connector": self.config.name,
                "username": self.config.username, "password": self.config.password,
                "duplex": self.config.duplex, "filter": flt.to_json(),
                "client_uris": self.manager.client_uris(),
                "management_url": self.manager.management_url(),
                "config": mirror_json(self.config)}))
            try:
                kind, detail = await asyncio.wait_for(asyncio.shield(self._handshake), timeout)
            except TimeoutError:
                kind, detail = "handshake-timeout", f"{endpoint}: no handshake within {timeout:g}s"
            if kind != "welcome":
                link.close(detail)
                self.link = None
                error = (kind, detail)
                if kind in ("remote-is-slave", "connection-lost"):
                    continue  # try the next broker of the list at once
                return error
            self._fire(BridgeEvent.WELCOMED)
            up_since = time.monotonic()
            lost_wait = asyncio.ensure_future(link.lost)
            synced_wait = asyncio.ensure_future(self._synced.wait())
            done, _ = await asyncio.wait({lost_wait, synced_wait},
                                         return_when=asyncio.FIRST_COMPLETED)
            if synced_wait in done:
                self.connects += 1
                self._fire(BridgeEvent.SYNCED)
            else:
                synced_wait.cancel()
            cause = await lost_wait
            self.teardown()
            self.link = None
            self.policy.connected_for(time.monotonic() - up_since)
            # A BYE is a clean shutdown of the remote broker, not a crash.
            kind = "remote-shutdown" if cause.startswith(BYE_CAUSE) else "link-lost"
            self.link_ended = {"kind": kind, "message": f"{endpoint}: {cause}",
                               "at": time.time()}
            return (kind, f"{endpoint}: {cause}")
        return error

    async def _connect(self, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                       timeout: float) -> WireLink:
        loop = asyncio.get_running_loop()
        link = self.manager.track(WireLink(self, initiator=True,
                                           heartbeat_s=self.config.heartbeat_ms / 1000))
        if ctx is None:
            try:
                await loop.create_connection(lambda: link, endpoint.host, endpoint.port)
            except BaseException:
                link.connection_lost(None)
                raise
            return link
        # The TLS handshake on a TCP connection of our own, so a failed handshake closes
        # it at once (create_connection(ssl=...) can leave it half-closed).
        try:
            tcp, _ = await loop.create_connection(asyncio.Protocol, endpoint.host,
                                                  endpoint.port)
        except BaseException:
            link.connection_lost(None)  # never connected: nothing to wait for at stop
            raise
        try:
            tls = await loop.start_tls(tcp, link, ctx, server_hostname=endpoint.host,
                                       ssl_handshake_timeout=timeout)
            if tls is None:
                raise ConnectionResetError("connection closed during the TLS handshake")
        except BaseException:
            tcp.abort()
            link.connection_lost(None)
            raise
        link.connection_made(tls)
        return link

    def _start_halves(self, link: WireLink, *, again: bool = False,
                      refusals: bool = False) -> None:
        assert self.remote is not None
        cfg = self.config
        self.forwarder = Forwarder(self.manager, link, cfg, self.remote,
                                   f"NC_{cfg.name}_{self.manager.broker.name}_outbound_"
                                   f"{self.remote}", self.counters, self.static,
                                   peer_takes_again=again)
        if cfg.duplex:
            self.receiver = Receiver(self.manager, link, self.remote,
                                     DestinationFilter.of(cfg), self.counters,
                                     resync_s=cfg.interest_resync_ms / 1000,
                                     refusals=refusals)
            self.receiver.start()
        if cfg.static_bridge or self.static:
            # No interest is needed for static demand; forward at once.
            self.forwarder.replan()
        if cfg.static_bridge:
            self.forwarder.synced = True
            self._synced.set()

    # ------------------------------------------------------------ LinkHandler
    def on_frame(self, link: WireLink, frame: WireFrame) -> None:
        if link is not self.link:
            return
        hs = self._handshake
        if hs is not None and not hs.done():
            if frame.type is FrameType.WELCOME:
                body = decode_json(frame)
                if body.get("version") != WIRE_VERSION:
                    hs.set_result(("version-mismatch",
                                   f"remote speaks wire version {body.get('version')}"))
                    return
                self.remote = str(body.get("broker", "?"))
                self.remote_client_uris = client_uris_of(body)
                self.remote_management_url = management_url_of(body)
                features = body.get("features")
                offered = features if isinstance(features, list) else []
                # The remote's first INTEREST may follow in this very read: the
                # halves must exist before the next frame is handled.
                self._start_halves(link, again=FEATURE_MESSAGES_AGAIN in offered,
                                   refusals=FEATURE_REFUSALS in offered)
                hs.set_result(("welcome", ""))
                return
            if frame.type is FrameType.REFUSE:
                body = decode_json(frame)
                hs.set_result((str(body.get("code", "refused")),
                               f"{self.connected_to}: {body.get('message', '')}"))
                return
            hs.set_result(("protocol-error", f"expected WELCOME, got {frame.type.name}"))
            return
        self.route(link, frame)

    def on_synced(self) -> None:
        self._synced.set()

    def on_refused(self, code: str, message: str) -> None:
        self.last_error = {"kind": code, "message": message, "at": time.time()}

    def on_lost(self, link: WireLink, cause: str) -> None:
        hs = self._handshake
        if link is self.link and hs is not None and not hs.done():
            tls = self.connected_to is not None and self.connected_to.tls
            if isinstance(link.lost_exc, ssl.SSLError) or (tls and link.bytes_in == 0):
                # TLS 1.3: the remote checks our certificate after our side of the
                # handshake ended, then closes (with an alert, or without a word).
                why = (f" ({link.lost_exc.reason})"
                       if isinstance(link.lost_exc, ssl.SSLError) else "")
                hs.set_result(("tls-refused",
                               f"{self.connected_to}: the remote closed the TLS connection "
                               f"without answering{why}: it refuses this broker's "
                               "certificate? Set ssl_certfile/ssl_keyfile of the network "
                               "connector to a certificate that the remote listener's "
                               "ssl_cafile trusts"))
                return
            hint = ""
            if self.connected_to is not None and not self.connected_to.tls and \
                    link.bytes_in == 0:
                hint = " before answering (a TLS port? then use ssl:// in the URI)"
            hs.set_result(("connection-lost", f"{self.connected_to}: {cause}{hint}"))

    # ------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        fwd = self.forwarder
        return {"connector": self.config.name, "name": self.name, "direction": "outbound",
                "targets": [str(e) for e in self.endpoints], "state": self.state.value,
                "state_since": round(self.state_since, 3), "remote_broker": self.remote,
                "connected_to": str(self.connected_to) if self.connected_to else None,
                "duplex": self.config.duplex, "last_error": self.last_error,
                "link_ended": self.link_ended,
                "attempts": self.attempts, "connects": self.connects,
                "demand": len(fwd.demands) if fwd is not None else 0,
                "inflight": fwd.inflight if fwd is not None else 0,
                "remote_client_uris": list(self.remote_client_uris),
                **self.counters.as_dict()}
