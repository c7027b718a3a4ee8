"""Helpers for the interop suite: a stomp.py client wrapper that records what it
receives, and a raw-socket STOMP client for byte-level edge cases (its parsing is
tests/support/raw_stomp.py's, shared with the socket-free tests).

Nothing here sleeps to wait for something: every wait is a condition wait or a
socket read with a deadline, and it fails loudly when the deadline passes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import stomp
from stomp.utils import Frame as StompPyFrame

from tests.support.brokers import ThreadBroker
from tests.support.raw_stomp import (  # noqa: F401 - the raw helpers, shared
    TIMEOUT,
    ClosedError,
    FrameReader,
    RawFrame,
    escape,
    frame_bytes,
    uid,
    unescape,
)

# ---------------------------------------------------------------------------- stomp.py


class Collector(stomp.ConnectionListener):
    """Records every frame a stomp.py connection receives, under one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: list[StompPyFrame] = []
        self.receipts: list[str] = []
        self.errors: list[StompPyFrame] = []
        self.connected: list[StompPyFrame] = []
        self.heartbeats = 0
        self.sent_heartbeats = 0
        self.disconnected = False

    def _add(self, fn: Callable[[], None]) -> None:
        with self.cond:
            fn()
            self.cond.notify_all()

    def on_connected(self, frame: StompPyFrame) -> None:
        self._add(lambda: self.connected.append(frame))

    def on_message(self, frame: StompPyFrame) -> None:
        self._add(lambda: self.messages.append(frame))

    def on_receipt(self, frame: StompPyFrame) -> None:
        self._add(lambda: self.receipts.append(frame.headers["receipt-id"]))

    def on_error(self, frame: StompPyFrame) -> None:
        self._add(lambda: self.errors.append(frame))

    def on_heartbeat(self) -> None:
        def inc() -> None:
            self.heartbeats += 1
        self._add(inc)

    def on_send(self, frame: StompPyFrame) -> None:
        if not frame.cmd:  # stomp.py sends a heart-beat as a frame without a command
            def inc() -> None:
                self.sent_heartbeats += 1
            self._add(inc)

    def on_disconnected(self) -> None:
        def mark() -> None:
            self.disconnected = True
        self._add(mark)

    def wait(self, predicate: Callable[[], Any], timeout: float = TIMEOUT,
             what: str = "condition") -> Any:
        with self.cond:
            ok = self.cond.wait_for(predicate, timeout)
            if not ok:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; have "
                    f"{len(self.messages)} messages, receipts={self.receipts}, "
                    f"errors={[e.headers for e in self.errors]}, "
                    f"disconnected={self.disconnected}")
            return ok

    def wait_messages(self, n: int, timeout: float = TIMEOUT) -> list[StompPyFrame]:
        self.wait(lambda: len(self.messages) >= n, timeout, f"{n} messages")
        with self.cond:
            return list(self.messages)

    def wait_receipt(self, receipt_id: str, timeout: float = TIMEOUT) -> None:
        self.wait(lambda: receipt_id in self.receipts, timeout, f"receipt {receipt_id}")

    def wait_error(self, timeout: float = TIMEOUT) -> StompPyFrame:
        self.wait(lambda: bool(self.errors), timeout, "an ERROR frame")
        return self.errors[0]

    def wait_disconnected(self, timeout: float = TIMEOUT) -> None:
        self.wait(lambda: self.disconnected, timeout, "the connection to close")

    def bodies(self) -> list[str]:
        with self.cond:
            return [m.body for m in self.messages]


_CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11,
                "1.2": stomp.Connection12}


