"""TLS contexts for every encrypted connection of a broker: client listeners, broker
links (``ssl://`` listeners and network connectors) and replication links.

All of them use TLS 1.2 at least and an optional OpenSSL cipher list. Certificates
and keys are reloaded in place (``CertificateReloader``, on SIGHUP): loading a new
pair into an existing ``SSLContext`` changes what new connections present, while
open connections keep the session they negotiated.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("meshmq.tls")

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
VERIFY_MODES = {"none": ssl.CERT_NONE, "want": ssl.CERT_OPTIONAL, "need": ssl.CERT_REQUIRED}


class TlsFileError(Exception):
    """A certificate, key or CA file cannot be used; ``option`` names which one."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def check_ciphers(ciphers: str) -> None:
    """Raise ValueError when OpenSSL selects no cipher from ``ciphers``."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(ciphers)
    except ssl.SSLError:
        raise ValueError(f"{ciphers!r} selects no cipher OpenSSL knows (an OpenSSL cipher "
                         "list such as 'ECDHE+AESGCM:ECDHE+CHACHA20')") from None


def _describe(path: Path | None, exc: OSError, keyfile: Path | None = None) -> str:
    key = f" (key {keyfile})" if keyfile is not None else ""
    return f"cannot load {path}{key}: {exc.strerror or exc}"


def _base(purpose: ssl.Purpose, ciphers: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(purpose)
    ctx.minimum_version = MINIMUM_VERSION
    if ciphers:
        ctx.set_ciphers(ciphers)  # validated by the config loader
    return ctx


def _load_pair(ctx: ssl.SSLContext, certfile: Path, keyfile: Path | None,
               cert_option: str) -> None:
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except OSError as exc:  # ssl.SSLError too
        raise TlsFileError(cert_option, _describe(certfile, exc, keyfile)) from None


def _load_ca(ctx: ssl.SSLContext, cafile: Path) -> None:
    try:
        ctx.load_verify_locations(cafile)
    except OSError as exc:
        raise TlsFileError("ssl_cafile", _describe(cafile, exc)) from None


def server_context(certfile: Path, keyfile: Path | None, cafile: Path | None,
                   client_auth: str, ciphers: str | None) -> ssl.SSLContext:
    """The accepting side: presents ``certfile``; verifies peers' certificates against
    ``cafile`` as ``client_auth`` (none/want/need) says. Raises TlsFileError."""
    ctx = _base(ssl.Purpose.CLIENT_AUTH, ciphers)
    _load_pair(ctx, certfile, keyfile, "ssl_certfile")
    if cafile is not None:
        _load_ca(ctx, cafile)
    ctx.verify_mode = VERIFY_MODES[client_auth]
    return ctx


def client_context(cafile: Path | None, certfile: Path | None, keyfile: Path | None,
                   verify_hostname: bool, ciphers: str | None) -> ssl.SSLContext:
    """The dialing side: always verifies the server's certificate (``cafile``, else the
    system trust store); presents ``certfile`` when given (mutual TLS)."""
    ctx = _base(ssl.Purpose.SERVER_AUTH, ciphers)
    if cafile is not None:
        _load_ca(ctx, cafile)
    ctx.check_hostname = verify_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if certfile is not None:
        _load_pair(ctx, certfile, keyfile, "ssl_certfile")
    return ctx


def verified_peer(ctx: ssl.SSLContext | None, peercert: object) -> dict[str, object] | None:
    """The peer's certificate when the handshake verified one, else None."""
    if ctx is None or ctx.verify_mode == ssl.CERT_NONE:
        return None
    return peercert if isinstance(peercert, dict) and peercert else None


@dataclass
class _Pair:
    label: str
    ctx: ssl.SSLContext
    certfile: Path
    keyfile: Path | None


class CertificateReloader:
    """Every context that presents a certificate, so SIGHUP can reload them all."""

    def __init__(self) -> None:
        self._pairs: list[_Pair] = []

    def register(self, label: str, ctx: ssl.SSLContext, certfile: Path | None,
                 keyfile: Path | None) -> ssl.SSLContext:
        if certfile is not None:
            self._pairs.append(_Pair(label, ctx, certfile, keyfile))
        return ctx

    def __len__(self) -> int:
        return len(self._pairs)

    def reload(self) -> int:
        """Load each certificate/key pair again; returns how many were reloaded. A pair
        that does not load (missing file, key not matching) is checked in a scratch
        context first, so the old pair stays in use; that is logged in one line."""
        done = 0
        for pair in self._pairs:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(pair.certfile,
                                                                        pair.keyfile)
                pair.ctx.load_cert_chain(pair.certfile, pair.keyfile)
            except OSError as exc:
                log.error("%s: keeping the previous certificate: %s", pair.label,
                          _describe(pair.certfile, exc, pair.keyfile))
                continue
            done += 1
        if self._pairs:
            log.info("TLS certificates reloaded: %d of %d", done, len(self._pairs))
        return done


def handshake_failure_reason(exc: BaseException) -> str:
    """Why a TLS handshake with a peer failed, in words an operator can act on."""
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or exc.strerror or str(exc)
        if reason in ("HTTP_REQUEST", "WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING",
                      "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL",
                      "HTTPS_PROXY_REQUEST"):  # a plaintext STOMP CONNECT reads as one
            return f"no TLS handshake ({reason}): the peer speaks plaintext"
        if reason == "CERTIFICATE_VERIFY_FAILED":
            return ("TLS handshake failed: a client certificate that ssl_cafile does not "
                    "trust (CERTIFICATE_VERIFY_FAILED)")
        if reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"):
            return f"TLS handshake failed: no client certificate, and one is required ({reason})"
        return f"TLS handshake failed: {reason}"
    if isinstance(exc, TimeoutError):
        return "no TLS handshake in time"
    return f"TLS handshake failed: {exc}"
