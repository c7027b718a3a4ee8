"""What a network connector's URI asks for: which bridges, to which brokers.

- ``tcp://h:p`` (``nio://`` is an alias): one bridge; ``ssl://h:p``: one bridge over TLS
  (never plaintext), ``?verifyHostName=false`` turning the host name check off.
- ``static:(u1,u2,...)``: one bridge per URI, each retrying on its own.
- ``static:(failover:(a,b)?...)`` and ``masterslave:(a,b,...)``: ONE bridge to whichever
  broker of the list answers (tried in order, once per pass; after a lost link the
  broker just lost comes last) — never a bridge stuck retrying a slave.
- ``multicast://group``: bridges to the brokers a discovery agent finds.

Query options of ``static:`` carry the reconnect policy (ActiveMQ names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from meshmq.config.model import NetworkConnectorConfig
from meshmq.discovery_uri import parse_multicast_uri
from meshmq.errors import ConfigError
from meshmq.uri import URI, CompositeURI, Options, SimpleURI, URIError, format_uri, parse_uri


def activemq_attempts(text: str) -> int:
    """``maxReconnectAttempts`` of a static: or multicast: URI, in ActiveMQ's meaning
    (there 0 retries for ever, as -1 does) mapped onto meshmq's (-1 for ever, 0 no
    reconnect, N passes)."""
    value = int(text)
    return -1 if value == 0 else value


BROKER_SCHEMES = ("tcp", "ssl", "nio")
_STATIC_OPTIONS: dict[str, tuple[str, Callable[[str], object]]] = {
    "initialReconnectDelay": ("initial_reconnect_delay_ms", int),
    "maxReconnectDelay": ("max_reconnect_delay_ms", int),
    "useExponentialBackOff": ("use_exponential_backoff", bool),
    "backOffMultiplier": ("backoff_multiplier", float),
    "maxReconnectAttempts": ("max_reconnect_attempts", activemq_attempts),
    "minConnectTime": ("min_connect_time_ms", int),
}


# Spellings of ActiveMQ's host name check option on an ssl:// URI.
_VERIFY_HOST_OPTIONS = ("verifyHostName", "socket.verifyHostName", "transport.verifyHostName")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    uri: str
    tls: bool = False  # ssl://: TLS, never plaintext
    verify_hostname: bool | None = None  # from the URI; None: the connector's option

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True, slots=True)
class ConnectorPlan:
    targets: tuple[tuple[Endpoint, ...], ...]  # one bridge per entry
    discovery: str | None  # multicast://... : bridges come and go with discovery
    config: NetworkConnectorConfig  # with the URI's reconnect options applied


def _error(config: NetworkConnectorConfig, message: str) -> ConfigError:
    return ConfigError(f"network connector {config.name!r}: {message} (uri {config.uri!r})")


def _endpoint(uri: URI) -> Endpoint:
    if not isinstance(uri, SimpleURI) or uri.scheme not in BROKER_SCHEMES:
        raise ValueError(f"{format_uri(uri)!r} is not a broker URI (tcp://host:port, "
                         "ssl://host:port for TLS; nio:// is an alias of tcp://)")
    if uri.port is None or not uri.host:
        raise ValueError(f"{format_uri(uri)!r} needs host:port")
    verify: bool | None = None
    for name in _VERIFY_HOST_OPTIONS:
        if name in uri.options:
            value = uri.options[name].lower()
            if value not in ("true", "false"):
                raise ValueError(f"{name}={uri.options[name]!r} is not true or false")
            verify = value == "true"
    return Endpoint(uri.host, uri.port, format_uri(uri), tls=uri.scheme == "ssl",
                    verify_hostname=verify)


def parse_endpoint(text: str) -> Endpoint:
    try:
        return _endpoint(parse_uri(text))
    except URIError as exc:
        raise ValueError(str(exc)) from None


def check_uri(uri: str) -> None:
    """Validate a connector URI completely (the config loaders call this, so a bad
    URI is reported with its file and line). Raises ValueError naming the bad part."""
    plan_connector(NetworkConnectorConfig(uri=uri), errors=ValueError)


def plan_connector(config: NetworkConnectorConfig,
                   errors: type[Exception] = ConfigError) -> ConnectorPlan:
    text = config.uri.strip()
    try:
        tree = parse_uri(text)
        if isinstance(tree, SimpleURI):
            if tree.scheme == "multicast":
                parse_multicast_uri(text)  # DiscoveryUriError is a ValueError
                return ConnectorPlan((), text, config)
            return ConnectorPlan(((_endpoint(tree),),), None, config)
        if tree.scheme == "failover":
            raise ValueError(f"a failover: URI must be wrapped: 'static:({text})' or, for a "
                             "master/slave pair, 'masterslave:(master,slave)'")
        if tree.scheme == "discovery":
            raise ValueError("discovery: is a client URI; a network connector discovers "
                             "brokers with multicast://")
        config = _apply_options(config, tree.options)
        if tree.scheme == "masterslave":
            if len(tree.components) < 2:
                raise ValueError("masterslave: needs at least two URIs (master, slave...)")
            return ConnectorPlan((tuple(_endpoint(c) for c in tree.components),), None,
                                 config)
        targets = []
        for part in tree.components:
            if isinstance(part, CompositeURI):
                if part.scheme != "failover":
                    raise ValueError(f"{part.scheme}: cannot be nested in static:")
                _check_failover_options(part.options)
                targets.append(tuple(_endpoint(c) for c in part.components))
            else:
                targets.append((_endpoint(part),))
        if not targets:
            raise ValueError("static: lists no broker")
        return ConnectorPlan(tuple(targets), None, config)
    except (ValueError, URIError) as exc:
        if errors is ConfigError:
            raise _error(config, str(exc)) from None
        raise errors(str(exc)) from None


def _apply_options(config: NetworkConnectorConfig, options: Options) -> NetworkConnectorConfig:
    changes: dict[str, object] = {}
    for name, value in options.items():
        if name not in _STATIC_OPTIONS:
            raise ValueError(f"unknown static: option {name!r} (known: "
                             f"{', '.join(sorted(_STATIC_OPTIONS))})")
        field, kind = _STATIC_OPTIONS[name]
        try:
            if kind is bool:
                if value.lower() not in ("true", "false"):
                    raise ValueError
                changes[field] = value.lower() == "true"
            else:
                changes[field] = kind(value)
        except ValueError:
            what = "int" if kind is activemq_attempts else getattr(kind, "__name__", "")
            raise ValueError(f"static: option {name}={value!r} is not a {what}") from None
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


_FAILOVER_OK = {"randomize", "maxReconnectAttempts", "initialReconnectDelay",
                "maxReconnectDelay", "useExponentialBackOff", "timeout",
                "startupMaxReconnectAttempts", "reconnectDelayExponent"}


def _check_failover_options(options: Options) -> None:
    """Inside a network connector, failover: tries its list once per attempt and leaves
    retrying to the bridge (what ActiveMQ needs maxReconnectAttempts=0 for); its
    options are accepted for compatibility."""
    for name in options:
        if name not in _FAILOVER_OK and not name.startswith("nested."):
            raise ValueError(f"unknown failover: option {name!r}")
