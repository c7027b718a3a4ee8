"""Failover URIs as typed settings: ActiveMQ's option names and defaults, plus a few of ours.

``parse_failover("failover:(stomp://a:61613,stomp://b:61613)?randomize=false")`` gives a
:class:`FailoverSpec`: the endpoints (protocol, host, port, TLS, per-endpoint options
with ``nested.*`` applied) and :class:`FailoverOptions`. A plain URI
(``stomp://a:61613``) is a failover list of one. Unknown options and bad values are
:class:`~meshmq.uri.URIError` naming the option.
"""

# ruff: noqa: N815  (the option fields keep ActiveMQ's camelCase names on purpose)
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshmq.backoff import ReconnectPolicy
from meshmq.uri import CompositeURI, Options, SimpleURI, URIError, format_uri, parse_uri

from .tls import TlsSettings

__all__ = ["ENDPOINT_OPTIONS", "Endpoint", "FailoverOptions", "FailoverSpec", "parse_failover"]

#: scheme -> (protocol or None for "the client's protocol", TLS)
_SCHEMES: dict[str, tuple[str | None, bool]] = {
    "tcp": (None, False), "nio": (None, False), "ssl": (None, True), "nio+ssl": (None, True),
    "stomp": ("stomp", False), "stomp+nio": ("stomp", False),
    "stomp+ssl": ("stomp", True), "stomp+nio+ssl": ("stomp", True),
    "mqtt": ("mqtt", False), "mqtt+nio": ("mqtt", False),
    "mqtts": ("mqtt", True), "mqtt+ssl": ("mqtt", True), "mqtt+nio+ssl": ("mqtt", True),
    "ws": (None, False), "wss": (None, True),  # WebSocket: the client's protocol
}
_WEBSOCKET = frozenset({"ws", "wss"})
# 61612 is ActiveMQ's documented STOMP-over-TLS port (and the example config's).
_DEFAULT_PORTS = {("stomp", False): 61613, ("stomp", True): 61612,
                  ("mqtt", False): 1883, ("mqtt", True): 8883}

