"""Logins over real sockets: client certificates over TLS (STOMP, MQTT 3.1.1 and 5,
WebSocket). Users from ActiveMQ's JAAS properties files are tested in memory in
tests/unit/broker/test_login_credentials.py, refusals held back for an address that
keeps failing in tests/unit/broker/test_login_refusals_held_back.py."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect as ws_connect

from meshmq.config.model import AuthConfig, CertificateUser, ListenerConfig, User
from meshmq.protocol.mqtt import ReasonCode
from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from tests.interop.mqtt_helpers import RawMqtt
from tests.support.brokers import ThreadBroker, make_config, poll

BOB_DN = "CN=bob, OU=clients, O=meshmq"


def stomp_connect(port: int, login: str | None = None, passcode: str | None = None, *,
                  tls: ssl.SSLContext | None = None, timeout: float = 10.0) -> Frame:
    """CONNECT on a fresh socket; the broker's first frame (CONNECTED or ERROR)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock = tls.wrap_socket(raw, server_hostname="localhost") if tls else raw
    with sock:
        headers = [("accept-version", "1.2"), ("host", "x")]
        headers += [("login", login)] if login is not None else []
        headers += [("passcode", passcode)] if passcode is not None else []
        sock.sendall(encode_frame("CONNECT", headers))
        parser = StompParser(version="1.2")
        while True:
            data = sock.recv(65536)
            assert data, "closed without a frame"
            frames = parser.feed(data)
            if frames:
                return frames[0]


def principals(broker: ThreadBroker) -> list[Any]:
    assert broker.runtime is not None
    rt = broker.runtime
    return broker.run(lambda: [c.principal for c in rt.broker.connections.values()])


def mqtt(port: int, level: int, tls: ssl.SSLContext | None = None) -> RawMqtt:
    raw = RawMqtt(port, level)
    if tls is not None:
        raw.sock = tls.wrap_socket(raw.sock, server_hostname="localhost")
    return raw


# ------------------------------------------------------------------ client certificates

@pytest.fixture
def tls_broker(tmp_path: Path, pki: Any) -> Iterator[ThreadBroker]:
    cert, key = pki.broker("a")
    tls = {"ssl_certfile": cert, "ssl_keyfile": key, "ssl_cafile": pki.ca,
           "client_auth": "want"}
    config = make_config(tmp_path / "data", listeners=(
        ListenerConfig(name="stomp", protocol="stomp+ssl", port=0, **tls),
        ListenerConfig(name="mqtt", protocol="mqtt+ssl", port=0, **tls),
        ListenerConfig(name="wss", protocol="wss", port=0, **tls),
        ListenerConfig(name="plain", protocol="stomp", port=0)),
        auth=AuthConfig(anonymous_access=False, users=(User("carol", "pw"),),
                        certificate_users=(CertificateUser("bob", dn=BOB_DN,
                                                           groups=("admins",)),)))
    broker = ThreadBroker(config).start()
    yield broker
    broker.stop()


def client_tls(pki: Any, who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if who is not None:
        cert, key = pki.client(who)
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_certificate_authenticates_stomp_mqtt_and_websocket(
        tls_broker: ThreadBroker, pki: Any) -> None:
    assert tls_broker.runtime is not None
    addresses = tls_broker.runtime.addresses
    bob = client_tls(pki, "bob")
    # The certificate decides; the login sent with it is ignored.
    assert stomp_connect(tls_broker.port, "carol", "wrong", tls=bob).command == "CONNECTED"
    for level in (4, 5):
        client = mqtt(addresses["mqtt"][1], level, bob)
        client.connect(f"bob{level}")
        client.sock.close()
    # A deadline of 30 s: the TLS handshake on a busy two-core machine can take seconds.
    with ws_connect(f"wss://127.0.0.1:{addresses['wss'][1]}/", subprotocols=["v12.stomp"],
                    ssl=bob, server_hostname="localhost", open_timeout=30) as ws:
        ws.send(encode_frame("CONNECT", [("accept-version", "1.2"), ("host", "x")]).decode())
        assert str(ws.recv(timeout=10)).startswith("CONNECTED")
        found = principals(tls_broker)
    assert {(p.user, p.groups) for p in found} == {(BOB_DN, frozenset({"admins"}))}
    # Without a certificate the password rule applies, on TLS and plain listeners alike.
    anon = client_tls(pki, None)
    assert stomp_connect(tls_broker.port, "carol", "pw", tls=anon).command == "CONNECTED"
    assert stomp_connect(addresses["plain"][1], "carol", "pw").command == "CONNECTED"


def test_unknown_certificate_is_refused_and_only_logged(
        tls_broker: ThreadBroker, pki: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert tls_broker.runtime is not None
    app = client_tls(pki, "app")
    err = stomp_connect(tls_broker.port, "carol", "pw", tls=app)
    assert err.command == "ERROR"
    assert err.get("message") == "User name [carol] or password is invalid."
    assert b"CN=app" not in err.body
    client = mqtt(tls_broker.runtime.addresses["mqtt"][1], 5, app)
    ack = client.connect("app", expect_success=False)
    assert ack.reason_code == ReasonCode.NOT_AUTHORIZED
    assert "CN=app" not in (ack.properties.reason_string or "")
    client.sock.close()
    poll(lambda: "No user for client certificate: CN=app, OU=clients, O=meshmq"
         in caplog.text, what="the DN in the broker log")
