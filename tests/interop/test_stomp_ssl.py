"""The stomp+ssl:// listener: TLS with a certificate from the configuration."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import stomp

from meshmq.config.model import ListenerConfig
from meshmq.protocol.stomp import StompParser, encode_frame
from tests.support.brokers import ThreadBroker, make_config, poll


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate (Debian package openssl)")
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return crt, key


def test_stomp_over_tls_round_trip(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    crt, key = cert
    config = dataclasses.replace(make_config(tmp_path / "data"), listeners=(
        ListenerConfig(name="stomp", protocol="stomp+ssl", host="127.0.0.1", port=0,
                       ssl_certfile=crt, ssl_keyfile=key),))
    broker = ThreadBroker(config).start()
    try:
        ctx = ssl.create_default_context(cafile=str(crt))
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            parser = StompParser(version="1.2")
            tls.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
            tls.sendall(encode_frame("SUBSCRIBE", [("destination", "/queue/tls"), ("id", "1")]))
            tls.sendall(encode_frame("SEND", [("destination", "/queue/tls")], b"secret"))
            frames: list = []  # type: ignore[type-arg]
            while not any(f.command == "MESSAGE" for f in frames):
                data = tls.recv(65536)
                assert data, "broker closed the TLS connection"
                frames += parser.feed(data)
            assert frames[0].command == "CONNECTED"
            assert [f.body for f in frames if f.command == "MESSAGE"] == [b"secret"]
        # stomp.py over TLS as well
        conn = stomp.Connection12([("127.0.0.1", broker.port)])
        conn.set_ssl(for_hosts=[("127.0.0.1", broker.port)], ca_certs=str(crt))
        conn.connect(wait=True)
        conn.disconnect()
        # A plain-text client on the TLS port gets nowhere and does not hurt the broker.
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as plain:
            plain.sendall(encode_frame("CONNECT", [("accept-version", "1.2")]))
            plain.settimeout(10)
            try:
                reply = plain.recv(100)
            except (ConnectionResetError, TimeoutError):
                reply = b""
            assert b"CONNECTED" not in reply
        poll(lambda: broker.stats()["connections"] == 0, 10, "connections to close")
    finally:
        broker.stop()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a
    client certificate from another CA (all made with openssl)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates (Debian package openssl)")
    d = tmp_path / "pki"
    d.mkdir()

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
            "-out", f"{ca}.pem", "-days", "1", "-subj", f"/CN={ca}")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca, ext in (("server", "ca", ["-extfile", "san.ext"]),
                          ("client", "ca", []), ("stranger", "other-ca", [])):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)
    return {p.stem + p.suffix.replace(".pem", ""): p for p in d.iterdir()}


def _handshake(port: int, pki: dict[str, Path], who: str | None) -> str:
    """CONNECT over TLS as ``who`` (a client certificate) or with none: the first
    frame's command, or why the connection failed."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if who is not None:
        ctx.load_cert_chain(str(pki[who]), str(pki[f"{who}.key"]))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]))
            frames = StompParser(version="1.2").feed(tls.recv(65536))
            return frames[0].command if frames else "refused: closed by the broker"
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize(("client_auth", "expect"), [
    (None, {None: "refused", "client": "CONNECTED", "stranger": "refused"}),
    ("need", {None: "refused", "client": "CONNECTED", "stranger": "refused"}),
    ("want", {None: "CONNECTED", "client": "CONNECTED", "stranger": "refused"}),
    ("none", {None: "CONNECTED", "client": "CONNECTED", "stranger": "CONNECTED"}),
])
def test_client_certificates_on_a_tls_listener(tmp_path: Path, pki: dict[str, Path],
                                               client_auth: str | None,
                                               expect: dict[str | None, str]) -> None:
    """A listener with a CA bundle requires a client certificate it verifies unless told
    otherwise; a refused client costs nothing to the others."""
    config = dataclasses.replace(make_config(tmp_path / "data"), listeners=(
        ListenerConfig(name="stomp", protocol="stomp+ssl", host="127.0.0.1", port=0,
                       ssl_certfile=pki["server"], ssl_keyfile=pki["server.key"],
                       ssl_cafile=pki["ca"], client_auth=client_auth),))
    broker = ThreadBroker(config).start()
    try:
        got = {who: _handshake(broker.port, pki, who) for who in expect}
        assert {who: r.split(":")[0] for who, r in got.items()} == expect, got
        assert _handshake(broker.port, pki, "client") == "CONNECTED"
    finally:
        broker.stop()

