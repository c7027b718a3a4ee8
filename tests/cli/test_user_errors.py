"""What a new user meets when something is wrong: one line on stderr that says what to
change, a non-zero exit status, never a traceback. Real subprocess brokers and real
sockets held busy by the test."""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.brokers import ProcessBroker, ThreadBroker, make_config, poll
from tests.support.ports import free_port

from meshmq.config.model import ListenerConfig

pytestmark = pytest.mark.slow


def meshmq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshmq.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out
    lines = [ln for ln in done.stderr.splitlines() if " INFO " not in ln]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def broker_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--log-level", "WARNING", "broker", "--data", str(tmp_path / "data"), *extra]


@pytest.mark.parametrize(("flag", "what"), [("--stomp", "STOMP"), ("--mqtt", "MQTT")])
def test_busy_listener_port_is_one_line(tmp_path: Path, busy_port: int, flag: str,
                                        what: str) -> None:
    others = {"--stomp": "127.0.0.1:0", "--mqtt": "127.0.0.1:0"}
    others[flag] = f"127.0.0.1:{busy_port}"
    done = meshmq(*broker_args(tmp_path, "--stomp", others["--stomp"], "--mqtt",
                               others["--mqtt"], "--management", "off"))
    assert done.returncode != 0
    line = one_line(done)
    assert f"cannot listen for {what}" in line and f"127.0.0.1:{busy_port}" in line
    assert "address already in use" in line and flag in line
    # Nothing stayed behind: the journal is unlocked, a broker starts on the same data.
    again = meshmq(*broker_args(tmp_path, "--stomp", "127.0.0.1:0", "--mqtt", "127.0.0.1:0",
                                "--management", f"127.0.0.1:{busy_port}"))
    assert "locked" not in again.stderr


def test_busy_management_port_is_one_line(tmp_path: Path, busy_port: int) -> None:
    done = meshmq(*broker_args(tmp_path, "--stomp", "127.0.0.1:0", "--mqtt", "127.0.0.1:0",
                               "--management", f"127.0.0.1:{busy_port}"))
    assert done.returncode != 0
    line = one_line(done)
    assert "cannot listen for the management endpoint" in line
    assert f"127.0.0.1:{busy_port}" in line and "--management" in line


def test_busy_replication_port_is_one_line(tmp_path: Path, busy_port: int) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text(f"""
[broker]
name = "n1"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"

[management]
enabled = false

[ha]
mode = "replicated"
listen = "127.0.0.1:{busy_port}"
members = ["127.0.0.1:{free_port()}", "127.0.0.1:{free_port()}"]
""")
    done = meshmq("--log-level", "WARNING", "broker", "--config", str(cfg))
    assert done.returncode != 0
    line = one_line(done)
    assert "cannot listen for replication" in line and "[ha] listen" in line


def test_port_zero_lets_the_os_choose_and_other_listeners_stay(tmp_path: Path) -> None:
    cfg = tmp_path / "meshmq.toml"
    cfg.write_text(f"""
[broker]
name = "zero"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{free_port()}"

[[listeners]]
name = "ws"
url = "ws://127.0.0.1:0"

[management]
enabled = false
""")
    broker = ProcessBroker(cfg, tmp_path / "broker.log",
                           extra_args=("--stomp", "127.0.0.1:0")).start()
    try:
        assert broker.port not in (0, 61613)
        assert "ws" in broker.ports  # --stomp replaced only the STOMP listener
    finally:
        broker.terminate()


def test_two_brokers_from_activemq_xml_start_on_one_host(tmp_path: Path) -> None:
    def xml(name: str) -> Path:
        path = tmp_path / f"{name}.xml"
        path.write_text(f"""<beans><broker xmlns="http://activemq.apache.org/schema/core"
  brokerName="{name}" dataDirectory="{tmp_path / name}" persistent="false">
  <transportConnectors>
    <transportConnector name="stomp" uri="stomp://127.0.0.1:{free_port()}"/>
  </transportConnectors>
</broker></beans>""")
        return path

    first = ProcessBroker(xml("b1"), tmp_path / "b1.log").start()
    try:
        second = ProcessBroker(xml("b2"), tmp_path / "b2.log").start()
        try:
            ports = []
            for log in ("b1.log", "b2.log"):
                found = re.search(r"management endpoint on http://[\d.]+:(\d+)",
                                  (tmp_path / log).read_text())
                assert found, log
                ports.append(int(found.group(1)))
            assert ports[0] != ports[1]
        finally:
            second.terminate()
    finally:
        first.terminate()


