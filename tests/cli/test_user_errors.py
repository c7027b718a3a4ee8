"""What a new user meets when something is wrong: one line on stderr that says what to
change, a non-zero exit status, never a traceback. Real subprocess brokers and real
sockets held busy by the test."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.brokers import ProcessBroker, ThreadBroker, poll
from tests.support.ports import free_port

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
