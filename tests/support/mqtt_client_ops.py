"""Packet-level MQTT client operations, written once for every raw test client.

A raw MQTT test client sends packets with meshmq's encoder and reads them back through
a client-side ``MqttDecoder``, exactly as the broker wrote them. What differs between
the socket client of the interop suite (tests/interop/mqtt_helpers.py) and the
in-memory client (tests/support/memory_mqtt.py) is only how bytes go out and how more
bytes come in; ``MqttClientOps`` holds the conversations (connect, subscribe, publish
with its QoS exchange, ack, read until the broker closes, the PINGREQ round trip that
proves absence) over those two primitives, so both kinds of test read packets the same
way. ``ErrorLog`` is the logging handler both environments use to fail a test when the
broker logged an error.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from meshmq.protocol.mqtt import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
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
    Will,
    encode,
)

TIMEOUT = 10.0
LEVELS = (4, 5)
_ids = itertools.count(1)


def uid(prefix: str = "m") -> str:
    """A name unique within this test process (client ids, topics)."""
    return f"{prefix}{next(_ids)}"


class ClosedError(AssertionError):
    """The broker closed the connection while a packet was awaited."""


class ErrorLog(logging.Handler):
    """Collects ERROR records (an exception in the broker's pump, an internal error)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        out = []
        for r in self.records:
            text = r.getMessage()
            if r.exc_info and r.exc_info[1] is not None:
                text += f" -> {type(r.exc_info[1]).__name__}: {r.exc_info[1]}"
            out.append(text)
        return out


class MqttClientOps:
    """MQTT conversations over two primitives a subclass provides: ``send_bytes`` (bytes
    to the broker) and ``_fill`` (decode more of what the broker sent into ``pending``,
    with a deadline, or report that it closed). Packets that arrive while an ack is
    awaited stay in ``pending`` for the next read."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.decoder = MqttDecoder(server_side=False, protocol_level=level)
        self.pending: list[Packet] = []
        self._pid = itertools.count(1)

    # -- what a subclass provides ---------------------------------------------------------
    def send_bytes(self, data: bytes) -> None:
        raise NotImplementedError

    def _fill(self, deadline: float) -> bool:
        """Decode more packets into ``pending``: True if more may come, False once the
        broker has closed and all it sent was read. TimeoutError past ``deadline``."""
        raise NotImplementedError

    # One broker answers SUBSCRIBE before the subscription's first PUBLISH; MQTT lets a
    # server send matching PUBLISH packets before the SUBACK, which a node of shards does
    # for a subscription that another shard runs (its SUBACK waits for that shard).
    suback_first = True

    def _settle(self) -> None:
        """Before a PINGREQ: let the broker act as the wire's latency would let it."""

    # -- output -------------------------------------------------------------------------
    def send(self, packet: Packet) -> None:
        self.send_bytes(encode(packet, self.level))

    def next_pid(self) -> int:
        return next(self._pid) % 65535 + 1

    # -- input --------------------------------------------------------------------------
    def _await(self, found: Callable[[], Packet | None], timeout: float,
               what: Callable[[], str]) -> Packet | None:
        """Read until ``found()`` gives something; None if the broker closed first.
        Fails at the deadline with an AssertionError whose message is ``what()``."""
        deadline = time.monotonic() + timeout
        while True:
            got = found()
            if got is not None:
                return got
            try:
                if not self._fill(deadline):
                    return found()
            except TimeoutError:
                raise AssertionError(f"{what()} (waited {timeout}s)") from None

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        def first() -> Packet | None:
            return self.pending.pop(0) if self.pending else None
        packet = self._await(first, timeout, lambda: "no packet arrived")
        if packet is None:
            raise ClosedError("connection closed by the broker")
        return packet

    def expect(self, cls: type[Any], timeout: float = TIMEOUT) -> Any:
        packet = self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def _until_closed(self, stop: type[Any] | None, timeout: float) -> list[Packet]:
        got: list[Packet] = []

        def take() -> None:
            for p in self.pending:
                got.append(p)
                assert stop is None or not isinstance(p, stop), \
                    f"connection not closed; received {got!r}"
            self.pending.clear()

        def closed_yet() -> Packet | None:
            take()
            return None
        self._await(closed_yet, timeout,
                    lambda: f"connection still open; received {got!r}")
        take()
        return got

    def until_closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Every packet received until the broker closes (fails at the deadline)."""
        return self._until_closed(None, timeout)

    def until_closed_or(self, stop: type[Any], timeout: float = TIMEOUT) -> list[Packet]:
        """Packets until the broker closes; fails as soon as a ``stop`` packet arrives
        first (e.g. the PINGRESP of a PINGREQ sent after what should have closed us)."""
        return self._until_closed(stop, timeout)

    def ping(self, timeout: float = TIMEOUT) -> list[Packet]:
        """PINGREQ -> PINGRESP; returns what arrived before the PINGRESP.

        The broker handles one connection's packets in order and writes in order, so
        anything it decided to send before our PINGREQ is in the returned list."""
        self._settle()
        self.send(Pingreq())
        before: list[Packet] = []
        while True:
            packet = self.recv(timeout)
            if isinstance(packet, Pingresp):
                return before
            before.append(packet)

    def _expect_ack(self, cls: type[Any], pid: int | None, timeout: float = TIMEOUT) -> Any:
        """Wait for the ack ``cls`` of ``pid``; other packets stay in ``pending``."""
        def find() -> Packet | None:
            for i, p in enumerate(self.pending):
                if isinstance(p, cls) and p.packet_id == pid:
                    return self.pending.pop(i)
            return None
        ack = self._await(find, timeout,
                          lambda: f"no {cls.__name__} for {pid}; pending {self.pending!r}")
        if ack is None:
            raise ClosedError(f"closed while waiting for {cls.__name__} {pid}")
        return ack

    def publishes(self, n: int, timeout: float = TIMEOUT) -> list[Publish]:
        """The next ``n`` packets, which must all be PUBLISH."""
        return [self.expect(Publish, timeout) for _ in range(n)]

    # -- conversations --------------------------------------------------------------------
    def connect(self, client_id: str = "", *, clean: bool = True, keep_alive: int = 0,
                properties: Properties | None = None, will: Will | None = None,
                username: str | None = None, password: bytes | None = None,
                expect_success: bool = True) -> Connack:
        self.send(Connect(client_id=client_id, clean_start=clean, keep_alive=keep_alive,
                          username=username, password=password, will=will,
                          properties=properties or Properties(), protocol_level=self.level))
        ack: Connack = self.expect(Connack)
        if expect_success:
            assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
        return ack

    def subscribe(self, *filters: str | tuple[str, int] | tuple[str, SubscriptionOptions],
                  qos: int = 1, properties: Properties | None = None) -> Suback:
        subs: list[tuple[str, SubscriptionOptions]] = []
        for f in filters:
            if isinstance(f, str):
                subs.append((f, SubscriptionOptions(qos=qos)))
            elif isinstance(f[1], int):
                subs.append((f[0], SubscriptionOptions(qos=f[1])))
            else:
                subs.append((f[0], f[1]))
        pid = self.next_pid()
        self.send(Subscribe(pid, subs, properties or Properties()))
        if not self.suback_first:
            found: Suback = self._expect_ack(Suback, pid)
            return found
        ack: Suback = self.expect(Suback)
        assert ack.packet_id == pid
        return ack

    def unsubscribe(self, *filters: str) -> Unsuback:
        pid = self.next_pid()
        self.send(Unsubscribe(pid, list(filters)))
        ack: Unsuback = self.expect(Unsuback)
        assert ack.packet_id == pid
        return ack

    def publish(self, topic: str, payload: bytes = b"", *, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> Packet | None:
        """PUBLISH; for QoS 1 returns the PUBACK, for QoS 2 runs the whole flow and
        returns the PUBCOMP. Other packets arriving meanwhile stay in ``pending``."""
        pid = self.next_pid() if qos else None
        self.send(Publish(topic, payload, qos=qos, retain=retain, packet_id=pid,
                          properties=properties or Properties()))
        if qos == 0:
            return None
        if qos == 1:
            puback: Puback = self._expect_ack(Puback, pid)
            return puback
        rec = self._expect_ack(Pubrec, pid)
        assert rec.reason_code < 0x80, rec
        self.send(Pubrel(pid or 0))
        pubcomp: Pubcomp = self._expect_ack(Pubcomp, pid)
        return pubcomp

    def ack(self, publish: Publish) -> None:
        """Complete the receiver side of a QoS 1/2 delivery."""
        if publish.qos == 1:
            self.send(Puback(publish.packet_id or 0))
        elif publish.qos == 2:
            self.send(Pubrec(publish.packet_id or 0))
            self._expect_ack(Pubrel, publish.packet_id)  # other packets stay pending
            self.send(Pubcomp(publish.packet_id or 0))

    def disconnect(self, code: int = 0, properties: Properties | None = None) -> None:
        self.send(Disconnect(ReasonCode(code), properties or Properties()))


__all__ = ["LEVELS", "TIMEOUT", "ClosedError", "ErrorLog", "MqttClientOps", "uid"]
