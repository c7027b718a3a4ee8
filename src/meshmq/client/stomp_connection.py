"""One STOMP 1.2 connection on meshmq's sans-I/O codec: every request carries a receipt.

Works with any STOMP 1.2 broker (meshmq, ActiveMQ): durable subscriptions use
ActiveMQ's ``client-id`` + ``activemq.subscriptionName`` convention.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from meshmq.errors import MeshmqError
from meshmq.protocol.stomp import (
    OUTCOME_HEADER,
    Frame,
    StompParser,
    encode_frame,
    parse_heartbeat,
)

from .connection import BaseConnection, DeliverFn, Dialer, dial_tcp, log
from .errors import (
    AuthenticationFailedError,
    BrokerError,
    ConnectionLostError,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from .options import Endpoint
from .types import DEDUP_HEADER, PEERS_HEADER, AckMode, Message, SubscriptionSpec

__all__ = ["StompConnection"]

_V = "1.2"


class StompConnection(BaseConnection):
    protocol = "stomp"

    def __init__(self, endpoint: Endpoint, deliver: DeliverFn, generation: int, *,
                 login: str | None = None, passcode: str | None = None,
                 client_id: str | None = None, heartbeat_ms: tuple[int, int] = (5000, 5000),
                 virtual_host: str | None = None,
                 tls: ssl.SSLContext | None = None, dialer: Dialer = dial_tcp) -> None:
        super().__init__(endpoint, deliver, generation, tls=tls, dialer=dialer)
        self.login = login
        self.passcode = passcode
        self.client_id = client_id
        self.heartbeat_ms = heartbeat_ms
        self.virtual_host = virtual_host or endpoint.host
        self.parser = StompParser(version=_V)
        self.session_id: str | None = None

    # ------------------------------------------------------------- handshake

    async def handshake(self, **_: Any) -> None:
        headers = [("accept-version", _V), ("host", self.virtual_host),
                   ("heart-beat", f"{self.heartbeat_ms[0]},{self.heartbeat_ms[1]}")]
        if self.login is not None:
            headers += [("login", self.login), ("passcode", self.passcode or "")]
        if self.client_id is not None:
            headers.append(("client-id", self.client_id))
        fut = self.expect("CONNECTED")
        self.write(encode_frame("CONNECT", headers, version=_V))
        frame: Frame = await fut
        self.session_id = frame.get("session")
        peers = frame.get(PEERS_HEADER)
        self.peers = tuple(p.strip() for p in peers.split(",") if p.strip()) if peers else ()
        sx, sy = parse_heartbeat(frame.get("heart-beat", "0,0"))
        send_ms = max(self.heartbeat_ms[0], sy) if self.heartbeat_ms[0] and sy else 0
        recv_ms = max(self.heartbeat_ms[1], sx) if self.heartbeat_ms[1] and sx else 0
        if send_ms:
            self.start_task(self._beat(send_ms / 1000), f"heart-beat {self.endpoint}")
        if recv_ms:
            self.start_task(self._watch(recv_ms / 1000), f"heart-beat watch {self.endpoint}")

    async def _beat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)  # a periodic timer, not a wait for a condition
            self.write(b"\n")

    async def _watch(self, interval: float) -> None:
        # The broker promised a beat every `interval`; allow it twice that, checked
        # four times per interval so a silent broker is dropped soon after 2 x interval.
        while True:
            await asyncio.sleep(interval / 4)
            if self._loop.time() - self.last_received > 2 * interval:
                self.abort(f"no heart-beat from the broker for {2 * interval:g} s")
                return

    # ---------------------------------------------------------------- reading

    def feed(self, data: bytes) -> None:
        for frame in self.parser.feed(data):
            self._on_frame(frame)

    def _on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command == "MESSAGE":
            headers = frame.header_map()
            ack_id = headers.get("ack") or headers.get("message-id")
            key = headers.get(DEDUP_HEADER) or headers.get("message-id")
            self.deliver(Message(
                destination=headers.get("destination", ""), body=frame.body, headers=headers,
                subscription=headers.get("subscription", ""),
                redelivered=headers.get("redelivered") == "true", ack_id=ack_id,
                generation=self.generation, key=key))
        elif command == "RECEIPT":
            self.resolve(frame.get("receipt-id") or "", frame)
        elif command == "CONNECTED":
            self.resolve("CONNECTED", frame)
        elif command == "ERROR":
            message = frame.get("message") or frame.body.decode("utf-8", "replace").strip()
            error = _error(self.endpoint, message, frame.get(OUTCOME_HEADER))
            receipt = frame.get("receipt-id")
            if not (receipt and self.resolve(receipt, error=error)):
                error = BrokerError(f"{self.endpoint}: broker error: {message}")
                if _is_auth_refusal(message):
                    error = AuthenticationFailedError(
                        f"{self.endpoint}: login refused: {message}")
                self.resolve("CONNECTED", error=error)
            # STOMP closes the connection after an ERROR frame.
            self._die(ConnectionLostError(f"{self.endpoint}: broker error: {message}"))

    # ------------------------------------------------------------- requests

    async def request(self, command: str, headers: list[tuple[str, str]], body: bytes = b"",
                      *, confirm: bool = True) -> Frame | None:
        """Send a frame; with ``confirm``, wait for its RECEIPT and return it."""
        if not confirm:
            self.write(encode_frame(command, headers, body, version=_V))
            return None
        receipt = self.next_id("r-")
        fut = self.expect(receipt)
        self.write(encode_frame(command, [*headers, ("receipt", receipt)], body, version=_V))
        frame: Frame = await fut
        return frame

    async def send(self, destination: str, body: bytes, headers: dict[str, str], *,
                   confirm: bool = True, transaction: str | None = None,
                   **_: Any) -> None:
        hdrs = [("destination", destination), *headers.items()]
        if transaction is not None:
            hdrs.append(("transaction", transaction))
        await self.request("SEND", hdrs, body, confirm=confirm)

    async def subscribe(self, spec: SubscriptionSpec) -> dict[str, str]:
        hdrs = [("destination", spec.destination), ("id", spec.id), ("ack", spec.ack.value)]
        if spec.durable_name is not None:
            hdrs.append(("activemq.subscriptionName", spec.durable_name))
        if spec.selector is not None:
            hdrs.append(("selector", spec.selector))
        hdrs += [(k, v) for k, v in spec.headers.items()]
        receipt = await self.request("SUBSCRIBE", hdrs)
        return {} if receipt is None else receipt.header_map()

    async def unsubscribe(self, spec: SubscriptionSpec, *, remove_durable: bool) -> None:
        await self.request("UNSUBSCRIBE", [("id", spec.id)])
        if remove_durable and spec.durable_name is not None:
            # A second UNSUBSCRIBE naming the subscription removes it; ActiveMQ refuses
            # to remove one whose consumer is still open ("Durable consumer is in use").
            await self.request("UNSUBSCRIBE", [("id", spec.id), (
                "activemq.subscriptionName", spec.durable_name)])

    async def ack(self, message: Message, spec: SubscriptionSpec, *, positive: bool = True,
                  transaction: str | None = None) -> None:
        if message.ack_id is None or spec.ack is AckMode.AUTO:
            return
        hdrs = [("id", message.ack_id)]
        if transaction is not None:
            hdrs.append(("transaction", transaction))
        # Acks are confirmed too: a lost ack is a redelivery, which the app must know of.
        await self.request("ACK" if positive else "NACK", hdrs)

    async def begin(self, tx: str) -> None:
        await self.request("BEGIN", [("transaction", tx)])

    async def commit(self, tx: str) -> None:
        await self.request("COMMIT", [("transaction", tx)])

    async def abort_tx(self, tx: str) -> None:
        await self.request("ABORT", [("transaction", tx)])

    async def goodbye(self) -> None:
        try:
            await self.request("DISCONNECT", [])
        except ConnectionLostError:
            pass
        log.debug("%s: disconnected", self.endpoint)


def _error(endpoint: Endpoint, message: str, outcome: str | None) -> MeshmqError:
    """The error an ERROR answering a request raises. A COMMIT's says (meshmq's
    ``meshmq-outcome`` header, not its text) whether the transaction was rolled back or
    may have committed; anything else is the broker's refusal."""
    if outcome == "unknown":
        return TransactionInDoubtError(f"{endpoint}: {message}")
    if outcome == "rolled-back":
        return TransactionRolledBackError(f"{endpoint}: {message}")
    return BrokerError(f"{endpoint}: broker error: {message}")


def _is_auth_refusal(message: str) -> bool:
    """An ERROR answering CONNECT that refuses the credentials (meshmq: "Authentication
    failed"; ActiveMQ: "User name [x] or password is invalid.", "not authorized")."""
    text = message.lower()
    return any(word in text for word in ("authentication", "password", "not authorized",
                                         "credentials"))
