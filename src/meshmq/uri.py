"""The one URI grammar of meshmq: transport URIs and composite (failover, network) URIs.

Pure and typed: text in, a small immutable tree out, and back (``format_uri``).

* A **simple URI** names one endpoint: ``scheme://host[:port][/path][?query]``, for the
  schemes in :data:`SIMPLE_SCHEMES` (``tcp``, ``ssl``, ``stomp+ssl``, ``mqtts``, ``ws``,
  ``multicast``, ...). IPv6 hosts are written in brackets (``tcp://[::1]:61616``).
* A **composite URI** wraps a list of URIs: ``failover:(a,b)?opts``, ``static:(a,b)``,
  ``masterslave:(a,b)``, ``discovery:(multicast://default)``; components may be composite
  themselves (``static:(failover:(a,b)?randomize=false)``). As in ActiveMQ, the bare form
  ``failover:a,b`` (and ``static:failover:(a,b)?x=y``) splits the rest at top-level
  commas and has no options of its own: a trailing ``?query`` belongs to the last
  component. ``scheme://(...)`` is accepted for ``scheme:(...)``.

Options are an ordered, immutable ``str -> str`` mapping (:class:`Options`);
percent-escapes are decoded when parsing and written back by ``format_uri`` for
characters that would otherwise end a component (``&=?#,()%`` and white space). What an
option *means* (``nested.*``, defaults, types) is left to the consumer.

``parse_uri(format_uri(u)) == u`` for every tree; ``format_uri`` writes the canonical
form (``failover:a,b`` comes back as ``failover:(a,b)``). Every error is a
:class:`URIError` naming the offending part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias
from urllib.parse import quote, unquote

from meshmq.errors import MeshmqError

__all__ = [
    "COMPOSITE_SCHEMES",
    "SIMPLE_SCHEMES",
    "URI",
    "CompositeURI",
    "Options",
    "SimpleURI",
    "URIError",
    "format_uri",
    "parse_uri",
]

#: Schemes naming a single endpoint. ``+ssl``/``+nio`` variants follow ActiveMQ's
#: transport connector names; ``mqtts`` is the usual MQTT-over-TLS spelling.
SIMPLE_SCHEMES: frozenset[str] = frozenset({
    "tcp", "ssl", "nio", "nio+ssl", "auto", "auto+ssl", "auto+nio", "auto+nio+ssl",
    "stomp", "stomp+ssl", "stomp+nio", "stomp+nio+ssl",
    "mqtt", "mqtts", "mqtt+ssl", "mqtt+nio", "mqtt+nio+ssl",
    "ws", "wss", "multicast",
})
#: Schemes whose body is a list of URIs.
COMPOSITE_SCHEMES: frozenset[str] = frozenset({"failover", "static", "masterslave",
                                               "discovery"})

_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_HOST_RE = re.compile(r"[A-Za-z0-9_.~-]+")
_IPV6_RE = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.~-]+)?")
_PATH_RE = re.compile(r"/[A-Za-z0-9_.~!$'*+;:@/-]*")
# Characters that would end a component or an option if written raw.
_SAFE = "!$'*+/:;@~-._[]"


class URIError(MeshmqError):
    """A URI that does not parse, or an option that is not allowed; names the bad part."""

    code = "invalid-uri"

    def __init__(self, uri: str, part: str, reason: str) -> None:
        self.uri = uri
        self.part = part
        self.reason = reason
        shown = f" ({part!r})" if part and part != uri else ""
        super().__init__(f"bad URI {uri!r}: {reason}{shown}")


class Options(Mapping[str, str]):
    """An immutable, ordered ``str -> str`` mapping; equality is order-sensitive.

    Built from pairs; a repeated key is an error (the URI would be ambiguous).
    """

    __slots__ = ("_index", "_pairs")

    def __init__(self, pairs: Iterable[tuple[str, str]] | Mapping[str, str] = ()) -> None:
        items = tuple(pairs.items() if isinstance(pairs, Mapping) else pairs)
        index: dict[str, str] = {}
        for key, value in items:
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"option {key!r}={value!r}: keys and values must be str")
            if key in index:
                raise ValueError(f"option {key!r} given twice")
            index[key] = value
        self._pairs = items
        self._index = index

    def __getitem__(self, key: str) -> str:
        return self._index[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._pairs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Options):
            return self._pairs == other._pairs
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"Options({dict(self._pairs)!r})"

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return self._pairs

    def with_prefix(self, prefix: str) -> Options:
        """The options whose key starts with ``prefix``, with the prefix removed
        (``opts.with_prefix("nested.")``)."""
        return Options((k[len(prefix):], v) for k, v in self._pairs
                       if k.startswith(prefix) and len(k) > len(prefix))

    def without_prefix(self, prefix: str) -> Options:
        return Options((k, v) for k, v in self._pairs if not k.startswith(prefix))

    def merged(self, other: Mapping[str, str]) -> Options:
        """These options, overridden/extended by ``other`` (existing keys keep their place)."""
        result = dict(self._pairs)
        result.update(other)
        return Options(result)


@dataclass(frozen=True, slots=True)
class SimpleURI:
    """One endpoint. ``host`` is stored without IPv6 brackets; ``port`` None = not given."""

    scheme: str
    host: str
    port: int | None = None
    path: str = ""
    options: Options = field(default_factory=Options)

    @property
    def address(self) -> tuple[str, int | None]:
        return self.host, self.port

    def __str__(self) -> str:
        return format_uri(self)


@dataclass(frozen=True, slots=True)
class CompositeURI:
    """A list of URIs under one scheme (failover, static, masterslave, discovery)."""

    scheme: str
    components: tuple[URI, ...]
    options: Options = field(default_factory=Options)

    def __str__(self) -> str:
        return format_uri(self)


URI: TypeAlias = SimpleURI | CompositeURI


# --------------------------------------------------------------------------- parsing


def parse_uri(text: str) -> URI:
    """Parse ``text`` into a :class:`SimpleURI` or :class:`CompositeURI` tree."""
    if not isinstance(text, str):
        raise TypeError(f"a URI must be a str, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise URIError(text, "", "empty URI")
    return _parse(stripped, text)


def _parse(text: str, whole: str) -> URI:
    scheme, sep, rest = text.partition(":")
    if not sep or not scheme:
        raise URIError(whole, text, "missing scheme (expected e.g. tcp://host:port)")
    if not _SCHEME_RE.fullmatch(scheme):
        raise URIError(whole, scheme, "invalid scheme")
    lowered = scheme.lower()
    if lowered in COMPOSITE_SCHEMES:
        return _parse_composite(lowered, rest, text, whole)
    if lowered in SIMPLE_SCHEMES:
        return _parse_simple(lowered, rest, text, whole)
    raise URIError(whole, scheme, "unknown scheme; known: "
                   + ", ".join(sorted(SIMPLE_SCHEMES | COMPOSITE_SCHEMES)))


def _parse_composite(scheme: str, rest: str, text: str, whole: str) -> CompositeURI:
    body = rest[2:] if rest.startswith("//(") else rest
    if body.startswith("("):
        close = _matching_paren(body, whole)
        inner, tail = body[1:close], body[close + 1:]
        options = Options()
        if tail:
            if not tail.startswith("?"):
                raise URIError(whole, tail, "unexpected text after ')'")
            options = _parse_query(tail[1:], whole)
    else:
        if not body:
            raise URIError(whole, text, f"{scheme}: needs at least one URI")
        inner, options = body, Options()
    parts = _split_top_level(inner, whole)
    if not parts or all(not p.strip() for p in parts):
        raise URIError(whole, text, f"{scheme}: needs at least one URI")
    components = []
    for part in parts:
        if not part.strip():
            raise URIError(whole, inner, "empty URI in the list (stray comma?)")
        components.append(_parse(part.strip(), whole))
    return CompositeURI(scheme, tuple(components), options)


def _matching_paren(body: str, whole: str) -> int:
    depth = 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    raise URIError(whole, body, "unbalanced '(': no matching ')'")


def _split_top_level(inner: str, whole: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(inner):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise URIError(whole, inner, "unbalanced ')'")
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if depth != 0:
        raise URIError(whole, inner, "unbalanced '('")
    parts.append(inner[start:])
    return parts


def _parse_simple(scheme: str, rest: str, text: str, whole: str) -> SimpleURI:
    if not rest.startswith("//"):
        raise URIError(whole, text, f"expected {scheme}://host[:port]")
    rest = rest[2:]
    if "#" in rest:
        raise URIError(whole, rest[rest.index("#"):], "fragments are not allowed")
    rest, qmark, query = rest.partition("?")
    options = _parse_query(query, whole) if qmark else Options()
    slash = rest.find("/", rest.find("]") + 1 if rest.startswith("[") else 0)
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if path and not _PATH_RE.fullmatch(path):
        raise URIError(whole, path, "invalid characters in the path")
    if "@" in authority:
        raise URIError(whole, authority, "user information in the URI is not supported "
                       "(give credentials as client options)")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise URIError(whole, authority, "unterminated IPv6 address ('[' without ']')")
        host, after = authority[1:end], authority[end + 1:]
        if not host or not _IPV6_RE.fullmatch(host):
            raise URIError(whole, authority[:end + 1], "invalid IPv6 address")
        if after and not after.startswith(":"):
            raise URIError(whole, after, "unexpected text after the IPv6 address")
        port_text = after[1:] if after else None
    else:
        host, colon, port_part = authority.partition(":")
        port_text = port_part if colon else None
        if not host:
            raise URIError(whole, text, "missing host")
        if not _HOST_RE.fullmatch(host):
            raise URIError(whole, host, "invalid host name")
    port = None
    if port_text is not None:
        if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5 \
                or int(port_text) > 65535:
            raise URIError(whole, port_text, "port must be a number from 0 to 65535")
        port = int(port_text)
    return SimpleURI(scheme, host, port, path, options)


def _parse_query(query: str, whole: str) -> Options:
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    if not query:
        return Options()
    for item in query.split("&"):
        if not item:
            raise URIError(whole, query, "empty option (stray '&')")
        raw_key, eq, raw_value = item.partition("=")
        if not eq:
            raise URIError(whole, item, f"option {raw_key!r} has no value (expected name=value)")
        try:
            key = unquote(raw_key, errors="strict")
            value = unquote(raw_value, errors="strict")
        except UnicodeDecodeError:
            raise URIError(whole, item, "percent-escapes that are not UTF-8") from None
        if not key:
            raise URIError(whole, item, "option without a name")
        if key in seen:
            raise URIError(whole, item, f"option {key!r} given twice")
        seen.add(key)
        pairs.append((key, value))
    return Options(pairs)


# ------------------------------------------------------------------------ formatting


def format_uri(uri: URI) -> str:
    """The canonical text of ``uri``; ``parse_uri`` reads it back to an equal tree."""
    if isinstance(uri, CompositeURI):
        inner = ",".join(format_uri(c) for c in uri.components)
        return f"{uri.scheme}:({inner}){_format_query(uri.options)}"
    host = f"[{uri.host}]" if ":" in uri.host else uri.host
    port = "" if uri.port is None else f":{uri.port}"
    return f"{uri.scheme}://{host}{port}{uri.path}{_format_query(uri.options)}"


def _format_query(options: Options) -> str:
    if not options:
        return ""
    return "?" + "&".join(f"{quote(k, safe=_SAFE)}={quote(v, safe=_SAFE)}"
                          for k, v in options.pairs)
