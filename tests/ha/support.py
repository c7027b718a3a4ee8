"""Helpers for the HA tests: broker processes that may start as slaves, their configs,
a failover STOMP producer (stomp.py with receipts) and a draining consumer.

The failover client library is being written on another branch; until it is merged the
producer here does what ``failover:(a,b)?randomize=false`` does: try the endpoints in
order, re-send whatever was not confirmed by a receipt.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stomp
from stomp.utils import Frame

from tests.support.brokers import ProcessBroker, poll

_LISTEN_RE = re.compile(r"listening for (\S+) on \S+://([\d.]+):(\d+)")
_MGMT_RE = re.compile(r"management endpoint on http://([\d.]+):(\d+)")


def write_config(path: Path, *, name: str, data_dir: Path, store: str = "",
                 ha: str = "", fsync: bool = False, stomp_port: int = 0) -> Path:
    """A broker config on ``data_dir`` (shared between brokers in shared-store mode)."""
    path.write_text(f"""
[broker]
name = "{name}"
data_directory = "{data_dir}"

[[listeners]]
name = "stomp"
url = "stomp://127.0.0.1:{stomp_port}"

[store]
fsync = {'true' if fsync else 'false'}
directory = "{data_dir / 'journal'}"
{store}

[management]
enabled = true
port = 0

