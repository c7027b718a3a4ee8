"""The server side of one MQTT connection as a sans-I/O state machine.

Bytes in (:meth:`ServerConnection.receive_data` returns packets and protocol
violations as events), packets out (:meth:`ServerConnection.send` returns bytes), and
everything MQTT itself keeps per connection in between: the connection's state (a
transition table, :data:`TRANSITIONS`), packet-id allocation, the outbound QoS 1/2
in-flight window, the inbound QoS 2 exchanges (PUBREC / PUBREL / PUBCOMP) with the
receive-maximum count they hold, topic aliases both ways, and keep-alive with the time
passed in (:meth:`ServerConnection.timeouts`). No asyncio, no clock, no broker: the
transport adapter (``transport/mqtt_server.py``) turns events into broker calls.

Why a separate machine: the protocol's rules can be tested packet by packet (even byte
by byte) against a client machine without sockets, and the adapter is left with I/O
and broker calls.
"""

from __future__ import annotations

import enum
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar, cast

from .decoder import MqttDecoder
from .encoder import encode, encode_publish, encode_publish_prepared
from .errors import MqttProtocolError
from .packets import (
    PROTOCOL_LEVEL_5,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
)
from .properties import Properties, encode_properties
from .reason_codes import (
    DISCONNECT_REASON_CODES,
    ConnackReturnCode,
    ReasonCode,
    connack_return_code_v311,
)

T = TypeVar("T")

TOPIC_ALIAS_MAXIMUM: Final = 64  # aliases a client may set towards us (CONNACK says so)
# The answer to an unsupported protocol version: a 3.1.1 CONNACK (return code 1) that
# every version can read.
UNSUPPORTED_VERSION_CONNACK: Final = b"\x20\x02\x00\x01"


class ConnState(enum.StrEnum):
    AWAIT_CONNECT = "await-connect"
    CONNECTING = "connecting"  # CONNECT received, its CONNACK not yet sent
    CONNECTED = "connected"
    CLOSED = "closed"


class ConnInput(enum.StrEnum):
    CONNECT = "connect"  # the client's CONNECT decoded
    ACCEPT = "accept"  # CONNACK success sent
    REFUSE = "refuse"  # CONNACK failure sent (or the refusal is a plain close)
    CLIENT_DISCONNECT = "client-disconnect"
    SERVER_DISCONNECT = "server-disconnect"  # DISCONNECT sent, or a 3.1.1 close
    FAIL = "fail"  # a protocol violation or a timeout ends the connection


_S, _I = ConnState, ConnInput
TRANSITIONS: Final[dict[tuple[ConnState, ConnInput], ConnState]] = {
    (_S.AWAIT_CONNECT, _I.CONNECT): _S.CONNECTING,
    (_S.CONNECTING, _I.ACCEPT): _S.CONNECTED,
    (_S.CONNECTING, _I.REFUSE): _S.CLOSED,
    (_S.AWAIT_CONNECT, _I.REFUSE): _S.CLOSED,  # a CONNECT too malformed to decode
    (_S.CONNECTED, _I.CLIENT_DISCONNECT): _S.CLOSED,
}
for _state in ConnState:
    TRANSITIONS[(_state, _I.FAIL)] = _S.CLOSED
    TRANSITIONS[(_state, _I.SERVER_DISCONNECT)] = _S.CLOSED


class InvalidTransitionError(Exception):
    """The server tried something its state does not allow (a bug of ours)."""


def transition(state: ConnState, event: ConnInput) -> ConnState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransitionError(f"{event} in state {state}") from None


@dataclass(slots=True)
class ProtocolViolation:
    """Event: the client broke the protocol; ``error`` carries the reason code."""

    error: MqttProtocolError


@dataclass(slots=True)
class ConnectTimeout:
    """Event from :meth:`ServerConnection.timeouts`: no CONNECT in time."""


@dataclass(slots=True)
class KeepAliveTimeout:
    """Event from :meth:`ServerConnection.timeouts`: silent past keep-alive x grace."""

    silent_s: float


