"""A STOMP client over a real WebSocket connection (the websockets library)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from websockets.sync.client import ClientConnection, connect

from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from tests.support.raw_stomp import uid

TIMEOUT = 10.0


class WsStomp:
    """A STOMP client over a websockets connection: frames out as text or binary
    messages, every message received is fed to an incremental STOMP parser."""

    def __init__(self, port: int, subprotocols: tuple[str, ...] | None = ("v12.stomp",), *,
                 text: bool = True, path: str = "/") -> None:
        self.ws: ClientConnection = connect(
            f"ws://127.0.0.1:{port}{path}", subprotocols=subprotocols and list(subprotocols),
            compression=None, proxy=None, open_timeout=TIMEOUT, close_timeout=TIMEOUT,
            max_size=None, ping_interval=None)
        self.text = text
        self.parser = StompParser(version="1.2")
        self.pending: list[Frame] = []
        self.kinds: list[type] = []  # str or bytes: the type of each message received

    def send_raw(self, data: bytes) -> None:
        self.ws.send(data.decode() if self.text else data)

    def send(self, command: str, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        self.send_raw(encode_frame(command, headers, body))

    def next(self, command: str | None = None, timeout: float = TIMEOUT) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            if self.pending:
                frame = self.pending.pop(0)
                assert command is None or frame.command == command, \
                    (frame.command, frame.headers, frame.body[:200])
                return frame
            message = self.ws.recv(timeout=max(0.0, deadline - time.monotonic()))
            self.kinds.append(type(message))
            data = message.encode() if isinstance(message, str) else message
            self.pending.extend(self.parser.feed(data))

    def connect(self) -> Frame:
        self.send("CONNECT", [("accept-version", "1.0,1.1,1.2"), ("host", "localhost")])
        return self.next("CONNECTED")

    def receipt(self, command: str, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        rid = uid("r-")
        self.send(command, [*headers, ("receipt", rid)], body)
        frame = self.next("RECEIPT")
        assert frame.get("receipt-id") == rid

    def close(self) -> None:
        self.ws.close()


def closed_after() -> Iterator[list[WsStomp]]:
    """Body of a fixture: the clients a test puts in the list are closed after it."""
    made: list[WsStomp] = []
    yield made
    for client in made:
        client.close()
