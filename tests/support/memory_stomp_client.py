"""A STOMP client for broker behaviour tests on a ``MemoryBroker``, shaped like the
interop suite's stomp.py wrapper (send/subscribe/ack with receipts, collected MESSAGE,
RECEIPT and ERROR frames) so a behaviour test reads the same with or without sockets.

It writes what a well-behaved client library writes (escaped headers on 1.1 and 1.2, a
content-length on every SEND) and reads frames with the byte-level parser of
``raw_stomp``; waiting runs the broker's loop, so nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshmq.config.model import StoreConfig
from meshmq.store.base import Store
from tests.support.memory_broker import DEFAULT_TIMEOUT_S, MemoryBroker, memory_config
from tests.support.raw_stomp import MemoryRawClient, escape, uid


class StompTestBroker(MemoryBroker):
    """A MemoryBroker with the statistics views the behaviour tests read."""

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.broker.statistics()
        return result

    def destination_stats(self, name: str) -> dict[str, Any]:
        for d in self.stats()["destinations"]:
            if d["name"] == name:
                return d  # type: ignore[no-any-return]
        raise KeyError(name)


def make_broker(data_dir: Path, store: Store | None = None,
                **changes: Any) -> StompTestBroker:
    """A broker configured as the socket suite's (persistent, name "test"), with no
    listeners and an in-memory store unless ``store`` is given."""
    fields: dict[str, Any] = {"broker_name": "test", "persistent": True,
                              "data_directory": data_dir, "store": StoreConfig(fsync=False)}
    fields.update(changes)
    return StompTestBroker(memory_config(**fields), store)


@dataclass
class Frame:
    """A received frame: ``headers`` as a dict (first occurrence wins), ``body`` decoded
    as UTF-8 unless the client was made with ``auto_decode=False``."""

    cmd: str
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = b""


class Listener:
    """What the connection received so far, by kind."""

    def __init__(self, client: MemoryClient) -> None:
        self._client = client
        self._messages: list[Frame] = []
        self._receipts: list[str] = []
        self._errors: list[Frame] = []
        self._connected: list[Frame] = []

    # Reading any of these first takes in what has arrived, so a plain
    # ``broker.wait_for(lambda: ... listener.messages ...)`` sees new frames.
    @property
    def messages(self) -> list[Frame]:
        self._client.pump()
        return self._messages

    @property
    def receipts(self) -> list[str]:
        self._client.pump()
        return self._receipts

    @property
    def errors(self) -> list[Frame]:
        self._client.pump()
        return self._errors

    @property
    def connected(self) -> list[Frame]:
        self._client.pump()
        return self._connected

    @property
    def heartbeats(self) -> int:
        self._client.pump()
        return self._client.raw.heartbeats

    @property
    def disconnected(self) -> bool:
        self._client.pump()
        return self._client.raw.transport.closed

    def wait(self, predicate: Callable[[], Any], timeout: float = DEFAULT_TIMEOUT_S,
             what: str = "condition") -> Any:
        def ready() -> bool:
            self._client.pump()
            return bool(predicate())
        try:
            self._client.broker.wait_for(ready, timeout, what)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; have {len(self.messages)} messages, receipts={self.receipts}, "
                f"errors={[e.headers for e in self.errors]}") from None
        return True

    def wait_messages(self, n: int, timeout: float = DEFAULT_TIMEOUT_S) -> list[Frame]:
        self.wait(lambda: len(self.messages) >= n, timeout, f"{n} messages")
        return list(self.messages)

    def wait_receipt(self, receipt_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.wait(lambda: receipt_id in self.receipts, timeout, f"receipt {receipt_id}")

    def wait_error(self, timeout: float = DEFAULT_TIMEOUT_S) -> Frame:
        self.wait(lambda: bool(self.errors), timeout, "an ERROR frame")
        return self.errors[0]

    def wait_disconnected(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.wait(lambda: self._client.raw.transport.closed, timeout,
                  "the connection to close")

    def bodies(self) -> list[Any]:
        return [m.body for m in self.messages]


class Connection:
    """The frame calls of a client library's connection object: one frame each, no
    receipt awaited (``MemoryClient.conn``)."""

    def __init__(self, client: MemoryClient) -> None:
        self._client = client

    def send(self, destination: str, body: str | bytes = "",
             headers: dict[str, Any] | None = None) -> None:
        self._client.send(destination, body, headers, receipt=False)

    def subscribe(self, destination: str, id: str, ack: str = "auto",
                  headers: dict[str, str] | None = None) -> None:
        self._client.send_frame("SUBSCRIBE", {"destination": destination, "id": id,
                                              "ack": ack, **(headers or {})})

    def begin(self, transaction: str, headers: dict[str, str] | None = None) -> None:
        self._client.send_frame("BEGIN", {"transaction": transaction, **(headers or {})})

    def commit(self, transaction: str, headers: dict[str, str] | None = None) -> None:
        self._client.send_frame("COMMIT", {"transaction": transaction, **(headers or {})})

    def abort(self, transaction: str, headers: dict[str, str] | None = None) -> None:
        self._client.send_frame("ABORT", {"transaction": transaction, **(headers or {})})

    def disconnect(self, receipt: str | None = None) -> None:
        self._client.send_frame("DISCONNECT", {"receipt": receipt} if receipt else {})


class MemoryClient:
    """A STOMP 1.0/1.1/1.2 client connection on a ``MemoryBroker``."""

    def __init__(self, broker: MemoryBroker, version: str = "1.2", *,
                 login: str | None = None, passcode: str | None = None,
                 client_id: str | None = None, heartbeats: tuple[int, int] = (0, 0),
                 auto_decode: bool = True, connect: bool = True,
                 headers: dict[str, str] | None = None) -> None:
        self.broker = broker
        self.version = version
        self.raw = MemoryRawClient(broker)
        self.listener = Listener(self)
        self.conn = Connection(self)
        self._auto_decode = auto_decode
        self._connect_headers: list[tuple[str, str]] = []
        if version != "1.0":
            self._connect_headers += [("accept-version", version), ("host", "localhost"),
                                      ("heart-beat", f"{heartbeats[0]},{heartbeats[1]}")]
        if login is not None:
            self._connect_headers.append(("login", login))
        if passcode is not None:
            self._connect_headers.append(("passcode", passcode))
        if client_id is not None:
            self._connect_headers.append(("client-id", client_id))
        self._connect_headers += list((headers or {}).items())
        if connect:
            self.connect()

    # -- the wire
    def pump(self) -> None:
        """Sort every complete frame received so far into the listener's lists."""
        raw = self.raw
        raw.take()
        while True:
            raw._skip_heartbeats()
            parsed = raw._try_parse()
            if parsed is None:
                return
            headers: dict[str, str] = {}
            for k, v in parsed.headers:
                headers.setdefault(k, v)
            body: Any = parsed.body
            if self._auto_decode:
                body = body.decode("utf-8", errors="replace")
            frame = Frame(parsed.command, headers, body)
            listener = self.listener
            if frame.cmd == "MESSAGE":
                listener._messages.append(frame)
            elif frame.cmd == "RECEIPT":
                listener._receipts.append(headers.get("receipt-id", ""))
            elif frame.cmd == "ERROR":
                listener._errors.append(frame)
            elif frame.cmd == "CONNECTED":
                listener._connected.append(frame)
                raw.version = headers.get("version", "1.0")

    def send_frame(self, command: str, headers: dict[str, str] | None = None,
                   body: bytes = b"") -> None:
        items = list((headers or {}).items())
        if self.version != "1.0" and command not in ("CONNECT", "STOMP"):
            items = [(escape(k), escape(v)) for k, v in items]
        self.raw.send_frame(command, items, body)

    def connect(self, wait: bool = True) -> None:
        self.raw.send_frame("CONNECT", self._connect_headers)
        if wait:
            self.listener.wait(lambda: self.listener.connected or self.listener.errors,
                               what="CONNECTED")

    def _receipted(self, command: str, headers: dict[str, str], receipt: bool,
                   body: bytes = b"", prefix: str = "r-") -> None:
        rid = uid(prefix) if receipt else None
        if rid:
            headers["receipt"] = rid
        self.send_frame(command, headers, body)
        if rid:
            self.listener.wait_receipt(rid)

    # -- frames with receipts ------------------------------------------------
    def send(self, destination: str, body: str | bytes = "",
             headers: dict[str, Any] | None = None, *, receipt: bool = True) -> None:
        data = body.encode() if isinstance(body, str) else body
        hdrs = {"destination": destination,
                **{k: str(v) for k, v in (headers or {}).items()},
                "content-length": str(len(data))}
        self._receipted("SEND", hdrs, receipt, data, "send-")

    def subscribe(self, destination: str, sub_id: str | None = None, *, ack: str = "auto",
                  receipt: bool = True, headers: dict[str, str] | None = None) -> str:
        sub_id = sub_id or uid("sub-")
        hdrs = {"destination": destination, "id": sub_id, "ack": ack, **(headers or {})}
        self._receipted("SUBSCRIBE", hdrs, receipt, prefix="sub-r-")
        return sub_id

    def unsubscribe(self, sub_id: str, *, headers: dict[str, str] | None = None) -> None:
        self._receipted("UNSUBSCRIBE", {"id": sub_id, **(headers or {})}, True,
                        prefix="unsub-r-")

    def _ack_headers(self, message: Frame, transaction: str | None) -> dict[str, str]:
        h = message.headers
        if self.version == "1.2":
            hdrs = {"id": h["ack"]}
        elif self.version == "1.1":
            hdrs = {"message-id": h["message-id"], "subscription": h["subscription"]}
        else:
            hdrs = {"message-id": h["message-id"]}
        if transaction is not None:
            hdrs["transaction"] = transaction
        return hdrs

    def ack(self, message: Frame, *, transaction: str | None = None,
            receipt: bool = True) -> None:
        self._receipted("ACK", self._ack_headers(message, transaction), receipt,
                        prefix="ack-r-")

    def nack(self, message: Frame, *, transaction: str | None = None,
             receipt: bool = True) -> None:
        self._receipted("NACK", self._ack_headers(message, transaction), receipt,
                        prefix="nack-r-")

    def begin(self, txn: str) -> None:
        self._receipted("BEGIN", {"transaction": txn}, True, prefix="begin-r-")

    def commit(self, txn: str) -> None:
        self._receipted("COMMIT", {"transaction": txn}, True, prefix="commit-r-")

    def abort(self, txn: str) -> None:
        self._receipted("ABORT", {"transaction": txn}, True, prefix="abort-r-")

    def barrier(self) -> None:
        """A RECEIPT round trip: every delivery decided before it has been received."""
        txn = uid("barrier-")
        self.begin(txn)
        self.abort(txn)

    def disconnect(self, timeout: float = 2.0) -> None:
        """DISCONNECT with a receipt (waited for up to ``timeout``), then drop."""
        if not self.raw.transport.closed:
            rid = uid("disc-")
            self.send_frame("DISCONNECT", {"receipt": rid})
            try:
                self.listener.wait(lambda: rid in self.listener.receipts
                                   or self.raw.transport.closed, timeout,
                                   "DISCONNECT receipt")
            except AssertionError:
                pass
        self.close()

    def close(self) -> None:
        self.raw.close()

    # -- reading -----------------------------------------------------------------
    def wait_messages(self, n: int, timeout: float = DEFAULT_TIMEOUT_S) -> list[Frame]:
        return self.listener.wait_messages(n, timeout)

    @property
    def messages(self) -> list[Frame]:
        return list(self.listener.messages)

    def bodies(self) -> list[Any]:
        return self.listener.bodies()
