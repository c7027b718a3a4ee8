"""The activemq.xml importer: mapping, warnings for what is ignored, errors located."""

import logging
from pathlib import Path

import pytest

from meshmq.config.activemq_xml import UNLIMITED_REDELIVERIES, load_activemq_xml
from meshmq.config.load import load_config
from meshmq.config.model import BrokerConfig, DestinationPolicy, ListenerConfig, User
from meshmq.errors import ConfigError

EXAMPLE = Path(__file__).parents[3] / "examples" / "activemq.xml"
MIB = 1024 * 1024

HEAD = ('<beans xmlns="http://www.springframework.org/schema/beans">\n'
        '<broker xmlns="http://activemq.apache.org/schema/core" brokerName="b">\n')
TAIL = "</broker>\n</beans>\n"


def load(tmp_path: Path, body: str, *, head: str = HEAD, tail: str = TAIL) -> BrokerConfig:
    """``body`` starts on line 3 of the file."""
    path = tmp_path / "activemq.xml"
    path.write_text(head + body + tail)
    return load_config(path)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "meshmq.config" and r.levelno == logging.WARNING]


def test_stock_example_imports(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load_config(EXAMPLE)
    base = EXAMPLE.parent
    assert config.broker_name == "localhost"
    assert config.data_directory == base / "data"
    assert config.source == str(EXAMPLE)
    assert config.listeners == (
        ListenerConfig(name="openwire", protocol="tcp", host="0.0.0.0", port=61616,
                       max_connections=1000),
        ListenerConfig(name="stomp", protocol="stomp", host="0.0.0.0", port=61613,
                       max_connections=1000),
        ListenerConfig(name="mqtt", protocol="mqtt", host="0.0.0.0", port=1883,
                       max_connections=1000),
        ListenerConfig(name="ws", protocol="ws", host="0.0.0.0", port=61614,
                       max_connections=1000),
    )
    assert config.stomp.max_frame_size == 100 * MIB
    assert config.stomp.heartbeat_grace == 1.5
    assert config.store.kind == "journal"
    assert config.store.directory == base / "data" / "kahadb"
    assert config.store.segment_size == 32 * MIB
    assert [p.match for p in config.policies] == ["queue://orders.>", "topic://>", "queue://>"]
    orders, topics, queues = config.policies
    assert (orders.max_redeliveries, orders.individual_dlq_prefix) == (3, "DLQ.")
    assert (orders.prioritized_messages, orders.memory_limit) == (True, 32 * MIB)
    assert (queues.max_redeliveries, queues.memory_limit) == (6, 16 * MIB)
    assert queues.non_persistent_to_dlq is False  # ActiveMQ's default, kept on import
    assert topics.max_redeliveries == 6
    assert config.usage.memory_limit == 64 * MIB
    assert (config.usage.on_limit, config.usage.block_timeout_ms) == ("block", 30000)
    assert config.store.max_disk_bytes == 100 * 1024 * MIB  # <storeUsage limit="100 gb">
    assert config.auth.anonymous_access is False
    assert config.auth.users == (User("system", "manager", ("users", "admins")),
                                 User("user", "password", ("users",)))
    logged = "\n".join(warnings(caplog))
    for expected in (":64: <managementContext> is not supported yet, ignored",
                     ":135: <shutdownHooks> is not supported yet, ignored",
                     ":128: amqp:// transport connectors are not supported yet, ignored",
                     ":39: <pendingMessageLimitStrategy> is not supported yet, ignored",
                     ":24: <broker> attribute 'schedulerSupport' is ignored by meshmq"):
        assert f"{EXAMPLE}{expected}" in logged


def test_placeholders_and_properties_files(tmp_path: Path) -> None:
    (tmp_path / "credentials.properties").write_text(
        "# stock file\nactivemq.username=system\nactivemq.password = manager\n")
    config = load(tmp_path, """\
<plugins><simpleAuthenticationPlugin anonymousAccessAllowed="true"><users>
  <authenticationUser username="${activemq.username}" password="${activemq.password}"
                      groups="admins"/>
</users></simpleAuthenticationPlugin></plugins>
<persistenceAdapter><kahaDB directory="${activemq.base}/store"/></persistenceAdapter>
""", head='<beans><bean class="org.springframework.beans.factory.config.'
          'PropertyPlaceholderConfigurer"><property name="locations">\n'
          '<value>file:${activemq.conf}/credentials.properties</value></property></bean>\n'
          '<broker dataDirectory="${activemq.data}/x">\n')
    assert config.auth.users == (User("system", "manager", ("admins",)),)
    assert config.auth.anonymous_access is True
    assert config.store.directory == tmp_path / "store"
    assert config.data_directory == tmp_path / "data" / "x"


def test_caller_properties_win(tmp_path: Path) -> None:
    path = tmp_path / "activemq.xml"
    path.write_text('<broker dataDirectory="${activemq.data}" brokerName="${name}"/>')
    config = load_activemq_xml(path, properties={"activemq.data": "/srv/amq", "name": "n1"})
    assert (config.data_directory, config.broker_name) == (Path("/srv/amq"), "n1")


def test_client_certificate_options_follow_activemq(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, """\
<transportConnectors>
  <transportConnector name="need" uri="stomp+ssl://0.0.0.0:1?needClientAuth=true"/>
  <transportConnector name="want" uri="mqtt+ssl://0.0.0.0:2?wantClientAuth=true"/>
  <transportConnector name="both" uri="wss://0.0.0.0:3?wantClientAuth=true&amp;needClientAuth=true"/>
  <transportConnector name="plain" uri="stomp+ssl://0.0.0.0:4"/>
  <transportConnector name="bridge" uri="ssl://0.0.0.0:5?needClientAuth=true"/>
  <transportConnector name="plainbridge" uri="tcp://0.0.0.0:6?needClientAuth=true"/>
</transportConnectors>
<sslContext><sslContext keyStore="tls/broker.pem" trustStore="/etc/ca.crt"/></sslContext>
""")
    assert [(lst.name, lst.client_auth) for lst in config.listeners] == [
        ("need", "need"), ("want", "want"), ("both", "need"), ("plain", "none"),
        ("bridge", "need"), ("plainbridge", None)]
    assert f"{tmp_path / 'activemq.xml'}:9: URI option needClientAuth only applies to TLS " \
           "connectors (ssl, stomp+ssl, mqtt+ssl, wss) in meshmq, ignored" in warnings(caplog)


def test_connector_schemes_and_uri_options(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, """\
<transportConnectors>
  <transportConnector name="s" uri="stomp+nio://0.0.0.0:61613?wireFormat.maxDataLength=1048576&amp;transport.defaultHeartBeat=5000,0&amp;transport.hbGracePeriodMultiplier=2.5&amp;maximumConnections=7"/>
  <transportConnector name="s2" uri="stomp://127.0.0.1:61614?wireFormat.maxFrameSize=2048&amp;transport.closeAsync=false"/>
  <transportConnector name="t" uri="nio://0.0.0.0:61616?wireFormat.maxFrameSize=5"/>
  <transportConnector name="tls" uri="stomp+ssl://0.0.0.0:61612"/>
  <transportConnector name="bridge" uri="ssl://0.0.0.0:61617"/>
  <transportConnector name="m" uri="mqtt+nio://0.0.0.0:1883"/>
</transportConnectors>
<sslContext><sslContext keyStore="tls/broker.pem" trustStore="/etc/ca.crt"
   keyStorePassword="password"/></sslContext>
""")
    assert [(lst.name, lst.protocol, lst.host, lst.port) for lst in config.listeners] == [
        ("s", "stomp", "0.0.0.0", 61613), ("s2", "stomp", "127.0.0.1", 61614),
        ("t", "tcp", "0.0.0.0", 61616), ("tls", "stomp+ssl", "0.0.0.0", 61612),
        ("bridge", "ssl", "0.0.0.0", 61617), ("m", "mqtt", "0.0.0.0", 1883)]
    assert config.listeners[0].max_connections == 7
    assert config.stomp.max_frame_size == MIB  # the first STOMP connector decides
    assert config.stomp.default_heartbeat == (5000, 0)
    assert config.stomp.heartbeat_grace == 2.5
    tls = config.listeners[3]
    assert (tls.ssl_certfile, tls.ssl_keyfile, tls.ssl_cafile) == (
        tmp_path / "tls/broker.pem", tmp_path / "tls/broker.pem", Path("/etc/ca.crt"))
    assert config.listeners[4].ssl_certfile == tmp_path / "tls/broker.pem"
    assert config.listeners[0].ssl_certfile is None
    logged = warnings(caplog)
    file = tmp_path / "activemq.xml"
    assert f"{file}:5: URI option wireFormat.maxFrameSize=2048 conflicts with an earlier " \
           "STOMP connector; the first one wins" in logged
    assert f"{file}:5: URI option transport.closeAsync is ignored by meshmq" in logged
    assert f"{file}:6: URI option wireFormat.maxFrameSize only applies to STOMP connectors " \
           "in meshmq, ignored" in logged
    assert not any("mqtt+nio://" in line for line in logged)  # MQTT connectors are imported
    assert f"{file}:11: <sslContext> attribute 'keyStorePassword' is ignored by meshmq" in logged


def test_memory_store_usage_and_policies(tmp_path: Path) -> None:
    config = load(tmp_path, """\
<persistenceAdapter><memoryPersistenceAdapter/></persistenceAdapter>
<systemUsage><systemUsage sendFailIfNoSpace="true">
  <memoryUsage><memoryUsage limit="1 gb"/></memoryUsage>
</systemUsage></systemUsage>
<destinationPolicy><policyMap>
  <defaultEntry><policyEntry queuePrefetch="10" topicPrefetch="20"/></defaultEntry>
  <policyEntries>
    <policyEntry topic="prices.>" producerFlowControl="false" durableTopicPrefetch="5">
      <deadLetterStrategy><individualDeadLetterStrategy processNonPersistent="true"/>
      </deadLetterStrategy>
    </policyEntry>
    <policyEntry queue="a.b" maxPageSize="7" queueBrowserPrefetch="8">
      <deadLetterStrategy><sharedDeadLetterStrategy processExpired="false">
        <deadLetterQueue><queue physicalName="MY.DLQ"/></deadLetterQueue>
      </sharedDeadLetterStrategy></deadLetterStrategy>
    </policyEntry>
    <policyEntry queue="a.*"/>
    <policyEntry tempQueue=">"/>
  </policyEntries>
</policyMap></destinationPolicy>
<plugins><redeliveryPlugin><redeliveryPolicyMap><redeliveryPolicyMap>
  <redeliveryPolicyEntries>
    <redeliveryPolicy queue="a.c" maximumRedeliveries="-1"/>
  </redeliveryPolicyEntries>
  <defaultEntry><redeliveryPolicy maximumRedeliveries="2"/></defaultEntry>
</redeliveryPolicyMap></redeliveryPolicyMap></redeliveryPlugin></plugins>
""")
    assert config.store.kind == "memory"
    assert (config.usage.memory_limit, config.usage.on_limit) == (1024**3, "fail")
    amq = {"non_persistent_to_dlq": False, "max_redeliveries": 2}
    assert config.policies == (
        DestinationPolicy(match="queue://a.b", page_size=7, browser_prefetch=8,
                          dead_letter_queue="MY.DLQ", expired_to_dlq=False, **amq),
        DestinationPolicy(match="queue://a.c", max_redeliveries=UNLIMITED_REDELIVERIES,
                          non_persistent_to_dlq=False),  # inherits queue://a.*
        DestinationPolicy(match="queue://a.*", **amq),
        DestinationPolicy(match="topic://prices.>", producer_flow_control=False,
                          durable_topic_prefetch=5, individual_dlq_prefix="ActiveMQ.DLQ.Topic.",
                          max_redeliveries=2, non_persistent_to_dlq=True),
        DestinationPolicy(match="queue://>", queue_prefetch=10, topic_prefetch=20, **amq),
        DestinationPolicy(match="topic://>", queue_prefetch=10, topic_prefetch=20, **amq),
        DestinationPolicy(match="temp-queue://>", **amq),
    )


def test_kahadb_sync_strategy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, '<persistenceAdapter><kahaDB journalDiskSyncStrategy="never" '
                            'indexCacheSize="10000" journalMaxWriteBatchSize="1 mb"/>'
                            '</persistenceAdapter>\n')
    assert (config.store.fsync, config.store.max_batch_bytes) == (False, MIB)
    assert warnings(caplog)[0] == (
        f"{tmp_path / 'activemq.xml'}:3: <kahaDB> attribute 'indexCacheSize' is ignored by meshmq")


