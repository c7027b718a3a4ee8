"""The client side of one MQTT connection, sans-I/O: packets out as bytes, bytes in as
packets. Small on purpose: it lets tests (and tools) drive :class:`ServerConnection`
packet by packet, or byte by byte, with no socket in between."""

from __future__ import annotations

from .decoder import MqttDecoder
from .encoder import encode
from .packets import Packet


class ClientConnection:
    def __init__(self, protocol_level: int) -> None:
        self.level = protocol_level
        self.decoder = MqttDecoder(protocol_level=protocol_level, server_side=False)

    def send(self, packet: Packet) -> bytes:
        return encode(packet, self.level)

    def receive_data(self, data: bytes) -> list[Packet]:
        """The server's packets in ``data``; raises MqttProtocolError if it broke the
        protocol."""
        return self.decoder.feed(data)