Event = Packet | ProtocolViolation


def fingerprint(topic: str, payload: bytes) -> int:
    """Tells a retransmitted QoS 2 PUBLISH from a new message that reuses its id."""
    return zlib.crc32(payload, zlib.crc32(topic.encode())) ^ len(payload)


@dataclass(slots=True)
class InflightState:
    """The QoS 2 exchanges of a session, which outlive its connections (a persistent
    session stores them in its record)."""

    inbound_qos2: set[int] = field(default_factory=set)  # PUBREC sent, PUBREL awaited
    inbound_fp: dict[int, int] = field(default_factory=dict)  # their fingerprints
    # PUBREL taken but our PUBCOMP not yet written (pid -> fingerprint): the client still
    # holds the id, so a PUBLISH of the same message with it is a retransmission, not a
    # new message (some clients resend PUBLISH instead of PUBREL after a reconnect).
    released: dict[int, int] = field(default_factory=dict)
    outbound_pubrel: set[int] = field(default_factory=set)  # PUBREL sent, PUBCOMP awaited

    def to_record(self) -> dict[str, object]:
        return {"qos2_in": sorted(self.inbound_qos2),
                "qos2_fp": {str(k): v for k, v in self.inbound_fp.items()},
                "released": {str(k): v for k, v in self.released.items()},
                "pubrel_out": sorted(self.outbound_pubrel)}

    @classmethod
    def from_record(cls, saved: dict[str, object]) -> InflightState:
        def ints(key: str) -> set[int]:
            value = saved.get(key, [])
            return {int(v) for v in value} if isinstance(value, list) else set()

        def pairs(key: str) -> dict[int, int]:
            value = saved.get(key, {})
            return {int(k): int(v) for k, v in value.items()} \
                if isinstance(value, dict) else {}

        return cls(ints("qos2_in"), pairs("qos2_fp"), pairs("released"), ints("pubrel_out"))


