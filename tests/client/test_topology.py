"""Topology push: a listener with update_cluster_clients tells STOMP and MQTT 5 clients
the broker's peers; the failover client adds them to its list (updateURIsSupported) and
can fail over to a broker it was never given. Off by default: a client stays within the
list it was given."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from meshmq.client import Event, EventKind, FailoverClient, OperationTimeoutError
from meshmq.config.activemq_xml import loads_activemq_xml
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError
from meshmq.transport.topology import Topology, push_families
from meshmq.uri import URIError
from tests.client.conftest import LISTENERS, mqtt_uri, stomp_uri
from tests.client.test_client_features import run
from tests.support.brokers import ThreadBroker

#: The test listeners with the topology push on (update_cluster_clients).
PUSHING = tuple(dataclasses.replace(lst, update_cluster_clients=True) for lst in LISTENERS)


def test_sources_union_per_protocol_and_change_notification() -> None:
    t = Topology(["stomp://b:61613", "mqtt://b:1883"])
    changes: list[int] = []
    t.on_change(lambda topo: changes.append(topo.version))
    t.set_source("network", ["stomp+ssl://c:61614", "STOMP://b:61613", "mqtts://c:8883",
                             "tcp://c:61616"])
    assert t.uris == ("stomp://b:61613", "mqtt://b:1883", "stomp+ssl://c:61614",
                      "mqtts://c:8883", "tcp://c:61616")
    assert t.header_value("stomp") == "stomp://b:61613,stomp+ssl://c:61614"
    assert t.header_value("mqtt") == "mqtt://b:1883,mqtts://c:8883"
    t.set_source("network", ["stomp+ssl://c:61614", "stomp://b:61613", "mqtts://c:8883",
                             "tcp://c:61616"])  # same list: no change
    t.clear_source("static")
    assert t.header_value("stomp") == "stomp+ssl://c:61614,stomp://b:61613"
    assert changes == [2, 3]
    assert Topology().header_value("stomp") is None
    assert Topology(["stomp://b:1"], enabled=False).header_value("stomp") is None


def test_client_and_broker_agree_on_the_header_name() -> None:
    from meshmq.client import types
    from meshmq.transport import topology

    assert types.PEERS_HEADER == topology.PEERS_HEADER == "meshmq-peers"


def test_bad_peer_uris_are_rejected() -> None:
    t = Topology()
    with pytest.raises(URIError, match="unknown scheme"):
        t.set_source("ha", ["gopher://x:1"])
    with pytest.raises(URIError, match="not a composite"):
        t.set_source("ha", ["failover:(stomp://a:1)"])


def test_config_option_is_validated_with_its_name(tmp_path: Path) -> None:
    cfg = loads_toml('[broker]\nadvertised_peers = "stomp://b:61613, mqtt://b:1883"\n')
    assert cfg.advertised_peer_list == ("stomp://b:61613", "mqtt://b:1883")
    with pytest.raises(ConfigError, match="advertised_peers") as info:
        loads_toml('[broker]\nadvertised_peers = "stomp://b:61613,bogus"\n')
    assert "'bogus'" in str(info.value)


def test_stomp_and_mqtt5_clients_learn_the_peers(meshmq_factory: Callable[..., ThreadBroker]
                                                 ) -> None:
    b = meshmq_factory(advertised_peers="stomp://10.0.0.2:61613,mqtt://10.0.0.2:1883",
                       listeners=PUSHING)

    async def main() -> None:
        events: list[Event] = []
        async with FailoverClient(stomp_uri(b), on_event=events.append) as c:
            assert [str(e) for e in c.endpoints] == [stomp_uri(b), "stomp://10.0.0.2:61613"]
        assert events[0].peers == ("stomp://10.0.0.2:61613",)
        assert EventKind.TOPOLOGY in [e.kind for e in events]
        async with FailoverClient(mqtt_uri(b), client_id="t") as m:
            assert [str(e) for e in m.endpoints] == [mqtt_uri(b), "mqtt://10.0.0.2:1883"]
        async with FailoverClient(f"failover:({mqtt_uri(b)})?updateURIsSupported=false",
                                  client_id="t") as m:
            assert len(m.endpoints) == 1
        async with FailoverClient(mqtt_uri(b), client_id="t", mqtt_version=4) as m:
            assert len(m.endpoints) == 1  # MQTT 3.1.1 has no place for the list
    run(main())


def test_client_given_one_uri_fails_over_to_a_pushed_peer(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    peer = meshmq_factory()
    first = meshmq_factory(advertised_peers=stomp_uri(peer), listeners=PUSHING)

    async def main() -> None:
        async with FailoverClient(stomp_uri(first)) as c:
            sub = await c.subscribe("/queue/q")
            await asyncio.to_thread(first.stop)
            await c.send("/queue/q", "via the pushed peer")
            assert (await sub.get(10)).text == "via the pushed peer"
            assert c.endpoint is not None and c.endpoint.port == peer.port
    run(main())


def test_runtime_sources_reach_new_connections(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    meshmq = meshmq_factory(listeners=PUSHING)
    assert meshmq.runtime is not None
    topo = meshmq.runtime.topology
    meshmq.run(lambda: topo.set_source("network", ["stomp://10.1.1.1:61613"]))

    async def main() -> None:
        async with FailoverClient(stomp_uri(meshmq)) as c:
            assert "stomp://10.1.1.1:61613" in [str(e) for e in c.endpoints]
    run(main())


def test_updateuris_url_file_is_read_on_every_reconnect_cycle(
        meshmq_factory: Callable[..., ThreadBroker], tmp_path: Path) -> None:
    b = meshmq_factory()
    listing = tmp_path / "brokers.txt"
    listing.write_text(f"{stomp_uri(b)}\nstomp://10.9.9.9:61613\n")

    async def main() -> None:
        uri = f"failover:({stomp_uri(b)})?updateURIsURL=file://{listing}"
        async with FailoverClient(uri) as c:
            assert [str(e) for e in c.endpoints] == [stomp_uri(b), "stomp://10.9.9.9:61613"]
    run(main())


def _bridged_pair(tmp_path: Path, *, push: bool) -> tuple[ThreadBroker, ThreadBroker]:
    """B, and A with a network connector to B; A's STOMP listener pushes or not."""
    from meshmq.config.model import ListenerConfig
    from tests.network.helpers import LINK_AUTH, connector, tcp_uri, wait_forwarding
    from tests.support.brokers import make_config

    def listeners(pushing: bool) -> tuple[ListenerConfig, ...]:
        return (ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0,
                               update_cluster_clients=pushing),
                ListenerConfig(name="tcp", protocol="tcp", host="127.0.0.1", port=0))

    b = ThreadBroker(make_config(tmp_path / "b", broker_name="b", listeners=listeners(False),
                                 auth=LINK_AUTH))
    b.start()
    a = ThreadBroker(make_config(tmp_path / "a", broker_name="a", listeners=listeners(push),
                                 network_connectors=(connector(f"static:({tcp_uri(b)})"),)))
    a.start()
    wait_forwarding(a)
    return a, b


