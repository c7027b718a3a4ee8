"""The worked example of docs/security.md, as shipped in examples/tls/: certificates from
make-certs.sh, two brokers linked over mutual TLS with certificate users and an
authorization map; clients with a certificate or a password (ports moved to free ones)."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import stomp

from meshmq.config.load import load_config
from tests.support.brokers import ThreadBroker, poll
from tests.support.ports import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tls"
FIXED_PORTS = (61612, 61617, 61622, 61627, 8161, 8162)


class Inbox(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frames: list[tuple[str, Any]] = []

    def _add(self, kind: str, frame: Any) -> None:
        with self.cond:
            self.frames.append((kind, frame))
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        self._add("MESSAGE", frame)

    def on_error(self, frame: Any) -> None:
        self._add("ERROR", frame)

    def on_receipt(self, frame: Any) -> None:
        self._add("RECEIPT", frame)

    def next(self, kind: str) -> Any:
        with self.cond:
            assert self.cond.wait_for(lambda: any(k == kind for k, _ in self.frames), 10), \
                f"no {kind}: {self.frames}"
            i = next(i for i, (k, _) in enumerate(self.frames) if k == kind)
            return self.frames.pop(i)[1]


@pytest.fixture
def example(tmp_path: Path) -> dict[str, Any]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the example's certificates")
    subprocess.run(["bash", str(EXAMPLE / "make-certs.sh"), str(tmp_path / "pki"), "--days",
                    "2"], check=True, capture_output=True)
    ports = {p: free_port() for p in FIXED_PORTS}
    for name in ("broker-a.toml", "broker-b.toml"):
        text = (EXAMPLE / name).read_text()
        text = re.sub(r"\b(" + "|".join(map(str, FIXED_PORTS)) + r")\b",
                      lambda m: str(ports[int(m.group(1))]), text)
        (tmp_path / name).write_text(text)
    return {"dir": tmp_path, "ports": ports}


def client(port: int, pki: Path, *, cert: str | None = None, login: str | None = None,
           passcode: str | None = None) -> tuple[stomp.Connection12, Inbox]:
    conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1, timeout=10)
    key_file = cert_file = None
    if cert is not None:
        cert_file, key_file = str(pki / f"{cert}.pem"), str(pki / f"{cert}.key")
    conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(pki / "ca.pem"),
                 cert_file=cert_file, key_file=key_file)
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(login, passcode, wait=True)
    return conn, inbox


def test_the_worked_example_links_two_brokers_over_mutual_tls(example: dict[str, Any]) -> None:
    root, ports, pki = example["dir"], example["ports"], example["dir"] / "pki"
    brokers = [ThreadBroker(load_config(root / f"broker-{n}.toml")).start() for n in "ab"]
    try:
        a = brokers[0]
        for broker in brokers:
            poll(lambda br=broker: any(  # type: ignore[misc]
                x["state"] == "forwarding" and x["direction"] == "outbound"
                for x in br.run(br.runtime.network.status)), what="bridges up")
        # On B, a client authenticated by its certificate (CN=app: group apps).
        consumer, inbox = client(ports[61622], pki, cert="client-app")
        consumer.subscribe("/queue/orders.new", id="1", headers={"receipt": "s"})
        inbox.next("RECEIPT")
        poll(lambda: a.run(lambda: any(
            c.spec.network_path is not None for q in a.runtime.broker.queues.values()
            for c in q.consumers)), what="B's demand on A")
        # On A, the application logs in with its password (hashed in the file).
        producer, out = client(ports[61612], pki, login="orders-app",
                               passcode="orders-secret")
        producer.send("/queue/orders.new", "order 1", headers={"receipt": "r1"})
        out.next("RECEIPT")
        assert inbox.next("MESSAGE").body == "order 1"  # across the TLS link
        producer.send("/queue/payroll", "x", headers={"receipt": "r2"})
        assert out.next("ERROR").headers["message"] == \
            "User orders-app is not authorized to write to: queue://payroll"
        producer.disconnect()
        consumer.disconnect()
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with socket.create_connection(("127.0.0.1", ports[61612]), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:orders-app\n"
                        b"passcode:wrong\n\n\x00")
            reply = tls.recv(1000)
        assert reply.startswith(b"ERROR\n")
        assert b"User name [orders-app] or password is invalid." in reply
    finally:
        for broker in brokers:
            broker.stop()


def test_a_client_certificate_from_another_authority_is_refused(
        example: dict[str, Any], tmp_path: Path) -> None:
    root, ports, pki = example["dir"], example["ports"], example["dir"] / "pki"
    other = tmp_path / "other"
    subprocess.run(["bash", str(EXAMPLE / "make-certs.sh"), str(other), "--client", "app"],
                   check=True, capture_output=True)
    broker = ThreadBroker(load_config(root / "broker-a.toml")).start()

    def first_reply(cert_dir: Path) -> str:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        ctx.load_cert_chain(str(cert_dir / "client-app.pem"), str(cert_dir / "client-app.key"))
        try:
            with socket.create_connection(("127.0.0.1", ports[61612]), timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
                return tls.recv(100).split(b"\n")[0].decode() or "closed"
        except (ssl.SSLError, ConnectionError) as exc:
            return f"refused: {type(exc).__name__}"

    try:
        assert first_reply(other) in ("closed", "refused: SSLError",
                                      "refused: ConnectionResetError")
        # The example's own client certificate gets in (and the refused connection's
        # close has run on the broker's loop by then).
        assert first_reply(pki) == "CONNECTED"
    finally:
        broker.stop()
