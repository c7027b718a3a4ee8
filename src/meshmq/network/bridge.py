"""The initiating end of a network connector: the asyncio driver of one bridge.

The decisions are ``bridge_state.BridgeMachine``'s (sans-I/O): which target to dial,
when to retry, when to give up, what the state and the last error are. This driver
performs its actions (dial, timers, write HELLO, close the link, start and tear down the
forwarding and receiving halves) and feeds back what happened, classifying socket and
TLS errors into failure kinds. Identical failures in a row are logged once; the state
and the last error with its cause are always in ``status()``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from meshmq import __version__
from meshmq.core import destinations as dst
from meshmq.errors import ConfigError
from meshmq.network.bridge_state import (
    Action,
    BridgeMachine,
    BridgeState,
    CancelTimer,
    Changed,
    CloseLink,
    Connect,
    GiveUp,
    Send,
    StartHalves,
    StartTimer,
    Teardown,
)
from meshmq.network.endpoint import LinkEnd, mirror_json
from meshmq.network.forwarder import Forwarder
from meshmq.network.interest import DestinationFilter
from meshmq.network.link import WireLink
from meshmq.network.receiver import Receiver
from meshmq.network.stats import LinkCounters
from meshmq.protocol.wire import (
    FEATURES,
    WIRE_VERSION,
    FrameType,
    WireFrame,
    encode_json,
)

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.connector_uri import Endpoint
    from meshmq.network.services import BridgeServices

log = logging.getLogger("meshmq.network")

ADVISORY_TOPIC = dst.topic("ActiveMQ.Advisory.NetworkBridge")


class Bridge(LinkEnd):
    def __init__(self, services: BridgeServices, config: NetworkConnectorConfig,
                 endpoints: tuple[Endpoint, ...]) -> None:
        self.services = services
        self.config = config
        self.endpoints = endpoints
        self.machine = BridgeMachine(config, endpoints, hello=self._hello)
        self.state_since = time.time()
        self.counters = LinkCounters()
        self.link: WireLink | None = None
        self._logged: tuple[str, str] | None = None
        self._dialing: asyncio.Task[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._actions: deque[Action] = deque()
        self._performing = False
        self._stopping = False
        # Exclusions win over static inclusion too (as ActiveMQ checks them first).
        excluded = DestinationFilter.of(config).excluded
        self.static = tuple(d for d in (dst.Destination.parse_uri(u)
                                        for u in config.statically_included_destinations)
                            if not any(dst.matches(p, d) for p in excluded))

    # What the machine knows, as the status and the manager read it.
    @property
    def state(self) -> BridgeState:
        return self.machine.state

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.machine.last_error

    @property
    def link_ended(self) -> dict[str, Any] | None:
        return self.machine.link_ended

    @property
    def remote(self) -> str | None:
        return self.machine.remote

    @property
    def connected_to(self) -> Endpoint | None:
        return self.machine.connected_to

    @property
    def attempts(self) -> int:
        return self.machine.attempts

    @property
    def connects(self) -> int:
        return self.machine.connects

    def stopping(self) -> bool:
        return self._stopping

    @property
    def name(self) -> str:
        return f"{self.config.name}:{','.join(str(e) for e in self.endpoints)}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._feed(self.machine.start(time.time()))

    async def stop(self) -> None:
        self._stopping = True
        dialing, self._dialing = self._dialing, None
        self._feed(self.machine.stop(time.time()))
        if dialing is not None:
            dialing.cancel()
            try:
                await dialing
            except asyncio.CancelledError:
                pass

    # ------------------------------------------------------------ performing actions
    def _feed(self, actions: list[Action]) -> None:
        """Perform ``actions`` in order; events fed while performing queue behind."""
        self._actions.extend(actions)
        if self._performing:
            return
        self._performing = True
        try:
            while self._actions:
                self._perform(self._actions.popleft())
        finally:
            self._performing = False

    def _perform(self, action: Action) -> None:
        if isinstance(action, Changed):
            if action.new is not action.old:
                self.state_since = time.time()
            self._log(action)
            if action.new is not action.old:
                self.services.bridge_changed(self)
        elif isinstance(action, Connect):
            self._dialing = asyncio.get_running_loop().create_task(
                self._dial(action.endpoint), name=f"bridge {self.name}")
        elif isinstance(action, StartTimer):
            self._cancel_timer(action.name)
            self._timers[action.name] = asyncio.get_running_loop().call_later(
                action.delay, self._timer_fired, action.name)
        elif isinstance(action, CancelTimer):
            self._cancel_timer(action.name)
        elif isinstance(action, Send):
            if self.link is not None:
                self.link.write(action.data)
        elif isinstance(action, CloseLink):
            link, self.link = self.link, None
            if link is not None and not link.closed:
                if action.bye:
                    link.write(encode_json(FrameType.BYE, {"reason": "broker stopping"}))
                link.close(action.reason)
        elif isinstance(action, StartHalves):
            assert self.link is not None
            self.remote_client_uris = action.client_uris
            self.remote_management_url = action.management_url
            self._start_halves(self.link, action.remote, again=action.again,
                               refusals=action.refusals, ranges=action.ranges,
                               holds=action.holds)
        elif isinstance(action, Teardown):
            self.teardown()
            self.link = None
        elif isinstance(action, GiveUp):
            log.error("bridge %s: giving up after %d attempts (max_reconnect_attempts)",
                      self.name, action.attempts)

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _timer_fired(self, name: str) -> None:
        self._timers.pop(name, None)
        self._feed(self.machine.timer_fired(name, time.time()))

    def _log(self, change: Changed) -> None:
        old, error = change.old, change.error
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
        elif change.new is BridgeState.FORWARDING:
            self._logged = None
            log.info("bridge %s: forwarding to broker %r at %s", self.name, self.remote,
                     self.connected_to)
        elif change.new is not old:
            log.debug("bridge %s: %s -> %s", self.name, old, change.new)

    def _hello(self) -> bytes:
        flt = DestinationFilter.of(self.config)
        return encode_json(FrameType.HELLO, {
            "protocol": "meshmq", "versions": [WIRE_VERSION], "software": __version__,
            "features": list(FEATURES),
            "broker": self.services.host.broker.name, "connector": self.config.name,
            "username": self.config.username, "password": self.config.password,
            "duplex": self.config.duplex, "filter": flt.to_json(),
            "client_uris": self.services.client_uris(),
            "management_url": self.services.management_url(),
            "config": mirror_json(self.config)})

    async def _dial(self, endpoint: Endpoint) -> None:
        """Dial ``endpoint``; feed the machine the outcome, as a failure kind or up."""
        failure = await self._open(endpoint)
        if self._stopping:
            return
        if failure is not None:
            self._feed(self.machine.connect_failed(*failure, time.time()))
        else:
            self._feed(self.machine.transport_up(time.time()))

    async def _open(self, endpoint: Endpoint) -> tuple[str, str] | None:
        if self.services.is_self(endpoint):
            return ("self", f"{endpoint} is this broker")
        timeout = self.config.handshake_timeout_ms / 1000
        ctx: ssl.SSLContext | None = None
        if endpoint.tls:  # ssl:// is TLS or nothing: never a plaintext fallback
            try:
                ctx = self.services.client_tls(self.config, endpoint.verify_hostname)
            except ConfigError as exc:
                return ("tls-config", f"{endpoint}: {exc}")
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
            # cancellation (the bridge's stop) that lands as the connect completes.
            async with asyncio.timeout(timeout):
                link = await self._connect(endpoint, ctx, timeout)
        except ssl.SSLCertVerificationError as exc:
            return ("tls-verify-failed",
                    f"{endpoint}: the remote's certificate is not trusted "
                    f"({exc.verify_message}): set ssl_cafile of the network connector "
                    "to the CA that signed it" + (
                        ", or verify_hostname = false" if exc.verify_code == 62 else ""))
        except ssl.SSLError as exc:
            return ("tls-failed", f"{endpoint}: TLS handshake failed ({exc.reason}): "
                    "ssl:// needs an ssl listener on the remote broker (is it a "
                    "plaintext tcp:// port?)")
        except ConnectionRefusedError:
            return ("connection-refused", f"{endpoint}: connection refused")
        except TimeoutError:
            return ("connect-timeout", f"{endpoint}: no answer within {timeout:g}s")
        except OSError as exc:
            return ("unreachable", f"{endpoint}: {exc.strerror or exc}")
        if self._stopping:
            link.close("bridge stopped")
            return None
        self.link = link
        return None

    async def _connect(self, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                       timeout: float) -> WireLink:
        link = self.services.track(WireLink(self, initiator=True,
                                            heartbeat_s=self.config.heartbeat_ms / 1000))
        await self.services.dial(link, endpoint, ctx, timeout)
        return link

    def _start_halves(self, link: WireLink, remote: str, *, again: bool,
                      refusals: bool, ranges: bool, holds: bool) -> None:
        cfg = self.config
        self.forwarder = Forwarder(self.services.routes, link, cfg, remote,
                                   f"NC_{cfg.name}_{self.services.host.broker.name}_outbound_"
                                   f"{remote}", self.counters, self.static,
                                   peer_takes_again=again)
        if cfg.duplex:
            self.receiver = Receiver(self.services.routes, link, remote,
                                     DestinationFilter.of(cfg), self.counters,
                                     resync_s=cfg.interest_resync_ms / 1000,
                                     refusals=refusals, ack_ranges=ranges,
                                     hold_notes=holds)
            self.receiver.start()
        if cfg.static_bridge or self.static:
            # No interest is needed for static demand; forward at once.
            self.forwarder.replan()
        if cfg.static_bridge:
            self.forwarder.synced = True  # the machine counts the bridge synced too

    # ------------------------------------------------------------ LinkHandler
    def on_frame(self, link: WireLink, frame: WireFrame) -> None:
        if link is not self.link:
            return
        if self.machine.state is BridgeState.HANDSHAKING:
            self._feed(self.machine.handshake_frame(frame, time.time()))
            return
        self.route(link, frame)

    def on_synced(self) -> None:
        self._feed(self.machine.synced(time.time()))

    def on_refused(self, code: str, message: str) -> None:
        self.machine.refused(code, message, time.time())

    def on_lost(self, link: WireLink, cause: str) -> None:
        if link is not self.link:
            return
        now = time.time()
        if self.machine.state is not BridgeState.HANDSHAKING:
            self._feed(self.machine.link_lost(cause, now))
            return
        tls = self.connected_to is not None and self.connected_to.tls
        if isinstance(link.lost_exc, ssl.SSLError) or (tls and link.bytes_in == 0):
            # TLS 1.3: the remote checks our certificate after our side of the
            # handshake ended, then closes (with an alert, or without a word).
            why = (f" ({link.lost_exc.reason})"
                   if isinstance(link.lost_exc, ssl.SSLError) else "")
            self._feed(self.machine.handshake_failed(
                "tls-refused",
                f"{self.connected_to}: the remote closed the TLS connection "
                f"without answering{why}: it refuses this broker's "
                "certificate? Set ssl_certfile/ssl_keyfile of the network "
                "connector to a certificate that the remote listener's "
                "ssl_cafile trusts", now))
            return
        hint = ""
        if self.connected_to is not None and not self.connected_to.tls and \
                link.bytes_in == 0:
            hint = " before answering (a TLS port? then use ssl:// in the URI)"
        self._feed(self.machine.handshake_failed(
            "connection-lost", f"{self.connected_to}: {cause}{hint}", now))

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
                "held": sorted(map(str, fwd.held)) if fwd is not None else [],
                "remote_client_uris": list(self.remote_client_uris),
                **self.counters.as_dict()}
