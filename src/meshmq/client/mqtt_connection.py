"""One MQTT 3.1.1 / 5 connection on meshmq's sans-I/O codec.

Sends are QoS 1 (confirmed by PUBACK) unless asked otherwise; subscriptions are
confirmed by SUBACK. MQTT 5 user properties carry the application's headers, the
``dedup-id`` and, in CONNACK, the broker's peer list (``meshmq-peers``).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from meshmq.protocol.mqtt import (
    PROTOCOL_LEVEL_5,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    encode,
    encode_publish,
)

from .connection import BaseConnection, DeliverFn, Dialer, dial_tcp
from .errors import (
    AuthenticationFailedError,
    BrokerError,
    ClientError,
    ConnectionLostError,
    ProtocolVersionRefusedError,
)
from .options import Endpoint
from .types import DEDUP_HEADER, PEERS_HEADER, AckMode, Message, SubscriptionSpec

__all__ = ["MqttConnection"]

SESSION_FOREVER = 0xFFFFFFFF
#: CONNACK codes that refuse the credentials (3.1.1's 4 and 5 decode to these too).
_AUTH_REFUSALS = frozenset({ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.NOT_AUTHORIZED,
                            ReasonCode.BAD_AUTHENTICATION_METHOD})


class MqttConnection(BaseConnection):
    protocol = "mqtt"

    def __init__(self, endpoint: Endpoint, deliver: DeliverFn, generation: int, *,
                 login: str | None = None, passcode: str | None = None,
                 client_id: str | None = None, keep_alive: int = 30, version: int = 5,
                 durable: bool = False,
                 tls: ssl.SSLContext | None = None, dialer: Dialer = dial_tcp) -> None:
        super().__init__(endpoint, deliver, generation, tls=tls, dialer=dialer)
        if version not in (4, 5):
            raise ValueError("MQTT version must be 4 (3.1.1) or 5")
        self.login = login
        self.passcode = passcode
        self.client_id = client_id or ""
        self.keep_alive = keep_alive
        self.level = version
        self.durable = durable
        self.decoder = MqttDecoder(protocol_level=version, server_side=False)
        self.session_present = False
        self._packet_id = 0
        self._qos2_in: set[int] = set()

    @property
    def v5(self) -> bool:
        return self.level == PROTOCOL_LEVEL_5

    def _pid(self) -> int:
        for _ in range(0xFFFF):
            self._packet_id = self._packet_id % 0xFFFF + 1
            if f"p{self._packet_id}" not in self._pending:
                return self._packet_id
        raise ClientError("no free MQTT packet identifier (65535 requests in flight)")

    def _send(self, packet: Any) -> None:
        self.write(encode(packet, self.level))

    # -------------------------------------------------------------- handshake

    async def handshake(self, **_: Any) -> None:
        props = Properties()
        if self.v5 and self.durable:
            props.session_expiry_interval = SESSION_FOREVER
        fut = self.expect("CONNACK")
        self._send(Connect(client_id=self.client_id, clean_start=not self.durable,
                           keep_alive=self.keep_alive, username=self.login,
                           password=None if self.passcode is None else self.passcode.encode(),
                           properties=props, protocol_level=self.level))
        try:
            ack: Connack = await fut
        except ConnectionLostError as exc:
            if self.v5:
                # Some 3.1.1 brokers (ActiveMQ 5, given MQTT 5 properties) just close.
                raise ProtocolVersionRefusedError(
                    f"{self.endpoint}: closed after an MQTT 5 CONNECT ({exc})") from None
            raise
        if ack.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            raise ProtocolVersionRefusedError(f"{self.endpoint}: MQTT {self.level} refused")
        if ack.reason_code in _AUTH_REFUSALS:
            raise AuthenticationFailedError(
                f"{self.endpoint}: login refused: {ack.reason_code.name}")
        if ack.reason_code >= 0x80:
            raise BrokerError(f"{self.endpoint}: connection refused: {ack.reason_code.name}")
        self.session_present = ack.session_present
        for key, value in ack.properties.user_properties:
            if key == PEERS_HEADER:
                self.peers = tuple(p.strip() for p in value.split(",") if p.strip())
        if self.keep_alive:
            self.start_task(self._ping(self.keep_alive), f"keep-alive {self.endpoint}")

    async def _ping(self, keep_alive: int) -> None:
        # PINGREQ every keep_alive / 2; a broker silent for 1.5 x keep_alive is dead.
        interval = keep_alive / 4
        last_ping = self._loop.time()
        while True:
            await asyncio.sleep(interval)  # a periodic timer, not a wait for a condition
            now = self._loop.time()
            if now - self.last_received > 1.5 * keep_alive:
                self.abort(f"broker silent for {1.5 * keep_alive:g} s (keep-alive)")
                return
            if now - last_ping >= keep_alive / 2:
                self._send(Pingreq())
                last_ping = now

    # --------------------------------------------------------------- reading

    def feed(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MqttProtocolError as exc:
            if self.v5 and "CONNACK" in self._pending:
                # A 3.1.1 broker answers an MQTT 5 CONNECT with a 3.1.1 CONNACK
                # ("unacceptable protocol version"), which is not valid MQTT 5.
                self.resolve("CONNACK", error=ProtocolVersionRefusedError(
                    f"{self.endpoint}: MQTT 5 refused ({exc})"))
            raise
        for packet in packets:
            self._on_packet(packet)

    def _on_packet(self, packet: Any) -> None:
        if isinstance(packet, Publish):
            self._on_publish(packet)
        elif isinstance(packet, Puback | Pubcomp):
            error = None
            if packet.reason_code >= 0x80:
                error = BrokerError(f"{self.endpoint}: publish refused: "
                                    f"{packet.reason_code.name}")
            self.resolve(f"p{packet.packet_id}", packet, error)
        elif isinstance(packet, Pubrec):
            if packet.reason_code >= 0x80:
                self.resolve(f"p{packet.packet_id}", error=BrokerError(
                    f"{self.endpoint}: publish refused: {packet.reason_code.name}"))
            else:
                self._send(Pubrel(packet.packet_id))
        elif isinstance(packet, Pubrel):
            self._qos2_in.discard(packet.packet_id)
            self._send(Pubcomp(packet.packet_id))
        elif isinstance(packet, Suback | Unsuback):
            self.resolve(f"p{packet.packet_id}", packet)
        elif isinstance(packet, Connack):
            self.resolve("CONNACK", packet)
        elif isinstance(packet, Disconnect):
            reason = packet.properties.reason_string or packet.reason_code.name
            self.abort(f"disconnected by the broker: {reason}")
        elif isinstance(packet, Pingresp):
            pass

    def _on_publish(self, p: Publish) -> None:
        headers = dict(p.properties.user_properties) if self.v5 else {}
        if p.qos == 2:
            if p.packet_id in self._qos2_in:
                self._send(Pubrec(p.packet_id or 0))
                return  # the broker re-sent a QoS 2 message we already have
            self._qos2_in.add(p.packet_id or 0)
        msg = Message(destination=p.topic, body=p.payload, headers=headers, subscription="",
                      redelivered=p.dup, ack_id=None if p.qos == 0 else str(p.packet_id),
                      generation=self.generation, key=headers.get(DEDUP_HEADER))
        msg.headers.setdefault("qos", str(p.qos))
        if p.qos == 2:
            self._send(Pubrec(p.packet_id or 0))
            msg.ack_id = None
        self.deliver(msg)

    # -------------------------------------------------------------- requests

    async def send(self, destination: str, body: bytes, headers: dict[str, str], *,
                   confirm: bool = True, transaction: str | None = None,
                   **extra: Any) -> None:
        qos = int(extra.get("qos", 1))
        retain = bool(extra.get("retain", False))
        if transaction is not None:
            raise ClientError("MQTT has no transactions (use STOMP)")
        props = Properties(user_properties=list(headers.items())) if self.v5 and headers \
            else None
        if not confirm or qos == 0:
            self.write(encode_publish(destination, body, qos=0, retain=retain,
                                      protocol_level=self.level, properties=props))
            return
        pid = self._pid()
        fut = self.expect(f"p{pid}")
        self.write(encode_publish(destination, body, qos=qos, retain=retain, packet_id=pid,
                                  protocol_level=self.level, properties=props))
        await fut

    async def subscribe(self, spec: SubscriptionSpec) -> dict[str, str]:
        pid = self._pid()
        fut = self.expect(f"p{pid}")
        self._send(Subscribe(pid, [(spec.destination, SubscriptionOptions(qos=spec.qos))]))
        ack: Suback = await fut
        code = ack.reason_codes[0] if ack.reason_codes else ReasonCode.UNSPECIFIED_ERROR
        if code >= 0x80:
            raise BrokerError(f"{self.endpoint}: subscription to {spec.destination!r} "
                              f"refused: {code.name}")
        return {}

    async def unsubscribe(self, spec: SubscriptionSpec, *, remove_durable: bool) -> None:
        pid = self._pid()
        fut = self.expect(f"p{pid}")
        self._send(Unsubscribe(pid, [spec.destination]))
        await fut

    async def ack(self, message: Message, spec: SubscriptionSpec, *, positive: bool = True,
                  transaction: str | None = None) -> None:
        if not positive:
            raise ClientError("MQTT has no negative acknowledgement (NACK is STOMP only)")
        if message.ack_id is not None and (spec.ack is not AckMode.AUTO):
            self._send(Puback(int(message.ack_id)))

    def auto_ack(self, message: Message) -> None:
        if message.ack_id is not None:
            self._send(Puback(int(message.ack_id)))

    async def begin(self, tx: str) -> None:
        raise ClientError("MQTT has no transactions (use STOMP)")

    async def commit(self, tx: str) -> None:
        raise ClientError("MQTT has no transactions (use STOMP)")

    async def abort_tx(self, tx: str) -> None:
        raise ClientError("MQTT has no transactions (use STOMP)")

    async def goodbye(self) -> None:
        self._send(Disconnect())
        assert self._writer is not None
        await self._writer.drain()
