"""The network of brokers as one graph: this broker's links (``/api/peers``) and the map
assembled from every broker reachable from it (``/api/network/map``).

Each broker learns its peers' management URLs in the link handshake (``management_url``
in HELLO/WELCOME). The map walks them breadth-first with aiohttp's client and a short
timeout, so one slow or dead broker costs at most that timeout and shows as a node with
``reachable: false`` — never as an error of the whole map.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost
    from meshmq.network.bridge import Bridge
    from meshmq.network.responder import Responder

FETCH_TIMEOUT_S = 1.0
MAX_BROKERS = 64  # a bound on the walk (a network this size needs a better tool)


def _demand(end: Bridge | Responder) -> list[str]:
    fwd = end.forwarder
    if fwd is None:
        return []
    return sorted({str(demand.destination) for demand, _ in fwd.demands.values()})


def peers(runtime: ManagementHost) -> list[dict[str, Any]]:
    """One entry per link of this broker: outbound bridges (connected or not) and the
    inbound links other brokers opened."""
    out: list[dict[str, Any]] = []
    network = runtime.network
    for bridge in network.bridges:
        error = bridge.last_error
        out.append({
            "broker": bridge.remote or ", ".join(str(e) for e in bridge.endpoints),
            "management_url": bridge.remote_management_url,
            "via": f"bridge {bridge.name}", "direction": "outbound",
            "state": bridge.state.value, "duplex": bridge.config.duplex,
            "last_error_kind": error.get("kind") if isinstance(error, dict) else None,
            "demand": _demand(bridge)})
    for responder in sorted(network.inbound, key=lambda r: r.remote or ""):
        if not responder.ready:
            continue
        out.append({
            "broker": responder.remote, "management_url": responder.remote_management_url,
            "via": f"inbound link of connector {responder.connector}",
            "direction": "inbound", "state": "forwarding", "duplex": responder.duplex,
            "last_error_kind": None, "demand": _demand(responder)})
    return out


@dataclass
class RateMeter:
    """Messages per second of each broker, from the growth of its totals between two
    looks (the map is drawn again every second, so two looks are close)."""

    last: dict[str, tuple[float, int, int]] = field(default_factory=dict)

    def rates(self, broker: str, enqueued: int, dequeued: int) -> dict[str, float]:
        now = time.monotonic()
        before = self.last.get(broker)
        self.last[broker] = (now, enqueued, dequeued)
        if before is None or now <= before[0]:
            return {"enqueue_rate": 0.0, "dequeue_rate": 0.0}
        span = now - before[0]
        return {"enqueue_rate": round(max(0, enqueued - before[1]) / span, 1),
                "dequeue_rate": round(max(0, dequeued - before[2]) / span, 1)}


def _node(stat: dict[str, Any], url: str | None, meter: RateMeter) -> dict[str, Any]:
    dests = stat.get("destinations") or []
    enqueued = sum(int(d.get("enqueued", 0)) for d in dests if d.get("type") == "queue")
    dequeued = sum(int(d.get("dequeued", 0)) for d in dests if d.get("type") == "queue")
    broker = str(stat.get("broker", "?"))
    ha = stat.get("ha") if isinstance(stat.get("ha"), dict) else {}
    return {"broker": broker, "role": (ha or {}).get("role", "standalone"),
            "rates": {**meter.rates(broker, enqueued, dequeued), "enqueued": enqueued,
                      "dequeued": dequeued,
                      "depth": sum(int(d.get("depth", 0)) for d in dests),
                      "connections": stat.get("connections", 0)},
            "management_url": url, "reachable": True}


def _links_from_stat(stat: dict[str, Any]) -> list[dict[str, Any]]:
    """Links of a broker without ``/api/peers`` (an older version): its bridges as
    ``/api/stat`` lists them, without peer URLs (the walk stops there)."""
    network = stat.get("network") if isinstance(stat.get("network"), dict) else None
    out = []
    for b in (network or {}).get("bridges", []):
        error = b.get("last_error")
        out.append({"broker": b.get("remote_broker") or ", ".join(b.get("targets", [])),
                    "management_url": None, "direction": b.get("direction", "outbound"),
                    "state": b.get("state", "unknown"), "duplex": bool(b.get("duplex")),
                    "last_error_kind": error.get("kind") if isinstance(error, dict) else None,
                    "demand": []})
    return out


async def _fetch(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                 timeout: aiohttp.ClientTimeout) -> dict[str, Any] | None:
    """A peer's JSON document; None when that route is not there (an older version)."""
    async with session.get(url, headers=headers, timeout=timeout) as resp:
        if resp.status == 404:
            return None
        resp.raise_for_status()
        body = await resp.json()
        if not isinstance(body, dict):
            raise ValueError(f"{url} answered {type(body).__name__}, not an object")
        return body


