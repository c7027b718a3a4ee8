"""The broker's $SYS statistics are regenerated at every start: an empty broker that is
stopped and started again recovers nothing, and ``meshmq stat`` lists no $SYS rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from tests.support.brokers import ProcessBroker, poll
from tests.support.ports import free_ports


def _config(tmp_path: Path) -> Path:
    stomp, mqtt, mgmt = free_ports(3)
    cfg = tmp_path / "meshmq.toml"
    cfg.write_text(f"""
[broker]
name = "sys-restart"
data_directory = "{tmp_path / 'data'}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{stomp}"

[[listeners]]
name = "mqtt"
url = "mqtt://127.0.0.1:{mqtt}"

[store]
fsync = true

[management]
port = {mgmt}
""")
    return cfg


def _stat(cfg: Path) -> str:
    port = re.search(r"\[management\]\nport = (\d+)", cfg.read_text())
    assert port is not None
    out = subprocess.run([sys.executable, "-m", "meshmq.cli.main", "stat", "--url",
                          f"127.0.0.1:{port.group(1)}"], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout


def test_empty_broker_restart_recovers_no_sys_messages(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    log = tmp_path / "broker.log"
    first = ProcessBroker(cfg, log).start()
    # The statistics are there for MQTT subscribers (retained) ...
    got: list[str] = []
    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id="sys-reader")
    sub.on_message = lambda _c, _u, m: got.append(m.topic)
    sub.connect("127.0.0.1", first.ports["mqtt"])
    sub.loop_start()
    try:
        sub.subscribe("$SYS/broker/#", qos=0)
        poll(lambda: "$SYS/broker/version" in got, what="retained $SYS/broker/version")
    finally:
        sub.disconnect()
        sub.loop_stop()
    # ... but they are the broker's own topics, not destinations of the operator's.
    assert "$SYS" not in _stat(cfg)
    assert first.terminate() == 0

    before = len(log.read_text())
    second = ProcessBroker(cfg, log).start()
    try:
        text = log.read_text()[before:]
        assert "store recovered 0 messages in 0 destinations" in text, text
        assert "$SYS" not in _stat(cfg)
    finally:
        assert second.terminate() == 0
