"""The ``multicast://`` discovery URI: what a network connector's or a transport
connector's ``discoveryUri`` asks for (group address and port, group name, beat interval,
and the reconnect options for the bridges it leads to).

A grammar, kept beside ``meshmq.uri`` so that the configuration checks it without
importing the network package (src/meshmq/network/discovery.py runs the agent).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import urllib.parse
from dataclasses import dataclass, field
from typing import Final

DEFAULT_GROUP_ADDRESS: Final = "239.255.2.3"
DEFAULT_PORT: Final = 6155
DEFAULT_GROUP: Final = "default"
MAX_STRING: Final = 0xFFFF  # a string in a discovery beat (and so a group name)
MAX_INTERVAL_MS: Final = 0xFFFFFFFF  # a beat carries its interval in 4 bytes


class DiscoveryUriError(ValueError):
    """A bad ``multicast://`` URI; the message names the bad part."""


# ---------------------------------------------------------------------------
# The URI


@dataclass(frozen=True, slots=True)
class MulticastSettings:
    """A parsed ``multicast://`` URI. Times in milliseconds."""

    address: str = DEFAULT_GROUP_ADDRESS
    port: int = DEFAULT_PORT
    group: str = DEFAULT_GROUP
    keepalive_interval_ms: int = 500
    time_to_live: int = 1
    interface: str | None = None  # local IPv4 address to send from and join on
    # For the connector acting on what is discovered (ActiveMQ's names and defaults).
    initial_reconnect_delay_ms: int = 5000
    max_reconnect_delay_ms: int = 30_000
    use_exponential_backoff: bool = False
    backoff_multiplier: float = 2.0
    max_reconnect_attempts: int = 0  # ActiveMQ's meaning: 0 for ever
    discovered_options: dict[str, str] = field(default_factory=dict)  # "discovered." removed


# option -> (settings field, kind, minimum)
_OPTIONS: dict[str, tuple[str, str, float | None]] = {
    "group": ("group", "str", None),
    "keepAliveInterval": ("keepalive_interval_ms", "int", 1),
    "timeToLive": ("time_to_live", "int", 0),
    "interface": ("interface", "ipv4", None),
    "initialReconnectDelay": ("initial_reconnect_delay_ms", "int", 0),
    "maxReconnectDelay": ("max_reconnect_delay_ms", "int", 0),
    "useExponentialBackOff": ("use_exponential_backoff", "bool", None),
    "backOffMultiplier": ("backoff_multiplier", "float", 1.0),
    "maxReconnectAttempts": ("max_reconnect_attempts", "int", -1),
}
_DISCOVERED_PREFIX = "discovered."


def parse_multicast_uri(uri: str) -> MulticastSettings:
    """Parse ``multicast://default`` or ``multicast://<group address>:<port>?options``.

    Raises ``DiscoveryUriError`` naming the bad part.
    """
    text = uri.strip()
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise DiscoveryUriError(f"not a multicast:// URI: {uri!r} ({exc})") from None
    if parts.scheme.lower() != "multicast" or not text.lower().startswith("multicast://"):
        raise DiscoveryUriError(f"not a multicast:// URI: {uri!r}")
    if parts.path not in ("", "/") or parts.fragment:
        raise DiscoveryUriError(f"a multicast URI has no path or fragment: {uri!r}")
    try:
        port = parts.port
    except ValueError:
        raise DiscoveryUriError(f"port out of range 0-65535 in {uri!r}") from None
    host = parts.hostname or ""
    if parts.username is not None or parts.password is not None:
        raise DiscoveryUriError(f"a multicast URI has no user or password: {uri!r}")
    if host in ("", DEFAULT_GROUP):  # ActiveMQ: "default" (or no host) = 239.255.2.3
        address = DEFAULT_GROUP_ADDRESS
    else:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise DiscoveryUriError(
                f"group address {host!r} is not an IPv4 multicast address "
                f"(224.0.0.0-239.255.255.255) or 'default'") from None
        if ip.version != 4 or not ip.is_multicast:
            raise DiscoveryUriError(
                f"group address {host!r} is not an IPv4 multicast address "
                "(224.0.0.0-239.255.255.255)")
        address = str(ip)
    if port == 0:
        raise DiscoveryUriError(f"port 0 is not a group port: {uri!r}")
    values: dict[str, object] = {"address": address, "port": port or DEFAULT_PORT}
    discovered: dict[str, str] = {}
    for option, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True,
                                                strict_parsing=False):
        if option.startswith(_DISCOVERED_PREFIX) and len(option) > len(_DISCOVERED_PREFIX):
            discovered[option[len(_DISCOVERED_PREFIX):]] = value
            continue
        if option not in _OPTIONS:
            close = difflib.get_close_matches(option, sorted(_OPTIONS), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f" (known: {', '.join(sorted(_OPTIONS))})")
            raise DiscoveryUriError(f"unknown multicast URI option {option!r}{hint}")
        name, kind, low = _OPTIONS[option]
        values[name] = _option_value(option, value, kind, low)
    settings = MulticastSettings(**values, discovered_options=discovered)  # type: ignore[arg-type]
    if settings.keepalive_interval_ms > MAX_INTERVAL_MS:
        raise DiscoveryUriError(f"option keepAliveInterval must be <= {MAX_INTERVAL_MS}, "
                                f"got {settings.keepalive_interval_ms}")
    if settings.time_to_live > 255:
        raise DiscoveryUriError(f"option timeToLive must be <= 255, got {settings.time_to_live}")
    if not settings.group.strip() or len(settings.group.encode()) > MAX_STRING:
        raise DiscoveryUriError("option group must be a non-empty name")
    return settings


def _option_value(option: str, value: str, kind: str, low: float | None) -> object:
    parsed: object
    if kind == "str":
        return value
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise DiscoveryUriError(f"option {option} must be true or false, got {value!r}")
        return value.lower() == "true"
    if kind == "ipv4":
        try:
            return str(ipaddress.IPv4Address(value))
        except ValueError:
            raise DiscoveryUriError(
                f"option {option} must be a local IPv4 address, got {value!r}") from None
    try:
        parsed = int(value) if kind == "int" else float(value)
    except ValueError:
        raise DiscoveryUriError(
            f"option {option} must be {'an integer' if kind == 'int' else 'a number'}, "
            f"got {value!r}") from None
    if isinstance(parsed, float) and not math.isfinite(parsed):
        raise DiscoveryUriError(f"option {option} must be a finite number, got {value!r}")
    if low is not None and parsed < low:
        raise DiscoveryUriError(f"option {option} must be >= {low}, got {value}")
    return parsed
