"""In-process networks: multicast discovery, destination filters, static bridges,
bridge advisories and the status in /api/stat."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from meshmq.config.model import ListenerConfig
from tests.interop.stomp_helpers import uid
from tests.network.helpers import (
    bridges,
    connector,
    consumers_on,
    net_config,
    tcp_uri,
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


def test_bridge_advisories_and_status_in_api_stat(tmp_path: Path, client) -> None:
    port = free_port()
    b_cfg = net_config(tmp_path / "b", "B")
    tcp = ListenerConfig(name="tcp", protocol="tcp", host="127.0.0.1", port=port)
    b_cfg = dataclasses.replace(b_cfg, listeners=(b_cfg.listeners[0], tcp))
    a = ThreadBroker(net_config(tmp_path / "a", "A",
                                connector(f"static:(tcp://127.0.0.1:{port})"))).start()
    b = None
    try:
        watcher = client(on=a)
        watcher.subscribe("/topic/ActiveMQ.Advisory.NetworkBridge")
        poll(lambda: (bridges(a)[0]["last_error"] or {}).get("kind") == "connection-refused",
             what="the refused connection in the status")
        b = ThreadBroker(b_cfg).start()
        wait_forwarding(a)

        def states() -> list[str]:
            return [json.loads(m.body)["state"] for m in watcher.listener.messages]
        poll(lambda: "forwarding" in states(), what="a forwarding advisory")
        # Each retry after the refusal went connecting -> backing-off; the last one
        # made it through the handshake.
        assert states()[-4:] == ["connecting", "handshaking", "syncing-demand", "forwarding"]
        assert a.runtime is not None
        api = a.run(a.runtime.statistics)
        entry = api["network"]["bridges"][0]  # type: ignore[index]
        assert entry["state"] == "forwarding" and entry["remote_broker"] == "B"
        assert entry["direction"] == "outbound" and entry["connects"] == 1
        assert entry["attempts"] >= 2
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_two_named_connectors_between_the_same_brokers(tmp_path: Path, client) -> None:
    from meshmq.config.model import AuthConfig, User

    b = ThreadBroker(net_config(tmp_path / "b", "B", auth=AuthConfig(
        anonymous_access=True, users=(User("bridge", "secret"),)))).start()
    uri = f"static:({tcp_uri(b)})"
    a = ThreadBroker(net_config(
        tmp_path / "a", "A",
        connector(uri, name="orders", username="bridge", password="secret",
                  dynamically_included_destinations=("queue://orders.>",)),
        connector(uri, name="billing", username="bridge", password="secret",
                  dynamically_included_destinations=("queue://billing.>",)))).start()
    try:
        wait_forwarding(a, 2)
        consumer = client(on=b)
        consumer.subscribe("/queue/orders.1")
        consumer.subscribe("/queue/billing.1")
        poll(lambda: sorted(s["demand"] for s in bridges(a)) == [1, 1], what="demand split")
        producer = client(on=a)
        producer.send("/queue/orders.1", "o")
        producer.send("/queue/billing.1", "b")
        poll(lambda: sorted(consumer.bodies()) == ["b", "o"], what="both connectors forwarding")
        by_name = {s["connector"]: s["forwarded"] for s in bridges(a)}
        assert by_name == {"orders": 1, "billing": 1}
    finally:
        a.stop()
        b.stop()


def test_local_consumers_come_first_with_decreased_network_priority(tmp_path: Path,
                                                                     client) -> None:
    b = ThreadBroker(net_config(tmp_path / "b", "B")).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(f"static:({tcp_uri(b)})"))).start()
    try:
        wait_forwarding(a)
        q = f"/queue/{uid('prio')}"
        remote, local = client(on=b), client(on=a)
        remote.subscribe(q)
        local.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "50"})
        poll(lambda: consumers_on(a, q.replace("/queue/", "queue://")) == 2, what="demand")
        producer = client(on=a)
        for i in range(60):
            producer.send(q, str(i))
        # The local consumer's window (50) fills first; only the overflow crosses.
        poll(lambda: len(local.listener.messages) == 50 and len(remote.listener.messages) == 10,
             what="50 local, 10 remote")
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("replay", [True, False])
def test_replay_when_no_consumers_or_stuck_without_it(tmp_path: Path, client,
                                                      replay: bool) -> None:
    """ActiveMQ's remedy (replay_when_no_consumers) with meshmq's redistribution off:
    with it, messages stranded on B go back to A where the consumer now is; without
    it (ActiveMQ's default) they stay stuck on B."""
    opts = {"redistribution": False, "replay_when_no_consumers": replay,
            "replay_delay_ms": 0}
    port_a, port_b = free_port(), free_port()
    a = ThreadBroker(_fixed(net_config(tmp_path / "a", "A", connector(
        f"static:(tcp://127.0.0.1:{port_b})", **opts)), port_a)).start()
    b = ThreadBroker(_fixed(net_config(tmp_path / "b", "B", connector(
        f"static:(tcp://127.0.0.1:{port_a})", **opts)), port_b)).start()
    try:
        wait_forwarding(a)
        wait_forwarding(b)
        q = f"/queue/{uid('stuck')}"
        dest = q.replace("/queue/", "queue://")
        on_b = client(on=b)
        on_b.subscribe(q, ack="client-individual", headers={"activemq.prefetchSize": "1"})
        poll(lambda: consumers_on(a, dest) == 1, what="demand on A")
        producer = client(on=a)
        for i in range(5):
            producer.send(q, str(i), {"persistent": "true"})
        poll(lambda: b.destination_stats(dest[8:])["depth"] == 5, what="all five on B")
        on_b.disconnect()
        on_a = client(on=a)
        on_a.subscribe(q)
        poll(lambda: consumers_on(b, dest) == 1, what="A's consumer known on B")
        client(on=b).send(q, "marker", {"persistent": "true"})
        if replay:
            poll(lambda: len(on_a.listener.messages) == 6, what="the stranded five and marker")
            assert sorted(on_a.bodies()) == ["0", "1", "2", "3", "4", "marker"]
        else:
            poll(lambda: on_a.bodies() == ["marker"], what="only the marker")
            # Stuck, as in ActiveMQ (depth 6 until B hears A's ack of the marker).
            poll(lambda: b.destination_stats(dest[8:])["depth"] == 5, what="five stuck on B")
            assert on_a.bodies() == ["marker"]
    finally:
        a.stop()
        b.stop()


def _fixed(config, port: int):
    listeners = tuple(dataclasses.replace(lst, port=port) if lst.protocol == "tcp" else lst
                      for lst in config.listeners)
    return dataclasses.replace(config, listeners=listeners)


@pytest.mark.parametrize("suppress", [True, False])
def test_suppress_duplicate_queue_subscriptions_in_a_mesh(tmp_path: Path, client,
                                                          suppress: bool) -> None:
    ports = {n: free_port() for n in "ABC"}
    nodes = {}
    for name in "ABC":
        others = ",".join(f"tcp://127.0.0.1:{ports[o]}" for o in "ABC" if o != name)
        nodes[name] = ThreadBroker(_fixed(net_config(tmp_path / name, name, connector(
            f"static:({others})", network_ttl=2,
            suppress_duplicate_queue_subscriptions=suppress)), ports[name])).start()
    a, c = nodes["A"], nodes["C"]
    try:
        for node in nodes.values():
            wait_forwarding(node, 2)
        q = f"/queue/{uid('sup')}"
        client(on=c).subscribe(q)

        def demand_by_remote() -> dict[str, int]:
            return {s["remote_broker"]: s["demand"] for s in bridges(a)
                    if s["direction"] == "outbound"}
        # Direct route A -> C always; the two-hop route A -> B -> C only when not
        # suppressed.
        expected = {"B": 0, "C": 1} if suppress else {"B": 1, "C": 1}
        poll(lambda: demand_by_remote() == expected, what=f"demand {expected}")
    finally:
        for node in nodes.values():
            node.stop()