def test_send_and_receive_without_a_broker_are_one_line() -> None:
    port = free_port()
    for args in (("send", "/queue/q", "x"), ("receive", "/queue/q", "--timeout", "1")):
        done = meshmq(*args, "--url", f"127.0.0.1:{port}")
        assert done.returncode == 2
        line = one_line(done)
        assert f"cannot reach a broker at 127.0.0.1:{port}" in line and "--url" in line


def test_stat_pointed_at_a_stomp_port_is_one_line(broker: ThreadBroker) -> None:
    started = time.monotonic()
    done = meshmq("stat", "--url", f"127.0.0.1:{broker.port}", timeout=60)
    assert done.returncode == 2
    line = one_line(done)
    assert "is not a meshmq management endpoint" in line
    assert time.monotonic() - started < 30


def test_help_is_for_users() -> None:
    done = meshmq("--help")
    assert done.returncode == 0
    assert "thin shell" not in done.stdout
    assert "meshmq broker --stomp 127.0.0.1:0" in done.stdout
    broker_help = meshmq("broker", "--help").stdout
    assert "replaces only the plain STOMP listener" in " ".join(broker_help.split())


def test_broker_started_on_port_zero_logs_the_real_port(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "meshmq.cli.main", "broker", "--data",
                             str(tmp_path / "data"), "--stomp", "127.0.0.1:0", "--mqtt",
                             "127.0.0.1:0", "--management", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None

        def started() -> bool:
            line = proc.stdout.readline() if proc.stdout else ""
            lines.append(line)
            return "started" in line

        poll(started, 30, "the broker to start")
        text = "".join(lines)
        stomp = re.search(r"listening for stomp on stomp://127\.0\.0\.1:(\d+)", text)
        assert stomp and int(stomp.group(1)) not in (0, 61613), text
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def _stomp_config(tmp_path: Path, kind: str, port: int) -> Path:
    if kind == "toml":
        path = tmp_path / "meshmq.toml"
        path.write_text(f"""
[broker]
name = "cfg"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "front"
url = "stomp://127.0.0.1:{port}"

[management]
enabled = false
""")
    else:
        path = tmp_path / "activemq.xml"
        path.write_text(f"""<beans><broker xmlns="http://activemq.apache.org/schema/core"
  brokerName="cfg" dataDirectory="{tmp_path / 'data'}" persistent="false">
  <transportConnectors>
    <transportConnector name="front" uri="stomp://127.0.0.1:{port}"/>
  </transportConnectors>
</broker></beans>""")
    return path


@pytest.mark.parametrize(("kind", "entry"), [
    ("toml", 'the [[listeners]] entry named "front"'),
    ("xml", '<transportConnector name="front">'),
    ("flags", None),
])
def test_bind_failure_says_where_the_address_is_set(tmp_path: Path, busy_port: int,
                                                    kind: str, entry: str | None) -> None:
    if kind == "flags":
        args = broker_args(tmp_path, "--stomp", f"127.0.0.1:{busy_port}", "--mqtt",
                           "127.0.0.1:0", "--management", "off")
    else:
        cfg = _stomp_config(tmp_path, kind, busy_port)
        args = ["--log-level", "WARNING", "broker", "--config", str(cfg)]
    done = meshmq(*args)
    assert done.returncode != 0
    line = one_line(done)
    assert line.startswith("meshmq: cannot listen for STOMP")
    assert f"on 127.0.0.1:{busy_port} (address already in use" in line
    assert "--stomp HOST:PORT" in line
    if entry is None:
        assert "configuration" not in line  # there is none: the flag is what to change
    else:
        assert entry in line and str(cfg) in line


def test_unloadable_tls_certificate_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "tls.toml"
    cfg.write_text(f"""
[broker]
name = "tls"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "secure"
url = "stomp+ssl://127.0.0.1:0"
ssl_certfile = "{tmp_path / 'missing.pem'}"

[management]
enabled = false
""")
    done = meshmq("--log-level", "WARNING", "broker", "--config", str(cfg))
    assert done.returncode == 2
    line = one_line(done)
    assert "cannot listen" not in line  # the address is fine; the certificate is not
    assert str(cfg) in line and "ssl_certfile" in line and "missing.pem" in line


def test_replication_bind_failure_leaves_nothing_bound_or_locked(tmp_path: Path,
                                                                 busy_port: int) -> None:
    import asyncio
    import fcntl
    import os

    from meshmq.config.load import load_config
    from meshmq.errors import ListenError
    from meshmq.transport.runtime import BrokerRuntime

    management = free_port()
    cfg = tmp_path / "node.toml"
    cfg.write_text(f"""
[broker]
name = "n1"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:0"

[management]
port = {management}

[ha]
mode = "replicated"
listen = "127.0.0.1:{busy_port}"
members = ["127.0.0.1:{free_port()}", "127.0.0.1:{free_port()}"]
""")
    config = load_config(cfg)
    config = dataclasses.replace(config, store=dataclasses.replace(config.store, fsync=False))

    async def start() -> None:
        with pytest.raises(ListenError, match="cannot listen for replication"):
            await BrokerRuntime(config).start()

    asyncio.run(start())
    with socket.socket() as s:  # the management endpoint let go of its port
        s.bind(("127.0.0.1", management))
    locks = list((tmp_path / "data").rglob("lock"))
    assert locks
    for lock in locks:  # and the journal of its lock
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_unusable_data_directory_is_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    done = meshmq("--log-level", "WARNING", "broker", "--data", str(not_a_dir), "--stomp",
                  "127.0.0.1:0", "--mqtt", "127.0.0.1:0", "--management", "off")
    assert done.returncode != 0
    line = one_line(done)
    assert str(not_a_dir) in line and "--data" in line


def test_send_and_receive_at_a_port_that_is_no_stomp_broker(tmp_path: Path) -> None:
    mqtt = ListenerConfig(name="mqtt", protocol="mqtt", host="127.0.0.1", port=0)
    config = make_config(tmp_path / "data")
    broker = ThreadBroker(dataclasses.replace(config, listeners=(*config.listeners, mqtt)))
    broker.start()
    try:
        assert broker.runtime is not None
        where = f"127.0.0.1:{broker.runtime.addresses['mqtt'][1]}"
        for args in (("send", "/queue/q", "x"), ("receive", "/queue/q", "--timeout", "5")):
            done = meshmq(*args, "--url", where)
            assert done.returncode == 2
            line = one_line(done)
            assert f"{where} does not answer as a STOMP broker" in line
            assert "--url" in line
    finally:
        broker.stop()


def test_send_refused_by_the_broker_names_it(broker: ThreadBroker) -> None:
    where = f"127.0.0.1:{broker.port}"
    done = meshmq("send", "not-a-destination", "x", "--url", where)
    assert done.returncode != 0
    line = one_line(done)
    assert f"meshmq send: the broker at {where} refused: " in line
    assert "not-a-destination" in line



def test_audit_of_a_missing_trace_path_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    missing = tmp_path / "no-such-traces"
    for extra in ((), ("--follow", "--once")):
        done = meshmq("audit", str(missing), "--out", str(tmp_path / "audit"), *extra)
        assert done.returncode != 0
        line = one_line(done)  # no Spark start-up chatter either
        assert f"trace path {missing} does not exist" in line


def test_second_broker_on_the_same_data_directory_is_told_to_use_its_own(
        tmp_path: Path) -> None:
    first = ThreadBroker(make_config(tmp_path / "data")).start()
    try:
        done = meshmq(*broker_args(tmp_path, "--stomp", "127.0.0.1:0", "--mqtt",
                                   "127.0.0.1:0", "--management", "off"))
        assert done.returncode != 0
        line = one_line(done)
        assert "locked by another broker" in line and "--data DIR" in line
    finally:
        first.stop()
