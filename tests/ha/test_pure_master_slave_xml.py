"""ActiveMQ's pure master/slave, as the seed (004) configures it, imported and run: the
slave names the master's OpenWire connector in ``masterConnectorURI``; the master's file
has only a plain ``tcp://`` connector on that port. meshmq elects its master by majority,
so the files must also name a witness (the load refuses, naming file, line and attribute,
until they do); with it, the two brokers and the witness start from activemq.xml files
alone, one serves, the other is a slave, and a SIGKILL of the master hands over."""

from __future__ import annotations

from pathlib import Path

import pytest
import stomp

from meshmq.config.load import load_config
from meshmq.errors import ConfigError
from tests.ha.support import HaProcess
from tests.support.brokers import poll
from tests.support.ports import free_ports

# The seed's slave broker element, verbatim (its single attribute makes it a slave).
SEED_SLAVE = ('<broker xmlns="http://activemq.apache.org/schema/core" '
              'masterConnectorURI="tcp://localhost:61616" brokerName="amq1S" '
              'dataDirectory="${activemq.base}/data">')


def _file(directory: Path, broker: str, connectors: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "activemq.xml"
    path.write_text('<beans xmlns="http://www.springframework.org/schema/beans">\n'
                    f"{broker}\n"
                    f"  <transportConnectors>\n{connectors}  </transportConnectors>\n"
                    "</broker>\n</beans>\n")
    return path


def _openwire(port: int) -> str:
    return f'    <transportConnector name="openwire" uri="tcp://127.0.0.1:{port}"/>\n'


def _stomp(port: int) -> str:
    return f'    <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>\n'


def test_the_seed_slave_alone_is_refused_naming_what_to_add(tmp_path: Path) -> None:
    path = _file(tmp_path, SEED_SLAVE, _openwire(62616))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.file, info.value.line, info.value.option) == (
        str(path), 2, "broker@masterConnectorURI")
    assert ('masterConnectorURI="static:(tcp://localhost:61616,tcp://WITNESS-HOST:PORT)"'
            in str(info.value))
    assert 'masterConnectorURI="static:(tcp://THIS-HOST:62616,' in str(info.value)
    assert "\n" not in str(info.value)


def test_the_master_connector_element_alone_is_refused_too(tmp_path: Path) -> None:
    path = _file(tmp_path, '<broker xmlns="http://activemq.apache.org/schema/core" '
                 'brokerName="amq1S">\n<masterConnector remoteURI="tcp://localhost:61616" '
                 'userName="User1" password="pass1"/>', _openwire(62616))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.line, info.value.option) == (
        3, "broker/masterConnector@remoteURI")
    assert 'remoteURI="static:(tcp://localhost:61616,tcp://WITNESS-HOST:PORT)"' \
        in str(info.value)


def _role(proc: HaProcess) -> str | None:
    try:
        role: str = proc.stat()["ha"]["role"]
    except (OSError, AssertionError):
        return None
    return role


def test_the_seed_pair_with_a_witness_serves_and_fails_over(tmp_path: Path) -> None:
    m_wire, s_wire, w_wire, m_stomp, s_stomp, m_mgmt, s_mgmt = free_ports(7)
    witness_uri = f"tcp://127.0.0.1:{w_wire}"
    # The seed's master: a plain broker with an openwire connector on the port the slave
    # names; plus what the load error asks for: the slave's and the witness's addresses.
    master = _file(tmp_path / "master",
                   '<broker xmlns="http://activemq.apache.org/schema/core" brokerName="amq1" '
                   'dataDirectory="${activemq.base}/data" masterConnectorURI='
                   f'"static:(tcp://127.0.0.1:{s_wire},{witness_uri})">',
                   _openwire(m_wire) + _stomp(m_stomp))
    # The seed's slave, its masterConnectorURI naming the master's openwire connector
    # (and now the witness).
    slave = _file(tmp_path / "slave", SEED_SLAVE.replace(
        '"tcp://localhost:61616"', f'"static:(tcp://127.0.0.1:{m_wire},{witness_uri})"'),
        _openwire(s_wire) + _stomp(s_stomp))
    witness = _file(tmp_path / "witness",
                    '<broker xmlns="http://activemq.apache.org/schema/core" brokerName="w" '
                    'dataDirectory="${activemq.base}/data" masterConnectorURI='
                    f'"static:(tcp://127.0.0.1:{m_wire},tcp://127.0.0.1:{s_wire})">',
                    _openwire(w_wire))
    # The openwire connectors became the replication addresses, the stomp ones remain.
    for path, wire, stomp_port in ((master, m_wire, m_stomp), (slave, s_wire, s_stomp)):
        config = load_config(path)
        assert config.ha.mode == "replicated"
        assert config.ha.listen == f"127.0.0.1:{wire}"
        assert [(lst.name, lst.port) for lst in config.listeners] == [("stomp", stomp_port)]

    # activemq.xml has no management endpoint (ActiveMQ's console is in jetty.xml).
    procs = {
        "master": HaProcess(master, tmp_path / "master.log",
                            args=("--management", f"127.0.0.1:{m_mgmt}")),
        "slave": HaProcess(slave, tmp_path / "slave.log",
                           args=("--management", f"127.0.0.1:{s_mgmt}")),
        "witness": HaProcess(witness, tmp_path / "witness.log", command="witness"),
    }
    try:
        for proc in procs.values():
            proc.start()
        # meshmq elects the master: either broker may win.
        serving: list[str] = poll(lambda: [n for n in ("master", "slave")
                                           if "listening for stomp" in procs[n].text()],
                                  60, "one broker serving")
        assert len(serving) == 1, serving
        first = serving[0]
        other = "slave" if first == "master" else "master"
        poll(lambda: _role(procs[first]) == "master" and _role(procs[other]) == "slave",
             30, "one master and one slave")
        assert "listening for stomp" not in procs[other].text()

        port = procs[first].port
        conn = stomp.Connection12([("127.0.0.1", port)], timeout=5)
        conn.connect(wait=True)
        conn.send("/queue/pair", "kept", headers={"persistent": "true"},
                  receipt="r1")
        poll(lambda: procs[first].stat()["destinations"] is not None, 10, "stat")
        conn.disconnect()

        procs[first].kill9()
        poll(lambda: "listening for stomp" in procs[other].text(), 60,
             "the slave to take over")
        assert _role(procs[other]) == "master"
        received: list[str] = []

        class Listener(stomp.ConnectionListener):  # type: ignore[misc]
            def on_message(self, frame: stomp.utils.Frame) -> None:
                received.append(frame.body)

        conn = stomp.Connection12([("127.0.0.1", procs[other].port)], timeout=5)
        conn.set_listener("l", Listener())
        conn.connect(wait=True)
        conn.subscribe("/queue/pair", id="1", ack="auto")
        poll(lambda: received == ["kept"], 30, "the confirmed message on the new master")
        conn.disconnect()
    finally:
        for proc in procs.values():
            if proc.alive():
                proc.terminate()
