"""The native TOML loader, and the one validator both loaders share.

Layout of a file (one section per nested dataclass of ``BrokerConfig``)::

    [broker]          scalar fields of BrokerConfig (``name`` is ``broker_name``)
    [[listeners]]     ListenerConfig, plus ``url = "stomp://host:port"``
    [stomp]           StompConfig
    [store]           StoreConfig
    [[policies]]      DestinationPolicy
    [usage]           UsageConfig
    [auth]            AuthConfig; users as [[auth.users]] (User)
    [management]      ManagementConfig
    [trace]           TraceConfig
    [[streams]]       StreamPolicy
    [[network_connectors]]  NetworkConnectorConfig (bridges to other brokers)
    [shards]          ShardsConfig (BrokerConfig.sharding: [broker] shards is the count)

The schema is derived from the dataclasses themselves, so a field added to the
model is loadable at once (and ``test_config_docs`` insists it is documented).

Validation happens once, in ``build_config``: the activemq.xml importer
translates into the same raw shape and goes through the same checks, so both
formats report the same mistakes the same way. ``tomllib`` keeps no positions,
so ``toml_positions`` rescans the text to map each dotted option to its line.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import logging
import os
import re
import tomllib
import types
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from meshmq.config.credential_files import read_certificate_users, read_groups, read_users
from meshmq.config.model import (
    CLIENT_AUTH,
    HA_MODES,
    HA_ROLES,
    LIMIT_ACTIONS,
    LISTENER_PROTOCOLS,
    LOG_FORMATS,
    LOG_LEVELS,
    SHARD_PLACEMENTS,
    STORE_KINDS,
    TRACE_FORMATS,
    AuthorizationConfig,
    BrokerConfig,
    HaConfig,
    ListenerConfig,
    NetworkConnectorConfig,
    management_exposure,
    parse_shards,
    sharding_conflict,
)
from meshmq.config.sizes import parse_size
from meshmq.core.destinations import Destination, is_wildcard_name, validate_name
from meshmq.core.passwords import check_hash, is_hashed
from meshmq.core.shards import MAX_SHARDS
from meshmq.discovery_uri import DiscoveryUriError, parse_multicast_uri
from meshmq.errors import ConfigError, DestinationError
from meshmq.tls import check_ciphers
from meshmq.uri import SimpleURI, URIError, parse_uri

__all__ = [
    "BROKER_SECTION",
    "SECTIONS",
    "Source",
    "build_config",
    "check_connector_uri",
    "load_toml",
    "loads_toml",
    "option_key",
    "split_listener_url",
    "toml_positions",
]

_T = TypeVar("_T")
log = logging.getLogger("meshmq.config")

BROKER_SECTION = "broker"
# Sections whose TOML name is not their field's: ``[broker] shards`` is the count, so
# the shards' settings live in BrokerConfig.sharding.
_SECTION_NAMES: dict[str, str] = {"sharding": "shards"}
# Nested sections of BrokerConfig: TOML name -> field name (the same but for the above).
SECTIONS: dict[str, str] = {
    _SECTION_NAMES.get(f.name, f.name): f.name
    for f in dataclasses.fields(BrokerConfig)
    if f.name != "source" and (
        dataclasses.is_dataclass(f.default_factory)
        or isinstance(f.default, tuple)
    )
}
# Model field -> TOML key where the two differ ([broker] name reads better than broker_name).
_RENAMED: dict[tuple[type, str], str] = {(BrokerConfig, "broker_name"): "name"}
_NOT_CONFIGURABLE: frozenset[tuple[type, str]] = frozenset({(BrokerConfig, "source"),
                                                            (HaConfig, "implicit")})

# Int fields that also accept "64 mb"-style strings.
SIZE_FIELDS: frozenset[str] = frozenset({
    "StompConfig.max_frame_size", "StompConfig.max_header_size", "MqttConfig.max_packet_size",
    "StoreConfig.segment_size", "StoreConfig.max_batch_bytes", "StoreConfig.max_disk_bytes",
    "StoreConfig.min_free_disk", "StoreConfig.disk_reserve",
    "DestinationPolicy.memory_limit", "UsageConfig.memory_limit", "TraceConfig.max_file_bytes",
    "StreamPolicy.max_bytes", "HaConfig.log_retain_bytes", "LoggingConfig.max_file_bytes",
})
# Inclusive bounds; numbers not listed must merely be >= 0 (no option means anything below).
_RANGES: dict[str, tuple[float | None, float | None]] = {
    "ListenerConfig.port": (0, 65535),
    "ManagementConfig.port": (0, 65535),
    "ListenerConfig.max_connections": (1, None),
    "StompConfig.max_frame_size": (1, None),
    "StompConfig.max_headers": (1, None),
    "StompConfig.max_header_size": (1, None),
    "StompConfig.heartbeat_grace": (1.0, None),
    "StoreConfig.segment_size": (1, None),
    "StoreConfig.max_batch_bytes": (1, None),
    "StoreConfig.compact_live_ratio": (0.0, 1.0),
    "DestinationPolicy.page_size": (1, None),
    "TraceConfig.sample_rate": (0.0, 1.0),
    "TraceConfig.max_file_bytes": (1, None),
    "TraceConfig.flush_interval_ms": (1, None),
    # -1 = unlimited hops; 0 would forward nothing (NONZERO below).
    "NetworkConnectorConfig.network_ttl": (-1, None),
    "NetworkConnectorConfig.message_ttl": (-1, None),
    "NetworkConnectorConfig.consumer_ttl": (-1, None),
    "NetworkConnectorConfig.consumer_priority_base": (None, None),  # ActiveMQ's is -5
    "NetworkConnectorConfig.prefetch_size": (1, None),
    "NetworkConnectorConfig.backoff_multiplier": (1.0, None),
    "NetworkConnectorConfig.max_reconnect_attempts": (-1, None),
    "NetworkConnectorConfig.rate_duration_ms": (1, None),
    "NetworkConnectorConfig.handshake_timeout_ms": (1, None),
    "NetworkConnectorConfig.heartbeat_ms": (1, None),
    "NetworkConnectorConfig.interest_resync_ms": (1, None),
    "HaConfig.lease_ms": (100, None),
    "HaConfig.keepalive_ms": (10, None),
    "HaConfig.acquire_interval_ms": (10, None),
    "HaConfig.log_retain_bytes": (0, None),
    "MetricsConfig.max_destinations": (1, None),
    # Below 0.1 s a shard's ordinary restart would refuse sends; above an hour producers
    # would wait on a shard that is not coming back.
    "ShardsConfig.owner_wait_ms": (100, 3_600_000),
}
_NONZERO: dict[str, str] = {
    f"NetworkConnectorConfig.{name}": "-1 (unlimited) or at least 1 hop"
    for name in ("network_ttl", "message_ttl", "consumer_ttl")
}
# Why a bound exists, where the number alone does not say.
_RANGE_REASONS: dict[str, str] = {
    "NetworkConnectorConfig.prefetch_size": "a bridge's consumer never polls, it needs credit",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "ListenerConfig.protocol": LISTENER_PROTOCOLS,
    "StoreConfig.kind": STORE_KINDS,
    "UsageConfig.on_limit": LIMIT_ACTIONS,
    "ListenerConfig.client_auth": CLIENT_AUTH,
    "TraceConfig.format": TRACE_FORMATS,
    "HaConfig.mode": HA_MODES,
    "ShardsConfig.placement": SHARD_PLACEMENTS,
    "HaConfig.role": HA_ROLES,
    "LoggingConfig.level": LOG_LEVELS,
    "LoggingConfig.loggers": LOG_LEVELS,
    "LoggingConfig.format": LOG_FORMATS,
}
_NON_EMPTY: frozenset[str] = frozenset({
    "BrokerConfig.broker_name", "ListenerConfig.name", "ListenerConfig.host",
    "ManagementConfig.host", "ManagementConfig.admin_group", "User.name",
    "AuthConfig.anonymous_user", "CertificateUser.name",
    "DestinationPolicy.dead_letter_queue", "NetworkConnectorConfig.name",
    "NetworkConnectorConfig.uri",
})
# Listener protocols that carry broker-to-broker links, so may be advertised.
_BRIDGE_PROTOCOLS = frozenset({"tcp", "ssl", "nio"})
# The three destination lists of a network connector.
_DESTINATION_LISTS = ("excluded_destinations", "dynamically_included_destinations",
                      "statically_included_destinations")
_SSL_PROTOCOLS = frozenset({"ssl", "stomp+ssl", "mqtt+ssl", "wss"})
# URL scheme spellings that mean the same listener protocol.
_SCHEME_ALIASES = {"stomp+nio": "stomp", "stomp+nio+ssl": "stomp+ssl", "nio+ssl": "ssl",
                   "mqtt+nio": "mqtt", "mqtt+nio+ssl": "mqtt+ssl"}


def option_key(cls: type, field_name: str) -> str:
    """The TOML key of a model field (its name unless renamed)."""
    return _RENAMED.get((cls, field_name), field_name)


# ---------------------------------------------------------------------------
# Where things are: file, line and the option's display name


@dataclasses.dataclass
class Source:
    """Locates options of one file for error messages.

    ``lines`` maps dotted option paths (``listeners[0].port``) to lines; a path
    that is missing falls back to its nearest ancestor (the table header).
    ``labels`` renames a path for messages (the XML importer shows attribute
    paths; a listener ``url`` stands in for the protocol/host/port it set).
    """

    file: str | None = None
    base_dir: Path | None = None
    lines: dict[str, int] = dataclasses.field(default_factory=dict)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def line_of(self, path: str) -> int | None:
        return self._nearest(path, lambda p: self.lines.get(p) or self.lines.get(
            self.labels.get(p, "")))

    def label_of(self, path: str) -> str:
        return self._nearest(path, self.labels.get) or path

    def error(self, message: str, path: str) -> ConfigError:
        return ConfigError(message, file=self.file, line=self.line_of(path),
                           option=self.label_of(path) or None)

    @staticmethod
    def _nearest(path: str, get: Callable[[str], _T | None]) -> _T | None:
        while path:
            found = get(path)
            if found is not None:
                return found
            path = _parent_path(path)
        return None


def _parent_path(path: str) -> str:
    if path.endswith("]"):
        return path[: path.rindex("[")]
    cut = path.rfind(".")
    return path[:cut] if cut > 0 else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _unknown(kind: str, path: str, name: str, known: Iterable[str]) -> str:
    msg = f"unknown {kind} {path!r}"
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    # Also catch the model's field name used where the key is shorter (broker_name -> name).
    close = close or [k for k in sorted(known) if len(k) >= 4 and name.endswith(k)][:1]
    # ActiveMQ's camelCase spelling of an option: networkTTL -> network_ttl.
    snake = _snake(name)
    close = close or [k for k in (snake, f"{snake}_ms") if k in known][:1]
    return f"{msg}; did you mean {close[0]!r}?" if close else msg


def _snake(name: str) -> str:
    """``networkTTL`` -> ``network_ttl``, ``backOffMultiplier`` -> ``back_off_multiplier``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


