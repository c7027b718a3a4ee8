"""In-process networks: bridges built and dropped by multicast discovery (the rest of
what bridges do is tested over in-memory links in tests/unit/network/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.interop.stomp_helpers import uid
from tests.network.helpers import (
    bridges,
    connector,
    consumers_on,
    net_config,
    wait_forwarding,
)
from tests.support.brokers import ThreadBroker, poll
from tests.support.ports import free_port


def test_multicast_discovery_builds_and_drops_bridges(tmp_path: Path, client) -> None:
    group = f"multicast://239.255.2.3:{free_port()}?group={uid('g')}&keepAliveInterval=50"
    cfg_b = net_config(tmp_path / "b", "B")
    listeners = tuple(dataclasses.replace(lst, discovery_uri=group) if lst.protocol == "tcp"
                      else lst for lst in cfg_b.listeners)
    b = ThreadBroker(dataclasses.replace(cfg_b, listeners=listeners)).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(group))).start()
    try:
        wait_forwarding(a)
        assert bridges(a)[0]["remote_broker"] == "B"
        q = f"/queue/{uid('disc')}"
        consumer = client(on=b)
        consumer.subscribe(q)
        poll(lambda: consumers_on(a, q.replace("/queue/", "queue://")) == 1, what="demand")
        client(on=a).send(q, "found you")
        poll(lambda: consumer.bodies() == ["found you"], what="delivery via a discovered bridge")
        b.stop()  # says "dead" on its way out: the bridge goes away, no retry storm
        poll(lambda: bridges(a) == [], what="the bridge dropped after B left")
    finally:
        a.stop()
        if b.runtime is not None and b.runtime.started:
            b.stop()

