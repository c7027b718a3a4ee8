"""Exactly-once (MQTT 5 QoS 2) across a broker restart, as an outside suite tried it.

paho-mqtt 2.x publisher and subscriber, persistent sessions on both sides, N QoS 2
messages a few ms apart; the broker (a subprocess) is stopped with SIGTERM or SIGKILL
part-way and started again on the same ports; both clients reconnect by themselves.
Prints, per run, how many messages arrived and how many were duplicates.

    .venv/bin/python bench/repro_mqtt_qos2_restart.py --runs 5 --signal TERM
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "meshmq.cli.main", "broker", "--config",
                             str(cfg)], stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while "started" not in log.read_text(errors="replace").split("received SIG")[-1]:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("broker did not start:\n" + log.read_text(errors="replace"))
        time.sleep(0.02)
    return proc


def client(port: int, client_id: str) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=MQTTProtocolVersion.MQTTv5)
    c.reconnect_delay_set(0.05, 0.5)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect("127.0.0.1", port, 30, clean_start=False, properties=props)
    return c


def one_run(count: int, gap_s: float, kill_after_s: float, sig: signal.Signals) -> dict[str, int]:
    work = Path(tempfile.mkdtemp(prefix="qos2-restart-"))
    port = free_port()
    cfg = work / "meshmq.toml"
    cfg.write_text(f"""[broker]
name = "qos2"
data_directory = "{work / 'data'}"

[[listeners]]
name = "mqtt"
url = "mqtt://127.0.0.1:{port}"

[management]
enabled = false
""" + ("\n[trace]\nenabled = true\n" if os.environ.get("REPRO_TRACE") else ""))
    log = work / "broker.log"
    proc = start_broker(cfg, log)
    got: collections.Counter[bytes] = collections.Counter()
    lock = threading.Lock()

    seen: dict[bytes, list[tuple[int, bool]]] = collections.defaultdict(list)

    def on_message(c: paho.Client, u: object, msg: paho.MQTTMessage) -> None:
        with lock:
            got[msg.payload] += 1
            seen[msg.payload].append((msg.mid, bool(msg.dup)))

    sub = client(port, "qos2-sub")
    sub.on_message = on_message
    sub.loop_start()
    deadline = time.monotonic() + 10
    while not sub.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)
    sub.subscribe("qos2/t", qos=2)
    time.sleep(0.2)
    pub = client(port, "qos2-pub")
    pub.loop_start()
    started = time.monotonic()
    restarted = False
    for i in range(count):
        pub.publish("qos2/t", f"m{i}".encode(), qos=2)
        time.sleep(gap_s)
        if not restarted and time.monotonic() - started > kill_after_s:
            proc.send_signal(sig)
            proc.wait(30)
            proc = start_broker(cfg, log)
            restarted = True
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if len(got) >= count:
                break
        time.sleep(0.05)
    time.sleep(1.0)  # late duplicates
    pub.loop_stop()
    sub.loop_stop()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    if os.environ.get("REPRO_VERBOSE"):
        print({k: v for k, v in seen.items() if len(v) > 1}, "log:", log)
    else:
        shutil.rmtree(work, ignore_errors=True)
    with lock:
        return {"arrived": len(got), "duplicates": sum(n - 1 for n in got.values()),
                "missing": count - len(got)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--kill-after", type=float, default=1.0)
    parser.add_argument("--signal", choices=["TERM", "KILL"], default="TERM")
    args = parser.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    results = [one_run(args.count, args.gap_ms / 1000, args.kill_after, sig)
               for _ in range(args.runs)]
    for r in results:
        print(json.dumps(r))
    print(f"duplicates per run: {[r['duplicates'] for r in results]}, "
          f"missing per run: {[r['missing'] for r in results]}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
