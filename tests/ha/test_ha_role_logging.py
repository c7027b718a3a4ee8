"""A broker whose activemq.xml has a plain <kahaDB> runs with the shared-store lease (a
second broker on the directory would wait as a slave, as in ActiveMQ), but alone it is no
master/slave pair: it logs no master/slave role lines. A configured pair still does."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from meshmq.config.activemq_xml import loads_activemq_xml
from meshmq.config.model import BrokerConfig, HaConfig, ManagementConfig
from tests.support.brokers import ThreadBroker, make_config


def _xml(tmp_path: Path, kahadb: str) -> BrokerConfig:
    config = loads_activemq_xml(
        '<beans><broker brokerName="b" dataDirectory="data"><transportConnectors>'
        '<transportConnector name="stomp" uri="stomp://127.0.0.1:0"/></transportConnectors>'
        f'<persistenceAdapter>{kahadb}</persistenceAdapter></broker></beans>',
        base_dir=tmp_path)
    return dataclasses.replace(config, management=ManagementConfig(port=0))


def _role_lines(caplog: pytest.LogCaptureFixture, config: BrokerConfig) -> list[str]:
    caplog.set_level(logging.INFO)
    broker = ThreadBroker(config).start()
    try:
        assert broker.port > 0
    finally:
        broker.stop()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
            and r.getMessage().startswith(("master:", "slave:"))]


def test_a_lone_kahadb_broker_logs_no_master_slave_roles(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _xml(tmp_path, "<kahaDB/>")
    assert config.ha.mode == "shared" and config.ha.implicit
    assert _role_lines(caplog, config) == []


def test_a_kahadb_with_a_locker_or_toml_shared_mode_logs_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    locked = _xml(tmp_path / "x", '<kahaDB lockKeepAlivePeriod="1000"/>')
    assert not locked.ha.implicit
    assert [line.split(" at epoch")[0] for line in _role_lines(caplog, locked)] == [
        "master: took the shared lease", "master: recovering the store and starting all "
        "connectors"]
    caplog.clear()
    toml = make_config(tmp_path / "t", ha=HaConfig(mode="shared"))
    assert len(_role_lines(caplog, toml)) == 2