class Client:
    """A stomp.py connection with a :class:`Collector` and receipt-confirmed helpers."""

    def __init__(self, broker: ThreadBroker, version: str = "1.2", *,
                 login: str | None = None, passcode: str | None = None,
                 client_id: str | None = None, heartbeats: tuple[int, int] = (0, 0),
                 auto_decode: bool = True, connect: bool = True,
                 headers: dict[str, str] | None = None, source_port: int = 0) -> None:
        self.version = version
        kwargs: dict[str, Any] = {"reconnect_attempts_max": 1, "auto_decode": auto_decode,
                                  "timeout": TIMEOUT}
        if source_port:
            kwargs["bind_host_port"] = ("127.0.0.1", source_port)
        if version != "1.0":
            kwargs["heartbeats"] = heartbeats
        self.conn = _CONNECTIONS[version]([(broker.host, broker.port)], **kwargs)
        self.listener = Collector()
        self.conn.set_listener("collector", self.listener)
        self._headers = dict(headers or {})
        if client_id is not None:
            self._headers["client-id"] = client_id
        self._login = login
        self._passcode = passcode
        if connect:
            self.connect()

    def connect(self, wait: bool = True) -> None:
        self.conn.connect(self._login, self._passcode, wait=wait, headers=self._headers)

    # -- frames with receipts ------------------------------------------------
    def send(self, destination: str, body: str | bytes = "",
             headers: dict[str, Any] | None = None, *, receipt: bool = True) -> None:
        hdrs = {k: str(v) for k, v in (headers or {}).items()}
        rid = uid("send-") if receipt else None
        if rid:
            hdrs["receipt"] = rid
        self.conn.send(destination, body, headers=hdrs)
        if rid:
            self.listener.wait_receipt(rid)

    def subscribe(self, destination: str, sub_id: str | None = None, *, ack: str = "auto",
                  receipt: bool = True, headers: dict[str, str] | None = None) -> str:
        sub_id = sub_id or uid("sub-")
        hdrs = dict(headers or {})
        rid = uid("sub-r-") if receipt else None
        if rid:
            hdrs["receipt"] = rid
        if self.version == "1.0":
            hdrs["id"] = sub_id
            self.conn.subscribe(destination, ack=ack, headers=hdrs)
        else:
            self.conn.subscribe(destination, sub_id, ack=ack, headers=hdrs)
        if rid:
            self.listener.wait_receipt(rid)
        return sub_id

    def unsubscribe(self, sub_id: str, *, headers: dict[str, str] | None = None) -> None:
        hdrs = dict(headers or {})
        rid = uid("unsub-r-")
        hdrs["receipt"] = rid
        if self.version == "1.0":
            self.conn.unsubscribe(id=sub_id, headers=hdrs)
        else:
            self.conn.unsubscribe(sub_id, headers=hdrs)
        self.listener.wait_receipt(rid)

    def ack(self, message: StompPyFrame, *, transaction: str | None = None,
            receipt: bool = True) -> None:
        rid = uid("ack-r-") if receipt else None
        h = message.headers
        if self.version == "1.2":
            self.conn.ack(h["ack"], transaction=transaction, receipt=rid)
        elif self.version == "1.1":
            self.conn.ack(h["message-id"], h["subscription"], transaction=transaction,
                          receipt=rid)
        else:
            self.conn.ack(h["message-id"], transaction=transaction, receipt=rid)
        if rid:
            self.listener.wait_receipt(rid)

    def nack(self, message: StompPyFrame, *, transaction: str | None = None,
             receipt: bool = True) -> None:
        rid = uid("nack-r-") if receipt else None
        h = message.headers
        if self.version == "1.2":
            self.conn.nack(h["ack"], transaction=transaction, receipt=rid)
        else:
            self.conn.nack(h["message-id"], h["subscription"], transaction=transaction,
                           receipt=rid)
        if rid:
            self.listener.wait_receipt(rid)

    def begin(self, txn: str) -> None:
        rid = uid("begin-r-")
        self.conn.begin(txn, headers={"receipt": rid})
        self.listener.wait_receipt(rid)

    def commit(self, txn: str) -> None:
        rid = uid("commit-r-")
        self.conn.commit(txn, headers={"receipt": rid})
        self.listener.wait_receipt(rid)

    def abort(self, txn: str) -> None:
        rid = uid("abort-r-")
        self.conn.abort(txn, headers={"receipt": rid})
        self.listener.wait_receipt(rid)

    def barrier(self) -> None:
        """A RECEIPT round trip: everything the broker decided before it is on our side.

        Deliveries are written before any later frame of ours is handled, and TCP keeps
        order, so once the receipt is here every earlier MESSAGE is here too.
        """
        txn = uid("barrier-")
        self.begin(txn)
        self.abort(txn)

    def disconnect(self, timeout: float = 2.0) -> None:
        """DISCONNECT with a receipt (waited for up to ``timeout``), then close the socket.

        Never blocks forever: stomp.py's own disconnect() waits for its reader thread
        without a deadline, which hangs when the broker stops reading this connection.
        """
        if self.conn.transport.is_connected() and not self.listener.disconnected:
            rid = uid("disc-")
            try:
                self.conn.send_frame("DISCONNECT", {"receipt": rid})
                self.listener.wait(lambda: rid in self.listener.receipts
                                   or self.listener.disconnected, timeout, "DISCONNECT receipt")
            except Exception:
                pass
        self.close()

    def close(self) -> None:
        transport = self.conn.transport
        try:
            transport.disconnect_socket()
        except Exception:
            pass
        thread = getattr(transport, "io_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    # -- reading -----------------------------------------------------------------
    def wait_messages(self, n: int, timeout: float = TIMEOUT) -> list[StompPyFrame]:
        return self.listener.wait_messages(n, timeout)

    @property
    def messages(self) -> list[StompPyFrame]:
        with self.listener.cond:
            return list(self.listener.messages)

    def bodies(self) -> list[str]:
        return self.listener.bodies()


# ---------------------------------------------------------------------------- raw sockets


@dataclass(frozen=True)
class Address:
    """Where a RawClient connects when there is no ThreadBroker object (a subprocess)."""

    port: int
    host: str = "127.0.0.1"


class RawClient(FrameReader):
    """A STOMP client on a bare socket; reads frames exactly as they arrive."""

    def __init__(self, broker: ThreadBroker, timeout: float = TIMEOUT, *,
                 source_port: int = 0) -> None:
        super().__init__()
        source = (broker.host, source_port) if source_port else None
        self.sock = socket.create_connection((broker.host, broker.port), timeout=timeout,
                                             source_address=source)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out waiting for data from the broker")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("timed out waiting for data from the broker") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise ClosedError("the broker closed the connection")
        self.buf += data
