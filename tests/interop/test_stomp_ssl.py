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
