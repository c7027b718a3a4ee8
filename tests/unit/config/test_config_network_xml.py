"""activemq.xml <networkConnectors>, networkConnectorStartAsync, discoveryUri and the
conditionalNetworkBridgeFilterFactory: mapping, the seeds' snippets verbatim, warnings
and located errors."""

import dataclasses
import logging
from pathlib import Path

import pytest

from meshmq.config.activemq_xml import (
    NETWORK_CONNECTOR_ATTRIBUTES,
    NETWORK_CONNECTOR_LISTS,
    NETWORK_CONNECTOR_TLS_FIELDS,
    load_activemq_xml,
)
from meshmq.config.load import load_config
from meshmq.config.model import BrokerConfig, NetworkConnectorConfig
from meshmq.errors import ConfigError

HEAD = ('<beans xmlns="http://www.springframework.org/schema/beans">\n'
        '<broker xmlns="http://activemq.apache.org/schema/core" brokerName="b">\n')
TAIL = "</broker>\n</beans>\n"


def load(tmp_path: Path, body: str, *, head: str = HEAD) -> BrokerConfig:
    """``body`` starts on line 3 of the file."""
    path = tmp_path / "activemq.xml"
    path.write_text(head + body + TAIL)
    return load_config(path)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warnings, less the one every snippet without a transport connector gets."""
    return [r.getMessage() for r in caplog.records
            if r.name == "meshmq.config" and r.levelno == logging.WARNING
            and "no supported transport connector" not in r.getMessage()]


def in_connectors(snippet: str) -> str:
    return f"<networkConnectors>\n{snippet}\n</networkConnectors>\n"


# Every <networkConnector> snippet of the seeds (/work/shared/seeds/00[12]_*.txt), verbatim:
# snippet, expected name and uri.
SEEDS = [
    pytest.param('<networkConnector uri="static://(tcp://localhost:61626,'
                 'tcp://localhost:61627)" />',
                 "NC", "static://(tcp://localhost:61626,tcp://localhost:61627)", id="001-static"),
    pytest.param('<networkConnector uri="static:failover:(tcp://localhost:61626,'
                 'tcp://localhost:61627)" />',
                 "NC", "static:failover:(tcp://localhost:61626,tcp://localhost:61627)",
                 id="001-static-failover"),
    pytest.param('<networkConnector name="NC_1"\n'
                 'uri="static://(tcp://broker2Master:61616,tcp://broker2Slave:61616)"/>',
                 "NC_1", "static://(tcp://broker2Master:61616,tcp://broker2Slave:61616)",
                 id="002-static-pair"),
    pytest.param('<networkConnector name="NC_1"\n'
                 'uri="static:failover:(tcp://broker2Master:61616,tcp://broker2Slave:61616)'
                 '?randomize=false"/>',
                 "NC_1",
                 "static:failover:(tcp://broker2Master:61616,tcp://broker2Slave:61616)"
                 "?randomize=false", id="002-failover-randomize"),
    pytest.param('<networkConnector name="NC_1" uri="static:failover:(tcp://broker2Master:61616,'
                 'tcp://broker2Slave:61616)?randomize=false&maxReconnectAttempts=0"/>',
                 "NC_1",
                 "static:failover:(tcp://broker2Master:61616,tcp://broker2Slave:61616)"
                 "?randomize=false&maxReconnectAttempts=0", id="002-failover-no-reconnect"),
    pytest.param('<networkConnector\nname="NC_1"\n'
                 'uri="masterslave:(tcp://broker2Master:61616,tcp://broker2Slave:61616)"/>',
                 "NC_1", "masterslave:(tcp://broker2Master:61616,tcp://broker2Slave:61616)",
                 id="002-masterslave"),
]


@pytest.mark.parametrize(("snippet", "name", "uri"), SEEDS)
def test_seed_snippets_load_verbatim(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                     snippet: str, name: str, uri: str) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, in_connectors(snippet))
    assert config.network_connectors == (NetworkConnectorConfig(uri=uri, name=name),)
    logged = warnings(caplog)
    if "&max" in snippet:  # the seed's URI has a bare '&', which XML does not allow
        assert logged == [f"{tmp_path / 'activemq.xml'}:4: bare '&' read as '&amp;' "
                          "(XML requires '&amp;' there)"]
    else:
        assert logged == []


def test_every_model_field_has_an_xml_form() -> None:
    fields = {f.name for f in dataclasses.fields(NetworkConnectorConfig)}
    mapped = {*NETWORK_CONNECTOR_ATTRIBUTES.values(), *NETWORK_CONNECTOR_LISTS.values(), "uri",
              *NETWORK_CONNECTOR_TLS_FIELDS}
    assert mapped == fields


def test_every_attribute_and_list(tmp_path: Path) -> None:
    path = tmp_path / "activemq.xml"
    path.write_text(HEAD.replace('brokerName="b"', 'brokerName="b" '
                                 'networkConnectorStartAsync="true"') + in_connectors("""\
