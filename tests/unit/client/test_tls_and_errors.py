"""What a client application relies on before any connection: TLS contexts that verify
by default, setup errors and certificate failures that say what to pass, construction
errors raised at once, and the error hierarchy with its retriable flags."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

from meshmq.client import (
    AuthenticationFailedError,
    BrokerError,
    CertificateError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    ConnectionLostError,
    FailoverClient,
    OperationTimeoutError,
    TlsSetupError,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from meshmq.client.errors import ProtocolVersionRefusedError
from meshmq.client.tls import TlsSettings, client_context, describe_tls_failure
from meshmq.errors import MeshmqError, TransactionError

# ---------------------------------------------------------------------- contexts


def test_a_default_context_verifies_the_broker_and_its_name() -> None:
    ctx = client_context(TlsSettings())
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2


def test_turning_verification_off_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "meshmq.client"):
        ctx = client_context(TlsSettings(verify=False), "stomp+ssl://h:61612")
    assert ctx.verify_mode is ssl.CERT_NONE and not ctx.check_hostname
    assert "stomp+ssl://h:61612: TLS certificate verification is OFF" in caplog.text


def test_the_host_name_check_can_be_turned_off_alone() -> None:
    ctx = client_context(TlsSettings(check_hostname=False))
    assert ctx.verify_mode is ssl.CERT_REQUIRED and not ctx.check_hostname


def test_a_missing_ca_file_is_a_setup_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TlsSetupError, match=f"^stomp\\+ssl://h:1: cannot load CA file "
                       f"{missing}: No such file"):
        client_context(TlsSettings(cafile=str(missing)), "stomp+ssl://h:1")


def test_a_ca_file_that_is_not_pem_is_a_setup_error(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TlsSetupError, match=f"cannot load CA file {garbage}"):
        client_context(TlsSettings(cafile=str(garbage)))


def test_a_missing_client_certificate_names_it_and_its_key(tmp_path: Path) -> None:
    cert, key = tmp_path / "me.pem", tmp_path / "me.key"
    with pytest.raises(TlsSetupError, match=f"cannot load client certificate {cert} "
                       rf"\(key {key}\)"):
        client_context(TlsSettings(certfile=str(cert), keyfile=str(key)))


# ---------------------------------------------------------- certificate failures


def verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_code = code
    error.verify_message = message
    return error


@pytest.mark.parametrize(("code", "message", "hint"), [
    (62, "Hostname mismatch, certificate is not valid for 'h'.", "verifyHostName=false"),
    (64, "IP address mismatch", "verifyHostName=false"),
    (10, "certificate has expired", "must be renewed"),
    (20, "unable to get local issuer certificate", "trustStore=FILE"),
])
def test_a_verification_failure_names_the_cause_and_what_to_do(code: int, message: str,
                                                                hint: str) -> None:
    error = describe_tls_failure("stomp+ssl://h:1", verify_error(code, message))
    assert isinstance(error, CertificateError)
    text = str(error)
    assert text.startswith(f"stomp+ssl://h:1: certificate verify failed: "
                           f"{message.rstrip('.')};")
    assert hint in text and "\n" not in text


@pytest.mark.parametrize(("reason", "says"), [
    ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "the broker requires a client certificate"),
    ("SSLV3_ALERT_BAD_CERTIFICATE", "the broker refused the client certificate"),
    ("TLSV1_ALERT_UNKNOWN_CA", "the broker does not trust the client certificate's CA"),
    ("SSLV3_ALERT_CERTIFICATE_EXPIRED", "the broker refused the expired client certificate"),
])
def test_a_broker_refusing_our_certificate_says_what_to_pass(reason: str, says: str) -> None:
    alert = ssl.SSLError(1, "alert")
    alert.reason = reason
    error = describe_tls_failure("mqtts://h:8883", alert)
    assert isinstance(error, CertificateError)
    assert f"mqtts://h:8883: {says} ({reason}); pass a certificate" in str(error)
    assert "keyStore=FILE" in str(error)


@pytest.mark.parametrize("failure", [
    ConnectionRefusedError("refused"), TimeoutError(), ssl.SSLError(1, "other"),
])
def test_other_failures_are_not_certificate_errors(failure: BaseException) -> None:
    assert describe_tls_failure("stomp+ssl://h:1", failure) is None


# ------------------------------------------------------- construction, at once


def test_an_unusable_tls_file_fails_when_the_client_is_made(tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(TlsSetupError, match="cannot load CA file"):
        FailoverClient("failover:(stomp://a,stomp+ssl://b)", ssl_cafile=missing)
    with pytest.raises(TlsSetupError, match=r"stomp\+ssl://b:61612: cannot load CA file"):
        FailoverClient(f"failover:(stomp://a,stomp+ssl://b?trustStore={missing})")
    FailoverClient("stomp://a", ssl_cafile=missing)  # no TLS endpoint: never read


def test_a_key_needs_its_certificate() -> None:
    with pytest.raises(ClientError, match="ssl_keyfile needs ssl_certfile"):
        FailoverClient("stomp+ssl://a", ssl_keyfile="k.pem")


# -------------------------------------------------------------- the hierarchy


@pytest.mark.parametrize(("error", "catch_as", "retriable"), [
    (ConnectionLostError, (ClientError,), True),
    (OperationTimeoutError, (ClientError,), True),
    (ConnectionFailedError, (ClientError,), False),
    (AuthenticationFailedError, (BrokerError, ConnectionFailedError), False),
    (CertificateError, (ConnectionFailedError,), False),
    (ProtocolVersionRefusedError, (BrokerError,), False),
    (BrokerError, (ClientError,), False),
    (TlsSetupError, (ClientError,), False),
    (ClientClosedError, (ClientError,), False),
    (TransactionRolledBackError, (TransactionError,), True),
    (TransactionInDoubtError, (TransactionError,), False),
])
def test_what_an_error_can_be_caught_as_and_whether_to_retry(
        error: type[MeshmqError], catch_as: tuple[type[Exception], ...],
        retriable: bool) -> None:
    instance = error("x")
    assert isinstance(instance, MeshmqError)
    assert all(isinstance(instance, base) for base in catch_as)
    assert instance.retriable is retriable


def test_every_client_error_has_its_own_code() -> None:
    classes = [ClientError, BrokerError, ProtocolVersionRefusedError, ConnectionLostError,
               ConnectionFailedError, OperationTimeoutError, AuthenticationFailedError,
               CertificateError, TlsSetupError, ClientClosedError,
               TransactionRolledBackError, TransactionInDoubtError]
    codes = [c.code for c in classes]
    assert len(set(codes)) == len(codes)