[ha]
{ha}
""")
    return path


SHARED = 'mode = "shared"\nlease_ms = 1500\nkeepalive_ms = 300\nacquire_interval_ms = 50'


class HaProcess:
    """``meshmq broker`` as a subprocess that may start as a slave."""

    def __init__(self, config_path: Path, log_path: Path, *, args: tuple[str, ...] = (),
                 command: str = "broker") -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.args = args  # more `meshmq <command>` options, e.g. ("--management", "...")
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0
        self._pb = ProcessBroker(config_path, log_path)  # joins the leftover-kill fixture

    def start(self) -> HaProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshmq.cli.main", self.command, "--config",
             str(self.config_path), *self.args], stdout=self._log, stderr=subprocess.STDOUT,
            env=env)
        self._pb.proc = self.proc
        self._pb._log = self._log
        ProcessBroker.running.add(self._pb)
        return self

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")[self._offset:]

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}:\n{self.text()}")

    def wait_slave(self, timeout: float = 30) -> HaProcess:
        def ready() -> bool:
            self._check_alive()
            return "slave: the" in self.text()
        poll(ready, timeout, "the broker to report itself a slave")
        return self

    def wait_master(self, timeout: float = 30) -> HaProcess:
        def ready() -> bool:
            self._check_alive()
            text = self.text()
            return "started" in text and "listening for stomp" in text
        poll(ready, timeout, "the broker to become master")
        return self

    @property
    def port(self) -> int:
        found = [int(p) for name, _h, p in _LISTEN_RE.findall(self.text()) if name == "stomp"]
        assert found, "this broker has no STOMP listener (yet)"
        return found[-1]

    @property
    def management_port(self) -> int:
        found = _MGMT_RE.findall(self.text())
        assert found, "no management endpoint"
        return int(found[-1][1])

    def stat(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.management_port}/api/stat"
        with urllib.request.urlopen(url, timeout=10) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self._pb.kill9()

    def terminate(self, timeout: float = 30) -> int:
        return self._pb.terminate(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------- stomp.py clients


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.receipts: set[str] = set()
        self.messages: list[Frame] = []
        self.errors: list[Frame] = []
        self.disconnected = False

    def on_receipt(self, frame: Frame) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_message(self, frame: Frame) -> None:
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_error(self, frame: Frame) -> None:
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.disconnected = True
            self.cond.notify_all()


def connect(port: int) -> tuple[stomp.Connection12, Recorder]:
    conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1,
                              timeout=2)
    rec = Recorder()
    conn.set_listener("rec", rec)
    conn.connect(wait=True)
    return conn, rec


@dataclass
class ProducerReport:
    confirmed: set[str] = field(default_factory=set)
    in_doubt_resends: int = 0  # sends re-sent after a failure left them unconfirmed
    failovers: list[tuple[float, int]] = field(default_factory=list)  # (time, port)
    errors: list[str] = field(default_factory=list)


class FailoverProducer(threading.Thread):
    """Sends persistent messages ``<prefix>-<n>`` one at a time with a receipt, failing
    over between ``ports()`` in order (randomize=false) until ``stop`` is set."""

    def __init__(self, ports: Any, destination: str, prefix: str = "m",
                 receipt_timeout: float = 5.0, reconnect_deadline: float = 60.0) -> None:
        super().__init__(daemon=True)
        self.ports = ports  # callable returning the endpoint list, in failover order
        self.destination = destination
        self.prefix = prefix
        self.receipt_timeout = receipt_timeout
        self.reconnect_deadline = reconnect_deadline
        self.stop = threading.Event()
        self.report = ProducerReport()
        self.sent = 0
        self.fatal: BaseException | None = None

    def _connect(self) -> tuple[stomp.Connection12, Recorder]:
        deadline = time.monotonic() + self.reconnect_deadline
        delay = 0.01
        while True:
            for port in self.ports():
                try:
                    conn, rec = connect(port)
                except Exception:
                    continue
                self.report.failovers.append((time.monotonic(), port))
                return conn, rec
            if time.monotonic() > deadline:
                raise AssertionError("no broker accepted a connection")
            self.stop.wait(delay)  # back-off between rounds, as failover: does
            delay = min(delay * 2, 0.2)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.fatal = exc

    def _wait_receipt(self, rec: Recorder, body: str) -> bool:
        with rec.cond:
            rec.cond.wait_for(lambda: body in rec.receipts or rec.disconnected
                              or bool(rec.errors), self.receipt_timeout)
            return body in rec.receipts

    def _run(self) -> None:
        conn, rec = self._connect()
        n = 0
        while not self.stop.is_set():
            body = f"{self.prefix}-{n:06d}"
            attempts = 0
            while True:
                attempts += 1
                ok = False
                try:
                    conn.send(self.destination, body, headers={"persistent": "true"},
                              receipt=body)
                    ok = self._wait_receipt(rec, body)
                except Exception:
                    ok = False
                if ok:
                    self.report.confirmed.add(body)
                    break
                # Not confirmed: the broker died, refused (fenced) or is slow. Fail over
                # and send again; the consumer counts the duplicates this may create.
                if rec.errors:
                    self.report.errors.extend(e.headers.get("message", "") for e in rec.errors)
                self.report.in_doubt_resends += 1
                try:
                    conn.disconnect()
                except Exception:
                    pass
                conn, rec = self._connect()
            self.sent = n = n + 1
        try:
            conn.disconnect()
        except Exception:
            pass


def drain(port: int, destination: str, marker: str = "END") -> list[str]:
    """Every body queued on ``destination``, up to a marker sent last (auto-acked)."""
    conn, rec = connect(port)
    conn.send(destination, marker, headers={"persistent": "true"}, receipt="marker")
    poll(lambda: "marker" in rec.receipts, 30, "the marker receipt")
    conn.subscribe(destination, id="d", ack="auto")

    def has_marker() -> bool:
        with rec.cond:
            return any(m.body == marker for m in rec.messages)

    poll(has_marker, 60, "the marker message")
    with rec.cond:
        frames = list(rec.messages)
    conn.disconnect()
    return [f.body for f in frames if f.body != marker]




@dataclass
class ConsumerReport:
    received: list[str] = field(default_factory=list)  # every delivery, duplicates included
    acked: set[str] = field(default_factory=set)  # acks the broker confirmed (receipts)


class FailoverConsumer(threading.Thread):
    """Consumes ``destination`` with client-individual acks, each ack with a receipt,
    failing over between ``ports()`` in order, until ``stop`` is set."""

    def __init__(self, ports: Any, destination: str, receipt_timeout: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.destination = destination
        self.receipt_timeout = receipt_timeout
        self.stop = threading.Event()
        self.report = ConsumerReport()
        self.fatal: BaseException | None = None
        self.connections = 0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.fatal = exc

    def _connect(self) -> tuple[stomp.Connection12, Recorder]:
        deadline = time.monotonic() + 60
        delay = 0.01
        while not self.stop.is_set():
            for port in self.ports():
                try:
                    conn, rec = connect(port)
                    conn.subscribe(self.destination, id="s", ack="client-individual")
                except Exception:
                    continue
                self.connections += 1
                return conn, rec
            if time.monotonic() > deadline:
                raise AssertionError("no broker accepted the consumer")
            self.stop.wait(delay)
            delay = min(delay * 2, 0.2)
        raise _StoppedError

    @staticmethod
    def _next(rec: Recorder, seen: int) -> tuple[list[Frame], bool]:
        with rec.cond:
            rec.cond.wait_for(lambda: len(rec.messages) > seen or rec.disconnected
                              or bool(rec.errors), 0.2)
            return rec.messages[seen:], rec.disconnected or bool(rec.errors)

    def _confirmed(self, rec: Recorder, receipt: str) -> bool:
        with rec.cond:
            rec.cond.wait_for(lambda: receipt in rec.receipts or rec.disconnected,
                              self.receipt_timeout)
            return receipt in rec.receipts

    def _run(self) -> None:
        try:
            conn, rec = self._connect()
        except _StoppedError:
            return
        seen = 0
        n = 0
        while not self.stop.is_set():
            frames, broken = self._next(rec, seen)
            ok = True
            for frame in frames:
                seen += 1
                self.report.received.append(frame.body)
                n += 1
                receipt = f"ack-{n}"
                try:
                    conn.ack(frame.headers["ack"], receipt=receipt)
                except Exception:
                    ok = False
                    break
                if not self._confirmed(rec, receipt):
                    ok = False
                    break
                self.report.acked.add(frame.body)
            if broken or not ok:
                try:
                    conn.disconnect()
                except Exception:
                    pass
                try:
                    conn, rec = self._connect()
                except _StoppedError:
                    return
                seen = 0
        try:
            conn.disconnect()
        except Exception:
            pass


class _StoppedError(Exception):
    pass
