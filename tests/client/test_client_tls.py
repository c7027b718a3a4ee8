"""The failover client over real TLS brokers: the broker's certificate is verified by
default (CA, host name), client certificates are presented, the opt-out warns, and a
certificate failure is one line that names the endpoint and stops the reconnects."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshmq.client import (
    BlockingClient,
    CertificateError,
    ConnectionFailedError,
    EventKind,
    FailoverClient,
    TlsSetupError,
    parse_failover,
)
from meshmq.client.tls import TlsSettings, describe_tls_failure
from meshmq.config.model import ListenerConfig
from meshmq.uri import URIError
from tests.support.brokers import ThreadBroker
from tests.support.pki import Pki

CA_HINT = "pass the broker's CA with trustStore=FILE on the URI or ssl_cafile=FILE"


@pytest.fixture
def tls_broker(meshmq_factory: Callable[..., ThreadBroker], pki: Pki
               ) -> Callable[..., ThreadBroker]:
    """A broker with stomp+ssl, mqtt+ssl and wss listeners on ``host``, certificate of
    broker "a" (valid for 127.0.0.1 and localhost)."""

    def make(host: str = "127.0.0.1", **tls: Any) -> ThreadBroker:
        cert, key = pki.broker("a")
        listeners = tuple(ListenerConfig(name=p.replace("+", "_"), protocol=p, host=host,
                                         port=0, ssl_certfile=cert, ssl_keyfile=key, **tls)
                          for p in ("stomp+ssl", "mqtt+ssl", "wss"))
        return meshmq_factory(listeners=listeners)

    return make


def uri(b: ThreadBroker, listener: str = "stomp_ssl", host: str = "127.0.0.1") -> str:
    assert b.runtime is not None
    scheme = {"stomp_ssl": "stomp+ssl", "mqtt_ssl": "mqtts", "wss": "wss"}[listener]
    return f"{scheme}://{host}:{b.runtime.addresses[listener][1]}"


async def round_trip(client: FailoverClient, where: str = "tls.q") -> None:
    if client.protocol == "mqtt":
        sub = await client.subscribe(where.replace(".", "/"), qos=1)
        await client.send(where.replace(".", "/"), "over tls")
    else:
        sub = await client.subscribe(f"/queue/{where}")
        await client.send(f"/queue/{where}", "over tls")
    assert (await sub.get(10)).text == "over tls"


async def refused(uri_text: str, **kwargs: Any) -> tuple[CertificateError, list[Any]]:
    events: list[Any] = []
    client = FailoverClient(uri_text, on_event=events.append, **kwargs)
    try:
        with pytest.raises(CertificateError) as err:
            # Not retried for ever: the first failure ends the attempts.
            await client.connect(timeout=20)
    finally:
        await client.close()
    return err.value, events


@pytest.mark.parametrize("listener", ["stomp_ssl", "mqtt_ssl", "wss"])
def test_verified_with_the_brokers_ca(tls_broker: Callable[..., ThreadBroker], pki: Pki,
                                      listener: str) -> None:
    b = tls_broker()
    protocol = "mqtt" if listener == "mqtt_ssl" else "stomp"

    async def main() -> None:
        async with FailoverClient(uri(b, listener), protocol=protocol, client_id="t",
                                  ssl_cafile=pki.ca) as c:
            await round_trip(c)
        # The same CA as a URI option (ActiveMQ's trustStore).
        async with FailoverClient(f"failover:({uri(b, listener)}?trustStore={pki.ca})",
                                  protocol=protocol, client_id="t") as c:
            await round_trip(c)
    asyncio.run(main())


@pytest.mark.parametrize("listener", ["stomp_ssl", "mqtt_ssl", "wss"])
def test_a_certificate_from_an_unknown_ca_is_refused(
        tls_broker: Callable[..., ThreadBroker], pki: Pki, listener: str) -> None:
    b = tls_broker()
    protocol = "mqtt" if listener == "mqtt_ssl" else "stomp"
    where = uri(b, listener)

    async def main() -> None:
        # The system's trust store (the default) does not know the test CA either.
        for kwargs in ({}, {"ssl_cafile": pki.untrusted / "ca.pem"}):
            exc, events = await refused(where, protocol=protocol, client_id="t", **kwargs)
            assert str(exc) == (f"failover gave up: {where}: certificate verify failed: "
                                f"unable to get local issuer certificate; {CA_HINT}")
            assert [e.kind for e in events] == [EventKind.FAILED]
    asyncio.run(main())
    assert b.stats()["connections"] == 0


def test_a_host_name_the_certificate_does_not_hold_is_refused(
        tls_broker: Callable[..., ThreadBroker], pki: Pki) -> None:
    b = tls_broker(host="127.0.0.2")  # loopback, but not in the certificate
    where = uri(b, host="127.0.0.2")

    async def main() -> None:
        exc, _ = await refused(where, ssl_cafile=pki.ca)
        assert str(exc) == (f"failover gave up: {where}: certificate verify failed: IP "
                            "address mismatch, certificate is not valid for '127.0.0.2'; "
                            "connect by a name or address the certificate holds, or set "
                            "verifyHostName=false")
        # ActiveMQ's opt-out of the host name check alone; the CA is still checked.
        async with FailoverClient(f"{where}?verifyHostName=false", ssl_cafile=pki.ca) as c:
            await round_trip(c)
        await refused(f"{where}?socket.verifyHostName=false",
                      ssl_cafile=pki.untrusted / "ca.pem")
    asyncio.run(main())


def test_a_client_certificate_is_presented_to_a_listener_that_needs_one(
        tls_broker: Callable[..., ThreadBroker], pki: Pki) -> None:
    b = tls_broker(ssl_cafile=pki.ca, client_auth="need")
    where = uri(b)
    cert, key = pki.client("bob")

    async def main() -> None:
        async with FailoverClient(where, ssl_cafile=pki.ca, ssl_certfile=cert,
                                  ssl_keyfile=key) as c:
            await round_trip(c)
        async with FailoverClient(f"{where}?trustStore={pki.ca}&keyStore={cert}"
                                  f"&keyStoreKey={key}") as c:
            await round_trip(c)
        # meshmq's listener closes without a TLS alert: not surely a certificate problem
        # (retried as a lost connection), but the error says what it likely means.
        once = f"failover:({where})?maxReconnectAttempts=0&startupMaxReconnectAttempts=0"
        stranger, stranger_key = pki.stranger("client")
        for kwargs in ({}, {"ssl_certfile": stranger, "ssl_keyfile": stranger_key}):
            client = FailoverClient(once, ssl_cafile=pki.ca, **kwargs)
            with pytest.raises(ConnectionFailedError) as err:
                await client.connect(timeout=20)
            await client.close()
            assert str(err.value) == (
                f"failover gave up: {where}: closed by the broker during the handshake (a "
                "TLS listener that needs a client certificate does this when it gets none, "
                "or one its CA did not sign: pass keyStore=FILE or ssl_certfile=FILE)")
    asyncio.run(main())
    assert b.stats()["connections"] == 0


def test_a_tls_alert_about_the_client_certificate_is_a_certificate_error() -> None:
    alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert "
                            "certificate required")
    alert.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    exc = describe_tls_failure("stomp+ssl://b:61612", alert)
    assert str(exc) == ("stomp+ssl://b:61612: the broker requires a client certificate "
                        "(TLSV13_ALERT_CERTIFICATE_REQUIRED); pass a certificate its CA "
                        "signed with keyStore=FILE (and keyStoreKey=FILE) on the URI or "
                        "ssl_certfile=FILE (and ssl_keyfile=FILE)")
    assert describe_tls_failure("x", ssl.SSLError(1, "other")) is None
    assert describe_tls_failure("x", ConnectionResetError()) is None


def test_opting_out_of_verification_works_and_warns(
        tls_broker: Callable[..., ThreadBroker], caplog: pytest.LogCaptureFixture) -> None:
    b = tls_broker(host="127.0.0.2")  # neither the CA nor the host name would pass
    where = uri(b, host="127.0.0.2")

    async def main() -> None:
        async with FailoverClient(f"{where}?trustAll=true") as c:
            await round_trip(c)
        async with FailoverClient(where, ssl_verify=False) as c:
            await round_trip(c)
    with caplog.at_level(logging.WARNING, logger="meshmq.client"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records
                if "verification is OFF" in r.getMessage()]
    expected = (f"{where}: TLS certificate verification is OFF (trustAll / ssl_verify=False)"
                ": any server can pose as the broker; pass its CA instead")
    assert warnings == [expected, expected]


def test_give_up_on_auth_failure_false_keeps_trying_other_brokers(
        tls_broker: Callable[..., ThreadBroker], pki: Pki,
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    bad = tls_broker()
    good = meshmq_factory()
    assert good.runtime is not None
    plain = f"stomp://127.0.0.1:{good.runtime.addresses['stomp'][1]}"

    async def main() -> None:
        async with FailoverClient(f"failover:({uri(bad)},{plain})?randomize=false",
                                  give_up_on_auth_failure=False) as c:
            assert c.endpoint is not None and not c.endpoint.tls
    asyncio.run(main())


def test_files_that_cannot_be_used_fail_at_construction(tmp_path: Path, pki: Pki) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(TlsSetupError, match=f"cannot load CA file {missing}: No such file"):
        FailoverClient("stomp+ssl://127.0.0.1:61612", ssl_cafile=missing)
    with pytest.raises(TlsSetupError, match="cannot load client certificate"):
        FailoverClient(f"stomp+ssl://127.0.0.1:61612?keyStore={pki.ca}")  # no key in it
    with pytest.raises(Exception, match="ssl_keyfile needs ssl_certfile"):
        FailoverClient("stomp+ssl://127.0.0.1:61612", ssl_keyfile=missing)


def test_blocking_client_takes_the_same_tls_arguments(
        tls_broker: Callable[..., ThreadBroker], pki: Pki) -> None:
    b = tls_broker()
    with BlockingClient(uri(b), ssl_cafile=pki.ca) as c:
        sub = c.subscribe("/queue/blocking.tls")
        c.send("/queue/blocking.tls", "hi")
        assert sub.get(10).text == "hi"


def test_uri_tls_options_override_the_clients() -> None:
    a, b = parse_failover("failover:(stomp+ssl://a?trustStore=/a.pem&keyStore=/c.pem"
                          "&keyStoreKey=/c.key&keyStorePassword=pw,ssl://b?trustAll=true&"
                          "socket.verifyHostName=false)").endpoints
    client = TlsSettings(cafile="/sys.pem", certfile="/me.pem", keyfile="/me.key")
    assert a.tls_settings(client) == TlsSettings(cafile="/a.pem", certfile="/c.pem",
                                                 keyfile="/c.key", key_password="pw")
    assert b.tls_settings(client) == TlsSettings(cafile="/sys.pem", certfile="/me.pem",
                                                 keyfile="/me.key", verify=False,
                                                 check_hostname=False)
    with pytest.raises(URIError, match="keyStoreKey needs keyStore"):
        parse_failover("stomp+ssl://a?keyStoreKey=/k.pem")
    with pytest.raises(URIError, match="bad endpoint option"):
        parse_failover("stomp+ssl://a?trustAll=maybe")
