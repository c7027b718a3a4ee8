"""MQTT ``$SYS/broker/...`` statistics, mosquitto style, as retained messages.

Why in management: these are the broker's figures published for MQTT clients, the same
figures the admin API (``/api/stat``) and ``/metrics`` serve. They are computed from the
core's ``Broker.statistics()`` where they overlap, so "messages received" has one
definition: the enqueued count summed over the operator's destinations (the broker's
own ``$SYS`` and advisory topics excluded), as ``meshmq_messages_enqueued``.

The composition root starts the publisher when an MQTT listener can read the topics and
``[mqtt] sys_interval_ms`` is positive, and stops it before the listeners close. On a
node of shards the values are the node's (see :class:`SysTopics`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshmq.core.broker import Broker

SYS_TOPIC = "$SYS.broker."


# The figures behind the values, as numbers: what a shard reports to its node.
FIGURES = ("uptime_ms", "clients", "received", "sent", "stored", "heap")


def sys_figures(broker: Broker, stat: Mapping[str, Any]) -> dict[str, int]:
    """The broker's ``$SYS`` figures from ``stat`` (``Broker.statistics()``)."""
    dests = stat["destinations"]
    return {
        "uptime_ms": int(stat["uptime_ms"]),
        # Not the connections still being taken apart (see Broker.close_connection_step),
        # which the statistics' "connections" still counts, nor a node's shard links.
        "clients": sum(not c.closed and c.protocol != "shard"
                       for c in broker.connections.values()),
        "received": sum(int(d["enqueued"]) for d in dests),
        "sent": sum(int(d["dispatched"]) for d in dests),
        "stored": sum(int(d["depth"]) for d in dests),
        "heap": int(stat["memory"]["used"]),
    }


def node_figures(reports: Iterable[Mapping[str, Any]], uptime_ms: int) -> dict[str, int]:
    """A node's figures: its shards' latest reports summed (each destination has one
    owner, so nothing is counted twice), with the node's own uptime."""
    totals = dict.fromkeys(FIGURES, 0)
    for report in reports:
        for key in FIGURES:
            value = report.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] += value
    totals["uptime_ms"] = uptime_ms
    return totals


def values_of(figures: Mapping[str, int]) -> dict[str, str]:
    """Each ``$SYS/broker/<name>`` value."""
    from meshmq import __version__

    return {
        "version": f"meshmq {__version__}",
        "uptime": f"{int(figures['uptime_ms']) // 1000} seconds",
        "clients/connected": str(figures["clients"]),
        "messages/received": str(figures["received"]),
        "messages/sent": str(figures["sent"]),
        "store/messages/count": str(figures["stored"]),
        "heap/current": str(figures["heap"]),
    }


def sys_values(broker: Broker, stat: Mapping[str, Any]) -> dict[str, str]:
    """Each ``$SYS/broker/<name>`` value, from ``stat`` (``Broker.statistics()``)."""
    return values_of(sys_figures(broker, stat))


class SysTopics:
    """Publishes the ``$SYS`` values now and every ``interval_ms`` until stopped.

    ``pump``: deliver what the publication made ready (the subscribers' copies).

    A shard of a node publishes the node's figures, not its own: ``report`` gets its
    own figures every interval instead (the shard sends them to the supervisor), and
    ``own`` is False. The supervisor sums every shard's latest report and hands the
    sums to the front shard alone (:meth:`publish_node`), whose publication reaches
    every subscriber on any shard through the topics' owners: one value per
    interval, the node's.
    """

    def __init__(self, broker: Broker, interval_ms: int, pump: Callable[[], None]) -> None:
        self.broker = broker
        self.interval_ms = interval_ms
        self._pump = pump
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.report: Callable[[dict[str, int]], None] | None = None
        self.own = True

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.publish()

    def stop(self) -> None:
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def publish(self) -> None:
        """Publish every value once (retained, not persisted), or report the figures
        (a shard of a node), then schedule the next."""
        broker = self.broker
        figures = sys_figures(broker, broker.statistics())
        if self.report is not None:
            self.report(figures)
        if self.own:
            self._publish(figures)
        if self.interval_ms > 0 and self._loop is not None:
            self._timer = self._loop.call_later(self.interval_ms / 1000, self.publish)

    def publish_node(self, figures: Mapping[str, int]) -> None:
        """Publish the node's figures (the front shard of a node), while started."""
        if self._loop is not None:
            self._publish(figures)

    def _publish(self, figures: Mapping[str, int]) -> None:
        from meshmq.core import destinations as dst
        from meshmq.core.message import Message

        broker = self.broker
        for name, value in values_of(figures).items():
            msg = Message(message_id=broker.new_message_id("sys"),
                          destination=dst.topic(SYS_TOPIC + name.replace("/", ".")),
                          body=value.encode(), timestamp=broker.now_ms())
            broker.publish_internal(msg, retain=True, persist=False)
        self._pump()