def test_no_connectors_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = load(tmp_path, "")
    assert config.listeners == ()
    assert f"{tmp_path / 'activemq.xml'}:2: no supported transport connector: the broker " \
           "will accept no connections" in warnings(caplog)


def test_later_features_are_warned_never_silent(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    load(tmp_path, """\
<networkConnectors><ldapNetworkConnector uri="ldap://l:389"/></networkConnectors>
<services><statisticsBrokerPlugin/></services>
<persistenceAdapter><levelDB directory="x"/></persistenceAdapter>
<plugins><timeStampingBrokerPlugin/></plugins>
""")
    file = tmp_path / "activemq.xml"
    assert warnings(caplog)[:4] == [
        f"{file}:3: <ldapNetworkConnector> is not supported yet, ignored",
        f"{file}:4: <services> is not supported yet, ignored",
        f"{file}:5: <levelDB> is not supported yet, ignored",
        f"{file}:6: <timeStampingBrokerPlugin> is not supported yet, ignored",
    ]


# Each row: XML body (starting on line 3), the line and option the error must name, reason.
ERRORS = [
    pytest.param('<transportConnectors>\n<transportConnector name="s" uri="stomp://h:1"/>'
                 '</transportConnectors>\n<persistenceAdapter>\n  <kahaDB '
                 'journalMaxFileLenght="32mb"/>\n</persistenceAdapter>\n', 6,
                 "broker/persistenceAdapter/kahaDB@journalMaxFileLenght",
                 "unknown <kahaDB> attribute; did you mean 'journalMaxFileLength'?",
                 id="unknown-attribute"),
    pytest.param("\n<transportConectors/>\n", 4, "broker/transportConectors",
                 "unknown element <transportConectors> in <broker>; did you mean "
                 "'transportConnectors'?", id="unknown-element"),
    pytest.param('<transportConnectors><transportConnector name="s" uri="stomp://h:70000"/>'
                 "</transportConnectors>\n", 3,
                 "broker/transportConnectors/transportConnector@uri", "port out of range",
                 id="bad-port"),
    pytest.param('<transportConnectors>\n<transportConnector name="s" uri="gopher://h:1"/>'
                 "</transportConnectors>\n", 4,
                 "broker/transportConnectors/transportConnector@uri",
                 "unknown transport scheme", id="unknown-scheme"),
    pytest.param('<transportConnectors>\n<transportConnector uri="stomp://h:1?'
                 'maximumConnections=lots"/></transportConnectors>\n', 4,
                 "broker/transportConnectors/transportConnector@uri",
                 "expected an integer, got string 'lots'", id="bad-uri-option"),
    pytest.param('<transportConnectors>\n<transportConnector uri="stomp://h:1?'
                 'transport.hbGracePeriodMultiplier=0.5"/></transportConnectors>\n', 4,
                 "broker/transportConnectors/transportConnector@uri", "must be >= 1.0",
                 id="grace-below-one"),
    pytest.param('<transportConnectors>\n<transportConnector name="a" uri="stomp://h:1"/>\n'
                 '<transportConnector name="a" uri="stomp://h:2"/>\n</transportConnectors>\n',
                 5, "broker/transportConnectors/transportConnector@name",
                 "duplicate listener name 'a'", id="duplicate-connector"),
    pytest.param('<transportConnectors>\n<transportConnector name="tls" '
                 'uri="stomp+ssl://h:1"/>\n</transportConnectors>\n', 4,
                 "broker/transportConnectors/transportConnector",
                 "stomp+ssl listener 'tls' needs ssl_certfile", id="ssl-without-pem"),
    pytest.param('<systemUsage><systemUsage>\n<memoryUsage><memoryUsage limit="64 parsecs"/>'
                 "</memoryUsage></systemUsage></systemUsage>\n", 4,
                 "broker/systemUsage/systemUsage/memoryUsage/memoryUsage@limit",
                 "unknown size unit", id="bad-size"),
    pytest.param('<destinationPolicy><policyMap><policyEntries>\n<policyEntry queue="a.>.b"/>'
                 "</policyEntries></policyMap></destinationPolicy>\n", 4,
                 "broker/destinationPolicy/policyMap/policyEntries/policyEntry@queue",
                 "'>' must be the last segment", id="bad-policy-pattern"),
    pytest.param('<destinationPolicy><policyMap><policyEntries>\n'
                 '<policyEntry queue=">" prioritizedMessages="yes"/>'
                 "</policyEntries></policyMap></destinationPolicy>\n", 4,
                 "broker/destinationPolicy/policyMap/policyEntries/policyEntry"
                 "@prioritizedMessages", "expected true or false", id="bad-bool"),
    pytest.param('<destinationPolicy><policyMap><policyEntries>\n'
                 '<policyEntry memoryLimit="1 mb"/>'
                 "</policyEntries></policyMap></destinationPolicy>\n", 4,
                 "broker/destinationPolicy/policyMap/policyEntries/policyEntry",
                 "needs exactly one of queue=", id="policy-without-destination"),
    pytest.param('<plugins><simpleAuthenticationPlugin><users>\n'
                 '<authenticationUser username="u" password="p"/>\n'
                 '<authenticationUser username="u" password="q"/>\n'
                 "</users></simpleAuthenticationPlugin></plugins>\n", 5,
                 "broker/plugins/simpleAuthenticationPlugin/users/authenticationUser@username",
                 "duplicate user 'u'", id="duplicate-user"),
    pytest.param('<plugins><simpleAuthenticationPlugin><users>\n'
                 '<authenticationUser username="u"/>\n'
                 "</users></simpleAuthenticationPlugin></plugins>\n", 4,
                 "broker/plugins/simpleAuthenticationPlugin/users/authenticationUser",
                 "missing required option 'password'", id="user-without-password"),
    pytest.param('<persistenceAdapter>\n<kahaDB directory="${activemq.dta}/k"/>'
                 "</persistenceAdapter>\n", 4, "broker/persistenceAdapter/kahaDB@directory",
                 "unknown placeholder ${activemq.dta}", id="unknown-placeholder"),
    pytest.param('<plugins><redeliveryPlugin><redeliveryPolicyMap><redeliveryPolicyMap>'
                 '<redeliveryPolicyEntries>\n<redeliveryPolicy queue="q" '
                 'maximumRedeliveries="-2"/>\n</redeliveryPolicyEntries></redeliveryPolicyMap>'
                 "</redeliveryPolicyMap></redeliveryPlugin></plugins>\n", 4,
                 "broker/plugins/redeliveryPlugin/redeliveryPolicyMap/redeliveryPolicyMap/"
                 "redeliveryPolicyEntries/redeliveryPolicy@maximumRedeliveries",
                 "must be >= 0", id="bad-redeliveries"),
]


@pytest.mark.parametrize(("body", "line", "option", "reason"), ERRORS)
def test_errors_name_file_line_and_option(tmp_path: Path, body: str, line: int, option: str,
                                          reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, body)
    err = info.value
    assert (err.file, err.line, err.option) == (str(tmp_path / "activemq.xml"), line, option)
    assert reason in err.reason


@pytest.mark.parametrize(("text", "line", "reason"), [
    pytest.param("<beans>\n<broker>\n</beans>\n", 3, "mismatched tag", id="mismatched"),
    pytest.param("<beans>\n<broker a='1' a='2'/>\n</beans>\n", 2, "duplicate attribute",
                 id="duplicate-attribute"),
    pytest.param("", 1, "no element found", id="empty"),
    pytest.param("<beans>\n<broker/>\n</beans>\n<more/>", 4, "junk after document element",
                 id="two-roots"),
])
def test_malformed_xml(tmp_path: Path, text: str, line: int, reason: str) -> None:
    path = tmp_path / "activemq.xml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.file, info.value.line, info.value.option) == (str(path), line, None)
    assert info.value.reason == f"malformed XML: {reason}"


def test_broker_must_exist_once(tmp_path: Path) -> None:
    path = tmp_path / "activemq.xml"
    path.write_text("<beans><bean id='x'/></beans>")
    with pytest.raises(ConfigError, match="no <broker> element"):
        load_config(path)
    path.write_text("<beans>\n<broker/>\n<broker/>\n</beans>")
    with pytest.raises(ConfigError, match="more than one <broker>") as info:
        load_config(path)
    assert info.value.line == 3


# ------------------------------------------------------------------ authorizationPlugin

# The block ActiveMQ's documentation and main's conf/activemq.xml use.
AUTHORIZATION = """<plugins>
<authorizationPlugin><map><authorizationMap>
<authorizationEntries>
  <authorizationEntry queue=">" read="admins" write="admins" admin="admins"/>
  <authorizationEntry queue="USERS.>" read="users" write="users" admin="users"/>
  <authorizationEntry topic="ActiveMQ.Advisory.>" read="guests,users" write="guests, users"
                      admin="guests,users"/>
  <authorizationEntry tempQueue="true" read="x"/>
</authorizationEntries>
<defaultEntry><authorizationEntry read="auditors"/></defaultEntry>
<tempDestinationAuthorizationEntry>
  <tempDestinationAuthorizationEntry read="tempDestinationAdmins" write="tempDestinationAdmins"
                                     admin="tempDestinationAdmins"/>
</tempDestinationAuthorizationEntry>
</authorizationMap></map></authorizationPlugin>
</plugins>
"""


def test_authorization_plugin_imports_entries_default_and_temp(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from meshmq.config.model import AuthorizationEntry, AuthorizationRights

    caplog.set_level(logging.WARNING, "meshmq.config")
    authz = load(tmp_path, AUTHORIZATION).auth.authorization
    assert authz is not None
    assert authz.entries == (
        AuthorizationEntry(queue=">", read=("admins",), write=("admins",), admin=("admins",)),
        AuthorizationEntry(queue="USERS.>", read=("users",), write=("users",),
                           admin=("users",)),
        AuthorizationEntry(topic="ActiveMQ.Advisory.>", read=("guests", "users"),
                           write=("guests", "users"), admin=("guests", "users")))
    assert authz.default == AuthorizationRights(read=("auditors",))
    assert authz.temp == AuthorizationRights(read=("tempDestinationAdmins",),
                                             write=("tempDestinationAdmins",),
                                             admin=("tempDestinationAdmins",))
    assert any("tempQueue" in w and "no effect" in w for w in warnings(caplog))


@pytest.mark.parametrize(("body", "line", "message"), [
    pytest.param('<plugins><authorizationPlugin><map>\n<cachedLDAPAuthorizationMap/>\n'
                 "</map></authorizationPlugin></plugins>\n", 4,
                 "<cachedLDAPAuthorizationMap> is not supported", id="ldap"),
    pytest.param('<plugins><authorizationPlugin><map><authorizationMap>\n'
                 '<authorizationEntries><authorizationEntry read="a"/>'
                 "</authorizationEntries></authorizationMap></map></authorizationPlugin>"
                 "</plugins>\n", 4, "names a queue or a topic pattern", id="no-pattern"),
    pytest.param('<plugins><authorizationPlugin><map><authorizationMap>\n'
                 '<authorizationEntries><authorizationEntry queue="a.>.b" read="a"/>'
                 "</authorizationEntries></authorizationMap></map></authorizationPlugin>"
                 "</plugins>\n", 4, "'>' must be the last segment", id="bad-pattern"),
    pytest.param('<plugins><authorizationPlugin><map>\n<authorizationMap '
                 'groupClass="org.apache.activemq.jaas.UserPrincipal"/>'
                 "</map></authorizationPlugin></plugins>\n", 4, "groups only",
                 id="user-principals"),
])
def test_authorization_plugin_errors_name_the_line(tmp_path: Path, body: str, line: int,
                                                   message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, body)
    assert info.value.line == line and message in str(info.value), str(info.value)