#: Options accepted on an endpoint URI (or as ``nested.<name>`` on the failover URI).
ENDPOINT_OPTIONS: dict[str, str] = {
    "connectionTimeout": "ms to open the TCP (and TLS) connection and finish the "
                         "protocol handshake (default 30000)",
    "verifyHostName": "TLS: check the certificate's host name (default true)",
    "socket.verifyHostName": "the same as verifyHostName (ActiveMQ's spelling)",
    "trustStore": "TLS: a CA bundle file (PEM) to trust instead of the system's",
    "keyStore": "TLS: the client certificate (PEM), with its key unless keyStoreKey",
    "keyStoreKey": "TLS: the client certificate's private key (PEM)",
    "keyStorePassword": "TLS: the passphrase of an encrypted private key",
    "trustAll": "TLS: accept any broker certificate, unverified (default false; "
                "logs a warning)",
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One broker address as the client dials it."""

    protocol: str  # "stomp" or "mqtt"
    host: str
    port: int
    tls: bool = False
    connect_timeout: float = 30.0
    # TLS options from the URI; None: not given there (the client's settings apply).
    verify_host_name: bool | None = None
    trust_store: str | None = None
    websocket: bool = False  # ws:// / wss://: the protocol inside WebSocket frames
    path: str = ""  # the WebSocket request path
    key_store: str | None = None
    key_store_key: str | None = None
    key_store_password: str | None = None
    trust_all: bool | None = None

    def tls_settings(self, defaults: TlsSettings) -> TlsSettings:
        """The client's TLS settings with this URI's options on top."""
        return TlsSettings(
            cafile=self.trust_store or defaults.cafile,
            certfile=self.key_store or defaults.certfile,
            keyfile=self.key_store_key if self.key_store else defaults.keyfile,
            key_password=(self.key_store_password if self.key_store
                          else defaults.key_password),
            verify=defaults.verify if self.trust_all is None else not self.trust_all,
            check_hostname=(defaults.check_hostname if self.verify_host_name is None
                            else self.verify_host_name))

    def uri(self) -> str:
        if self.websocket:
            scheme = "wss" if self.tls else "ws"
        else:
            scheme = {("stomp", False): "stomp", ("stomp", True): "stomp+ssl",
                      ("mqtt", False): "mqtt", ("mqtt", True): "mqtts"}[
                          (self.protocol, self.tls)]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{self.path}"

    def __str__(self) -> str:
        return self.uri()

    @property
    def key(self) -> tuple[str, str, int, bool, bool]:
        """Identity of the broker address: settings do not make a different broker."""
        return self.protocol, self.host, self.port, self.tls, self.websocket


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _int(text: str) -> int:
    return int(text.strip())


def _float(text: str) -> float:
    value = float(text.strip())
    if math.isnan(value) or math.isinf(value):
        raise ValueError("expected a finite number")
    return value


def _opt_str(text: str) -> str | None:
    return text or None


@dataclass(frozen=True, slots=True)
class FailoverOptions:
    """The failover options, named as in ActiveMQ (times in milliseconds, as in the URI).

    meshmq additions: ``jitter``, ``reconnectResetAfter``, ``replyTimeout``,
    ``checkForDuplicates`` and ``auditDepth`` (ActiveMQ has the last two as connection
    factory settings).
    """

    randomize: bool = True
    maxReconnectAttempts: int = -1
    startupMaxReconnectAttempts: int = -1
    initialReconnectDelay: int = 10
    maxReconnectDelay: int = 30_000
    useExponentialBackOff: bool = True
    reconnectDelayExponent: float = 2.0
    timeout: int = -1
    backup: bool = False
    backupPoolSize: int = 1
    priorityBackup: bool = False
    priorityURIs: str | None = None
    trackMessages: bool = False
    maxCacheSize: int = 128 * 1024
    updateURIsSupported: bool = True
    updateURIsURL: str | None = None
    rebalanceUpdateURIs: bool = True
    warnAfterReconnectAttempts: int = 10
    replyTimeout: int = -1
    jitter: float = 0.0
    reconnectResetAfter: int = 0
    checkForDuplicates: bool = True
    auditDepth: int = 2048
    nested: Mapping[str, str] = field(default_factory=dict)

    def policy(self) -> ReconnectPolicy:
        return ReconnectPolicy(
            initial_delay=self.initialReconnectDelay / 1000,
            max_delay=self.maxReconnectDelay / 1000,
            exponential=self.useExponentialBackOff,
            multiplier=self.reconnectDelayExponent,
            max_attempts=self.maxReconnectAttempts,
            startup_max_attempts=self.startupMaxReconnectAttempts,
            randomize=self.randomize,
            jitter=self.jitter,
            reset_after=self.reconnectResetAfter / 1000,
        )

    @property
    def reply_timeout_s(self) -> float | None:
        """``replyTimeout`` in seconds; None = off."""
        return None if self.replyTimeout < 0 else self.replyTimeout / 1000

    @property
    def timeout_s(self) -> float | None:
        """``timeout`` in seconds; None = block while disconnected (ActiveMQ's -1)."""
        return None if self.timeout < 0 else self.timeout / 1000


_PARSERS: dict[str, Callable[[str], Any]] = {}
for _f in dataclasses.fields(FailoverOptions):
    if _f.name == "nested":
        continue
    _PARSERS[_f.name] = {"bool": _bool, "int": _int, "float": _float}.get(
        str(_f.type), _opt_str)

_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "maxReconnectAttempts": (lambda v: v >= -1, "must be -1 (for ever), 0 or more"),
    "startupMaxReconnectAttempts": (lambda v: v >= -1, "must be -1 (for ever), 0 or more"),
    "initialReconnectDelay": (lambda v: v >= 0, "must be >= 0"),
    "maxReconnectDelay": (lambda v: v >= 0, "must be >= 0"),
    "reconnectDelayExponent": (lambda v: v >= 1, "must be >= 1"),
    "timeout": (lambda v: v >= -1, "must be -1 (block) or a time in ms"),
    "backupPoolSize": (lambda v: v >= 0, "must be >= 0"),
    "maxCacheSize": (lambda v: v >= 0, "must be >= 0"),
    "jitter": (lambda v: 0 <= v <= 1, "must be between 0 and 1"),
    "reconnectResetAfter": (lambda v: v >= 0, "must be >= 0"),
    "auditDepth": (lambda v: v >= 0, "must be >= 0"),
    "warnAfterReconnectAttempts": (lambda v: v >= 0, "must be >= 0"),
    "replyTimeout": (lambda v: v == -1 or v > 0, "must be -1 (off) or a time in ms"),
}


@dataclass(frozen=True, slots=True)
class FailoverSpec:
    endpoints: tuple[Endpoint, ...]
    options: FailoverOptions
    text: str

    def priority_endpoints(self) -> tuple[Endpoint, ...]:
        """``priorityURIs`` (comma separated), else the first URI when priorityBackup."""
        if self.options.priorityURIs:
            keys = set()
            for part in self.options.priorityURIs.split(","):
                try:
                    ep = _endpoint(parse_uri(part.strip()), self.text,
                                   self.endpoints[0].protocol, Options())
                except URIError as exc:
                    raise URIError(self.text, f"priorityURIs={self.options.priorityURIs}",
                                   f"bad URI in priorityURIs: {exc.reason} "
                                   f"({exc.part!r})") from None
                keys.add(ep.key)
            return tuple(e for e in self.endpoints if e.key in keys)
        if self.options.priorityBackup:
            return self.endpoints[:1]
        return ()


def parse_failover(text: str, *, protocol: str | None = None) -> FailoverSpec:
    """Parse a failover (or plain) URI for a client speaking ``protocol``.

    ``protocol`` None means: take it from the URIs' schemes (``stomp://``, ``mqtt://``);
    ``tcp://`` and ``ssl://`` then default to STOMP.
    """
    if protocol not in (None, "stomp", "mqtt"):
        raise ValueError(f"protocol must be 'stomp' or 'mqtt', not {protocol!r}")
    uri = parse_uri(text)
    if isinstance(uri, CompositeURI):
        if uri.scheme != "failover":
            raise URIError(text, uri.scheme, "a client URI is failover:(...) or a single "
                           "endpoint; static:/masterslave:/discovery: are for network "
                           "connectors")
        components = uri.components
        raw = uri.options
    else:
        components, raw = (uri,), Options()
    if "nested." in raw:
        raise URIError(text, "nested.", "nested. needs an endpoint option name "
                       "(nested.connectionTimeout=...)")
    nested = raw.with_prefix("nested.")
    options = _options(raw.without_prefix("nested."), text)
    options = dataclasses.replace(options, nested=dict(nested.pairs))
    protocols: set[str] = set()
    for c in components:
        if isinstance(c, SimpleURI):
            named = _SCHEMES.get(c.scheme, (None, False))[0]
            if named is not None:
                protocols.add(named)
    chosen = protocol
    if chosen is None:
        if len(protocols) > 1:
            raise URIError(text, ",".join(sorted(protocols)),
                           "mixes STOMP and MQTT endpoints in one failover list")
        chosen = protocols.pop() if protocols else "stomp"
    endpoints = tuple(_endpoint(c, text, chosen, nested) for c in components)
    spec = FailoverSpec(endpoints, options, text)
    spec.priority_endpoints()  # a bad priorityURIs is an error of the URI, not later
    return spec


def _options(raw: Options, text: str) -> FailoverOptions:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        parser = _PARSERS.get(key)
        if parser is None:
            raise URIError(text, key, f"unknown failover option {key!r}{_did_you_mean(key)}"
                           "; known: " + ", ".join(sorted(_PARSERS)))
        try:
            parsed = parser(value)
        except ValueError as exc:
            raise URIError(text, f"{key}={value}", f"bad value for {key}: {exc}") from None
        check = _CHECKS.get(key)
        if check is not None and not check[0](parsed):
            raise URIError(text, f"{key}={value}", f"{key} {check[1]}")
        values[key] = parsed
    return FailoverOptions(**values)


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, [*_PARSERS, *ENDPOINT_OPTIONS], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _endpoint(uri: SimpleURI | CompositeURI, text: str, protocol: str,
              nested: Options) -> Endpoint:
    if isinstance(uri, CompositeURI):
        raise URIError(text, format_uri(uri), "a failover list holds endpoint URIs, "
                       "not composites")
    if uri.scheme not in _SCHEMES:
        raise URIError(text, uri.scheme, f"the client cannot dial {uri.scheme}:// URIs "
                       "(use stomp://, stomp+ssl://, mqtt://, mqtts://, ws://, wss://, "
                       "tcp:// or ssl://)")
    proto, tls = _SCHEMES[uri.scheme]
    if proto is not None and proto != protocol:
        raise URIError(text, format_uri(uri), f"a {proto.upper()} endpoint in a "
                       f"{protocol.upper()} client's list")
    opts = nested.merged(uri.options)
    for key in opts:
        if key not in ENDPOINT_OPTIONS:
            raise URIError(text, key, f"unknown endpoint option {key!r}{_did_you_mean(key)}"
                           "; known: "
                           + ", ".join(sorted(ENDPOINT_OPTIONS)))
    try:
        timeout = _int(opts.get("connectionTimeout", "30000"))
        verify_text = opts.get("verifyHostName", opts.get("socket.verifyHostName"))
        verify = None if verify_text is None else _bool(verify_text)
        trust_all = None if "trustAll" not in opts else _bool(opts["trustAll"])
    except ValueError as exc:
        raise URIError(text, format_uri(uri), f"bad endpoint option: {exc}") from None
    if timeout <= 0:
        raise URIError(text, "connectionTimeout", "connectionTimeout must be > 0")
    websocket = uri.scheme in _WEBSOCKET
    if websocket:
        port = uri.port if uri.port is not None else (443 if tls else 80)
    else:
        port = uri.port if uri.port is not None else _DEFAULT_PORTS[(protocol, tls)]
    if "keyStoreKey" in opts and "keyStore" not in opts:
        raise URIError(text, "keyStoreKey", "keyStoreKey needs keyStore (the client "
                       "certificate the key belongs to)")
    return Endpoint(protocol, uri.host, port, tls, timeout / 1000, verify,
                    opts.get("trustStore"), websocket, uri.path if websocket else "",
                    key_store=opts.get("keyStore"), key_store_key=opts.get("keyStoreKey"),
                    key_store_password=opts.get("keyStorePassword"), trust_all=trust_all)