<networkConnector name="hub" uri="static:(tcp://h1:61616,tcp://h2:61616)"
    userName="bridge" password="${bridge.password}" duplex="true" conduitSubscriptions="false"
    networkTTL="4" messageTTL="3" consumerTTL="-1" decreaseNetworkConsumerPriority="false"
    consumerPriorityBase="-7" prefetchSize="10" alwaysSyncSend="false"
    suppressDuplicateQueueSubscriptions="true" suppressDuplicateTopicSubscriptions="false"
    staticBridge="true" bridgeTempDestinations="false" dynamicOnly="true" autoStart="false"
    replayWhenNoConsumers="true" replayDelay="250" selectorAware="true" rateLimit="9"
    rateDuration="2000" initialReconnectDelay="10" maxReconnectDelay="20"
    useExponentialBackOff="false" backOffMultiplier="3" maxReconnectAttempts="5"
    minConnectTime="7" redistribution="false" redistributionDelay="3" handshakeTimeout="11"
    heartbeat="12" interestResync="13">
  <excludedDestinations>
    <queue physicalName="internal.>"/>
    <topic physicalName="ActiveMQ.Advisory.>"/>
  </excludedDestinations>
  <dynamicallyIncludedDestinations>
    <queue physicalName="orders.*,billing"/>
    <tempQueue physicalName="replies"/>
  </dynamicallyIncludedDestinations>
  <staticallyIncludedDestinations><topic physicalName="prices"/></staticallyIncludedDestinations>
</networkConnector>""") + TAIL)
    config = load_activemq_xml(path, properties={"bridge.password": "s3cret"})
    assert config.network_connector_start_async is True
    assert config.network_connectors == (NetworkConnectorConfig(
        uri="static:(tcp://h1:61616,tcp://h2:61616)", name="hub", username="bridge",
        password="s3cret", duplex=True, conduit_subscriptions=False, network_ttl=4,
        message_ttl=3, consumer_ttl=-1, decrease_network_consumer_priority=False,
        consumer_priority_base=-7, prefetch_size=10, always_sync_send=False,
        suppress_duplicate_queue_subscriptions=True,
        suppress_duplicate_topic_subscriptions=False,
        excluded_destinations=("queue://internal.>", "topic://ActiveMQ.Advisory.>"),
        dynamically_included_destinations=("queue://orders.*", "queue://billing",
                                           "temp-queue://replies"),
        statically_included_destinations=("topic://prices",), static_bridge=True,
        bridge_temp_destinations=False, dynamic_only=True, replay_when_no_consumers=True,
        replay_delay_ms=250, selector_aware=True, redistribution=False,
        redistribution_delay_ms=3, rate_limit=9, rate_duration_ms=2000,
        initial_reconnect_delay_ms=10, max_reconnect_delay_ms=20,
        use_exponential_backoff=False, backoff_multiplier=3.0, max_reconnect_attempts=5,
        min_connect_time_ms=7, handshake_timeout_ms=11, heartbeat_ms=12,
        interest_resync_ms=13, auto_start=False),)


def test_several_connectors_and_multicast(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, in_connectors("""\
<networkConnector name="queues" uri="static:(tcp://b2:61616)" conduitSubscriptions="false">
  <dynamicallyIncludedDestinations><queue physicalName="&gt;"/></dynamicallyIncludedDestinations>
</networkConnector>
<networkConnector name="topics" uri="static:(tcp://b2:61616)" destinationFilter="x">
  <dynamicallyIncludedDestinations><topic physicalName=">"/></dynamicallyIncludedDestinations>
  <durableDestinations><topic physicalName="d"/></durableDestinations>
