"""``/api/jolokia``: the read subset of ActiveMQ's Jolokia API that monitoring scripts use
(Nagios check_jmx4perl, Checkmk, KEDA, Zabbix templates), so they work unchanged.

Served: ``GET /api/jolokia/read/<mbean>[/<attr>[,<attr>...]]``, ``POST /api/jolokia`` with
``{"type": "read", ...}`` (or a JSON array of them: a bulk request) and ``/version``. The
Broker mbean and the Queue/Topic mbeans are computed from ``Broker.statistics()``;
``*`` in a key's value is a pattern read, answered as Jolokia does (a map from the
canonical mbean name to its attributes). Errors follow Jolokia: HTTP 200 with
``status``/``error_type``/``error`` in the body."""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from meshmq import __version__
from meshmq.management.api import reply, runtime_of
from meshmq.management.routes_broker import client_connections, role_of, store_usage

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost

routes = web.RouteTableDef()

DOMAIN = "org.apache.activemq"
NOT_FOUND = "javax.management.InstanceNotFoundException"
NO_ATTRIBUTE = "javax.management.AttributeNotFoundException"
MALFORMED = "javax.management.MalformedObjectNameException"
BAD_REQUEST = "java.lang.IllegalArgumentException"


class JolokiaError(Exception):
    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


Figures = dict[str, Any]  # one destination's entry of Broker.statistics()


def _uptime_text(ms: int) -> str:
    """ActiveMQ's Uptime attribute: e.g. "1 hour 2 minutes" or "12.345 seconds"."""
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.3f} seconds"
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{int(n)} {unit}{'s' if n != 1 else ''}")
    return " ".join(parts)


def _canonical(props: dict[str, str]) -> str:
    """A JMX canonical name: the keys sorted."""
    return f"{DOMAIN}:" + ",".join(f"{k}={props[k]}" for k in sorted(props))


def broker_attributes(runtime: ManagementHost) -> dict[str, Callable[[], Any]]:
    broker = runtime.broker
    stat = broker.statistics()
    dests: list[Figures] = stat["destinations"]  # type: ignore[assignment]
    name = runtime.config.broker_name
    usage = broker.usage

    def names(kind: str) -> list[dict[str, str]]:
        return [{"objectName": _canonical({"type": "Broker", "brokerName": name,
                                           "destinationType": kind.title(),
                                           "destinationName": d["name"]})}
                for d in dests if d["type"] == kind]

    def total(key: str) -> int:
        return sum(int(d[key]) for d in dests)

    return {
        "BrokerName": lambda: name,
        "BrokerId": lambda: name,
        "BrokerVersion": lambda: __version__,
        "UptimeMillis": lambda: broker.now_ms() - broker.started_ms,
        "Uptime": lambda: _uptime_text(broker.now_ms() - broker.started_ms),
        "TotalEnqueueCount": lambda: total("enqueued"),
        "TotalDequeueCount": lambda: total("dequeued"),
        "TotalConsumerCount": lambda: total("consumers"),
        "TotalProducerCount": lambda: total("producers"),
        "TotalMessageCount": lambda: total("depth"),
        "CurrentConnectionsCount": lambda: client_connections(runtime),
        "TotalConnectionsCount": lambda: broker.client_connections_opened,
        "MemoryPercentUsage": lambda: int(usage.percent),
        "MemoryLimit": lambda: usage.limit,
        "StorePercentUsage": lambda: int(store_usage(runtime)["percent"]),
        "StoreLimit": lambda: runtime.config.store.max_disk_bytes,
        # meshmq keeps no temporary store: non-persistent messages stay in memory.
        "TempPercentUsage": lambda: 0,
        "TempLimit": lambda: 0,
        "Slave": lambda: role_of(runtime) == "slave",
        # As the store factory decides: persistent = false means a memory store.
        "Persistent": lambda: runtime.config.persistent
        and runtime.config.store.kind != "memory",
        "DataDirectory": lambda: str(runtime.config.data_directory),
        "Queues": lambda: names("queue"),
        "Topics": lambda: names("topic"),
    }


def destination_attributes(runtime: ManagementHost, d: Figures
                           ) -> dict[str, Callable[[], Any]]:
    limit = runtime.broker.usage.limit
    return {
        "Name": lambda: d["name"],
        "QueueSize": lambda: d["depth"],
        "EnqueueCount": lambda: d["enqueued"],
        "DequeueCount": lambda: d["dequeued"],
        "DispatchCount": lambda: d["dispatched"],
        "ExpiredCount": lambda: d["expired"],
        "InFlightCount": lambda: d["inflight"],
        "ConsumerCount": lambda: d["consumers"],
        "ProducerCount": lambda: d["producers"],
        "MemoryUsageByteCount": lambda: d["memory"],
        "MemoryPercentUsage": lambda: int(100 * d["memory"] / limit) if limit > 0 else 0,
        "MemoryLimit": lambda: limit,
        "DLQ": lambda: d["name"].startswith(("DLQ.", "ActiveMQ.DLQ")),
    }


def parse_name(text: str) -> dict[str, str]:
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        raise JolokiaError(400, MALFORMED, f"{MALFORMED} : Key properties cannot be empty "
                           f"(an mbean name is DOMAIN:key=value,..., got {text!r})")
    props: dict[str, str] = {"": domain}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key or not value:
            raise JolokiaError(400, MALFORMED, f"{MALFORMED} : key=value expected in "
                               f"{text!r}, got {part!r}")
        props[key] = value
    return props


def _matches(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern) if "*" in pattern or "?" in pattern \
        else pattern == value