def test_network_connector_peers_are_pushed_and_the_client_fails_over_to_them(
        tmp_path: Path) -> None:
    a, b = _bridged_pair(tmp_path, push=True)
    try:
        async def main() -> None:
            # Given only A, the client learns B from A (the bridge handshake told A
            # where B's clients connect) and moves there when A goes.
            async with FailoverClient(stomp_uri(a)) as c:
                assert stomp_uri(b) in [str(e) for e in c.endpoints]
                sub = await c.subscribe("/queue/net")
                await asyncio.to_thread(a.stop)
                await c.send("/queue/net", "on b")
                assert (await sub.get(10)).text == "on b"
                assert c.endpoint is not None and c.endpoint.port == b.port
        run(main())
    finally:
        for broker in (a, b):
            if broker.runtime is not None and broker.runtime.started:
                broker.stop()


def test_by_default_a_client_stays_within_its_own_list(tmp_path: Path) -> None:
    a, b = _bridged_pair(tmp_path, push=False)
    try:
        async def main() -> None:
            events: list[Event] = []
            async with FailoverClient(f"failover:({stomp_uri(a)})?initialReconnectDelay=10",
                                      on_event=events.append) as c:
                assert [str(e) for e in c.endpoints] == [stomp_uri(a)]
                assert events[0].peers == ()
                await asyncio.to_thread(a.stop)
                # A is gone and B was never in the client's list: the send waits for A.
                with pytest.raises(OperationTimeoutError):
                    await c.send("/queue/net", "nowhere to go", timeout=1.0)
                assert [str(e) for e in c.endpoints] == [stomp_uri(a)]
                assert EventKind.TOPOLOGY not in [e.kind for e in events]
                assert EventKind.RESUMED not in [e.kind for e in events]
        run(main())
    finally:
        for broker in (a, b):
            if broker.runtime is not None and broker.runtime.started:
                broker.stop()


