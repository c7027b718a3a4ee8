"""HA configuration in TOML and activemq.xml: mapping, defaults and clear errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from meshmq.config.activemq_xml import loads_activemq_xml
from meshmq.config.toml_loader import loads_toml
from meshmq.errors import ConfigError


def xml(body: str, head: str = "<broker brokerName='b'>") -> str:
    return f"<beans>\n{head}\n{body}\n</broker>\n</beans>\n"


def test_kahadb_is_a_shared_store_as_in_activemq() -> None:
    config = loads_activemq_xml(xml('<persistenceAdapter><kahaDB directory="/srv/shared/k" '
                                    'lockKeepAlivePeriod="2000"><locker><shared-file-locker '
                                    'lockAcquireSleepInterval="250"/></locker></kahaDB>'
                                    '</persistenceAdapter>'))
    assert config.store.kind == "journal"
    assert config.store.directory == Path("/srv/shared/k")
    assert (config.ha.mode, config.ha.keepalive_ms, config.ha.lease_ms,
            config.ha.acquire_interval_ms) == ("shared", 2000, 6000, 250)


def test_use_lock_false_and_non_persistent_brokers_have_no_ha() -> None:
    off = loads_activemq_xml(xml('<persistenceAdapter><kahaDB useLock="false"/>'
                                 '</persistenceAdapter>'))
    assert off.ha.mode == "none"
    transient = loads_activemq_xml(xml('<persistenceAdapter><kahaDB/></persistenceAdapter>',
                                       head="<broker persistent='false'>"))
    assert transient.ha.mode == "none"


POOLED = """
<bean id="postgres-ds" class="org.postgresql.ds.PGPoolingDataSource">
  <property name="serverName" value="db.example"/>
  <property name="portNumber" value="5433"/>
  <property name="databaseName" value="activemq"/>
  <property name="user" value="amq"/>
  <property name="password" value="s3cret word"/>