</networkConnector>
<multicastNetworkConnector name="lan" remoteURI="multicast://default?group=g"/>
<ldapNetworkConnector uri="ldap://ldap:389"/>"""))
    queues, topics, lan = config.network_connectors
    assert (queues.name, queues.conduit_subscriptions) == ("queues", False)
    assert queues.dynamically_included_destinations == ("queue://>",)
    assert topics.dynamically_included_destinations == ("topic://>",)
    assert (lan.name, lan.uri) == ("lan", "multicast://default?group=g")
    file = tmp_path / "activemq.xml"
    *logged, explained = warnings(caplog)
    assert explained.startswith(f"{file}:4: network connector 'queues' sets conduit")
    assert logged == [
        f"{file}:7: <networkConnector> attribute 'destinationFilter' is ignored by meshmq",
        f"{file}:9: <durableDestinations> is not supported yet, ignored",
        f"{file}:11: <multicastNetworkConnector> bridges to each broker discovered in the "
        "multicast group (meshmq has no one-to-many bridge transport)",
        f"{file}:12: <ldapNetworkConnector> is not supported yet, ignored",
    ]


def test_discovery_uri_on_transport_connectors(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, """\
<transportConnectors>
  <transportConnector name="openwire" uri="tcp://0.0.0.0:61616"
                      discoveryUri="multicast://default"/>
  <transportConnector name="stomp" uri="stomp://0.0.0.0:61613"
                      discoveryUri="multicast://default"/>
</transportConnectors>
""")
    assert [lst.discovery_uri for lst in config.listeners] == ["multicast://default", None]
    assert warnings(caplog) == [
        f"{tmp_path / 'activemq.xml'}:6: discoveryUri on a stomp:// connector is ignored: "
        "meshmq advertises only tcp/ssl connectors, which carry broker links"]


FILTER_POLICIES = """\
<destinationPolicy><policyMap><policyEntries>
  <policyEntry queue="orders.>">
    <networkBridgeFilterFactory>
      <conditionalNetworkBridgeFilterFactory replayWhenNoConsumers="true" replayDelay="500"
          selectorAware="true"/>
    </networkBridgeFilterFactory>
  </policyEntry>
  <policyEntry queue=">">
    <networkBridgeFilterFactory>
      <conditionalNetworkBridgeFilterFactory replayDelay="900" rateLimit="10"
          rateDuration="100"/>
    </networkBridgeFilterFactory>
  </policyEntry>
  <policyEntry topic=">">
    <networkBridgeFilterFactory><defaultNetworkBridgeFilterFactory/></networkBridgeFilterFactory>
  </policyEntry>
</policyEntries></policyMap></destinationPolicy>
"""


def test_bridge_filter_factory_applies_to_every_connector(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, FILTER_POLICIES + in_connectors(
        '<networkConnector name="a" uri="tcp://a:61616"/>\n'
        '<networkConnector name="b" uri="tcp://b:61616" rateLimit="0"/>'))
    a, b = config.network_connectors
    assert (a.replay_when_no_consumers, a.replay_delay_ms, a.selector_aware) == (True, 500, True)
    assert (a.rate_limit, a.rate_duration_ms) == (10, 100)
    assert (b.replay_when_no_consumers, b.rate_limit) == (True, 0)  # its own attribute wins
    file = tmp_path / "activemq.xml"
    assert warnings(caplog) == [
        f"{file}:6: <conditionalNetworkBridgeFilterFactory> of policy queue://orders.> applies "
        "to every network connector in meshmq (meshmq configures replay_when_no_consumers, "
        "replay_delay_ms, selector_aware per connector)",
        f"{file}:12: <conditionalNetworkBridgeFilterFactory> of policy queue://> applies to "
        "every network connector in meshmq (meshmq configures replay_delay_ms, rate_limit, "
        "rate_duration_ms per connector)",
        f"{file}:12: replayDelay=900 conflicts with line 6; the first one is used",
    ]


def test_bridge_filter_factory_without_connectors_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, """\
<destinationPolicy><policyMap><defaultEntry><policyEntry><networkBridgeFilterFactory>
  <conditionalNetworkBridgeFilterFactory replayWhenNoConsumers="true"/>