def test_update_cluster_clients_in_toml_and_activemq_xml() -> None:
    toml = loads_toml('[[listeners]]\nurl = "stomp://127.0.0.1:61613"\n'
                      '[[listeners]]\nname = "mqtt"\nurl = "mqtt://127.0.0.1:1883"\n'
                      'update_cluster_clients = true\n')
    assert [lst.update_cluster_clients for lst in toml.listeners] == [False, True]
    xml = loads_activemq_xml(
        '<beans><broker xmlns="http://activemq.apache.org/schema/core"><transportConnectors>'
        '<transportConnector name="s" uri="stomp://0.0.0.0:61613" '
        'updateClusterClients="true"/>'
        '<transportConnector name="m" uri="mqtt://0.0.0.0:1883"/>'
        '</transportConnectors></broker></beans>')
    assert [lst.update_cluster_clients for lst in xml.listeners] == [True, False]
    assert push_families([("stomp", True), ("mqtt", False)]) == {"stomp"}
    assert push_families([("ws", True)]) == {"stomp", "mqtt"}
    assert push_families([("stomp", False), ("tcp", True)]) == frozenset()
    t = Topology(["stomp://b:1", "mqtt://b:2"], push_to=frozenset({"mqtt"}))
    assert (t.header_value("stomp"), t.header_value("mqtt")) == (None, "mqtt://b:2")


def test_providers_are_read_at_every_connect() -> None:
    live = ["stomp://n1:61613"]
    t = Topology(["stomp://s:61613"])
    t.set_provider("network", lambda: list(live))
    assert t.header_value("stomp") == "stomp://s:61613,stomp://n1:61613"
    live[:] = ["stomp://n2:61613", "not a uri", "failover:(stomp://x:1)", "stomp://s:61613"]
    assert t.header_value("stomp") == "stomp://s:61613,stomp://n2:61613"
    live.clear()
    assert t.header_value("mqtt") is None


def test_push_follows_the_listener_a_client_came_through(tmp_path: Path) -> None:
    """Two STOMP listeners: only the clients of the one with update_cluster_clients are
    told the peers."""
    from meshmq.config.model import ListenerConfig
    from tests.interop.stomp_helpers import RawClient
    from tests.support.brokers import make_config

    broker = ThreadBroker(make_config(
        tmp_path / "d", advertised_peers="stomp://peer:61613",
        listeners=(ListenerConfig(name="quiet", protocol="stomp", host="127.0.0.1", port=0),
                   ListenerConfig(name="loud", protocol="stomp", host="127.0.0.1", port=0,
                                  update_cluster_clients=True)))).start()
    try:
        assert broker.runtime is not None
        heard = {}
        for name in ("quiet", "loud"):
            class Addr:
                host = "127.0.0.1"
                port = broker.runtime.addresses[name][1]
            with RawClient(Addr()) as c:  # type: ignore[arg-type]
                heard[name] = c.connect("1.2").get("meshmq-peers")
        assert heard == {"quiet": None, "loud": "stomp://peer:61613"}
    finally:
        broker.stop()
