"""Configuration of replicated master/slave: TOML validation and the activemq.xml
mapping of pure master/slave (masterConnectorURI, <masterConnector>,
shutdownOnMasterFailure, waitForSlave)."""

from __future__ import annotations

import re

import pytest

from meshmq.config.activemq_xml import loads_activemq_xml
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError

GOOD = ('[ha]\nmode = "replicated"\nlisten = "127.0.0.1:7001"\n'
        'members = ["127.0.0.1:7002", "127.0.0.1:7003"]\n')


def test_toml_replicated_section() -> None:
    config = loads_toml(GOOD + 'synchronous = false\nlog_retain_bytes = "1 mb"\n'
                        'node_id = "a"\nuser = "repl"\npassword = "s3cret"\n')
    ha = config.ha
    assert (ha.mode, ha.listen, ha.members) == (
        "replicated", "127.0.0.1:7001", ("127.0.0.1:7002", "127.0.0.1:7003"))
    assert (ha.synchronous, ha.log_retain_bytes, ha.node_id) == (False, 1 << 20, "a")
    assert (ha.user, ha.password, ha.role, ha.can_be_master) == (
        "repl", "s3cret", "broker", True)


def test_a_witness_needs_no_journal() -> None:
    config = loads_toml('[store]\nkind = "postgres"\ndsn = "h"\n' + GOOD + 'role = "witness"\n')
    assert config.ha.role == "witness"


@pytest.mark.parametrize(("extra", "option", "message"), [
    ('[ha]\nmode = "replicated"\nmembers = ["h:1"]\n', "ha.listen", "needs listen"),
    ('[ha]\nmode = "replicated"\nlisten = "h:1"\n', "ha.members", "needs members"),
    ('[ha]\nmode = "replicated"\nlisten = "h"\nmembers = ["h:2"]\n', "ha.listen",
     "not a HOST:PORT"),
    ('[ha]\nmode = "replicated"\nlisten = "h:1"\nmembers = ["h:2", "h:99999"]\n',
     "ha.members[1]", "not a HOST:PORT"),
    ('[ha]\nmode = "replicated"\nlisten = "h:1"\nmembers = ["h:1"]\n', "ha.members",
     "not this one"),
    ('[ha]\nmode = "replicated"\nlisten = "h:1"\nmembers = ["h:2", "h:2"]\n', "ha.members",
     "each other node once"),
    ('[store]\nkind = "postgres"\ndsn = "h"\n' + GOOD, "ha.mode", "store.kind = 'journal'"),
    (GOOD + 'role = "arbiter"\n', "ha.role", "arbiter"),
])
def test_replicated_mistakes_name_the_bad_part(extra: str, option: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_toml(extra)
    assert info.value.option == option


def _xml(broker: str) -> str:
    return (f"<beans>{broker}<persistenceAdapter><kahaDB directory='/x'/>"
            "</persistenceAdapter></broker></beans>")


def test_master_connector_uri_makes_a_replicated_node_not_a_shared_store() -> None:
    ha = loads_activemq_xml(_xml('<broker brokerName="s" masterConnectorURI='
                                 '"static:(tcp://m.example:62001,tcp://w.example:62003)">')).ha
    assert (ha.mode, ha.members, ha.listen) == (
        "replicated", ("m.example:62001", "w.example:62003"), "0.0.0.0:62001")
    assert ha.can_be_master is True and ha.user is None


@pytest.mark.parametrize("where", ["{mc}", "<services>{mc}</services>"])
def test_master_connector_element_with_credentials_and_a_witness(where: str) -> None:
    mc = ('<masterConnector remoteURI="static:(tcp://m:62001,tcp://w:62003)" '
          'userName="repl" password="pw"/>')
    ha = loads_activemq_xml(_xml('<broker brokerName="s" waitForSlave="true">'
                                 + where.format(mc=mc))).ha
    assert (ha.mode, ha.members, ha.user, ha.password) == (
        "replicated", ("m:62001", "w:62003"), "repl", "pw")


def test_shutdown_on_master_failure_means_never_take_over() -> None:
    ha = loads_activemq_xml(_xml('<broker shutdownOnMasterFailure="true" '
                                 'masterConnectorURI="static:(tcp://m:62001,tcp://w:1)">')).ha
    assert ha.can_be_master is False


@pytest.mark.parametrize(("broker", "message"), [
    ('<broker masterConnectorURI="http://m:1">', "not a tcp://HOST:PORT"),
    ('<broker masterConnectorURI="tcp://m">', "not a tcp://HOST:PORT"),
    ("<broker><masterConnector/>", "needs remoteURI"),
    ('<broker waitForSlave="true">', "name each other with <masterConnector"),
])
def test_pure_master_slave_mistakes_name_the_bad_part(broker: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        loads_activemq_xml(_xml(broker))


def test_the_tcp_connector_becomes_the_replication_address_and_later_lines_stay_right(
) -> None:
    xml = ('<beans>\n<broker brokerName="s" masterConnectorURI="static:(tcp://m:62001,'
           'tcp://w:62003)">\n<transportConnectors>\n'
           '<transportConnector name="openwire" uri="tcp://0.0.0.0:62002"/>\n'
           '<transportConnector name="stomp" uri="stomp://0.0.0.0:61613"/>\n'
           '<transportConnector name="stomp" uri="stomp://0.0.0.0:61614"/>\n'
           '</transportConnectors>\n</broker></beans>')
    with pytest.raises(ConfigError) as info:  # the duplicate is the third connector
        loads_activemq_xml(xml, file="s.xml")
    assert (info.value.line, info.value.reason) == (6, "duplicate listener name 'stomp'")
    config = loads_activemq_xml(xml.replace('name="stomp" uri="stomp://0.0.0.0:61614"',
                                            'name="stomp2" uri="stomp://0.0.0.0:61614"'))
    assert config.ha.listen == "0.0.0.0:62002"
    assert [lst.name for lst in config.listeners] == ["stomp", "stomp2"]


def test_without_a_tcp_connector_a_loopback_pair_is_told_to_add_one() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            'add <transportConnector name="openwire" uri="tcp://0.0.0.0:PORT"/>')):
        loads_activemq_xml(_xml('<broker masterConnectorURI='
                                '"static:(tcp://localhost:61616,tcp://w:1)">'))
