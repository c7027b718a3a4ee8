"""MQTT ``$SYS/broker/...`` statistics, mosquitto style, as retained messages.

Why in management: these are the broker's figures published for MQTT clients, the same
figures the admin API (``/api/stat``) and ``/metrics`` serve. They are computed from the
core's ``Broker.statistics()`` where they overlap, so "messages received" has one
definition: the enqueued count summed over the operator's destinations (the broker's
own ``$SYS`` and advisory topics excluded), as ``meshmq_messages_enqueued``.

The composition root starts the publisher when an MQTT listener can read the topics and
``[mqtt] sys_interval_ms`` is positive, and stops it before the listeners close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshmq.core.broker import Broker

SYS_TOPIC = "$SYS.broker."


def sys_values(broker: Broker, stat: Mapping[str, Any]) -> dict[str, str]:
    """Each ``$SYS/broker/<name>`` value, from ``stat`` (``Broker.statistics()``)."""
    from meshmq import __version__

    dests = stat["destinations"]
    return {
        "version": f"meshmq {__version__}",
        "uptime": f"{int(stat['uptime_ms']) // 1000} seconds",
        # Not the connections still being taken apart (see Broker.close_connection_step),
        # which the statistics' "connections" still counts.
        "clients/connected": str(sum(not c.closed for c in broker.connections.values())),
        "messages/received": str(sum(int(d["enqueued"]) for d in dests)),
        "messages/sent": str(sum(int(d["dispatched"]) for d in dests)),
        "store/messages/count": str(sum(int(d["depth"]) for d in dests)),
        "heap/current": str(stat["memory"]["used"]),
    }


class SysTopics:
    """Publishes the ``$SYS`` values now and every ``interval_ms`` until stopped.

    ``pump``: deliver what the publication made ready (the subscribers' copies).
    """

    def __init__(self, broker: Broker, interval_ms: int, pump: Callable[[], None]) -> None:
        self.broker = broker
        self.interval_ms = interval_ms
        self._pump = pump
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.publish()

    def stop(self) -> None:
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def publish(self) -> None:
        """Publish every value once (retained, not persisted), then schedule the next."""
        from meshmq.core import destinations as dst
        from meshmq.core.message import Message

        broker = self.broker
        for name, value in sys_values(broker, broker.statistics()).items():
            msg = Message(message_id=broker.new_message_id("sys"),
                          destination=dst.topic(SYS_TOPIC + name.replace("/", ".")),
                          body=value.encode(), timestamp=broker.now_ms())
            broker.publish_internal(msg, retain=True, persist=False)
        self._pump()
        if self.interval_ms > 0 and self._loop is not None:
            self._timer = self._loop.call_later(self.interval_ms / 1000, self.publish)
