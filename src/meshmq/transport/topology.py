"""Topology push: the client URIs of this broker's peers, told to clients as they connect.

ActiveMQ tells only OpenWire clients about the other brokers, and only on transport
connectors with ``updateClusterClients``; meshmq tells STOMP and MQTT clients too, on
listeners with ``update_cluster_clients = true`` (off by default, as in ActiveMQ: a
pushed peer may lie outside the list a client was given), so a failover client that
started with one URI learns the rest (``updateURIsSupported``):

* STOMP: a ``meshmq-peers`` header in CONNECTED;
* MQTT 5: a ``meshmq-peers`` user property in CONNACK (3.1.1 has no place for it).

The value is a comma-separated list of URIs. Each client gets the URIs of its own
protocol only (``stomp://``, ``stomp+ssl://`` for STOMP; ``mqtt://``, ``mqtts://``,
``mqtt+ssl://`` for MQTT), so every URI it receives is one it can dial.

The list is the union of named *sources*: ``static`` (``broker.advertised_peers`` in
the config) and whatever other parts of the broker set — master/slave
(``set_source("ha", ...)``) — plus *providers* read at every connect: the runtime
registers the network manager's live list of linked brokers (their client URIs, sent
in the bridge handshake) as ``network``. Pure data, no I/O; the sessions read it when a
client connects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meshmq.uri import SimpleURI, URIError, format_uri, parse_uri

__all__ = ["PEERS_HEADER", "Topology", "push_families"]

PEERS_HEADER = "meshmq-peers"

_FAMILIES: dict[str, frozenset[str]] = {
    "stomp": frozenset({"stomp", "stomp+ssl", "stomp+nio", "stomp+nio+ssl"}),
    "mqtt": frozenset({"mqtt", "mqtts", "mqtt+ssl", "mqtt+nio", "mqtt+nio+ssl"}),
}


def push_families(listeners: Iterable[tuple[str, bool]]) -> frozenset[str]:
    """The client protocols (``stomp``, ``mqtt``) told the peers, from each listener's
    ``(protocol, update_cluster_clients)``; a WebSocket listener carries both."""
    found: set[str] = set()
    for protocol, push in listeners:
        if not push:
            continue
        if protocol in ("ws", "wss"):
            found.update(("stomp", "mqtt"))
        found.update(f for f, schemes in _FAMILIES.items() if protocol in schemes)
    return frozenset(found)


class Topology:
    """Named lists of peer URIs; ``for_protocol`` gives what a client of that protocol
    is told. ``enabled=False`` keeps the lists but tells clients nothing; ``push_to``
    names the client protocols told at all (None: every one)."""

    def __init__(self, advertised: Iterable[str] = (), *, enabled: bool = True,
                 push_to: frozenset[str] | None = None) -> None:
        self.enabled = enabled
        self.push_to = push_to
        self._sources: dict[str, tuple[str, ...]] = {}
        self._cache: dict[str, str | None] = {}
        self._listeners: list[Callable[[Topology], None]] = []
        self._providers: dict[str, Callable[[], Iterable[str]]] = {}
        self.version = 0
        if advertised:
            self.set_source("static", advertised)

    def set_source(self, name: str, uris: Iterable[str]) -> None:
        """Replace the URIs of source ``name`` (an empty list removes it). Every URI
        must be a single endpoint (:class:`~meshmq.uri.URIError` otherwise)."""
        checked: list[str] = []
        for text in uris:
            uri = parse_uri(text)
            if not isinstance(uri, SimpleURI):
                raise URIError(text, uri.scheme, "a peer is one endpoint URI, not a composite")
            checked.append(format_uri(uri))
        new = tuple(dict.fromkeys(checked))
        if self._sources.get(name, ()) == new:
            return
        if new:
            self._sources[name] = new
        else:
            self._sources.pop(name, None)
        self._cache.clear()
        self.version += 1
        for callback in list(self._listeners):
            callback(self)

    def clear_source(self, name: str) -> None:
        self.set_source(name, ())

    def set_provider(self, name: str, provider: Callable[[], Iterable[str]]) -> None:
        """A source read at every client connect (e.g. the network manager's live list
        of linked brokers), so it never goes stale. URIs it gives that do not parse as
        one endpoint are left out."""
        self._providers[name] = provider
        self._cache.clear()

    def on_change(self, callback: Callable[[Topology], None]) -> None:
        self._listeners.append(callback)

    @property
    def sources(self) -> dict[str, tuple[str, ...]]:
        return dict(self._sources)

    @property
    def uris(self) -> tuple[str, ...]:
        """Every peer URI: sources in the order they were first set, then providers;
        duplicates dropped."""
        found = [u for uris in self._sources.values() for u in uris]
        for provider in self._providers.values():
            for text in provider():
                try:
                    uri = parse_uri(text)
                except URIError:
                    continue
                if isinstance(uri, SimpleURI):
                    found.append(format_uri(uri))
        return tuple(dict.fromkeys(found))

    def for_protocol(self, protocol: str) -> tuple[str, ...]:
        family = _FAMILIES.get(protocol, frozenset())
        return tuple(u for u in self.uris if u.partition(":")[0] in family)

    def header_value(self, protocol: str) -> str | None:
        """The ``meshmq-peers`` value for a client of ``protocol``; None: send nothing."""
        if not self.enabled or (self.push_to is not None and protocol not in self.push_to):
            return None
        if self._providers:  # live lists: computed per connect, never cached
            uris = self.for_protocol(protocol)
            return ",".join(uris) if uris else None
        if protocol not in self._cache:
            uris = self.for_protocol(protocol)
            self._cache[protocol] = ",".join(uris) if uris else None
        return self._cache[protocol]
