"""The node's client ports, bound by the supervisor before any shard starts.

Binding first keeps a node's start the same as a broker's: ``port = 0`` gets one port
the OS chooses (every shard then binds that concrete port), a port in use is refused with
the same one line, naming the setting to change. The supervisor keeps each socket bound
with ``SO_REUSEPORT`` but never listens on it: the kernel hands connections only to
listening sockets (the shards'), yet the port stays the node's while a shard restarts.

Broker-link listeners (``tcp``, ``ssl``, ``nio``) are the front shard's alone and bound
without ``SO_REUSEPORT`` by the network code, so the supervisor only checks them (and
learns the port the OS chooses for ``port = 0``) and lets go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from dataclasses import dataclass, field

from meshmq.config.model import BrokerConfig, ListenerConfig
from meshmq.errors import describe_bind_failure
from meshmq.transport.listeners import bind_advice

__all__ = ["CLIENT_PROTOCOLS", "LINK_PROTOCOLS", "NodePorts", "bind_ports"]

CLIENT_PROTOCOLS = frozenset({"stomp", "stomp+ssl", "mqtt", "mqtt+ssl", "ws", "wss"})
LINK_PROTOCOLS = frozenset({"tcp", "ssl", "nio"})


@dataclass
class NodePorts:
    """The held sockets, and the listeners with their concrete ports for the shards."""

    listeners: tuple[ListenerConfig, ...]
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


def _addresses(host: str, port: int) -> list[tuple[int, int, int, tuple[object, ...]]]:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    seen: set[tuple[int, object]] = set()
    out: list[tuple[int, int, int, tuple[object, ...]]] = []
    for family, kind, proto, _, addr in infos:
        if (family, addr) not in seen:
            seen.add((family, addr))
            out.append((family, kind, proto, addr))
    return out


def _bind(family: int, kind: int, proto: int, addr: tuple[object, ...], port: int,
          reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as asyncio's create_server binds
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((addr[0], port, *addr[2:]))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_ports(config: BrokerConfig) -> NodePorts:
    """Bind every listener's address (all the addresses its host resolves to) and return
    the listeners with concrete ports; a failure closes what was bound and raises the
    listener's one-line ``ListenError``."""
    ports = NodePorts(listeners=())
    listeners: list[ListenerConfig] = []
    try:
        for listener in config.listeners:
            shared = listener.protocol in CLIENT_PROTOCOLS
            if not shared and listener.protocol not in LINK_PROTOCOLS:
                listeners.append(listener)  # the runtime warns about it and ignores it
                continue
            port = listener.port
            try:
                for family, kind, proto, addr in _addresses(listener.host, port):
                    sock = _bind(family, kind, proto, addr, port, shared)
                    port = sock.getsockname()[1]
                    if shared:
                        ports.sockets.append(sock)
                    else:
                        sock.close()
            except OSError as exc:
                what, change = bind_advice(config, listener)
                raise describe_bind_failure(what, listener.host, listener.port, exc,
                                            change) from None
            listeners.append(dataclasses.replace(listener, port=port))
    except BaseException:
        with contextlib.suppress(OSError):
            ports.close()
        raise
    ports.listeners = tuple(listeners)
    return ports