</networkBridgeFilterFactory></policyEntry></defaultEntry></policyMap></destinationPolicy>
""")
    assert config.network_connectors == ()
    assert warnings(caplog) == [
        f"{tmp_path / 'activemq.xml'}:4: <conditionalNetworkBridgeFilterFactory> (policy "
        "queue://>) has no effect: there are no network connectors"]


def test_bare_ampersand_does_not_hide_other_errors(tmp_path: Path) -> None:
    # Unclosed as well: the re-read with '&amp;' fails too, and the original error is the
    # one reported, not the re-read's (a mismatched tag on line 5).
    with pytest.raises(ConfigError, match="malformed XML") as info:
        load(tmp_path, in_connectors('<networkConnector uri="static:(tcp://a:1)?x=1&y=2">'))
    assert info.value.line == 4
    assert "invalid token" in info.value.reason


NCS = "broker/networkConnectors/networkConnector"

# Each row: XML body (starting on line 3), the line and option the error must name, reason.
ERRORS = [
    # Seed 001 names <networkConnector/> and <multicastNetworkConnector/> bare, in prose:
    # with no URI there is nothing to bridge to (ActiveMQ refuses them too).
    pytest.param(in_connectors("<networkConnector/>"), 4, f"{NCS}@uri",
                 "<networkConnector> needs a uri", id="uri-missing"),
    pytest.param(in_connectors("<multicastNetworkConnector/>"), 4,
                 "broker/networkConnectors/multicastNetworkConnector@remoteURI",
                 "needs a remoteURI", id="remote-uri-missing"),
    pytest.param(in_connectors('<multicastNetworkConnector remoteURI="tcp://a:1"/>'), 4,
                 "broker/networkConnectors/multicastNetworkConnector@remoteURI",
                 "its remoteURI must be multicast://", id="multicast-not-multicast"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1"\n conduitSubscription="x"/>'),
                 4, f"{NCS}@conduitSubscription",
                 "unknown <networkConnector> attribute; did you mean 'conduitSubscriptions'?",
                 id="unknown-attribute"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1" networkTTL="0"/>'), 4,
                 f"{NCS}@networkTTL", "must be -1 (unlimited) or at least 1 hop, got 0",
                 id="ttl-zero"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1" prefetchSize="0"/>'), 4,
                 f"{NCS}@prefetchSize", "must be >= 1", id="prefetch-zero"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1" duplex="yes"/>'), 4,
                 f"{NCS}@duplex", "expected true or false, got string 'yes'", id="bool"),
    pytest.param(in_connectors('<networkConnector uri="http://a:1"/>'), 4, f"{NCS}@uri",
                 "unknown network connector scheme 'http:'", id="bad-uri"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1"/>\n'
                               '<networkConnector uri="tcp://b:1"/>'), 5, NCS,
                 "duplicate network connector name 'NC'", id="duplicate-name"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1">\n<excludedDestinations>\n'
                               '<queue physicalName="a.>.b"/>\n</excludedDestinations>\n'
                               "</networkConnector>"), 6,
                 f"{NCS}/excludedDestinations/queue@physicalName",
                 "'>' must be the last segment", id="bad-destination"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1">\n<excludedDestinations>\n'
                               "<queue/>\n</excludedDestinations>\n</networkConnector>"), 6,
                 f"{NCS}/excludedDestinations/queue@physicalName", "needs a physicalName",
                 id="no-physical-name"),
    pytest.param(in_connectors('<networkConnector uri="tcp://a:1">\n<excludedDestinations>\n'
                               '<destination physicalName="a"/>\n</excludedDestinations>\n'
                               "</networkConnector>"), 6,
                 f"{NCS}/excludedDestinations/destination",
                 "unknown element <destination> in <excludedDestinations>",
                 id="unknown-list-element"),
    pytest.param('<transportConnectors><transportConnector uri="tcp://h:1"\n'
                 'discoveryUri="multicast://default?grup=x"/></transportConnectors>\n', 3,
                 "broker/transportConnectors/transportConnector@discoveryUri",
                 "unknown multicast URI option 'grup'; did you mean 'group'?",
                 id="bad-discovery-uri"),
    pytest.param('<destinationPolicy><policyMap><policyEntries><policyEntry queue=">">\n'
                 "<networkBridgeFilterFactory><conditionalNetworkBridgeFilterFactory\n"
                 ' replayDelay="-5"/></networkBridgeFilterFactory></policyEntry>\n'
                 "</policyEntries></policyMap></destinationPolicy>\n"
                 + in_connectors('<networkConnector uri="tcp://a:1"/>'), 4,
                 "broker/destinationPolicy/policyMap/policyEntries/policyEntry/"
                 "networkBridgeFilterFactory/conditionalNetworkBridgeFilterFactory@replayDelay",
                 "must be >= 0", id="bad-filter-value"),
    pytest.param('<destinationPolicy><policyMap><policyEntries><policyEntry queue=">">\n'
                 "<networkBridgeFilterFactory><conditionalNetworkBridgeFilterFactory\n"
                 ' replayWhenNoConsumer="true"/></networkBridgeFilterFactory></policyEntry>\n'
                 "</policyEntries></policyMap></destinationPolicy>\n", 4,
                 "broker/destinationPolicy/policyMap/policyEntries/policyEntry/"
                 "networkBridgeFilterFactory/conditionalNetworkBridgeFilterFactory"
                 "@replayWhenNoConsumer", "did you mean 'replayWhenNoConsumers'?",
                 id="unknown-filter-attribute"),
]


@pytest.mark.parametrize(("body", "line", "option", "reason"), ERRORS)
def test_errors_name_file_line_and_option(tmp_path: Path, body: str, line: int, option: str,
                                          reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, body)
    err = info.value
    assert (err.file, err.line, err.option) == (str(tmp_path / "activemq.xml"), line, option)
    assert reason in err.reason


def test_conduit_off_with_default_priority_explains_the_difference(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The seed's example (conduitSubscriptions="false" alone) promises 10/10/10; with
    the modern default priority local consumers come first, and the load says so."""
    caplog.set_level(logging.WARNING, "meshmq.config")
    load(tmp_path, in_connectors(
        '<networkConnector name="qs" uri="static:(tcp://b2:61616)" '
        'conduitSubscriptions="false"/>\n'
        '<networkConnector name="even" uri="static:(tcp://b3:61616)" '
        'conduitSubscriptions="false" decreaseNetworkConsumerPriority="false"/>\n'
        '<networkConnector name="kept" uri="static:(tcp://b4:61616)" '
        'conduitSubscriptions="false" decreaseNetworkConsumerPriority="true"/>'))
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert logged[0].startswith(f"{tmp_path / 'activemq.xml'}:4: network connector 'qs' ")
    assert 'decreaseNetworkConsumerPriority="false"' in logged[0]