def find_mbeans(runtime: ManagementHost, text: str
                ) -> tuple[bool, dict[str, dict[str, Callable[[], Any]]]]:
    """(is it a pattern, canonical name -> attributes) of the mbeans ``text`` names."""
    props = parse_name(text)
    pattern = any("*" in v or "?" in v for v in props.values())
    name = runtime.config.broker_name
    keys = set(props) - {""}
    found: dict[str, dict[str, Callable[[], Any]]] = {}
    if (_matches(props[""], DOMAIN) and _matches(props.get("type", ""), "Broker")
            and _matches(props.get("brokerName", ""), name)):
        if keys == {"type", "brokerName"}:
            found[_canonical({"type": "Broker", "brokerName": name})] = \
                broker_attributes(runtime)
        elif keys == {"type", "brokerName", "destinationType", "destinationName"}:
            stat = runtime.broker.statistics()
            for d in stat["destinations"]:  # type: ignore[attr-defined]
                kind = str(d["type"]).title()
                if _matches(props["destinationType"], kind) and _matches(
                        props["destinationName"], d["name"]):
                    found[_canonical({"type": "Broker", "brokerName": name,
                                      "destinationType": kind,
                                      "destinationName": d["name"]})] = \
                        destination_attributes(runtime, d)
    if not found:
        raise JolokiaError(404, NOT_FOUND, f"{NOT_FOUND} : {text}" if not pattern else
                           f"{NOT_FOUND} : No MBean found for pattern {text}")
    return pattern, found


def _values(attrs: dict[str, Callable[[], Any]], wanted: list[str] | None,
            mbean: str) -> dict[str, Any]:
    if wanted is None:
        return {k: get() for k, get in attrs.items()}
    missing = [a for a in wanted if a not in attrs]
    if missing:
        raise JolokiaError(404, NO_ATTRIBUTE, f"{NO_ATTRIBUTE} : No such attribute: "
                           f"{missing[0]} (mbean {mbean}; docs/operations.md lists the "
                           "supported attributes)")
    return {a: attrs[a]() for a in wanted}


def read(runtime: ManagementHost, request: dict[str, Any]) -> dict[str, Any]:
    """One Jolokia request's answer (success or error), as Jolokia shapes it."""
    try:
        kind = request.get("type")
        if kind == "version":
            value: Any = {"agent": f"meshmq {__version__}", "protocol": "7.2",
                          "info": {"product": "meshmq", "vendor": "meshmq",
                                   "version": __version__}}
        elif kind != "read":
            raise JolokiaError(400, BAD_REQUEST, f"{BAD_REQUEST} : request type {kind!r} is "
                               "not served: meshmq answers only \"read\" and \"version\" "
                               "(changes go through the admin API, /api/...)")
        else:
            mbean = request.get("mbean")
            if not isinstance(mbean, str):
                raise JolokiaError(400, BAD_REQUEST, f"{BAD_REQUEST} : a read needs "
                                   "\"mbean\", e.g. org.apache.activemq:type=Broker,"
                                   f"brokerName={runtime.config.broker_name}")
            attr = request.get("attribute")
            wanted: list[str] | None
            if not attr:  # None, "" or []: every attribute
                wanted = None
            elif isinstance(attr, str):
                wanted = attr.split(",") if "," in attr else [attr]
            elif isinstance(attr, list) and all(isinstance(a, str) for a in attr):
                wanted = attr
            else:
                raise JolokiaError(400, BAD_REQUEST, f"{BAD_REQUEST} : \"attribute\" must "
                                   "be a name or a list of names")
            pattern, found = find_mbeans(runtime, mbean)
            if pattern:
                value = {name: _values(attrs, wanted, name) for name, attrs in found.items()}
            else:
                (name, attrs), = found.items()
                values = _values(attrs, wanted, name)
                value = values[wanted[0]] if wanted is not None and len(wanted) == 1 \
                    and isinstance(attr, str) else values
    except JolokiaError as exc:
        return {"request": request, "error_type": exc.error_type, "error": exc.message,
                "status": exc.status}
    return {"request": request, "value": value, "timestamp": int(time.time()),
            "status": 200}


def split_path(path: str) -> list[str]:
    """A Jolokia GET path into its parts: ``/`` separates, ``!/`` is a slash inside a
    part and ``!!`` an exclamation mark."""
    parts, current, i = [], [], 0
    while i < len(path):
        ch = path[i]
        if ch == "!" and i + 1 < len(path):
            current.append(path[i + 1])
            i += 2
            continue
        if ch == "/":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p for p in parts if p]


@routes.get("/api/jolokia/read/{path:.+}")
async def get_read(request: web.Request) -> web.Response:
    parts = split_path(request.match_info["path"])
    body: dict[str, Any] = {"type": "read", "mbean": parts[0]}
    if len(parts) > 1:
        body["attribute"] = parts[1]
    return reply(read(runtime_of(request), body))


@routes.get("/api/jolokia/version")
async def get_version(request: web.Request) -> web.Response:
    return reply(read(runtime_of(request), {"type": "version"}))


@routes.post("/api/jolokia")
async def post(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    try:
        body = json.loads(await request.read() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return reply({"error_type": BAD_REQUEST, "status": 400,
                      "error": f"{BAD_REQUEST} : the body is not valid JSON: {exc}"})
    if isinstance(body, list) and all(isinstance(r, dict) for r in body):
        return reply([read(runtime, r) for r in body])
    if isinstance(body, dict):
        return reply(read(runtime, body))
    return reply({"error_type": BAD_REQUEST, "status": 400,
                  "error": f"{BAD_REQUEST} : the body must be a request object "
                  "{\"type\": \"read\", \"mbean\": ...} or a JSON array of them"})
