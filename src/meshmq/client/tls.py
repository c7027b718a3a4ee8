"""TLS for the clients: certificates are verified by default, and a failure says why.

:class:`TlsSettings` is what a client was given (keyword arguments, then the
endpoint's URI options on top); :func:`client_context` turns it into an
``ssl.SSLContext``: the system's CAs unless a CA file is given, host name checked,
TLS 1.2 or later, a client certificate when one is given. Turning verification off
is explicit (``trustAll=true`` / ``ssl_verify=False``) and logs a warning.
:func:`describe_tls_failure` turns an ``ssl`` error into one line that names the
endpoint, the cause and what to pass.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

from .errors import CertificateError, TlsSetupError

log = logging.getLogger("meshmq.client")

__all__ = ["TlsSettings", "client_context", "describe_tls_failure"]

# OpenSSL X509_V_ERR_* codes that need a hint of their own.
_HOSTNAME_MISMATCH = frozenset({62, 64})  # host name, IP address
_EXPIRED = frozenset({10})
# TLS alerts from a broker that wants (another) client certificate.
_CLIENT_CERT_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the broker requires a client certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the broker refused the client certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "the broker does not trust the client certificate's CA",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the broker refused the client certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the broker refused the expired client certificate",
}
_CA_HINT = "pass the broker's CA with trustStore=FILE on the URI or ssl_cafile=FILE"
_CERT_HINT = ("pass a certificate its CA signed with keyStore=FILE (and keyStoreKey=FILE) "
              "on the URI or ssl_certfile=FILE (and ssl_keyfile=FILE)")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cafile: str | None = None  # None: the system's trust store
    certfile: str | None = None  # client certificate (PEM), may hold the key too
    keyfile: str | None = None
    key_password: str | None = None
    verify: bool = True  # False: accept any certificate (warned)
    check_hostname: bool = True


def client_context(settings: TlsSettings, where: str = "") -> ssl.SSLContext:
    """An SSLContext for ``settings``; a file that cannot be used is a
    :class:`TlsSetupError` naming it (a setting to fix, not a broker to retry)."""
    what = "CA file"
    try:
        ctx = ssl.create_default_context(cafile=settings.cafile)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not settings.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            log.warning("%sTLS certificate verification is OFF (trustAll / ssl_verify=False)"
                        ": any server can pose as the broker; pass its CA instead",
                        f"{where}: " if where else "")
        elif not settings.check_hostname:
            ctx.check_hostname = False
        if settings.certfile is not None:
            what = "client certificate"
            ctx.load_cert_chain(settings.certfile, settings.keyfile, settings.key_password)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        path = settings.cafile if what == "CA file" else settings.certfile
        key = f" (key {settings.keyfile})" if what != "CA file" and settings.keyfile else ""
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TlsSetupError(f"{where + ': ' if where else ''}cannot load {what} "
                            f"{path}{key}: {reason}") from None
    return ctx


def describe_tls_failure(where: str, exc: BaseException, *, ca_hint: str = _CA_HINT,
                         cert_hint: str = _CERT_HINT) -> CertificateError | None:
    """A :class:`CertificateError` for a certificate problem (ours or the broker's
    verdict on ours), None for any other failure. The hints name the options to pass
    (the command line has its own)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        cause = str(exc.verify_message or exc).rstrip(".")
        if exc.verify_code in _HOSTNAME_MISMATCH:
            hint = ("connect by a name or address the certificate holds, or set "
                    "verifyHostName=false")
        elif exc.verify_code in _EXPIRED:
            hint = "the broker's certificate must be renewed"
        else:
            hint = ca_hint
        return CertificateError(f"{where}: certificate verify failed: {cause}; {hint}")
    reason = getattr(exc, "reason", None)  # not set on every SSLError
    if isinstance(exc, ssl.SSLError) and reason in _CLIENT_CERT_ALERTS:
        return CertificateError(f"{where}: {_CLIENT_CERT_ALERTS[reason]} ({reason}); "
                                f"{cert_hint}")
    return None
