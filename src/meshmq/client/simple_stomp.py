"""A small blocking STOMP 1.2 client on meshmq's codec, for the CLI and scripts.

One socket, no reconnects: the failover client (``meshmq.client``) builds on the
same codec for applications.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque

from meshmq.errors import MeshmqError, RemoteProtocolError
from meshmq.protocol.stomp import Frame, StompParser, encode_frame


class StompClientError(MeshmqError):
    """The broker answered with an ERROR frame, or the connection failed."""

    code = "client-error"


class SimpleStompClient:
    def __init__(self, host: str, port: int, *, login: str | None = None,
                 passcode: str | None = None, client_id: str | None = None,
                 timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> None:
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            # TLS: the context decides what is verified (meshmq.client.tls).
            self.sock = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
        except BaseException:
            raw.close()
            raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = StompParser(version="1.2")
        self.frames: deque[Frame] = deque()
        self._receipt_seq = 0
        headers = [("accept-version", "1.2"), ("host", host), ("heart-beat", "0,0")]
        if login is not None:
            headers += [("login", login), ("passcode", passcode or "")]
        if client_id is not None:
            headers.append(("client-id", client_id))
        try:
            self._send(encode_frame("CONNECT", headers, version="1.2"))
            frame = self._next(timeout)
            if frame is None or frame.command != "CONNECTED":
                raise StompClientError(f"connect failed: {_describe(frame)}")
        except BaseException:
            self.sock.close()  # a broker that dies during the handshake leaks no socket
            raise
        self.session = frame.get("session")

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _next(self, timeout: float | None) -> Frame | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.frames:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                raise StompClientError("connection closed by the broker")
            try:
                self.frames.extend(self.parser.feed(data))
            except RemoteProtocolError as exc:
                raise StompClientError(f"bad data from broker: {exc}") from exc
        frame = self.frames.popleft()
        if frame.command == "ERROR":
            raise StompClientError(f"broker error: {frame.get('message')}")
        return frame

    def _await_receipt(self, receipt: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        stash: list[Frame] = []
        try:
            while True:
                frame = self._next(max(0.0, deadline - time.monotonic()))
                if frame is None:
                    raise StompClientError(f"no receipt {receipt} within {timeout}s")
                if frame.command == "RECEIPT" and frame.get("receipt-id") == receipt:
                    return
                stash.append(frame)
        finally:
            self.frames.extendleft(reversed(stash))

    def _receipt(self) -> str:
        self._receipt_seq += 1
        return f"r{self._receipt_seq}"

    def send(self, destination: str, body: bytes, headers: dict[str, str] | None = None, *,
             confirm: bool = True, timeout: float = 30.0) -> None:
        hdrs = [("destination", destination), *(headers or {}).items()]
        receipt = self._receipt() if confirm else None
        if receipt:
            hdrs.append(("receipt", receipt))
        self._send(encode_frame("SEND", hdrs, body, version="1.2"))
        if receipt:
            self._await_receipt(receipt, timeout)

    def subscribe(self, destination: str, sub_id: str = "0", ack: str = "auto",
                  headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        receipt = self._receipt()
        hdrs = [("destination", destination), ("id", sub_id), ("ack", ack),
                *(headers or {}).items(), ("receipt", receipt)]
        self._send(encode_frame("SUBSCRIBE", hdrs, version="1.2"))
        self._await_receipt(receipt, timeout)

    def receive(self, timeout: float | None = None) -> Frame | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            frame = self._next(remaining)
            if frame is None or frame.command == "MESSAGE":
                return frame

    def ack(self, frame: Frame) -> None:
        ack_id = frame.get("ack")
        if ack_id is not None:
            self._send(encode_frame("ACK", [("id", ack_id)], version="1.2"))

    def close(self) -> None:
        try:
            receipt = self._receipt()
            self._send(encode_frame("DISCONNECT", [("receipt", receipt)], version="1.2"))
            self._await_receipt(receipt, 5.0)
        except (OSError, MeshmqError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> SimpleStompClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(frame: Frame | None) -> str:
    if frame is None:
        return "no answer"
    return f"{frame.command} {frame.get('message') or ''}".strip()
