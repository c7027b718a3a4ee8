"""A small blocking STOMP 1.2 connection for the Spark source and sink.

Runs inside Spark's Python workers, so it is created where it is used (never held
by a pickled reader or writer) and needs nothing but the standard library and
meshmq's own codec. ``brokers`` takes one address or a failover list; the first
broker that accepts the connection is used.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from urllib.parse import urlparse

from meshmq.client.errors import TlsSetupError
from meshmq.client.tls import TlsSettings, client_context, describe_tls_failure
from meshmq.errors import MeshmqError
from meshmq.protocol.stomp import Frame, StompParser, encode_frame

_CA_HINT = "pass the broker's CA with the trustStore option"
_CERT_HINT = "pass one with the keyStore (and keyStoreKey) options"


class StompIOError(MeshmqError):
    code = "stomp-io"
    retriable = True


_TLS_SCHEMES = frozenset({"ssl", "stomp+ssl", "stomp+nio+ssl"})


def parse_brokers(uri: str) -> list[tuple[str, int]]:
    """``failover:(tcp://a:61613,tcp://b:61613)?opts``, ``stomp://a:61613``, ``a:61613``
    or ``a:1,b:2`` -> [(host, port), ...]."""
    return [(host, port) for host, port, _ in parse_broker_list(uri)]


def parse_broker_list(uri: str) -> list[tuple[str, int, bool]]:
    """As :func:`parse_brokers`, with whether each address is TLS (``ssl://``,
    ``stomp+ssl://``; their default port is 61612)."""
    text = uri.strip()
    if text.startswith("failover:"):
        text = text[len("failover:"):]
        if text.startswith("("):
            end = text.find(")")
            if end < 0:
                raise ValueError(f"unbalanced parentheses in broker URI {uri!r}")
            text = text[1:end]
        else:
            text = text.split("?", 1)[0]
    out = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        parsed = urlparse(part if "://" in part else f"stomp://{part}")
        if not parsed.hostname:
            raise ValueError(f"no host in broker address {part!r} (of {uri!r})")
        tls = parsed.scheme.lower() in _TLS_SCHEMES
        out.append((parsed.hostname, parsed.port or (61612 if tls else 61613), tls))
    if not out:
        raise ValueError(f"no broker address in {uri!r}")
    return out


class StompLink:
    """``tls``: the settings for TLS addresses (``ssl://``, ``stomp+ssl://``; every
    address with ``tls_only``); the broker's certificate is verified (meshmq.client.tls)."""

    def __init__(self, brokers: str, *, login: str | None = None,
                 passcode: str | None = None, timeout: float = 30.0,
                 tls: TlsSettings | None = None, tls_only: bool = False) -> None:
        self.parser = StompParser(version="1.2")
        self.frames: deque[Frame] = deque()
        self.timeout = timeout
        self._receipts = 0
        errors = []
        context: ssl.SSLContext | None = None
        for host, port, secure in parse_broker_list(brokers):
            try:
                if secure or tls_only:
                    if context is None:
                        context = client_context(tls or TlsSettings())
                    self.sock = _tls_connect(host, port, timeout, context)
                else:
                    self.sock = socket.create_connection((host, port), timeout=timeout)
                break
            except TlsSetupError as exc:
                raise StompIOError(str(exc), retriable=False) from None
            except OSError as exc:
                cert = describe_tls_failure(f"{host}:{port}", exc, ca_hint=_CA_HINT,
                                            cert_hint=_CERT_HINT)
                if cert is not None:
                    raise StompIOError(str(cert), retriable=False) from None
                errors.append(f"{host}:{port}: {exc}")
        else:
            raise StompIOError("no broker reachable: " + "; ".join(errors))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        headers = [("accept-version", "1.2"), ("host", "meshmq"), ("heart-beat", "0,0")]
        if login is not None:
            headers += [("login", login), ("passcode", passcode or "")]
        try:
            self.sock.sendall(encode_frame("CONNECT", headers, version="1.2"))
            frame = self.next_frame(timeout)
            if frame is None or frame.command != "CONNECTED":
                raise StompIOError(f"CONNECT failed: {frame.command if frame else 'no answer'}")
        except BaseException:  # a refused login, say: the socket is not kept
            self.sock.close()
            raise

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return None
            if not data:
                raise StompIOError("connection closed by the broker")
            self.frames.extend(self.parser.feed(data))
        frame = self.frames.popleft()
        if frame.command == "ERROR":
            raise StompIOError(f"broker error: {frame.get('message')}", retriable=False)
        return frame

    def _receipt_id(self) -> str:
        self._receipts += 1
        return f"r{self._receipts}"

    def wait_receipt(self, receipt: str) -> Frame:
        """The RECEIPT ``receipt``; MESSAGE frames that arrive first are kept."""
        held: list[Frame] = []
        try:
            while True:
                frame = self.next_frame()
                if frame is None:
                    raise StompIOError(f"no receipt {receipt} within {self.timeout}s")
                if frame.command == "RECEIPT" and frame.get("receipt-id") == receipt:
                    return frame
                held.append(frame)
        finally:
            self.frames.extendleft(reversed(held))

    def send(self, destination: str, body: bytes, headers: list[tuple[str, str]], *,
             confirm: bool = False) -> None:
        hdrs = [("destination", destination), *headers]
        receipt = self._receipt_id() if confirm else None
        if receipt is not None:
            hdrs.append(("receipt", receipt))
        self.sock.sendall(encode_frame("SEND", hdrs, body, version="1.2"))
        if receipt is not None:
            self.wait_receipt(receipt)

    def subscribe(self, destination: str, sub_id: str, headers: list[tuple[str, str]]
                  ) -> Frame:
        """SUBSCRIBE and wait for its RECEIPT, which is returned."""
        receipt = self._receipt_id()
        self.sock.sendall(encode_frame("SUBSCRIBE", [
            ("destination", destination), ("id", sub_id), *headers, ("receipt", receipt)],
            version="1.2"))
        return self.wait_receipt(receipt)

    def unsubscribe(self, sub_id: str) -> None:
        receipt = self._receipt_id()
        self.sock.sendall(encode_frame("UNSUBSCRIBE", [("id", sub_id), ("receipt", receipt)],
                                       version="1.2"))
        self.wait_receipt(receipt)

    def ack(self, ack_id: str) -> None:
        self.sock.sendall(encode_frame("ACK", [("id", ack_id)], version="1.2"))

    def close(self) -> None:
        try:
            receipt = self._receipt_id()
            self.sock.sendall(encode_frame("DISCONNECT", [("receipt", receipt)],
                                           version="1.2"))
            self.wait_receipt(receipt)
        except (OSError, MeshmqError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> StompLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tls_connect(host: str, port: int, timeout: float, context: ssl.SSLContext
                 ) -> socket.socket:
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return context.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise
