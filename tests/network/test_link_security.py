"""Who may open a broker link: a stranger on the port is refused and can neither inject
nor drain messages; links over mutual TLS; TLS on the wrong kind of port; certificates
reloaded without dropping links."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from meshmq.config.model import ListenerConfig, NetworkConnectorConfig
from meshmq.core import destinations as dst
from meshmq.core.message import Message
from meshmq.protocol.wire import (
    MAGIC,
    WIRE_VERSION,
    FrameType,
    WireDecoder,
    decode_json,
    encode_json,
    encode_messages,
)
from tests.network.helpers import LINK_AUTH, bridges, connector, tcp_uri
from tests.support.brokers import ThreadBroker, make_config, poll
from tests.support.pki import Pki

# ------------------------------------------------------------------ the open-port attack


def _attack(port: int, creds: dict[str, str]) -> list[Any]:
    """Play a rogue broker: HELLO (duplex, so this end could drain queues), five persistent
    messages for queue 'injected', and interest in queue 'loot'. Returns the frames the
    broker answered until it closed the link (or went quiet)."""
    hello = {"protocol": "meshmq", "versions": [WIRE_VERSION], "broker": "rogue",
             "connector": "NC", "duplex": True, "filter": {}, "client_uris": [],
             "config": {}, **creds}
    messages = [(i + 1, Message(message_id=f"rogue-{i}", destination=dst.queue("injected"),
                                body=b"evil", persistent=True)) for i in range(5)]
    interest = {"op": "sync", "items": [{"id": "1", "dest": "queue://loot", "selector": None,
                                         "path": [], "durable": False,
                                         "origins": ["rogue"]}]}
    frames = []
    decoder = WireDecoder(expect_magic=False)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(MAGIC + encode_json(FrameType.HELLO, hello) + encode_messages(messages)
                  + encode_json(FrameType.INTEREST, interest))
        s.settimeout(2)  # an admitted link stays open: stop reading after a quiet moment
        try:
            while chunk := s.recv(65536):
                frames += decoder.feed(chunk)
        except TimeoutError:
            pass
    return frames


def _depth(broker: ThreadBroker, name: str) -> int:
    assert broker.runtime is not None
    rt = broker.runtime

    def depth() -> int:
        q = rt.broker.queues.get(dst.queue(name))
        return q.depth if q is not None else 0
    return broker.run(depth)


def _open_broker(tmp_path: Path, **listener: Any) -> ThreadBroker:
    """Default authentication (anonymous access, no users), a tcp listener, and three
    persistent messages in queue 'loot'."""
    config = make_config(tmp_path, broker_name="victim", listeners=(
        ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0),
        ListenerConfig(name="tcp", protocol="tcp", host="127.0.0.1", port=0, **listener)))
    broker = ThreadBroker(config).start()
    return broker


def _fill_loot(broker: ThreadBroker, client: Any) -> None:
    producer = client(on=broker)
    for i in range(3):
        producer.send("/queue/loot", f"secret {i}", headers={"persistent": "true"})
    poll(lambda: _depth(broker, "loot") == 3, what="3 messages in loot")


@pytest.mark.parametrize("creds", [{}, {"username": "system", "password": "manager"}],
                         ids=["no-credentials", "made-up-credentials"])
def test_a_stranger_on_a_default_broker_can_neither_inject_nor_drain(
        tmp_path: Path, client: Any, creds: dict[str, str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meshmq.network")
    broker = _open_broker(tmp_path)
    try:
        _fill_loot(broker, client)
        port = broker.runtime.addresses["tcp"][1]  # type: ignore[union-attr]
        for _ in range(2):
            frames = _attack(port, creds)
            assert [f.type for f in frames] == [FrameType.REFUSE]
        body = decode_json(frames[0])
        assert body["code"] == "authentication-failed"
        assert "refused by broker 'victim'" in body["message"]
        assert _depth(broker, "injected") == 0
        assert _depth(broker, "loot") == 3
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]  # once per remote
    finally:
        broker.stop()


def test_the_explicit_opt_out_admits_anonymous_links_and_warns(
        tmp_path: Path, client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The control of the test above: the same attack succeeds where links are opened
    on purpose, and the broker says so at start."""
    caplog.set_level(logging.WARNING, "meshmq.network")
    broker = _open_broker(tmp_path, allow_anonymous_links=True)
    try:
        assert any("listener tcp admits broker links without credentials" in r.getMessage()
                   and "anyone who reaches it can read and write every destination"
                   in r.getMessage() for r in caplog.records)
        _fill_loot(broker, client)
        frames = _attack(broker.runtime.addresses["tcp"][1], {})  # type: ignore[union-attr]
        assert frames[0].type is FrameType.WELCOME
        poll(lambda: _depth(broker, "injected") == 5, what="injected messages")
        assert any(f.type is FrameType.MESSAGES for f in frames)  # loot was sent out
    finally:
        broker.stop()


# ------------------------------------------------------------------ TLS links


def _tls_listener(pki: Pki, name: str = "b", **kw: Any) -> ListenerConfig:
    cert, key = pki.broker(name)
    return ListenerConfig(name="ssl", protocol="ssl", host="127.0.0.1", port=0,
                          ssl_certfile=cert, ssl_keyfile=key, ssl_cafile=pki.ca, **kw)


def _broker(tmp_path: Path, name: str, *listeners: ListenerConfig,
            connectors: tuple[NetworkConnectorConfig, ...] = ()) -> ThreadBroker:
    config = make_config(tmp_path / name, broker_name=name, auth=LINK_AUTH,
                         listeners=(ListenerConfig(name="stomp", protocol="stomp",
                                                   host="127.0.0.1", port=0),
                                    *listeners),
                         network_connectors=connectors)
    return ThreadBroker(config).start()


def _ssl_uri(broker: ThreadBroker, listener: str = "ssl") -> str:
    assert broker.runtime is not None
    return f"ssl://127.0.0.1:{broker.runtime.addresses[listener][1]}"


def _status(broker: ThreadBroker, connector_name: str) -> dict[str, Any]:
    return next(b for b in bridges(broker) if b["connector"] == connector_name)


def _error(broker: ThreadBroker, connector_name: str) -> dict[str, Any] | None:
    return _status(broker, connector_name)["last_error"]  # type: ignore[no-any-return]


def test_mutual_tls_links_forward_and_wrong_certificates_or_users_are_refused(
        tmp_path: Path, pki: Pki, client: Any) -> None:
    b = _broker(tmp_path, "B", _tls_listener(pki))
    uri = f"static:({_ssl_uri(b)})"
    cert_a, key_a = pki.broker("a")
    cert_s, key_s = pki.stranger("broker")
    a = _broker(tmp_path, "A", connectors=(
        connector(uri, name="good", ssl_cafile=pki.ca, ssl_certfile=cert_a,
                  ssl_keyfile=key_a),
        connector(uri, name="stranger", ssl_cafile=pki.ca, ssl_certfile=cert_s,
                  ssl_keyfile=key_s),
        connector(uri, name="wronguser", ssl_cafile=pki.ca, ssl_certfile=cert_a,
                  ssl_keyfile=key_a, username="link", password="wrong")))
    try:
        poll(lambda: _status(a, "good")["state"] == "forwarding", what="good bridge up")
        poll(lambda: _error(a, "stranger") is not None, what="stranger refused")
        poll(lambda: _error(a, "wronguser") is not None, what="wrong user refused")
        stranger = _error(a, "stranger")
        assert stranger is not None and stranger["kind"] in ("tls-refused", "tls-failed")
        assert "certificate" in stranger["message"]
        wrong = _error(a, "wronguser")
        assert wrong is not None and wrong["kind"] == "authentication-failed"
        assert "refused by broker 'B': authentication failed for user 'link'" in \
            wrong["message"]
        for name in ("stranger", "wronguser"):
            assert _status(a, name)["connects"] == 0
        # The certificate is the principal of the admitted link.
        inbound = b.run(lambda: [r.principal.user for r in  # type: ignore[union-attr]
                                 b.runtime.network.inbound if r.ready])  # type: ignore[union-attr]
        assert inbound == ["CN=a, OU=brokers, O=meshmq"]
        consumer = client(on=b)
        consumer.subscribe("/queue/tls.orders")
        poll(lambda: _status(a, "good")["demand"] == 1, what="demand over TLS")
        client(on=a).send("/queue/tls.orders", "over TLS")
        poll(lambda: consumer.bodies() == ["over TLS"], what="message forwarded")
    finally:
        a.stop()
        b.stop()


def test_tls_bridge_to_a_plaintext_port_says_why_and_retries(
        tmp_path: Path, pki: Pki) -> None:
    b = _broker(tmp_path, "B", ListenerConfig(name="tcp", protocol="tcp", host="127.0.0.1",
                                              port=0))
    plain = tcp_uri(b).replace("tcp://", "ssl://")
    a = _broker(tmp_path, "A", connectors=(connector(f"static:({plain})", ssl_cafile=pki.ca),))
    try:
        poll(lambda: (_error(a, "NC") or {}).get("kind") == "tls-failed", what="tls failure")
        poll(lambda: _status(a, "NC")["attempts"] >= 3, what="retries with backoff")
        error = _error(a, "NC")
        assert error is not None and "plaintext tcp:// port" in error["message"]
        assert _status(a, "NC")["connects"] == 0  # never fell back to plaintext
    finally:
        a.stop()
        b.stop()


def test_plaintext_bridge_to_a_tls_port_is_refused_in_one_line(
        tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "meshmq")
    b = _broker(tmp_path, "B", _tls_listener(pki))
    plain = _ssl_uri(b).replace("ssl://", "tcp://")
    a = _broker(tmp_path, "A", connectors=(connector(f"static:({plain})"),))
    try:
        poll(lambda: _status(a, "NC")["attempts"] >= 3, what="retries")
        error = _error(a, "NC")
        assert error is not None and "use ssl:// in the URI" in error["message"]
        lines = [r for r in caplog.records if r.name == "meshmq.network"
                 and "refused a connection" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert "plaintext" in lines[0].getMessage()
        assert not any(r.exc_info for r in caplog.records)  # no traceback anywhere
    finally:
        a.stop()
        b.stop()


def test_an_untrusted_server_certificate_is_refused(tmp_path: Path, pki: Pki) -> None:
    b = _broker(tmp_path, "B", _tls_listener(pki, client_auth="none"))
    a = _broker(tmp_path, "A", connectors=(
        connector(f"static:({_ssl_uri(b)})"),))  # system trust store: not our test CA
    try:
        poll(lambda: (_error(a, "NC") or {}).get("kind") == "tls-verify-failed",
             what="verification failure")
        error = _error(a, "NC")
        assert error is not None and "set ssl_cafile" in error["message"]
    finally:
        a.stop()
        b.stop()


def _server_cert_cn(port: int, ca: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        cert = tls.getpeercert()
    subject = dict(item for rdn in cert["subject"] for item in rdn)
    return str(subject["commonName"])


def test_certificates_reload_without_dropping_links(tmp_path: Path, pki: Pki,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "broker.pem", live / "broker.key"
    for src, dest in zip(pki.broker("a"), (cert, key), strict=True):
        shutil.copy(src, dest)
    b = _broker(tmp_path, "B", dataclasses.replace(_tls_listener(pki, client_auth="want"),
                                                   ssl_certfile=cert, ssl_keyfile=key))
    a = _broker(tmp_path, "A", connectors=(connector(f"static:({_ssl_uri(b)})",
                                                     ssl_cafile=pki.ca),))
    port = b.runtime.addresses["ssl"][1]  # type: ignore[union-attr]
    try:
        poll(lambda: _status(a, "NC")["state"] == "forwarding", what="bridge up")
        assert _server_cert_cn(port, pki.ca) == "a"
        for src, dest in zip(pki.broker("b"), (cert, key), strict=True):
            shutil.copy(src, dest)
        assert b.run(b.runtime.reload_tls) == 1  # type: ignore[union-attr]
        assert _server_cert_cn(port, pki.ca) == "b"  # new connections: the new pair
        status = _status(a, "NC")
        assert status["state"] == "forwarding" and status["connects"] == 1  # still open
        # A broken pair is not loaded: the previous one stays, and one line says why.
        key.write_text("not a key\n")
        caplog.set_level(logging.ERROR, "meshmq.tls")
        assert b.run(b.runtime.reload_tls) == 0  # type: ignore[union-attr]
        assert _server_cert_cn(port, pki.ca) == "b"
        errors = [r.getMessage() for r in caplog.records if r.name == "meshmq.tls"]
        assert len(errors) == 1 and "keeping the previous certificate" in errors[0]
    finally:
        a.stop()
        b.stop()


def test_a_hashed_link_password_admits_the_bridge_and_a_wrong_one_is_refused(
        tmp_path: Path) -> None:
    """The accepting broker checks a link's password as it checks clients' (scrypt off
    the event loop); frames the bridge sends right behind its HELLO wait for the answer."""
    from meshmq.config.model import AuthConfig, User
    from meshmq.core.passwords import hash_password
    from tests.network.helpers import net_config

    hashed = AuthConfig(users=(User("link", hash_password("link-secret")),))
    b = ThreadBroker(net_config(tmp_path / "b", "B", auth=hashed)).start()
    a = ThreadBroker(net_config(tmp_path / "a", "A", connector(tcp_uri(b)))).start()
    wrong = ThreadBroker(net_config(tmp_path / "w", "W", connector(
        tcp_uri(b), username="link", password="nope"))).start()
    try:
        poll(lambda: any(x["state"] == "forwarding" for x in bridges(a)),
             what="A's bridge admitted")
        poll(lambda: (bridges(wrong)[0].get("last_error") or {}).get("kind")
             == "authentication-failed", what="W's bridge refused")
    finally:
        for broker in (a, wrong, b):
            broker.stop()