def test_conduit_off_explained_for_toml_too(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    path = tmp_path / "b.toml"
    path.write_text('[[network_connectors]]\nname = "qs"\nuri = "static:(tcp://b2:61616)"\n'
                    "conduit_subscriptions = false\n")
    load_config(path)
    logged = warnings(caplog)
    assert len(logged) == 1 and logged[0].startswith(f"{path}:4: network connector 'qs' ")
    assert "decrease_network_consumer_priority = false" in logged[0]


def test_an_openwire_connector_is_accepted_and_said_to_be_a_broker_link(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "meshmq.config")
    config = load(tmp_path, '<transportConnectors>\n'
                  '  <transportConnector name="openwire" uri="tcp://0.0.0.0:61616"/>\n'
                  '</transportConnectors>\n')
    assert [(lst.name, lst.protocol) for lst in config.listeners] == [("openwire", "tcp")]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1, infos
    assert infos[0].startswith(f"{tmp_path / 'activemq.xml'}:4: transportConnector "
                               "'openwire' (tcp://) becomes a meshmq broker-link listener")
    assert "Java OpenWire/JMS clients cannot connect to it" in infos[0]


@pytest.mark.parametrize(("attribute", "attempts"), [("0", -1), ("-1", -1), ("3", 3)])
def test_max_reconnect_attempts_attribute_keeps_activemqs_meaning(
        tmp_path: Path, attribute: str, attempts: int) -> None:
    """In ActiveMQ the option (of a static: URI) retries for ever at 0; meshmq says -1."""
    config = load(tmp_path, in_connectors(
        f'<networkConnector name="nc" uri="static:(tcp://b:61616)" '
        f'maxReconnectAttempts="{attribute}"/>'))
    assert config.network_connectors[0].max_reconnect_attempts == attempts