# ---------------------------------------------------------------------------
# Building and validating the model from a raw TOML-shaped mapping


def build_config(raw: Mapping[str, Any], source: Source, *, from_strings: bool = False
                 ) -> BrokerConfig:
    """Validate ``raw`` (the shape of a parsed TOML file) and build the model.

    ``from_strings``: scalar values may arrive as text ("true", "1000", "1.5"),
    as XML attributes do; TOML values must already have the right type.
    """
    return _Builder(source, from_strings).root(raw)


class _Builder:
    def __init__(self, source: Source, from_strings: bool) -> None:
        self.src = source
        self.from_strings = from_strings

    def root(self, raw: Mapping[str, Any]) -> BrokerConfig:
        known = (BROKER_SECTION, *SECTIONS)
        for name in raw:
            if name not in known:
                raise self.src.error(_unknown("section", name, name, known), name)
        kwargs: dict[str, Any] = {}
        if BROKER_SECTION in raw:
            table = self._table(raw[BROKER_SECTION], BROKER_SECTION)
            sections = set(SECTIONS.values())
            scalars = [f for f in dataclasses.fields(BrokerConfig) if f.name not in sections]
            kwargs.update(self._fields(BrokerConfig, scalars, table, BROKER_SECTION))
        hints = get_type_hints(BrokerConfig)
        for name, field_name in SECTIONS.items():
            if name in raw:
                kwargs[field_name] = self._convert(raw[name], hints[field_name], name,
                                                   f"BrokerConfig.{field_name}")
        config = BrokerConfig(**kwargs, source=self.src.file)
        self._check(config)
        self._explain(raw, config)
        return config

    def _check_auth(self, config: BrokerConfig) -> None:
        auth = config.auth
        users: set[str] = set()
        for i, user in enumerate(auth.users):
            if user.name in users:
                raise self.src.error(f"duplicate user {user.name!r}", f"auth.users[{i}].name")
            users.add(user.name)
            problem = check_hash(user.password)
            if problem is not None:
                raise self.src.error(problem, f"auth.users[{i}].password")
        for i, cert_user in enumerate(auth.certificate_users):
            at = f"auth.certificate_users[{i}]"
            if (cert_user.dn is None) == (cert_user.dn_regex is None):
                raise self.src.error("give either 'dn' (the exact subject DN) or 'dn_regex'",
                                     at)
            if cert_user.dn_regex is not None:
                try:
                    re.compile(cert_user.dn_regex)
                except re.error as exc:
                    raise self.src.error(f"not a regular expression: {exc}",
                                         f"{at}.dn_regex") from None
        readers: dict[str, Callable[[Path], object]] = {
            "users_file": read_users, "groups_file": read_groups,
            "certificate_users_file": read_certificate_users,
            "certificate_groups_file": read_groups}
        for option, read in readers.items():
            path = getattr(auth, option)
            if path is None:
                continue
            try:
                read(path)
            except OSError as exc:
                raise self.src.error(f"cannot read {path}: {exc.strerror}",
                                     f"auth.{option}") from None

    def _explain(self, raw: Mapping[str, Any], config: BrokerConfig) -> None:
        """Log what a valid config does that its author may not expect."""
        for i, user in enumerate(config.auth.users):
            if not is_hashed(user.password):
                at = f"auth.users[{i}].password"
                line = self.src.line_of(at)
                log.warning("%s:%s: %s: user %r has a clear-text password; store the line "
                            "`meshmq passwd` prints instead", self.src.file or "<config>",
                            line if line is not None else "?", self.src.label_of(at),
                            user.name)
        tables = raw.get("network_connectors")
        for i, nc in enumerate(config.network_connectors):
            table = tables[i] if isinstance(tables, list) and i < len(tables) else {}
            if nc.conduit_subscriptions or "decrease_network_consumer_priority" in table:
                continue
            # ActiveMQ's older docs (and their 10/10/10 example) assume the priority is
            # not decreased; 5.18+ and meshmq decrease it, so local consumers come first.
            at = f"network_connectors[{i}].conduit_subscriptions"
            line = self.src.line_of(at)
            log.warning(
                "%s:%s: network connector %r sets conduit subscriptions off but keeps "
                "decrease_network_consumer_priority = true (the default, as in ActiveMQ "
                "5.18+): queue messages go to consumers on this broker first and reach "
                "remote consumers only when local ones are busy or absent; to share them "
                "evenly between local and remote consumers (ActiveMQ's older documented "
                "behaviour), also set decreaseNetworkConsumerPriority=\"false\" "
                "(TOML: decrease_network_consumer_priority = false); setting it either way "
                "silences this",
                self.src.file or "<config>", line if line is not None else "?", nc.name)

    # -- structure --------------------------------------------------------

    def _table(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.src.error(f"expected a table, got {_describe(value)}", path)
        return value

    def _dataclass(self, cls: type, value: Any, path: str) -> Any:
        table = dict(self._table(value, path))
        if cls is ListenerConfig:
            table = self._listener_url(table, path)
        return cls(**self._fields(cls, dataclasses.fields(cls), table, path))

    def _fields(self, cls: type, fields: Iterable[dataclasses.Field[Any]],
                table: Mapping[str, Any], path: str) -> dict[str, Any]:
        by_key = {option_key(cls, f.name): f for f in fields
                  if (cls, f.name) not in _NOT_CONFIGURABLE}
        for key in table:
            if key not in by_key:
                raise self.src.error(_unknown("option", _join(path, key), key, by_key),
                                     _join(path, key))
        hints = get_type_hints(cls)
        out: dict[str, Any] = {}
        for key, f in by_key.items():
            if key in table:
                out[f.name] = self._convert(table[key], hints[f.name], _join(path, key),
                                            f"{cls.__name__}.{f.name}")
            elif (f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING):
                raise self.src.error(f"missing required option {key!r}", _join(path, key))
        return out

    def _listener_url(self, table: dict[str, Any], path: str) -> dict[str, Any]:
        if "url" not in table:
            return table
        url = table.pop("url")
        url_path = _join(path, "url")
        if not isinstance(url, str):
            raise self.src.error(f"expected a string, got {_describe(url)}", url_path)
        clash = [k for k in ("protocol", "host", "port") if k in table]
        if clash:
            raise self.src.error(f"give either 'url' or {clash[0]!r}, not both", url_path)
        try:
            protocol, host, port, query = split_listener_url(url)
        except ValueError as exc:
            raise self.src.error(str(exc), url_path) from None
        if query:
            raise self.src.error(
                f"URL options ({query!r}) are not read here; set the listener's keys "
                "(max_connections, ...) or the [stomp] section instead", url_path)
        for key in ("protocol", "host", "port"):
            self.src.labels.setdefault(_join(path, key), url_path)
        return {**table, "protocol": protocol, "host": host, "port": port}

    # -- values -----------------------------------------------------------

    def _convert(self, value: Any, tp: Any, path: str, key: str) -> Any:
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):  # only ``X | None`` occurs in the model
            inner = [a for a in get_args(tp) if a is not type(None)]
            return self._convert(value, inner[0], path, key)
        if origin is tuple:
            return self._tuple(value, get_args(tp), path, key)
        if origin is dict:  # a table of str keys, e.g. [logging] loggers
            table = self._table(value, path)
            return {str(k): self._convert(v, get_args(tp)[1], f'{path}["{k}"]', key)
                    for k, v in table.items()}
        if dataclasses.is_dataclass(tp):
            return self._dataclass(tp, value, path)  # type: ignore[arg-type]
        if key == "BrokerConfig.shards":  # a count or "auto"
            try:
                return parse_shards(value, MAX_SHARDS, os.cpu_count())
            except ValueError as exc:
                raise self.src.error(str(exc), path) from None
        if tp is bool:
            return self._bool(value, path)
        if tp is int:
            return self._check_number(self._int(value, path, key), path, key)
        if tp is float:
            return self._check_number(self._float(value, path), path, key)
        if tp is str:
            return self._str(value, path, key)
        if tp is Path:
            return self._path(value, path)
        raise TypeError(f"unsupported model type {tp!r} for {key}")  # a model bug, not a user's

    def _tuple(self, value: Any, args: tuple[Any, ...], path: str, key: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise self.src.error(f"expected an array, got {_describe(value)}", path)
        if len(args) == 2 and args[1] is Ellipsis:
            types_ = [args[0]] * len(value)
        else:
            if len(value) != len(args):
                raise self.src.error(
                    f"expected an array of {len(args)} values, got {len(value)}", path)
            types_ = list(args)
        return tuple(self._convert(v, t, f"{path}[{i}]", key)
                     for i, (v, t) in enumerate(zip(value, types_, strict=True)))

    def _bool(self, value: Any, path: str) -> bool:
        if isinstance(value, bool):
            return value
        if self.from_strings and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise self.src.error(f"expected true or false, got {_describe(value)}", path)

    def _int(self, value: Any, path: str, key: str) -> int:
        if key in SIZE_FIELDS and isinstance(value, str | int) and not isinstance(value, bool):
            try:
                return parse_size(value)
            except ValueError as exc:
                raise self.src.error(str(exc), path) from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if self.from_strings and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise self.src.error(f"expected an integer, got {_describe(value)}", path)

    def _float(self, value: Any, path: str) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if self.from_strings and isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise self.src.error(f"expected a number, got {_describe(value)}", path)

    def _check_number(self, value: float, path: str, key: str) -> Any:
        low, high = _RANGES.get(key, (0, None))
        why = f" ({_RANGE_REASONS[key]})" if key in _RANGE_REASONS else ""
        if low is not None and value < low:
            raise self.src.error(f"must be >= {low}, got {value}{why}", path)
        if high is not None and value > high:
            raise self.src.error(f"must be <= {high}, got {value}{why}", path)
        if key in _NONZERO and value == 0:
            raise self.src.error(f"must be {_NONZERO[key]}, got 0", path)
        return value

    def _str(self, value: Any, path: str, key: str) -> str:
        if not isinstance(value, str):
            raise self.src.error(f"expected a string, got {_describe(value)}", path)
        choices = _CHOICES.get(key)
        if choices is not None and value not in choices:
            raise self.src.error(
                f"must be one of {', '.join(map(repr, choices))}, got {value!r}", path)
        if key in _NON_EMPTY and not value.strip():
            raise self.src.error("must not be empty", path)
        return value

    def _path(self, value: Any, path: str) -> Path:
        if not isinstance(value, str) or not value:
            raise self.src.error(f"expected a path, got {_describe(value)}", path)
        p = Path(value).expanduser()
        # Relative to the file, not the working directory: the broker may start anywhere.
        if not p.is_absolute() and self.src.base_dir is not None:
            p = self.src.base_dir / p
        return p

    # -- rules that span several options ------------------------------------

    def _check(self, config: BrokerConfig) -> None:
        conflict = sharding_conflict(config)
        if conflict is not None:
            raise self.src.error(conflict[0], f"{BROKER_SECTION}.shards")
        names: set[str] = set()
        addresses: set[tuple[str, int]] = set()
        for i, lst in enumerate(config.listeners):
            at = f"listeners[{i}]"
            if lst.name in names:
                raise self.src.error(f"duplicate listener name {lst.name!r}", f"{at}.name")
            names.add(lst.name)
            if lst.port != 0:  # port 0 means "any free port": never a clash
                if (lst.host, lst.port) in addresses:
                    raise self.src.error(
                        f"another listener already uses {lst.host}:{lst.port}", f"{at}.port")
                addresses.add((lst.host, lst.port))
            if lst.protocol in _SSL_PROTOCOLS and lst.ssl_certfile is None:
                raise self.src.error(
                    f"{lst.protocol} listener {lst.name!r} needs ssl_certfile",
                    f"{at}.ssl_certfile")
            if lst.client_auth is not None and lst.client_auth != "none":
                if lst.protocol not in _SSL_PROTOCOLS:
                    raise self.src.error(
                        f"client_auth applies to TLS listeners (ssl, stomp+ssl, "
                        f"mqtt+ssl, wss); {lst.name!r} is {lst.protocol}",
                        f"{at}.client_auth")
                if lst.ssl_cafile is None:
                    raise self.src.error(
                        f"client_auth = {lst.client_auth!r} needs ssl_cafile (the CA "
                        "bundle that client certificates are verified against)",
                        f"{at}.client_auth")
            if lst.discovery_uri is not None:
                self._check_discovery_uri(lst, f"{at}.discovery_uri")
            self._check_ciphers(lst.ssl_ciphers, f"{at}.ssl_ciphers")
            if lst.allow_anonymous_links and lst.protocol not in _BRIDGE_PROTOCOLS:
                raise self.src.error(
                    f"allow_anonymous_links applies to listeners of broker links (tcp, ssl, "
                    f"nio); {lst.name!r} is {lst.protocol}", f"{at}.allow_anonymous_links")
        for i, pol in enumerate(config.policies):
            at = f"policies[{i}]"
            try:
                Destination.parse_uri(pol.match)
            except DestinationError as exc:
                raise self.src.error(
                    f"not a destination pattern like 'queue://orders.>': {exc.message}",
                    f"{at}.match") from None
            try:
                validate_name(pol.dead_letter_queue)
                if is_wildcard_name(pol.dead_letter_queue):
                    raise DestinationError("a dead-letter queue cannot be a wildcard")
            except DestinationError as exc:
                raise self.src.error(exc.message, f"{at}.dead_letter_queue") from None
            if pol.individual_dlq_prefix is not None:
                try:
                    validate_name(pol.individual_dlq_prefix + "q")
                    if is_wildcard_name(pol.individual_dlq_prefix):
                        raise DestinationError("a dead-letter prefix cannot hold wildcards")
                except DestinationError as exc:
                    raise self.src.error(exc.message, f"{at}.individual_dlq_prefix") from None
        for i, stream in enumerate(config.streams):
            at = f"streams[{i}]"
            try:
                pattern = Destination.parse_uri(stream.match)
            except DestinationError as exc:
                raise self.src.error(
                    f"not a queue pattern like 'queue://stream.>': {exc.message}",
                    f"{at}.match") from None
            if not pattern.is_queue or pattern.is_temporary:
                raise self.src.error("streams are queues: use a queue:// pattern",
                                     f"{at}.match")
        self._check_ha(config)
        self._check_auth(config)
        if config.auth.authorization is not None:
            self._check_authorization(config.auth.authorization)
        if "(" in config.advertised_peers:
            raise self.src.error(
                "list each peer's client URI, comma separated (e.g. "
                "\"stomp://b:61613,mqtt://b:1883\"), not a failover:(...) URI: clients "
                "build their failover list from these", f"{BROKER_SECTION}.advertised_peers")
        for peer in config.advertised_peer_list:
            try:
                if not isinstance(parse_uri(peer), SimpleURI):
                    raise URIError(peer, peer, "a peer is one endpoint URI, not a composite")
            except URIError as exc:
                raise self.src.error(str(exc), f"{BROKER_SECTION}.advertised_peers") from None
        self._check_management(config)
        for i, name in enumerate(config.management.metrics.destinations):
            try:
                validate_name(name)
            except DestinationError as exc:
                raise self.src.error(exc.message, f"management.metrics.destinations[{i}]"
                                     ) from None
        connectors: set[str] = set()
        for i, nc in enumerate(config.network_connectors):
            at = f"network_connectors[{i}]"
            if nc.name in connectors:
                raise self.src.error(
                    f"duplicate network connector name {nc.name!r}: connectors need distinct "
                    "names (they name the bridges and their durable subscriptions)",
                    f"{at}.name")
            connectors.add(nc.name)
            self._check_connector(nc, at)

    def _check_authorization(self, authz: AuthorizationConfig) -> None:
        for i, entry in enumerate(authz.entries):
            at = f"auth.authorization.entries[{i}]"
            given = [k for k in ("queue", "topic") if getattr(entry, k) is not None]
            if len(given) != 1:
                raise self.src.error(
                    "an authorization entry names a queue or a topic pattern (one of them)"
                    if not given else "give either 'queue' or 'topic' in one entry, not both",
                    at if not given else f"{at}.topic")
            key = given[0]
            pattern = getattr(entry, key)
            try:
                validate_name(pattern)
            except DestinationError as exc:
                raise self.src.error(f"not a destination pattern like 'orders.>': "
                                     f"{exc.message}", f"{at}.{key}") from None

    def _check_management(self, config: BrokerConfig) -> None:
        mgmt = config.management
        if mgmt.ssl_keyfile is not None and mgmt.ssl_certfile is None:
            raise self.src.error("ssl_keyfile needs ssl_certfile (the certificate the "
                                 "management endpoint serves HTTPS with)",
                                 "management.ssl_keyfile")
        problem = management_exposure(config)
        if problem is not None:
            raise self.src.error(problem, "management.host")

    def _check_discovery_uri(self, lst: ListenerConfig, path: str) -> None:
        if lst.protocol not in _BRIDGE_PROTOCOLS:
            raise self.src.error(
                f"only tcp, ssl and nio listeners carry broker links and can be advertised; "
                f"{lst.name!r} is {lst.protocol}", path)
        try:
            parse_multicast_uri(lst.discovery_uri or "")
        except DiscoveryUriError as exc:
            raise self.src.error(str(exc), path) from None

    def _check_ciphers(self, ciphers: str | None, path: str) -> None:
        if ciphers is not None:
            try:
                check_ciphers(ciphers)
            except ValueError as exc:
                raise self.src.error(str(exc), path) from None

    def _check_tls_pair(self, certfile: Path | None, keyfile: Path | None, at: str) -> None:
        if keyfile is not None and certfile is None:
            raise self.src.error("ssl_keyfile needs ssl_certfile (the certificate of this "
                                 "key)", f"{at}.ssl_keyfile")

    def _check_connector(self, nc: NetworkConnectorConfig, at: str) -> None:
        try:
            check_connector_uri(nc.uri)
        except ValueError as exc:
            raise self.src.error(str(exc), f"{at}.uri") from None
        self._check_ciphers(nc.ssl_ciphers, f"{at}.ssl_ciphers")
        self._check_tls_pair(nc.ssl_certfile, nc.ssl_keyfile, at)
        if nc.max_reconnect_delay_ms < nc.initial_reconnect_delay_ms:
            raise self.src.error(
                f"must be >= initial_reconnect_delay_ms ({nc.initial_reconnect_delay_ms}), "
                f"got {nc.max_reconnect_delay_ms}", f"{at}.max_reconnect_delay_ms")
        for name in _DESTINATION_LISTS:
            for j, text in enumerate(getattr(nc, name)):
                try:
                    Destination.parse_uri(text)
                except DestinationError as exc:
                    raise self.src.error(
                        f"not a destination like 'queue://orders.>' or 'topic://prices.*': "
                        f"{exc.message}", f"{at}.{name}[{j}]") from None


    def _check_ha(self, config: BrokerConfig) -> None:
        ha, store = config.ha, config.store
        if store.kind == "postgres" and not store.dsn:
            raise self.src.error("store kind 'postgres' needs a dsn (a libpq connection "
                                 "string such as 'host=db dbname=meshmq')", "store.dsn")
        if ha.mode == "none":
            return
        if not config.persistent or store.kind == "memory":
            raise self.src.error(f"ha mode {ha.mode!r} needs a persistent journal or postgres "
                                 "store shared by the brokers", "ha.mode")
        if ha.mode == "replicated":
            self._check_replicated(config)
        elif ha.mode == "shared" and store.kind != "journal":
            raise self.src.error("ha mode 'shared' puts its lease next to a journal store; "
                                 "with a postgres store use mode 'database'", "ha.mode")
        if ha.mode == "database" and store.kind != "postgres":
            raise self.src.error("ha mode 'database' keeps its lease row in the postgres "
                                 "store; set store.kind = 'postgres'", "ha.mode")
        if ha.keepalive_ms * 2 > ha.lease_ms:
            raise self.src.error(
                f"keepalive_ms ({ha.keepalive_ms}) must be at most half of lease_ms "
                f"({ha.lease_ms}), or a healthy master could lose its lease", "ha.keepalive_ms")
        if ha.holder_id is not None and not 0 < len(ha.holder_id.encode()) <= 64:
            raise self.src.error("holder_id must be 1 to 64 bytes", "ha.holder_id")

    def _check_replicated(self, config: BrokerConfig) -> None:
        ha = config.ha
        if config.store.kind != "journal" and ha.role != "witness":
            raise self.src.error("ha mode 'replicated' copies a journal store to every node; "
                                 "set store.kind = 'journal'", "ha.mode")
        if not ha.listen:
            raise self.src.error("ha mode 'replicated' needs listen = \"HOST:PORT\", this "
                                 "node's replication address", "ha.listen")
        if not ha.members:
            raise self.src.error("ha mode 'replicated' needs members = [\"HOST:PORT\", ...], "
                                 "the other nodes' replication addresses", "ha.members")
        for i, addr in enumerate((ha.listen, *ha.members)):
            at = "ha.listen" if i == 0 else f"ha.members[{i - 1}]"
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise self.src.error(f"{addr!r} is not a HOST:PORT address", at)
        if ha.listen in ha.members or len(set(ha.members)) != len(ha.members):
            raise self.src.error("members must list each other node once, not this one",
                                 "ha.members")
        if ha.node_id is not None and not 0 < len(ha.node_id.encode()) <= 64:
            raise self.src.error("node_id must be 1 to 64 bytes", "ha.node_id")
        self._check_ciphers(ha.ssl_ciphers, "ha.ssl_ciphers")
        self._check_tls_pair(ha.ssl_certfile, ha.ssl_keyfile, "ha")
        if ha.ssl_certfile is None and (ha.ssl_cafile is not None or ha.ssl_ciphers):
            raise self.src.error("TLS on replication links needs ssl_certfile (each node "
                                 "is a TLS server to the others)", "ha.ssl_certfile")


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "array", dict: "table"}.get(type(value), type(value).__name__)
    if isinstance(value, dict | list):
        return kind
    return f"{kind} {value!r}"