async def _look(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                timeout: aiohttp.ClientTimeout
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    stat, peer_doc = await asyncio.gather(
        _fetch(session, f"{url}/api/stat", headers, timeout),
        _fetch(session, f"{url}/api/peers", headers, timeout))
    if stat is None:
        raise ValueError(f"{url} has no /api/stat")
    links = peer_doc.get("peers", []) if peer_doc is not None else _links_from_stat(stat)
    return stat, links


async def network_map(runtime: ManagementHost, meter: RateMeter,
                      authorization: str | None = None,
                      timeout: float = FETCH_TIMEOUT_S, *,
                      session: aiohttp.ClientSession | None = None,
                      stat: dict[str, Any] | None = None) -> dict[str, Any]:
    """The graph of every broker reachable from this one, breadth-first. The request's
    credentials are passed on (brokers of one network usually share their users).
    ``session`` keeps connections to the peers open from one map to the next; ``stat``
    is this broker's statistics when the caller has them already."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await network_map(runtime, meter, authorization, timeout, session=own,
                                     stat=stat)
    headers = {"Authorization": authorization} if authorization else {}
    own_url = runtime.network.management_url()
    nodes: dict[str, dict[str, Any]] = {}
    links_of: dict[str, list[dict[str, Any]]] = {}
    here = _node(stat if stat is not None else runtime.statistics(), own_url, meter)
    nodes[here["broker"]] = here
    links_of[here["broker"]] = peers(runtime)
    seen_urls = {own_url}
    frontier = [here["broker"]]
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    while frontier and len(nodes) < MAX_BROKERS:
        todo: dict[str, str | None] = {}
        for name in frontier:
            for link in links_of.get(name, []):
                peer, url = str(link["broker"]), link.get("management_url")
                if peer in nodes or peer in todo:
                    continue
                if url is not None and url in seen_urls:
                    continue
                todo[peer] = url
                seen_urls.add(url)
        frontier = []
        wanted = [(peer, url) for peer, url in todo.items() if url is not None]
        looks = await asyncio.gather(*(_look(session, url, headers, client_timeout)
                                       for _, url in wanted), return_exceptions=True)
        for (peer, url), look in zip(wanted, looks, strict=True):
            if isinstance(look, BaseException):
                nodes[peer] = _unreachable(peer, url, look)
                continue
            stat, links = look
            node = _node(stat, url, meter)
            nodes[peer] = node | {"broker": peer}
            links_of[peer] = links
            frontier.append(peer)
        for peer, url in todo.items():
            if url is None:
                nodes[peer] = _unreachable(peer, None, None)
    return {"broker": here["broker"], "at": time.time(),
            "nodes": sorted(nodes.values(), key=lambda n: n["broker"]),
            "edges": _edges(links_of)}


def _unreachable(peer: str, url: str | None, exc: BaseException | None) -> dict[str, Any]:
    if url is None:
        why = "its management URL is unknown (management off, or an older version)"
    elif isinstance(exc, TimeoutError):
        why = "no answer in time"
    else:
        why = str(exc) or type(exc).__name__
    return {"broker": peer, "role": None, "rates": None, "management_url": url,
            "reachable": False, "error": why}


def _edges(links_of: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One edge per pair of linked brokers, from the initiator to the responder. The
    initiator's bridge knows most (its state while down, its last error); the
    responder's inbound link stands in when the initiator could not be asked."""
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    for name, links in links_of.items():
        for link in links:
            peer = str(link["broker"])
            outbound = link.get("direction") == "outbound"
            key = (name, peer) if outbound else (peer, name)
            if key in edges and not outbound:
                continue
            edges[key] = {"from": key[0], "to": key[1], "state": link.get("state"),
                          "last_error_kind": link.get("last_error_kind"),
                          "duplex": bool(link.get("duplex")),
                          "demand": list(link.get("demand", []))}
    return [edges[k] for k in sorted(edges)]
