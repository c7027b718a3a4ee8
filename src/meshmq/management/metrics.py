"""The broker's figures as Prometheus metrics, read at scrape time.

:class:`BrokerCollector` turns what ``/api/stat`` already gathers (the core broker's
statistics, the network bridges, the HA role, the store's figures) and the trace
recorder's counters into metric families when ``GET /metrics`` asks, so nothing is added
to the per-message path. The one measurement taken on the write path is the store sync
latency histogram (:func:`sync_histogram`), observed once per durable-sync window.

A shard of a node adds its links to the other shards (``meshmq_shard_link_*``, label
``peer``); the node's endpoint (node/metrics.py) adds the ``shard`` label to them.

Per-destination series are bounded (``[management.metrics]``): destinations the
patterns name, up to ``max_destinations`` in name order, get series of their own; the
rest are summed into ``destination="_other"`` (one series per type).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from meshmq.config.model import MetricsConfig
from meshmq.core.destinations import name_matches
from meshmq.ha.roles import Role
from meshmq.network.bridge_state import BridgeState

if TYPE_CHECKING:
    from meshmq.management.host import ManagementHost

OTHER = "_other"
STANDALONE = "standalone"
SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# Per-destination figures: (statistics key, metric name, help, counter?).
_DESTINATION_FIGURES = (
    ("depth", "meshmq_destination_messages", "Messages waiting (queues; 0 for topics)",
     False),
    ("enqueued", "meshmq_destination_enqueued", "Messages sent to the destination", True),
    ("dequeued", "meshmq_destination_dequeued",
     "Messages consumed and acknowledged (topics: delivered)", True),
    ("dispatched", "meshmq_destination_dispatched", "Messages handed to consumers", True),
    ("expired", "meshmq_destination_expired", "Messages that expired", True),
    ("dead_lettered", "meshmq_destination_dead_lettered",
     "Messages moved to a dead letter queue", True),
    ("consumers", "meshmq_destination_consumers", "Consumers subscribed", False),
    ("producers", "meshmq_destination_producers", "Producers sending to it", False),
    ("inflight", "meshmq_destination_inflight_messages",
     "Messages dispatched and not yet acknowledged", False),
    ("memory", "meshmq_destination_memory_bytes", "Message bytes held in memory", False),
)
_BRIDGE_LABELS = ("connector", "peer", "direction")
# A shard's links to its peers (``ShardPeers.summary()``): (key, metric name, help, counter?).
_SHARD_LINK_FIGURES = (
    ("up", "meshmq_shard_link_up", "1 while the link to the peer shard is up", False),
    ("sent", "meshmq_shard_link_sent",
     "Sends forwarded to the peer shard, the destination's owner (first tries)", True),
    ("retried", "meshmq_shard_link_retried",
     "Sends the owning peer refused (on_limit = fail, a destination's own limit), "
     "sent again", True),
    ("delivered_out", "meshmq_shard_link_delivered_out",
     "Deliveries to the peer's consumers of destinations owned here", True),
    ("delivered_in", "meshmq_shard_link_delivered_in",
     "Deliveries from the owning peer to consumers connected here", True),
    ("unsettled_sends", "meshmq_shard_link_unsettled_sends",
     "Sends to the peer it has not stored yet", False),
    ("parked", "meshmq_shard_link_parked",
     "The peer's sends parked here at this shard's memory limit", False),
    ("parked_total", "meshmq_shard_link_parked_sends",
     "The peer's sends ever parked here at this shard's memory limit", True),
    ("link_pauses", "meshmq_shard_link_pauses", "Times the link's write buffer filled",
     True),
    ("holds_out", "meshmq_shard_link_holds_out",
     "Times this shard, the owner, asked the peer to hold its producers of a slow "
     "destination", True),
    ("holds_in", "meshmq_shard_link_holds_in",
     "Times the owning peer asked this shard to hold its producers of a slow "
     "destination", True),
    ("writes", "meshmq_shard_link_writes", "Writes on the link", True),
)


def sync_histogram() -> Histogram:
    """The store sync latency histogram of one runtime (registered in no global registry:
    several brokers may share a process)."""
    return Histogram("meshmq_store_sync_seconds",
                     "Time the broker waited for the store to make a write durable",
                     registry=None, buckets=SYNC_BUCKETS)


def select_destinations(destinations: Sequence[Mapping[str, Any]], config: MetricsConfig
                        ) -> tuple[list[Mapping[str, Any]], dict[str, dict[str, int]]]:
    """The destinations that get series of their own, and the others summed per type."""
    kept: list[Mapping[str, Any]] = []
    other: dict[str, dict[str, int]] = {}
    for dest in sorted(destinations, key=lambda d: (str(d["name"]), str(d["type"]))):
        named = not config.destinations or any(name_matches(p, str(dest["name"]))
                                                for p in config.destinations)
        if named and len(kept) < config.max_destinations:
            kept.append(dest)
            continue
        sums = other.setdefault(str(dest["type"]), {})
        for key, *_ in _DESTINATION_FIGURES:
            sums[key] = sums.get(key, 0) + int(dest.get(key, 0))
    return kept, other


class BrokerCollector(Collector):
    """Every ``meshmq_*`` metric of one broker runtime, read when collected."""

    def __init__(self, runtime: ManagementHost) -> None:
        self.runtime = runtime

    def collect(self) -> Iterable[Metric]:
        runtime = self.runtime
        stat: dict[str, Any] = runtime.statistics()
        yield from self._broker(stat)
        yield from self._destinations(stat["destinations"])
        yield from self._bridges(stat["network"]["bridges"])
        yield from self._store(stat["store"], stat.get("persistent_refused"))
        yield from self._ha(stat["ha"])
        links = runtime.shard_links()
        if links is not None:
            yield from self._shard_links(links)
        yield CounterMetricFamily("meshmq_trace_events_written",
                                  "Message trace events written to trace files",
                                  value=runtime.trace_events_written)
        yield CounterMetricFamily("meshmq_trace_events_dropped",
                                  "Message trace events lost to a failed trace write",
                                  value=runtime.trace_events_dropped)

    def _broker(self, stat: Mapping[str, Any]) -> Iterator[Metric]:
        runtime = self.runtime
        yield GaugeMetricFamily("meshmq_uptime_seconds", "Seconds since the broker started",
                                value=stat["uptime_ms"] / 1000)
        conns = GaugeMetricFamily("meshmq_connections",
                                  "Open client connections per listener",
                                  labels=("listener", "protocol"))
        protocols = {lst.name: lst.protocol for lst in runtime.config.listeners}
        for name, count in sorted(runtime.connections_by_listener().items()):
            conns.add_metric((name, protocols.get(name, "")), count)
        yield conns
        memory = stat["memory"]
        yield GaugeMetricFamily("meshmq_memory_used_bytes",
                                "Message bytes held in memory", value=memory["used"])
        yield GaugeMetricFamily("meshmq_memory_limit_bytes",
                                "Memory limit for messages ([usage] memory_limit)",
                                value=memory["limit"])
        dests = stat["destinations"]
        yield CounterMetricFamily("meshmq_messages_enqueued", "Messages sent to any destination",
                                  value=sum(int(d["enqueued"]) for d in dests))
        yield CounterMetricFamily("meshmq_messages_dequeued",
                                  "Messages consumed from any destination",
                                  value=sum(int(d["dequeued"]) for d in dests))
        yield CounterMetricFamily("meshmq_denied", "Operations refused by authorization",
                                  value=stat["denied"]["total"])
        yield CounterMetricFamily("meshmq_login_failures", "Failed logins",
                                  value=stat.get("failed_logins", 0))

    def _destinations(self, dests: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
        kept, other = select_destinations(dests, self.runtime.config.management.metrics)
        labels = ("destination", "type")
        for key, name, help_text, counter in _DESTINATION_FIGURES:
            family: GaugeMetricFamily | CounterMetricFamily = (
                CounterMetricFamily(name, help_text, labels=labels) if counter
                else GaugeMetricFamily(name, help_text, labels=labels))
            for dest in kept:
                family.add_metric((str(dest["name"]), str(dest["type"])), int(dest.get(key, 0)))
            for kind, sums in sorted(other.items()):
                family.add_metric((OTHER, kind), sums[key])
            yield family

    def _bridges(self, bridges: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
        state = GaugeMetricFamily("meshmq_bridge_state",
                                  "1 for the bridge's current state, 0 for the others",
                                  labels=(*_BRIDGE_LABELS, "state"))
        figures: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "forwarded": CounterMetricFamily("meshmq_bridge_forwarded",
                                             "Messages sent to the remote broker",
                                             labels=_BRIDGE_LABELS),
            "acknowledged": CounterMetricFamily("meshmq_bridge_acknowledged",
                                                "Forwarded messages settled by the remote",
                                                labels=_BRIDGE_LABELS),
            "received": CounterMetricFamily("meshmq_bridge_received",
                                            "Messages the remote broker forwarded here",
                                            labels=_BRIDGE_LABELS),
            "refused": CounterMetricFamily("meshmq_bridge_refused",
                                           "Messages the link's user may not send there",
                                           labels=_BRIDGE_LABELS),
            "inflight": GaugeMetricFamily("meshmq_bridge_inflight_messages",
                                          "Forwarded messages not yet settled",
                                          labels=_BRIDGE_LABELS),
            "connects": CounterMetricFamily("meshmq_bridge_connects",
                                            "Links established (reconnects included)",
                                            labels=_BRIDGE_LABELS),
            "holds_sent": CounterMetricFamily(
                "meshmq_bridge_holds_sent",
                "Times this broker asked the remote to hold a destination (push-back)",
                labels=_BRIDGE_LABELS),
            "holds_received": CounterMetricFamily(
                "meshmq_bridge_holds_received",
                "Times the remote asked this broker to hold a destination (push-back)",
                labels=_BRIDGE_LABELS),
        }
        held = GaugeMetricFamily("meshmq_bridge_held_destinations",
                                 "Destinations the remote asks this broker not to forward now",
                                 labels=_BRIDGE_LABELS)
        last_error = InfoMetricFamily("meshmq_bridge_last_error",
                                      "Kind of the bridge's last error",
                                      labels=_BRIDGE_LABELS)
        seen: set[tuple[str, str, str]] = set()
        for bridge in bridges:
            # The remote broker's name; its configured address until it first answers.
            targets = bridge.get("targets") or [""]
            key = (str(bridge.get("connector", "")),
                   str(bridge.get("remote_broker") or targets[0]),
                   str(bridge.get("direction", "")))
            if key in seen:
                continue  # two links to one unnamed peer: one series set, never duplicates
            seen.add(key)
            current = str(bridge.get("state", ""))
            for name in [s.value for s in BridgeState] + (
                    [] if current in BridgeState._value2member_map_ else [current]):
                state.add_metric((*key, name), 1 if name == current else 0)
            for field, family in figures.items():
                family.add_metric(key, int(bridge.get(field, 0)))
            held.add_metric(key, len(bridge.get("held") or ()))
            error = bridge.get("last_error")
            if error:
                last_error.add_metric(key, {"kind": str(error.get("kind", ""))})
        yield state
        yield from figures.values()
        yield held
        yield last_error

    def _store(self, store: Mapping[str, Any], refusing: object) -> Iterator[Metric]:
        runtime = self.runtime
        if "disk_bytes" in store:
            yield GaugeMetricFamily("meshmq_store_disk_bytes", "Bytes of the journal on disk",
                                    value=store["disk_bytes"])
        if "segments" in store:
            yield GaugeMetricFamily("meshmq_store_segments", "Journal segment files",
                                    value=store["segments"])
        if "bytes_written" in store:
            yield CounterMetricFamily("meshmq_store_written_bytes",
                                      "Bytes written to the journal",
                                      value=store["bytes_written"])
        if "syncs" in store:
            yield CounterMetricFamily("meshmq_store_syncs", "Journal syncs (fsync groups)",
                                      value=store["syncs"])
        if "inline_syncs" in store:
            yield CounterMetricFamily("meshmq_store_inline_syncs",
                                      "Journal syncs the event loop did itself, the writer "
                                      "thread being idle (no thread hop)",
                                      value=store["inline_syncs"])
        yield GaugeMetricFamily("meshmq_store_limit_bytes",
                                "Store size at which persistent messages are refused "
                                "(0: no limit)", value=runtime.config.store.max_disk_bytes)
        yield GaugeMetricFamily("meshmq_store_refusing_persistent",
                                "1 while the store refuses new persistent messages",
                                value=1 if refusing else 0)
        yield from runtime.sync_seconds.collect()

    @staticmethod
    def _shard_links(links: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
        for key, name, help_text, counter in _SHARD_LINK_FIGURES:
            family: GaugeMetricFamily | CounterMetricFamily = (
                CounterMetricFamily(name, help_text, labels=("peer",)) if counter
                else GaugeMetricFamily(name, help_text, labels=("peer",)))
            for link in links:
                family.add_metric((str(link.get("shard", "")),), int(link.get(key, 0) or 0))
            yield family

    @staticmethod
    def _ha(ha: Mapping[str, Any]) -> Iterator[Metric]:
        role = GaugeMetricFamily("meshmq_ha_role", "1 for the broker's current HA role",
                                 labels=("mode", "role"))
        current = str(ha.get("role", STANDALONE))
        mode = str(ha.get("mode", "none"))
        names = [r.value for r in Role] if mode != "none" else []
        for name in [*names, *([current] if current not in names else [])]:
            role.add_metric((mode, name), 1 if name == current else 0)
        yield role
        yield GaugeMetricFamily("meshmq_ha_epoch", "Lease epoch (replicated: term)",
                                value=int(ha.get("epoch", 0) or 0))