_URI_FORMS = ("static:(uri,...)", "masterslave:(master,slave,...)", "multicast://...",
              "tcp://host:port", "ssl://host:port", "nio://host:port")


def check_connector_uri(uri: str) -> None:
    """A light check of a network connector URI: its form, not every option.

    Accepts ``static:(...)`` / ``static:uri``, ``masterslave:(a,b,...)``, a
    ``multicast://`` discovery URI (fully parsed) and one ``tcp://``, ``ssl://`` or
    ``nio://`` host:port. Raises ``ValueError`` naming what is wrong.
    """
    text = uri.strip()
    scheme, sep, _ = text.partition(":")
    if not sep:
        raise ValueError(f"not a network connector URI: {uri!r}; expected one of "
                         f"{', '.join(_URI_FORMS)}")
    known = ("static", "masterslave", "multicast", "failover", *sorted(_BRIDGE_PROTOCOLS))
    if scheme not in known and scheme.lower() in known:
        raise ValueError(f"write the scheme {scheme + ':'!r} in lower case, as ActiveMQ does")
    if scheme == "multicast":
        try:
            parse_multicast_uri(text)
        except DiscoveryUriError as exc:
            raise ValueError(str(exc)) from None
        return
    if scheme in ("static", "masterslave", "failover", *_BRIDGE_PROTOCOLS):
        # The same parser the network manager plans its bridges with.
        from meshmq.connector_uri import check_uri

        check_uri(text)
        return
    raise ValueError(f"unknown network connector scheme {scheme + ':'!r} in {uri!r}; "
                     f"expected one of {', '.join(_URI_FORMS)}")


