"""The client side of STOMP / MQTT over WebSocket (``ws://``, ``wss://``) on wsproto.

Sans-I/O like the protocol codecs: :class:`WebSocketFramer` turns the protocol's bytes
into WebSocket frames and received frames back into bytes; the connection does the
I/O. The subprotocol offered is ``v12.stomp`` (STOMP) or ``mqtt`` (MQTT).
"""

from __future__ import annotations

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from .errors import BrokerError, ConnectionLostError

__all__ = ["SUBPROTOCOLS", "WebSocketFramer"]

SUBPROTOCOLS = {"stomp": "v12.stomp", "mqtt": "mqtt"}


class WebSocketFramer:
    def __init__(self, host: str, path: str, protocol: str) -> None:
        self._ws = WSConnection(ConnectionType.CLIENT)
        self.host = host
        self.path = path or "/"
        self.subprotocol = SUBPROTOCOLS[protocol]
        self.open = False

    def request(self) -> bytes:
        """The HTTP upgrade request."""
        return self._ws.send(Request(host=self.host, target=self.path,
                                     subprotocols=[self.subprotocol]))

    def handshake(self, data: bytes) -> tuple[bool, bytes]:
        """Feed the server's answer; (True, leftover protocol bytes) once accepted."""
        self._ws.receive_data(data)
        leftover = bytearray()
        for event in self._ws.events():
            if isinstance(event, AcceptConnection):
                self.open = True
            elif isinstance(event, RejectConnection | RejectData):
                raise BrokerError(f"WebSocket upgrade refused "
                                  f"({getattr(event, 'status_code', '?')})")
            elif self.open:
                leftover += self._payload(event)
        return self.open, bytes(leftover)

    def encode(self, data: bytes) -> bytes:
        return self._ws.send(BytesMessage(data=data))

    def decode(self, data: bytes) -> tuple[bytes, bytes]:
        """(protocol bytes, bytes to send back: pongs, close replies)."""
        self._ws.receive_data(data)
        payload = bytearray()
        reply = bytearray()
        for event in self._ws.events():
            if isinstance(event, Ping):
                reply += self._ws.send(event.response())
            elif isinstance(event, CloseConnection):
                raise ConnectionLostError(f"WebSocket closed by the broker ({event.code} "
                                          f"{event.reason or ''})".strip())
            else:
                payload += self._payload(event)
        return bytes(payload), bytes(reply)

    @staticmethod
    def _payload(event: object) -> bytes:
        if isinstance(event, BytesMessage):
            return bytes(event.data)
        if isinstance(event, TextMessage):
            return event.data.encode("utf-8")
        return b""
