"""The network side of one broker: its tcp:// listeners for other brokers' links, its
network connectors and their bridges, and what they share (arrival times for
redistribution, duplicate-route suppression, status, advisories)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

from meshmq.connector_uri import Endpoint, parse_endpoint, plan_connector
from meshmq.errors import ConfigError
from meshmq.network.bridge import ADVISORY_TOPIC, Bridge
from meshmq.network.link import TlsGate, WireLink, dial_tcp
from meshmq.network.responder import Responder
from meshmq.network.routes import NetworkRoutes
from meshmq.protocol.wire import FrameType, encode_json
from meshmq.tls import TlsFileError, client_context

if TYPE_CHECKING:
    from meshmq.config.model import ListenerConfig, NetworkConnectorConfig
    from meshmq.network.forwarder import Forwarder
    from meshmq.network.host import BrokerHost
    from meshmq.network.services import Dialer

log = logging.getLogger("meshmq.network")

LINK_CLOSE_WAIT_S = 1.0  # how long stop() waits for links to finish closing


class NetworkManager:
    """Owns the network's parts and wires them: implements ``services.BridgeServices``
    and ``services.ResponderServices`` for its ends, and hands its ``routes`` to the
    halves of every link."""

    def __init__(self, host: BrokerHost) -> None:
        self.host = host
        self.broker = host.broker
        self.config = host.config
        self.bridges: list[Bridge] = []
        self.inbound: set[Responder] = set()
        self.servers: list[asyncio.Server] = []
        self.local_addresses: set[tuple[str, int]] = set()
        self.inbound_heartbeat_s = 5.0
        # What the halves of every link share (arrivals, duplicate routes).
        self.routes = NetworkRoutes(host, self._forwarders)
        # How bridges open their connections (tests link brokers without sockets).
        self.dialer: Dialer = dial_tcp
        self._discovery: list[Any] = []
        self.accepting = True
        self._refused: dict[str, str] = {}
        self._client_tls: dict[tuple[str, bool], ssl.SSLContext] = {}
        self._links: set[WireLink] = set()  # every link not yet closed
        # Configured connectors now running (the rest: auto_start = false, or stopped by
        # an operator), and the discovery agent of each one that has one.
        self.running: set[str] = set()
        self._connector_agents: dict[str, Any] = {}

    # ------------------------------------------------------------ listeners
    async def listen(self, listener: ListenerConfig,
                     ctx: ssl.SSLContext | None = None) -> asyncio.Server:
        """Take links on ``listener``; over TLS when ``ctx`` is given (ssl://)."""
        loop = asyncio.get_running_loop()
        if listener.allow_anonymous_links:
            log.warning("listener %s admits broker links without credentials "
                        "(allow_anonymous_links): anyone who reaches it can read and write "
                        "every destination", listener.name)

        def refused_tls(peer: str, reason: str) -> None:
            host = peer.rpartition(":")[0]
            if self.note_refusal(f"tls {listener.name} {host}", reason):
                log.warning("listener %s refused a connection from %s: %s", listener.name,
                            peer, reason)

        def factory() -> asyncio.Protocol:
            link = self.accept(listener, ctx)
            if ctx is None:
                return link
            return TlsGate(link, ctx, self.inbound_heartbeat_s * 2, refused_tls)

        server = await loop.create_server(factory, listener.host, listener.port,
                                          reuse_address=True, backlog=128)
        self.servers.append(server)
        for sock in server.sockets:
            addr = sock.getsockname()
            self.local_addresses.add((addr[0], addr[1]))
        return server

    def accept(self, listener: ListenerConfig | None,
               ctx: ssl.SSLContext | None = None) -> WireLink:
        """A new inbound link on ``listener``, served by a new responder (its transport
        is connected by the caller: a listening socket, or an in-memory pipe)."""
        responder = Responder(self, listener, ctx)
        self.inbound.add(responder)
        return self.track(responder.make_link())

    async def dial(self, link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                   timeout: float) -> None:
        await self.dialer(link, endpoint, ctx, timeout)

    def track(self, link: WireLink) -> WireLink:
        """Remember ``link`` until it is closed, so stop() can wait for it."""
        self._links.add(link)
        link.lost.add_done_callback(lambda _: self._links.discard(link))
        return link

    def client_uris(self) -> list[str]:
        """Where clients reach this broker (told to peers in the handshake, so each
        broker can push its network's client URIs to failover clients)."""
        schemes = {"stomp": "stomp", "stomp+ssl": "stomp+ssl", "mqtt": "mqtt",
                   "mqtt+ssl": "mqtts", "ws": "ws", "wss": "wss"}
        out = []
        for listener in self.config.listeners:
            scheme = schemes.get(listener.protocol)
            address = self.host.addresses.get(listener.name)
            if scheme is None or address is None:
                continue
            host = address[0] if address[0] not in ("0.0.0.0", "::") else socket.gethostname()
            out.append(f"{scheme}://{host}:{address[1]}")
        return out

    def management_url(self) -> str | None:
        """Where this broker's management API answers (told to peers in the handshake, so
        a console opened on one broker can reach every broker of the network)."""
        address = self.host.addresses.get("management")
        if address is None or not self.config.management.enabled:
            return None
        scheme = "https" if self.config.management.ssl_certfile is not None else "http"
        host = address[0] if address[0] not in ("0.0.0.0", "::") else socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{address[1]}"

    def peer_client_uris(self) -> list[str]:
        uris: list[str] = []
        for end in [*self.bridges, *self.inbound]:
            if end.remote_client_uris and (end.forwarder is not None or
                                           end.receiver is not None):
                uris.extend(u for u in end.remote_client_uris if u not in uris)
        return uris

    def note_refusal(self, remote: str, kind: str | None) -> bool:
        """Remember why ``remote`` was last refused; True when that is news (log it)."""
        if kind is None:
            self._refused.pop(remote, None)
            return False
        if self._refused.get(remote) == kind:
            return False
        self._refused[remote] = kind
        return True

    def refusal(self) -> tuple[str, str] | None:
        """Why this broker cannot take a link now (None: it can)."""
        if not self.accepting:
            return ("remote-is-slave", f"broker {self.broker.name!r} is not the master")
        return None

    def is_self(self, endpoint: Endpoint) -> bool:
        port = endpoint.port
        if not any(p == port for _, p in self.local_addresses):
            return False
        try:
            infos = socket.getaddrinfo(endpoint.host, port, type=socket.SOCK_STREAM)
        except OSError:
            return False
        hosts = {info[4][0] for info in infos}
        return any((h, port) in self.local_addresses or
                   (a in ("0.0.0.0", "::") and p == port)
                   for h in hosts for a, p in self.local_addresses)

    # ------------------------------------------------------------ connectors
    def client_tls(self, config: NetworkConnectorConfig,
                   verify_hostname: bool | None = None) -> ssl.SSLContext:
        """The TLS context of a connector's ssl:// bridges (one per connector and host
        name check). Raises ConfigError naming the option whose file does not load."""
        verify = config.verify_hostname if verify_hostname is None else verify_hostname
        key = (config.name, verify)
        ctx = self._client_tls.get(key)
        if ctx is None:
            try:
                ctx = client_context(config.ssl_cafile, config.ssl_certfile,
                                     config.ssl_keyfile, verify, config.ssl_ciphers)
            except TlsFileError as exc:
                index = next((i for i, nc in enumerate(self.config.network_connectors)
                              if nc.name == config.name), 0)
                raise ConfigError(str(exc), file=self.config.source,
                                  option=f"network_connectors[{index}].{exc.option}"
                                  ) from None
            self._client_tls[key] = self.host.tls.register(
                f"network connector {config.name}", ctx, config.ssl_certfile,
                config.ssl_keyfile)
        return ctx

    async def start_connectors(self) -> None:
        for config in self.config.network_connectors:
            if not config.auto_start:
                log.info("network connector %s configured with auto_start=false: not started",
                         config.name)
                continue
            await self._start_connector(config)

    def connector_config(self, name: str) -> NetworkConnectorConfig | None:
        return next((nc for nc in self.config.network_connectors if nc.name == name), None)

    async def start_connector(self, name: str) -> bool:
        """Start a configured connector that is not running (the management API): its
        bridges dial with their normal backoff. False when it was running already."""
        config = self.connector_config(name)
        if config is None:
            raise KeyError(name)
        if name in self.running:
            return False
        log.info("network connector %s started by an operator", name)
        await self._start_connector(config)
        return True

    async def stop_connector(self, name: str) -> bool:
        """Stop a running connector: its discovery agent and its bridges close (each link
        says BYE first, as at shutdown). False when it was not running."""
        if self.connector_config(name) is None:
            raise KeyError(name)
        if name not in self.running:
            return False
        self.running.discard(name)
        log.info("network connector %s stopped by an operator", name)
        agent = self._connector_agents.pop(name, None)
        if agent is not None:
            self._discovery.remove(agent)
            await agent.stop()
        for bridge in [b for b in self.bridges if b.config.name == name]:
            self.bridges.remove(bridge)
            await bridge.stop()  # its STOP transition advises the new state
        return True

    async def _start_connector(self, config: NetworkConnectorConfig) -> None:
        plan = plan_connector(config)
        for endpoint in {e for endpoints in plan.targets for e in endpoints if e.tls}:
            self.client_tls(plan.config, endpoint.verify_hostname)  # bad files: fail now
        self.running.add(config.name)
        for endpoints in plan.targets:
            self.add_bridge(plan.config, endpoints)
        if plan.discovery is not None:
            await self._start_discovery(plan.config, plan.discovery)

    def add_bridge(self, config: NetworkConnectorConfig,
                   endpoints: tuple[Endpoint, ...]) -> Bridge:
        bridge = Bridge(self, config, endpoints)
        self.bridges.append(bridge)
        bridge.start()
        return bridge

    async def _start_discovery(self, config: NetworkConnectorConfig, uri: str) -> None:
        try:
            from meshmq.network.discovery import MulticastDiscoveryAgent
        except ImportError:  # pragma: no cover - the module ships with meshmq
            log.error("network connector %s: multicast discovery is unavailable", config.name)
            return
        found: dict[str, Bridge] = {}

        def up(service: str, broker_name: str) -> None:
            if broker_name == self.broker.name or service in found:
                return
            try:
                endpoint = parse_endpoint(service)
            except ValueError:
                log.warning("discovery: ignoring service %r of broker %r", service, broker_name)
                return
            log.info("discovery: broker %r at %s joined", broker_name, service)
            found[service] = self.add_bridge(config, (endpoint,))

        def down(service: str) -> None:
            bridge = found.pop(service, None)
            if bridge is not None:
                log.info("discovery: %s left", service)
                self.bridges.remove(bridge)
                asyncio.get_running_loop().create_task(bridge.stop())

        agent = MulticastDiscoveryAgent(uri, broker_name=self.broker.name,
                                        advertise=None, on_up=up, on_down=down)
        await agent.start()
        self._discovery.append(agent)
        self._connector_agents[config.name] = agent

    async def advertise(self, listener: ListenerConfig, address: tuple[str, int]) -> None:
        """Announce a tcp listener on its discovery group (transportConnector
        discoveryUri)."""
        if listener.discovery_uri is None:
            return
        from meshmq.network.discovery import MulticastDiscoveryAgent

        host = address[0] if address[0] not in ("0.0.0.0", "::") else "127.0.0.1"
        agent = MulticastDiscoveryAgent(listener.discovery_uri, broker_name=self.broker.name,
                                        advertise=f"{listener.protocol}://{host}:{address[1]}",
                                        on_up=lambda s, b: None, on_down=lambda s: None)
        await agent.start()
        self._discovery.append(agent)

    async def stop(self) -> None:
        self.running.clear()
        self._connector_agents.clear()
        for agent in self._discovery:
            await agent.stop()
        self._discovery.clear()
        for bridge in list(self.bridges):
            await bridge.stop()
        for server in self.servers:
            server.close()
        for responder in list(self.inbound):
            if responder.link is not None:
                # Say goodbye, so the dialing side sees a clean shutdown, not a crash.
                responder.link.write(encode_json(FrameType.BYE, {"reason": "broker stopping"}))
                responder.link.close("broker stopping")
            responder.cancel_admission()
            responder.teardown()
        self.inbound.clear()
        # A TLS link closes with a close_notify exchange: give it a moment, then cut it.
        links = list(self._links)
        for link in links:
            link.close("broker stopping")
        waiting = [link.lost for link in links if not link.lost.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=LINK_CLOSE_WAIT_S)
            for link in links:
                if not link.lost.done():
                    link.abort("broker stopping")
        # Let closed and aborted transports close their sockets, those of dials cancelled
        # halfway (their links were never up, so not waited for above) included.
        for _ in range(3):
            await asyncio.sleep(0)

    def _forwarders(self) -> list[Forwarder]:
        ends = [*self.bridges, *self.inbound]
        return [e.forwarder for e in ends if e.forwarder is not None]

    # ------------------------------------------------------------ status & advisories
    def bridge_changed(self, bridge: Bridge) -> None:
        error = bridge.last_error or {}
        self.broker.advise(ADVISORY_TOPIC, "NetworkBridgeState", {
            "connector": bridge.config.name, "bridge": bridge.name,
            "state": bridge.state.value, "remoteBroker": bridge.remote,
            "lastError": error.get("kind"), "lastErrorMessage": error.get("message")})
        self.host.request_pump()

    def inbound_changed(self, responder: Responder, *, up: bool) -> None:
        self.broker.advise(ADVISORY_TOPIC, "NetworkBridgeStarted" if up else
                           "NetworkBridgeStopped", {
                               "connector": responder.connector,
                               "remoteBroker": responder.remote, "direction": "inbound"})
        self.host.request_pump()

    def forget_inbound(self, responder: Responder) -> None:
        self.inbound.discard(responder)

    def status(self) -> list[dict[str, Any]]:
        out = [b.status() for b in self.bridges]
        out += [r.status() for r in self.inbound if r.ready]
        return out

    def summary(self) -> dict[str, Any]:
        return {"bridges": self.status(), "at": time.time()}