def split_listener_url(url: str) -> tuple[str, str, int, str]:
    """``"stomp+nio://0.0.0.0:61613?a=b"`` -> ``("stomp", "0.0.0.0", 61613, "a=b")``.

    The protocol is returned as written apart from aliases (``stomp+nio``);
    callers validate it. Raises ``ValueError`` with a readable reason.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"not a listener URL like 'stomp://127.0.0.1:61613': {url!r}")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"a listener URL has no path or fragment: {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"port out of range 0-65535 in {url!r}") from None
    if port is None or not parts.hostname:
        raise ValueError(f"listener URL needs host:port: {url!r}")
    scheme = parts.scheme.lower()
    return _SCHEME_ALIASES.get(scheme, scheme), parts.hostname, port, parts.query


# ---------------------------------------------------------------------------
# TOML


def load_toml(path: Path) -> BrokerConfig:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc.reason}", file=str(path)) from None
    return loads_toml(text, file=str(path), base_dir=path.absolute().parent)


_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)$")


def loads_toml(text: str, *, file: str | None = None, base_dir: Path | None = None
               ) -> BrokerConfig:
    """Parse and validate TOML text; ``base_dir`` anchors relative paths."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _TOML_AT.search(message)
        # "(at end of document)": blame the last line that has something on it.
        line = int(m.group(1)) if m else text.rstrip().count("\n") + 1
        message = _TOML_AT.sub("", message).replace(" (at end of document)", "")
        raise ConfigError(f"TOML syntax error: {message}", file=file, line=line) from None
    source = Source(file=file, base_dir=base_dir, lines=toml_positions(text))
    return build_config(raw, source)


