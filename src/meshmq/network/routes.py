"""What the forwarding and receiving halves of every link of one broker share: arrival
times (redistribution waits before sending a message back, so it cannot ping-pong) and
duplicate-route suppression (a demand dropped when another link serves the same
consumer by a shorter route).

Why its own object: the halves used to call back into the whole ``NetworkManager`` for
these. ``NetworkRoutes`` needs only the host and a way to list the forwarders, so a
forwarder/receiver pair can be built and tested without a manager; the manager owns
one and hands it to every link it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from meshmq.core.network_view import local_consumer_takes

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.core.message import Message
    from meshmq.network.forwarder import Forwarder
    from meshmq.network.host import BrokerHost
    from meshmq.network.interest import Demand

ARRIVALS_KEPT = 100_000


class NetworkRoutes:
    """Implements ``services.ForwarderServices`` and ``services.ReceiverServices``."""

    def __init__(self, host: BrokerHost,
                 forwarders: Callable[[], Iterable[Forwarder]] = tuple) -> None:
        self.host = host
        self._forwarders = forwarders
        # message id -> when it arrived over a bridge (ms), in two generations: new
        # arrivals go in the first, and when it is full it becomes the second (the
        # previous second is dropped), so between ARRIVALS_KEPT / 2 and ARRIVALS_KEPT of
        # the latest are kept at a dict store per arrival (an OrderedDict's eviction
        # per arrival cost more than the rest of this bookkeeping).
        self._arrivals: dict[str, int] = {}
        self._arrivals_old: dict[str, int] = {}
        self._replanning = False

    # ------------------------------------------------------------ redistribution
    def arrived(self, message_ids: list[str]) -> None:
        """A batch from one link, all at one time: one call and one clock read per
        batch, not per message (the receiver is compiled, this module is not)."""
        arrivals = self._arrivals
        arrivals.update(dict.fromkeys(message_ids, self.host.broker.now_ms()))
        if len(arrivals) >= ARRIVALS_KEPT // 2:
            self._arrivals_old, self._arrivals = arrivals, {}

    def arrival(self, message_id: str) -> int | None:
        """When ``message_id`` arrived over a bridge (ms), if it is still remembered."""
        arrived = self._arrivals.get(message_id)
        return self._arrivals_old.get(message_id) if arrived is None else arrived

    def may_return(self, msg: Message, config: NetworkConnectorConfig,
                   forwarder: Forwarder) -> bool:
        """May a queue message go back to a broker on its path? Only when nothing here
        can consume it (replayWhenNoConsumers / redistribution), and only once it has
        been here the configured delay, so messages cannot bounce."""
        if not (config.replay_when_no_consumers or config.redistribution):
            return False
        broker = self.host.broker
        if local_consumer_takes(broker, msg, selector_aware=config.selector_aware
                                or config.redistribution):
            return False
        delay = config.replay_delay_ms if config.replay_when_no_consumers \
            else config.redistribution_delay_ms
        arrived = self.arrival(msg.message_id)
        if arrived is not None and delay > 0:
            waited = broker.now_ms() - arrived
            if waited < delay:
                forwarder.redispatch_later((delay - waited) / 1000 + 0.01)
                return False
        return True

    # ------------------------------------------------------------ duplicate routes
    def suppress_duplicates(self, forwarder: Forwarder, plan: dict[str, Demand]
                            ) -> dict[str, Demand]:
        """suppressDuplicateQueue/TopicSubscriptions: when another bridge of this broker
        already serves the same real consumer by a shorter route, drop this demand."""
        cfg = forwarder.config
        if not (cfg.suppress_duplicate_queue_subscriptions
                or cfg.suppress_duplicate_topic_subscriptions):
            return plan
        best: dict[str, int] = {}
        for other in self._forwarders():
            if other is forwarder:
                continue
            for demand, _ in other.demands.values():
                for origin in demand.origins:
                    hops = len(demand.path)
                    if hops < best.get(origin, 1 << 30):
                        best[origin] = hops
        kept = {}
        for key, demand in plan.items():
            suppress = cfg.suppress_duplicate_queue_subscriptions if demand.destination.is_queue \
                else cfg.suppress_duplicate_topic_subscriptions
            if suppress and demand.origins and all(
                    best.get(o, 1 << 30) < len(demand.path) for o in demand.origins):
                continue
            kept[key] = demand
        return kept

    def demand_changed(self, origin: Forwarder) -> None:
        """``origin``'s demand changed: replan the others that suppress duplicates."""
        if self._replanning:
            return
        self._replanning = True
        try:
            for forwarder in list(self._forwarders()):
                cfg = forwarder.config
                if forwarder is not origin and (cfg.suppress_duplicate_queue_subscriptions
                                                or cfg.suppress_duplicate_topic_subscriptions):
                    forwarder.replan()
        finally:
            self._replanning = False