</bean>"""


def test_jdbc_with_lease_database_locker(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    config = loads_activemq_xml(xml(
        '<persistenceAdapter><jdbcPersistenceAdapter dataSource="#postgres-ds" '
        'lockKeepAlivePeriod="3000" createTablesOnStartup="true"><locker>'
        '<lease-database-locker lockAcquireSleepInterval="12000" leaseHolderId="amq-1" '
        'maxAllowableDiffFromDBTime="1000"/></locker><statements><statements '
        'tablePrefix="AMQ_"/></statements></jdbcPersistenceAdapter></persistenceAdapter>',
        head=POOLED + "\n<broker brokerName='b'>"))
    assert config.store.kind == "postgres"
    assert config.store.dsn == ("host=db.example port=5433 dbname=activemq user=amq "
                                "password='s3cret word'")
    assert config.store.table_prefix == "AMQ_"
    assert (config.ha.mode, config.ha.keepalive_ms, config.ha.lease_ms,
            config.ha.holder_id) == ("database", 3000, 12000, "amq-1")
    assert any("maxAllowableDiffFromDBTime' is ignored" in r.getMessage()
               for r in caplog.records)


def test_jdbc_default_locker_becomes_a_lease(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.config")
    dbcp = ('<bean id="ds" class="org.apache.commons.dbcp2.BasicDataSource">'
            '<property name="driverClassName" value="org.postgresql.Driver"/>'
            '<property name="url" value="jdbc:postgresql://pg:5432/amq"/>'
            '<property name="username" value="u"/></bean>')
    config = loads_activemq_xml(xml(
        '<persistenceAdapter><jdbcPersistenceAdapter dataSource="#ds" '
        'lockKeepAlivePeriod="30000"><locker><database-locker/></locker>'
        '</jdbcPersistenceAdapter></persistenceAdapter>', head=dbcp + "<broker>"))
    assert config.store.dsn == "host=pg port=5432 dbname=amq user=u"
    # ActiveMQ's JDBC keep-alive default (30 s) gets a lease of three renewals.
    assert (config.ha.mode, config.ha.keepalive_ms, config.ha.lease_ms) == \
        ("database", 30000, 90000)
    assert any("holds a database transaction for the broker's life" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(("body", "head", "message"), [
    ('<jdbcPersistenceAdapter dataSource="#nope"/>', "", "no <bean id='nope'>"),
    ('<jdbcPersistenceAdapter dataSource="#m"/>',
     '<bean id="m"><property name="url" value="jdbc:mysql://h/db"/></bean>',
     "only PostgreSQL data sources"),
    ('<jdbcPersistenceAdapter dataSource="#m"/>', '<bean id="m"/>', "names no PostgreSQL"),
    ('<kahaDB><locker><lease-database-locker/></locker></kahaDB>', "",
     "does not go with this persistence adapter"),
    ('<kahaDB lockKeepAlivePeriod="4000"><locker><shared-file-locker '
     'lockAcqireSleepInterval="1"/></locker></kahaDB>', "",
     "did you mean 'lockAcquireSleepInterval'"),
])
def test_xml_mistakes_name_the_bad_part(body: str, head: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        loads_activemq_xml(xml(f"<persistenceAdapter>{body}</persistenceAdapter>",
                               head=head + "<broker>"), file="activemq.xml")
    assert "activemq.xml" in str(info.value)


# Pure master/slave maps to replicated HA: tests/unit/ha/test_replicated_config.py.


def test_toml_ha_section() -> None:
    config = loads_toml('[store]\nkind = "postgres"\ndsn = "host=x"\n'
                        '[ha]\nmode = "database"\nlease_ms = 3000\nkeepalive_ms = 500\n')
    assert (config.ha.mode, config.ha.lease_ms, config.ha.keepalive_ms) == \
        ("database", 3000, 500)
    assert config.ha.restart_when_deposed is True


@pytest.mark.parametrize(("text", "option", "message"), [
    ('[ha]\nmode = "shared"\nlease_ms = 1000\nkeepalive_ms = 600\n', "ha.keepalive_ms",
     "at most half of lease_ms"),
    ('[store]\nkind = "memory"\n[ha]\nmode = "shared"\n', "ha.mode", "needs a persistent"),
    ('[ha]\nmode = "database"\n', "ha.mode", "set store.kind = 'postgres'"),
    ('[store]\nkind = "postgres"\ndsn = "h"\n[ha]\nmode = "shared"\n', "ha.mode",
     "use mode 'database'"),
    ('[store]\nkind = "postgres"\n', "store.dsn", "needs a dsn"),
    ('[ha]\nmode = "pure"\n', "ha.mode", "must be one of"),
    ('[ha]\nmode = "shared"\nholder_id = ""\n', "ha.holder_id", "1 to 64 bytes"),
])
def test_toml_ha_mistakes(text: str, option: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_toml(text, file="meshmq.toml")
    assert option in str(info.value)


def test_example_configs_load() -> None:
    from meshmq.config.load import load_config

    examples = Path(__file__).parents[3] / "examples"
    shared = load_config(examples / "ha-shared.toml")
    assert (shared.ha.mode, shared.store.directory) == (
        "shared", Path("/srv/shared/meshmq-journal"))
    replicated = load_config(examples / "ha-replicated.toml")
    assert (replicated.ha.mode, replicated.ha.members) == (
        "replicated", ("10.0.0.2:62001", "10.0.0.3:62001"))
    witness = load_config(examples / "ha-witness.toml")
    assert (witness.ha.role, witness.ha.listen) == ("witness", "10.0.0.3:62001")
    jdbc = load_config(examples / "activemq-jdbc-ha.xml")
    assert (jdbc.store.kind, jdbc.ha.mode, jdbc.ha.keepalive_ms, jdbc.ha.lease_ms) == (
        "postgres", "database", 2000, 6000)
    assert jdbc.store.dsn == ("host=db.example dbname=activemq port=5432 user=activemq "
                              "password=activemq")
