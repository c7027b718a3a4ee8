"""The broker's client and broker-link listeners: bind each configured address, with
its TLS context, and close them all at stop.

Why its own component: binding is start-up work with its own failure messages (which
setting to change for a port in use) and TLS file errors; the composition root only
says when. It receives the configuration, the session host the accepted connections
talk to, the pump's connection limits, the network (for ``tcp://`` broker links) and
the TLS reloader (SIGHUP).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING

from meshmq.config.model import BrokerConfig, ListenerConfig
from meshmq.errors import ConfigError, describe_bind_failure
from meshmq.tls import CertificateReloader, TlsFileError, server_context

if TYPE_CHECKING:
    from meshmq.network.manager import NetworkManager
    from meshmq.transport.handoff import Handoffs
    from meshmq.transport.host import SessionHost
    from meshmq.transport.pump import Pump
    from meshmq.transport.websocket import WebSocketOptions

log = logging.getLogger("meshmq.runtime")

# How a listener's protocol is named in messages to the operator.
LISTENER_LABELS = {"stomp": "STOMP", "stomp+ssl": "STOMP over TLS", "mqtt": "MQTT",
                   "mqtt+ssl": "MQTT over TLS", "ws": "WebSocket", "wss": "WebSocket over TLS",
                   "tcp": "broker links", "ssl": "broker links over TLS",
                   "nio": "broker links"}


class Listeners:
    """Every listener of ``config.listeners``, bound by ``start`` and closed by ``close``."""

    def __init__(self, config: BrokerConfig, host: SessionHost, engine: Pump,
                 network: NetworkManager, tls: CertificateReloader, *,
                 reuse_port: bool = False, links: bool = True) -> None:
        self.config = config
        # One shard of several: every shard binds the same client ports (SO_REUSEPORT, so
        # the kernel spreads connections over them); only the front shard takes links.
        self.reuse_port = reuse_port
        self.links = links
        self.host = host
        self.engine = engine
        self.network = network
        self.tls = tls
        self.addresses: dict[str, tuple[str, int]] = {}  # listener name -> bound address
        # A shard of a node: hands plain STOMP connections to their destination's owner.
        self.handoffs: Handoffs | None = None
        self._servers: list[asyncio.Server] = []

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind every listener; a failure closes what was bound, then raises (a bind
        failure names the setting to change)."""
        try:
            for listener in self.config.listeners:
                try:
                    await self._listen(loop, listener)
                except OSError as exc:
                    what, change = self._bind_advice(listener)
                    raise describe_bind_failure(what, listener.host, listener.port, exc,
                                                change) from None
        except BaseException:
            self.close()
            with contextlib.suppress(Exception):
                await self.network.stop()  # broker-link listeners advertise themselves
            raise

    def close(self) -> None:
        """Stop accepting connections (the open ones are the pump's to close)."""
        for server in self._servers:
            server.close()

    async def wait_closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def _index(self, listener: ListenerConfig) -> int:
        return next((i for i, lst in enumerate(self.config.listeners) if lst is listener), 0)

    def _bind_advice(self, listener: ListenerConfig) -> tuple[str, str]:
        return bind_advice(self.config, listener)

    async def _listen(self, loop: asyncio.AbstractEventLoop, listener: ListenerConfig) -> None:
        if listener.protocol in ("stomp", "stomp+ssl", "mqtt", "mqtt+ssl"):
            await self._listen_tcp(loop, listener)
        elif listener.protocol in ("ws", "wss"):
            await self._listen_ws(loop, listener)
        elif listener.protocol in ("tcp", "ssl", "nio"):
            if not self.links:
                return
            server = await self.network.listen(listener, self._ssl_context(listener))
            self._listening(listener, server)
            await self.network.advertise(listener, self.addresses[listener.name])
        else:
            log.warning("listener %s: %s:// is not a protocol this broker serves; ignored",
                        listener.name, listener.protocol)

    def _ssl_context(self, listener: ListenerConfig) -> ssl.SSLContext | None:
        if listener.protocol not in ("stomp+ssl", "mqtt+ssl", "wss", "ssl"):
            return None
        assert listener.ssl_certfile is not None  # the config loader requires it
        # A CA bundle for client certificates means they are required, unless the
        # listener says otherwise (config/model.py ListenerConfig.client_auth).
        auth = listener.client_auth or ("need" if listener.ssl_cafile else "none")
        try:
            ctx = server_context(listener.ssl_certfile, listener.ssl_keyfile,
                                 listener.ssl_cafile, auth, listener.ssl_ciphers)
        except TlsFileError as exc:  # not a bind failure
            raise ConfigError(str(exc), file=self.config.source,
                              option=f"listeners[{self._index(listener)}].{exc.option}"
                              ) from None
        return self.tls.register(f"listener {listener.name}", ctx, listener.ssl_certfile,
                                 listener.ssl_keyfile)

    async def _listen_tcp(self, loop: asyncio.AbstractEventLoop,
                          listener: ListenerConfig) -> None:
        """STOMP or MQTT over TCP (and TLS)."""
        host = self.host
        name = listener.name
        if listener.protocol.startswith("stomp"):
            from meshmq.transport.stomp_server import StompProtocol

            # Plain TCP only: a TLS session cannot leave this process.
            handoffs = self.handoffs if listener.protocol == "stomp" else None

            def accept() -> asyncio.Protocol:
                return StompProtocol(host, name, handoffs=handoffs)
        else:
            from meshmq.transport.mqtt_server import MqttProtocol

            mqtt_handoffs = self.handoffs if listener.protocol == "mqtt" else None

            def accept() -> asyncio.Protocol:
                return MqttProtocol(host, name, handoffs=mqtt_handoffs)
        self.engine.limit(name, listener.max_connections)
        server = await loop.create_server(accept, listener.host, listener.port,
                                          ssl=self._ssl_context(listener),
                                          reuse_address=True, reuse_port=self.reuse_port,
                                          backlog=1024)
        self._listening(listener, server)

    async def _listen_ws(self, loop: asyncio.AbstractEventLoop,
                         listener: ListenerConfig) -> None:
        """STOMP and MQTT over WebSocket, chosen by subprotocol."""
        from meshmq.transport.stomp_server import StompProtocol
        from meshmq.transport.websocket import start_websocket_listener

        host = self.host
        self.engine.limit(listener.name, listener.max_connections)
        # Plain ws:// only: a TLS session cannot leave this process.
        handoffs = self.handoffs if listener.protocol == "ws" else None

        def stomp() -> asyncio.Protocol:
            return StompProtocol(host, listener.name, handoffs=handoffs)

        def mqtt() -> asyncio.Protocol:
            from meshmq.transport.mqtt_server import MqttProtocol

            return MqttProtocol(host, listener.name, handoffs=handoffs)

        protocols = {"v12.stomp": stomp, "v11.stomp": stomp, "v10.stomp": stomp,
                     "stomp": stomp, "mqtt": mqtt}
        server = await start_websocket_listener(
            loop, listener.host, listener.port, protocols,
            ssl_context=self._ssl_context(listener),
            options=websocket_options(self.config), reuse_port=self.reuse_port,
            handoff=protocols.keys() if handoffs is not None else ())
        self._listening(listener, server)

    def _listening(self, listener: ListenerConfig, server: asyncio.Server) -> None:
        self._servers.append(server)
        sock = server.sockets[0].getsockname()
        self.addresses[listener.name] = (sock[0], sock[1])
        log.info("listening for %s on %s://%s:%d", listener.name, listener.protocol,
                 sock[0], sock[1])


def websocket_options(config: BrokerConfig) -> WebSocketOptions:
    """A WebSocket listener's limits (a connection handed to another shard keeps them)."""
    from meshmq.transport.websocket import WebSocketOptions

    return WebSocketOptions(max_message_size=config.stomp.max_frame_size)


def bind_advice(config: BrokerConfig, listener: ListenerConfig) -> tuple[str, str]:
    """What a listener is called in a bind failure, and where its address is set."""
    label = LISTENER_LABELS.get(listener.protocol, listener.protocol)
    flag = (f"--{listener.protocol} HOST:PORT (port 0: the OS chooses)"
            if listener.protocol in ("stomp", "mqtt") else "")
    source = config.source
    if source is None:
        return label, f"run with {flag}" if flag else "change the listener's address"
    if source.endswith(".xml"):
        where = f"change uri of <transportConnector name=\"{listener.name}\"> in {source}"
    else:
        where = (f"change url of the [[listeners]] entry named \"{listener.name}\" "
                 f"in {source}")
    return (f"{label} (listener \"{listener.name}\")",
            f"{where}, or run with {flag}" if flag else where)
