"""What a network connector's URI asks for: which bridges, to which brokers.

- ``tcp://h:p`` (``ssl://``, ``nio://`` are aliases): one bridge.
- ``static:(u1,u2,...)``: one bridge per URI, each retrying on its own.
- ``static:(failover:(a,b)?...)`` and ``masterslave:(a,b,...)``: ONE bridge to whichever
  broker of the list answers (tried in order, once per attempt), rebuilt from the
  start of the list after any failure — never a bridge stuck retrying a slave.
- ``multicast://group``: bridges to the brokers a discovery agent finds.

Query options of ``static:`` carry the reconnect policy (ActiveMQ names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import parse_qsl

from meshmq.config.model import NetworkConnectorConfig
from meshmq.errors import ConfigError

BROKER_SCHEMES = ("tcp", "ssl", "nio")
_STATIC_OPTIONS = {
    "initialReconnectDelay": ("initial_reconnect_delay_ms", int),
    "maxReconnectDelay": ("max_reconnect_delay_ms", int),
    "useExponentialBackOff": ("use_exponential_backoff", bool),
    "backOffMultiplier": ("backoff_multiplier", float),
    "maxReconnectAttempts": ("max_reconnect_attempts", int),
    "minConnectTime": ("min_connect_time_ms", int),
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    uri: str

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True, slots=True)
class ConnectorPlan:
    targets: tuple[tuple[Endpoint, ...], ...]  # one bridge per entry
    discovery: str | None  # multicast://... : bridges come and go with discovery
    config: NetworkConnectorConfig  # with the URI's reconnect options applied


def _error(config: NetworkConnectorConfig, message: str) -> ConfigError:
    return ConfigError(f"network connector {config.name!r}: {message} (uri {config.uri!r})")


def split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _composite(text: str, scheme: str, *, single_without_parens: bool = False
               ) -> tuple[list[str], str]:
    """``scheme:(a,b)?q`` (also ``scheme://(a,b)?q``, as the seeds write it) ->
    ([a, b], q). Without parentheses: ``scheme:a,b?q``, or, for ``static:``, one URI
    that keeps its own query (``static:failover:(a,b)?randomize=false``)."""
    body = text[len(scheme) + 1:]
    if body.startswith("//"):
        body = body[2:]
    query = ""
    if body.startswith("("):
        depth = 0
        for i, ch in enumerate(body):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                inner, rest = body[1:i], body[i + 1:]
                break
        else:
            raise ValueError("unbalanced parentheses")
        if rest and not rest.startswith("?"):
            raise ValueError(f"unexpected text after ')': {rest!r}")
        query = rest[1:]
    elif single_without_parens:
        return [body.strip()], ""
    else:
        inner, _, query = body.partition("?")
    return split_top(inner), query


def parse_endpoint(text: str) -> Endpoint:
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in BROKER_SCHEMES:
        raise ValueError(f"{text!r} is not a broker URI (tcp://host:port; ssl:// and nio:// "
                         "are aliases)")
    hostport = rest.split("?", 1)[0].rstrip("/")
    host, colon, port = hostport.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ValueError(f"{text!r} needs host:port")
    host = host.strip("[]")
    return Endpoint(host, int(port), text)


def plan_connector(config: NetworkConnectorConfig) -> ConnectorPlan:
    uri = config.uri.strip()
    try:
        if uri.startswith("multicast:"):
            return ConnectorPlan((), uri, config)
        if uri.startswith("masterslave:"):
            parts, query = _composite(uri, "masterslave")
            if len(parts) < 2:
                raise ValueError("masterslave: needs at least two URIs (master, slave...)")
            config = _apply_options(config, query)  # the same options as static:
            return ConnectorPlan((tuple(parse_endpoint(p) for p in parts),), None, config)
        if uri.startswith("static:"):
            parts, query = _composite(uri, "static", single_without_parens=True)
            config = _apply_options(config, query)
            targets = []
            for part in parts:
                if part.startswith("failover:"):
                    inner, fquery = _composite(part, "failover")
                    _check_failover_query(fquery)
                    targets.append(tuple(parse_endpoint(p) for p in inner))
                else:
                    targets.append((parse_endpoint(part),))
            if not targets:
                raise ValueError("static: lists no broker")
            return ConnectorPlan(tuple(targets), None, config)
        return ConnectorPlan(((parse_endpoint(uri),),), None, config)
    except ValueError as exc:
        raise _error(config, str(exc)) from None


def _apply_options(config: NetworkConnectorConfig, query: str) -> NetworkConnectorConfig:
    changes: dict[str, object] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
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
            raise ValueError(f"static: option {name}={value!r} is not a "
                             f"{kind.__name__}") from None
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


_FAILOVER_OK = {"randomize", "maxReconnectAttempts", "initialReconnectDelay",
                "maxReconnectDelay", "useExponentialBackOff", "timeout",
                "startupMaxReconnectAttempts", "reconnectDelayExponent"}


def _check_failover_query(query: str) -> None:
    """Inside a network connector, failover: tries its list once per attempt and leaves
    retrying to the bridge (what ActiveMQ needs maxReconnectAttempts=0 for); its
    options are accepted for compatibility."""
    for name, _ in parse_qsl(query, keep_blank_values=True):
        if name not in _FAILOVER_OK and not name.startswith("nested."):
            raise ValueError(f"unknown failover: option {name!r}")