def toml_positions(text: str) -> dict[str, int]:
    """Map each table and key of syntactically valid TOML to its 1-based line.

    Paths look like ``stomp.max_frame_size``, ``listeners[1].port`` and
    ``auth.anonymous_groups[0]``. Best effort: on anything unexpected the map
    built so far is returned (tomllib has already vouched for the syntax).
    """
    scanner = _TomlScanner(text)
    try:
        scanner.document()
    except (IndexError, ValueError):
        pass
    return scanner.lines


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]*")  # numbers, booleans, dates: up to the next delimiter


class _TomlScanner:
    """Walks TOML structure (tables, keys, nested values) without building values."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.lines: dict[str, int] = {}
        self.array_tables: dict[str, int] = {}  # indexed path -> elements seen

    def line(self) -> int:
        return bisect.bisect_left(self.newlines, self.i) + 1

    def record(self, path: str) -> None:
        self.lines.setdefault(path, self.line())

    def document(self) -> None:
        table = ""
        while True:
            self.skip(newlines=True)
            if self.i >= len(self.s):
                return
            if self.s[self.i] == "[":
                double = self.s.startswith("[[", self.i)
                self.i += 2 if double else 1
                start_line = self.line()
                table = self.header(self.keys(), double)
                self.lines.setdefault(table, start_line)
                self.i = self.s.index("]", self.i) + (2 if double else 1)
            else:
                path = self.dotted(table, self.keys())
                self.record(path)
                self.skip()
                self.i += 1  # "="
                self.value(path)

    def header(self, keys: list[str], double: bool) -> str:
        path = ""
        for n, key in enumerate(keys):
            path = _join(path, key)
            if double and n == len(keys) - 1:
                self.array_tables[path] = self.array_tables.get(path, 0) + 1
                path = f"{path}[{self.array_tables[path] - 1}]"
            elif path in self.array_tables:  # [a.b] after [[a]] is inside a's last element
                path = f"{path}[{self.array_tables[path] - 1}]"
        return path

    @staticmethod
    def dotted(table: str, keys: list[str]) -> str:
        path = table
        for key in keys:
            path = _join(path, key)
        return path

    def skip(self, newlines: bool = False) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            else:
                return

    def keys(self) -> list[str]:
        keys = []
        while True:
            self.skip()
            c = self.s[self.i]
            if c in "\"'":
                start = self.i + 1
                self.string()
                keys.append(self.s[start:self.i - 1])
            else:
                m = _BARE_KEY.match(self.s, self.i)
                if m is None:
                    raise ValueError("bad key")
                keys.append(m.group())
                self.i = m.end()
            self.skip()
            if self.s[self.i] != ".":
                return keys
            self.i += 1

    def string(self) -> None:
        s, q = self.s, self.s[self.i]
        if s.startswith(q * 3, self.i):
            self.i += 3
            while not s.startswith(q * 3, self.i):
                self.i += 2 if (q == '"' and s[self.i] == "\\") else 1
            self.i += 3
            while self.i < len(s) and s[self.i] == q:  # up to two quotes may end the content
                self.i += 1
            return
        self.i += 1
        while s[self.i] != q:
            self.i += 2 if (q == '"' and s[self.i] == "\\") else 1
        self.i += 1

    def value(self, path: str) -> None:
        self.skip()
        c = self.s[self.i]
        if c in "\"'":
            self.string()
        elif c == "[":
            self.i += 1
            n = 0
            while True:
                self.skip(newlines=True)
                if self.s[self.i] == "]":
                    self.i += 1
                    return
                self.record(f"{path}[{n}]")
                self.value(f"{path}[{n}]")
                self.skip(newlines=True)
                if self.s[self.i] == ",":
                    self.i += 1
                n += 1
        elif c == "{":
            self.i += 1
            while True:
                self.skip()
                if self.s[self.i] == "}":
                    self.i += 1
                    return
                key_path = self.dotted(path, self.keys())
                self.record(key_path)
                self.skip()
                self.i += 1  # "="
                self.value(key_path)
                self.skip()
                if self.s[self.i] == ",":
                    self.i += 1
        else:
            m = _SCALAR.match(self.s, self.i)
            assert m is not None  # the pattern matches the empty string at worst
            self.i = m.end()