class ServerConnection(Generic[T]):
    """One MQTT connection, server side. ``T``: what the adapter keeps per outbound
    QoS 1/2 packet id (the consumer and delivery tag to acknowledge when it settles)."""

    def __init__(self, *, max_packet_size: int, retain_available: bool,
                 receive_maximum: int, max_inflight: int, connect_timeout_s: float,
                 keepalive_grace: float, now: float) -> None:
        self.decoder = MqttDecoder(max_packet_size=max_packet_size,
                                   retain_available=retain_available)
        self.state = ConnState.AWAIT_CONNECT
        self.level = 4
        self.receive_maximum = receive_maximum  # ours: inbound QoS 1/2 unacked
        self.client_receive_max = max_inflight  # theirs (capped): outbound window
        self.client_max_packet = 0  # 0: no limit
        self.keep_alive = 0
        self.keepalive_grace = keepalive_grace
        self.connect_timeout_s = connect_timeout_s
        self.accepted_at = now
        self.last_read = now
        self.inflight = InflightState()
        self.inbound_pending = 0  # inbound QoS 1/2 publishes not yet settled
        self._outbound: dict[int, T | None] = {}  # packet id -> token (None: no ack owed)
        self._next_pid = 1
        self._in_aliases: dict[int, str] = {}
        # Topic aliases towards the client: topic -> alias, least recently used first.
        self.alias_max = 0
        self._out_aliases: OrderedDict[str, int] = OrderedDict()

    def _to(self, event: ConnInput) -> None:
        self.state = transition(self.state, event)

    # ------------------------------------------------------------ bytes in
    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """The packets in ``data`` (with what came before it), then a
        :class:`ProtocolViolation` if the bytes broke the protocol."""
        self.last_read = now
        if self.state is ConnState.CLOSED:
            return []
        events: list[Event]
        try:
            events = cast("list[Event]", self.decoder.feed(data))
        except MqttProtocolError as exc:
            events = list(self.decoder.packets_before_error)
            events.append(ProtocolViolation(exc))
        if self.state is ConnState.AWAIT_CONNECT and events:
            first = events[0]
            if isinstance(first, Connect):  # the decoder lets only a first CONNECT by
                self._to(ConnInput.CONNECT)
                self.level = first.protocol_level
        return events

    def timeouts(self, now: float) -> ConnectTimeout | KeepAliveTimeout | None:
        """What is overdue at ``now``: CONNECT, or any packet within keep-alive."""
        state = self.state
        if state is ConnState.AWAIT_CONNECT or state is ConnState.CONNECTING:
            # CONNECT, and its answer, within the connect timeout.
            if now - self.accepted_at > self.connect_timeout_s:
                return ConnectTimeout()
        elif state is ConnState.CONNECTED and self.keep_alive:
            silent = now - self.last_read
            if silent > self.keep_alive * self.keepalive_grace:
                return KeepAliveTimeout(silent)
        return None

    # ------------------------------------------------------------ bytes out
    def send(self, packet: Packet) -> bytes:
        """The bytes of ``packet``, after the state changes that sending it makes: a
        CONNACK connects or refuses, a DISCONNECT ends; a PUBACK (or a refusing
        PUBREC) frees receive-maximum room; a PUBCOMP ends an inbound QoS 2 exchange."""
        if isinstance(packet, Puback) or (isinstance(packet, Pubrec)
                                          and packet.reason_code.is_failure):
            if self.inbound_pending > 0:
                self.inbound_pending -= 1
        elif isinstance(packet, Pubcomp):
            self.inflight.released.pop(packet.packet_id, None)
        elif isinstance(packet, Connack):
            self._to(ConnInput.REFUSE if packet.reason_code.is_failure else ConnInput.ACCEPT)
        elif isinstance(packet, Disconnect):
            self._to(ConnInput.SERVER_DISCONNECT)
        return encode(packet, self.level)

    def accept(self, *, keep_alive: int, receive_maximum: int | None, alias_max: int,
               client_max_packet: int) -> None:
        """What CONNECT negotiated (called before sending the CONNACK)."""
        self.keep_alive = keep_alive
        if receive_maximum:
            self.client_receive_max = min(receive_maximum, self.client_receive_max)
        self.alias_max = alias_max
        self.client_max_packet = client_max_packet

    def refuse(self, code: ReasonCode, reason: str) -> bytes:
        """The CONNACK refusing the connection; b"" where 3.1.1 has no return code for
        ``code`` (e.g. a malformed CONNECT): the connection is just closed rather than
        claim "server unavailable"."""
        if self.level != PROTOCOL_LEVEL_5 and code != ReasonCode.SERVER_UNAVAILABLE and \
                connack_return_code_v311(code) == ConnackReturnCode.SERVER_UNAVAILABLE:
            self._to(ConnInput.REFUSE)
            return b""
        props = Properties(reason_string=reason) if self.level == PROTOCOL_LEVEL_5 \
            else Properties()
        return self.send(Connack(session_present=False, reason_code=code, properties=props))

    def disconnect(self, code: ReasonCode, reason: str) -> bytes:
        """A server-initiated close: DISCONNECT with a reason in MQTT 5 once connected,
        b"" (a plain close) otherwise."""
        if code not in DISCONNECT_REASON_CODES:
            # A code DISCONNECT may not carry (e.g. CONNACK-only 0x8C) is never sent.
            code = ReasonCode.PROTOCOL_ERROR if code < 0x80 else ReasonCode.UNSPECIFIED_ERROR
        if self.level == PROTOCOL_LEVEL_5 and self.state is ConnState.CONNECTED:
            return self.send(Disconnect(reason_code=code,
                                        properties=Properties(reason_string=reason[:200])))
        self._to(ConnInput.SERVER_DISCONNECT)
        return b""

    def fail(self, exc: MqttProtocolError) -> bytes:
        """The answer to a protocol violation (then close): a CONNACK refusal before
        the connection is up, a DISCONNECT after, or nothing."""
        code = exc.reason_code or ReasonCode.PROTOCOL_ERROR
        if self.state is ConnState.AWAIT_CONNECT or self.state is ConnState.CONNECTING:
            self.level = self.decoder.protocol_level or 4
            if exc.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                self._to(ConnInput.FAIL)
                return UNSUPPORTED_VERSION_CONNACK
            if exc.packet_type != Connect.packet_type:
                self._to(ConnInput.FAIL)
                return b""  # not a CONNECT at all: the spec says just close
            return self.refuse(code, exc.message)
        return self.disconnect(code, exc.message)

    def client_disconnected(self) -> None:
        self._to(ConnInput.CLIENT_DISCONNECT)

    # ------------------------------------------------------------ PUBLISH in
    def publish_received(self, packet: Publish) -> str | None:
        """The topic of an inbound PUBLISH (its alias resolved), or None when it is a
        retransmission of a QoS 2 message we already own (answer PUBREC only). Counts
        a new QoS 1/2 message against our receive maximum; raises on a violation."""
        topic = packet.topic
        if self.level == PROTOCOL_LEVEL_5:
            alias = packet.properties.topic_alias
            if alias is not None:
                if alias > TOPIC_ALIAS_MAXIMUM:
                    raise MqttProtocolError(f"topic alias {alias} above the maximum "
                                            f"{TOPIC_ALIAS_MAXIMUM}",
                                            reason_code=ReasonCode.TOPIC_ALIAS_INVALID)
                if topic:
                    self._in_aliases[alias] = topic
                else:
                    found = self._in_aliases.get(alias)
                    if found is None:
                        raise MqttProtocolError(f"unknown topic alias {alias}",
                                                reason_code=ReasonCode.PROTOCOL_ERROR)
                    topic = found
        qos = packet.qos
        if qos:
            if qos == 2 and (packet.packet_id in self.inflight.inbound_qos2
                             or self._is_released_resend(packet, topic)):
                return None
            self.inbound_pending += 1
            if self.inbound_pending > self.receive_maximum:
                raise MqttProtocolError("too many unacknowledged QoS 1/2 publishes",
                                        reason_code=ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
        return topic

    def _is_released_resend(self, packet: Publish, topic: str) -> bool:
        """A PUBLISH with an id we released but whose PUBCOMP the client never got, and
        the same message: a retransmission. The id goes back to awaiting PUBREL."""
        pid = packet.packet_id or 0
        inflight = self.inflight
        fp = inflight.released.get(pid)
        if fp is None:
            return False
        del inflight.released[pid]
        if fp != fingerprint(topic, packet.payload):
            return False  # a different message: the client reused the id
        inflight.inbound_qos2.add(pid)
        inflight.inbound_fp[pid] = fp
        return True

    def qos2_received(self, pid: int, topic: str, payload: bytes) -> None:
        """A new QoS 2 message is ours: PUBREL is awaited (PUBREC follows)."""
        inflight = self.inflight
        inflight.inbound_qos2.add(pid)
        inflight.inbound_fp[pid] = fingerprint(topic, payload)
        inflight.released.pop(pid, None)

    def pubrel_received(self, pid: int) -> tuple[ReasonCode, bool]:
        """The PUBCOMP reason code for a PUBREL, and whether the session's QoS 2 state
        changed (a persistent session records that before PUBCOMP)."""
        inflight = self.inflight
        if pid in inflight.inbound_qos2:
            inflight.inbound_qos2.discard(pid)
            inflight.released[pid] = inflight.inbound_fp.pop(pid, 0)
            if self.inbound_pending > 0:
                self.inbound_pending -= 1
            return ReasonCode.SUCCESS, True
        if inflight.released.pop(pid, None) is not None:
            return ReasonCode.SUCCESS, False  # released before a restart; PUBCOMP lost
        return ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, False

    # ------------------------------------------------------------ PUBLISH out
    def allocate_pid(self, token: T | None) -> int:
        """A free packet id for an outbound QoS 1/2 PUBLISH, holding ``token``."""
        outbound = self._outbound
        pubrel = self.inflight.outbound_pubrel
        for _ in range(65535):
            pid = self._next_pid
            self._next_pid = pid % 65535 + 1
            if pid not in outbound and pid not in pubrel:
                outbound[pid] = token
                return pid
        raise MqttProtocolError("no free MQTT packet identifier",
                                reason_code=ReasonCode.QUOTA_EXCEEDED)

    @property
    def inflight_count(self) -> int:
        return len(self._outbound)

    def puback_received(self, pid: int) -> T | None:
        """The token of the QoS 1 delivery a PUBACK settles."""
        return self._outbound.pop(pid, None)

    def pubrec_received(self, pid: int, failure: bool) -> tuple[T | None, bool]:
        """(the token the receiver now owns, whether PUBREL is to be sent)."""
        outbound = self._outbound
        token = outbound.get(pid)
        if pid in outbound:
            outbound[pid] = None
        if failure:
            outbound.pop(pid, None)
            return token, False
        self.inflight.outbound_pubrel.add(pid)
        return token, True

    def pubcomp_received(self, pid: int) -> bool:
        """Ends an outbound QoS 2 exchange; True if the session's QoS 2 state changed."""
        self._outbound.pop(pid, None)
        if pid in self.inflight.outbound_pubrel:
            self.inflight.outbound_pubrel.discard(pid)
            return True
        return False

    def drop_outbound(self, pid: int) -> T | None:
        return self._outbound.pop(pid, None)

    def forget_outbound(self, held: Callable[[T], bool]) -> None:
        """Packet ids whose token ``held`` names are free (e.g. their consumer closed)."""
        outbound = self._outbound
        for pid in [p for p, t in outbound.items() if t is not None and held(t)]:
            del outbound[pid]

    def resume_pubrels(self) -> list[int]:
        """The PUBRELs to send again on a resumed session (QoS 2 deliveries interrupted
        after PUBREC); their ids stay taken until PUBCOMP."""
        pids = sorted(self.inflight.outbound_pubrel)
        for pid in pids:
            self._outbound[pid] = None
        return pids

    def publish(self, topic: str, field: bytes | None, body: bytes, qos: int,
                pid: int | None, *, retain: bool, dup: bool,
                props: Properties | None) -> bytes | None:
        """An outbound PUBLISH (``field``: the topic's encoded field, when cached), with
        a topic alias where the client takes them; None if it exceeds the client's
        maximum packet size (MQTT 5: never sent, the alias is not taken)."""
        alias = 0
        evicted: tuple[str, int] | None = None
        v5 = self.level == PROTOCOL_LEVEL_5
        if v5 and self.alias_max:
            alias, known, evicted = self._topic_alias(topic)
            if props is None:
                props = Properties()
            props.topic_alias = alias
            if known:
                topic, field = "", None  # the client maps the alias to the topic
        if field is not None:
            header = field if pid is None else field + pid.to_bytes(2, "big")
            if v5:
                header += b"\x00" if props is None else encode_properties(props, 3)
            data = encode_publish_prepared(qos << 1 | (8 if dup else 0) | (1 if retain else 0),
                                           header, body)
        else:
            data = encode_publish(topic, body, qos=qos, retain=retain, dup=dup,
                                  packet_id=pid, protocol_level=self.level, properties=props)
        if self.client_max_packet and len(data) > self.client_max_packet:
            if alias and topic:  # the client never learnt this alias: forget it again
                self._out_aliases.pop(topic, None)
                if evicted is not None:
                    self._out_aliases[evicted[0]] = evicted[1]
                    self._out_aliases.move_to_end(evicted[0], last=False)
            return None
        return data

    def _topic_alias(self, topic: str) -> tuple[int, bool, tuple[str, int] | None]:
        """(alias, whether the client knows it already, the mapping it replaced)."""
        aliases = self._out_aliases
        alias = aliases.get(topic)
        if alias is not None:
            aliases.move_to_end(topic)
            return alias, True, None
        evicted = None
        if len(aliases) < self.alias_max:
            alias = len(aliases) + 1
        else:
            evicted = aliases.popitem(last=False)
            alias = evicted[1]
        aliases[topic] = alias
        return alias, False, evicted
