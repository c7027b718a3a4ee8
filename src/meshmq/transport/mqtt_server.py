"""MQTT 3.1.1 and 5 server sessions on the broker core.

One destination model: the MQTT topic ``a/b`` is the topic ``a.b`` STOMP sees
(``meshmq.protocol.mqtt.topics`` holds the mapping). A subscription is a core
consumer on a topic pattern: QoS 0 subscriptions acknowledge on dispatch, QoS 1/2
ones hold a window of unacknowledged messages. A persistent session (3.1.1 clean
session 0, or MQTT 5 session expiry > 0) keeps its subscriptions as durable topic
subscriptions named ``mqtt<qos><flags>:<filter>`` under the MQTT client id, as
ActiveMQ does, so they and their queued messages survive disconnects and broker
restarts. The publisher's QoS travels in the ``ActiveMQ.MQTT.QoS`` property and the
retain flag in ``ActiveMQ.Retain`` (ActiveMQ's names).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final, NamedTuple

from meshmq.core import destinations as dst
from meshmq.core.auth import Principal
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message, PropertyValue
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.errors import (
    AuthenticationError,
    AuthorizationError,
    DestinationError,
    LocalProtocolError,
    MeshmqError,
)
from meshmq.protocol.mqtt import (
    PROTOCOL_LEVEL_5,
    PROTOCOL_LEVEL_311,
    WILL_CONTEXT,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttProtocolError,
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
    RetainHandling,
    Suback,
    Subscribe,
    SubscriptionOptions,
    Unsuback,
    Unsubscribe,
    Will,
    decode_properties,
    destination_name_to_mqtt_topic,
    encode,
    encode_properties,
    encode_publish_prepared,
    is_shared,
    mqtt_filter_to_destination,
    mqtt_topic_to_destination_name,
    publish_topic_field,
)
from meshmq.protocol.mqtt.decoder import MqttDecoder
from meshmq.protocol.mqtt.session import (
    TOPIC_ALIAS_MAXIMUM,
    ConnectTimeout,
    ConnState,
    InflightState,
    ProtocolViolation,
    ServerConnection,
)
from meshmq.transport.adapter import BufferedOutput, SessionProtocol, socket_open
from meshmq.transport.handoff import AdoptedClaim, HandoffOffer
from meshmq.transport.login import authenticate
from meshmq.transport.mqtt_service import RETAIN_PROPERTY
from meshmq.transport.push_back import ProducerHold
from meshmq.transport.topology import PEERS_HEADER
from meshmq.transport.websocket import handoff_bytes, handoff_tried

if TYPE_CHECKING:
    from collections.abc import Callable

    from meshmq.core.broker import Connection
    from meshmq.transport.handoff import Handoffs
    from meshmq.transport.host import SessionHost
    from meshmq.transport.mqtt_service import MqttService

log = logging.getLogger("meshmq.mqtt")

QOS_PROPERTY: Final = "ActiveMQ.MQTT.QoS"
_INTERNAL: Final = frozenset({QOS_PROPERTY, RETAIN_PROPERTY, "dlqDeliveryFailureCause"})
__all__ = ["RETAIN_PROPERTY", "TOPIC_ALIAS_MAXIMUM", "MqttProtocol", "MqttSession"]
# Packets of one connection handled per event-loop turn before the rest waits for the next
# (a SUBSCRIBE counts once per topic filter).
PACKETS_PER_TURN: Final = 256
SERVER_SESSION_FOREVER: Final = 0xFFFFFFFF
# Consumers of a closed connection unsubscribed (or durable subscriptions of an ended
# session deleted) per event-loop turn.
CONSUMERS_CLOSED_PER_TURN = 1000


@dataclass(slots=True)
class MqttSubscription:
    filter: str
    options: SubscriptionOptions
    subscription_id: int | None
    consumer: Consumer | None = None
    exclude_dollar: bool = False
    shared: bool = False
    # 3.1.1 at QoS 0 (so an auto-ack consumer, no retain-as-published, no packet size
    # limit): every message is written as the same QoS 0 PUBLISH (deliver's fast path).
    plain: bool = False


@dataclass(slots=True)
class SessionState:
    """What outlives one network connection of a persistent session."""

    client_id: str
    subscriptions: dict[str, MqttSubscription] = field(default_factory=dict)
    inflight: InflightState = field(default_factory=InflightState)  # QoS 2 exchanges
    expiry_s: int = 0
    expiry_handle: asyncio.TimerHandle | None = None


def durable_name(flt: str, options: SubscriptionOptions) -> str:
    flags = ("n" if options.no_local else "") + ("r" if options.retain_as_published else "")
    return f"mqtt{options.qos}{flags}:{flt}"


def parse_durable_name(name: str) -> tuple[str, SubscriptionOptions] | None:
    head, sep, flt = name.partition(":")
    if not sep or not head.startswith("mqtt") or len(head) < 5 or not head[4].isdigit():
        return None
    flags = head[5:]
    return flt, SubscriptionOptions(qos=int(head[4]), no_local="n" in flags,
                                    retain_as_published="r" in flags)


def _topic_dest(topic: str) -> Destination:
    """The topic destination of an MQTT topic name, one shared object per name (so
    destination comparisons downstream are identity checks)."""
    entry = _DEST_CACHE.get(topic)
    return entry[0] if entry is not None else _dest_entry(topic)[0]


def _dest_entry(topic: str) -> tuple[Destination, tuple[Destination]]:
    """The cached ``(destination, (destination,))`` of an MQTT topic name: the tuple
    is what ``Broker.send`` takes, built once rather than per PUBLISH."""
    dest = dst.topic(mqtt_topic_to_destination_name(topic))
    if len(_DEST_CACHE) > 10_000:
        _DEST_CACHE.clear()
    entry = _DEST_CACHE[topic] = (dest, (dest,))
    return entry


_DEST_CACHE: Final[dict[str, tuple[Destination, tuple[Destination]]]] = {}


class _OutTopic(NamedTuple):
    """How a topic destination's name is spelt in PUBLISHes to MQTT subscribers."""

    topic: str | None  # None: the name has no MQTT spelling (e.g. a wildcard)
    field: bytes | None  # the encoded topic field; None if not encodable (never valid)
    dollar: bool  # the topic starts with '$' (filters starting with a wildcard skip it)


def _out_topic(name: str) -> _OutTopic:
    """The cached :class:`_OutTopic` of a topic destination name (the delivery hot path
    does one dict lookup instead of translating and encoding the name per message)."""
    entry = _OUT_TOPICS.get(name)
    if entry is not None:
        return entry
    try:
        topic: str | None = destination_name_to_mqtt_topic(name)
    except DestinationError:
        topic = None  # e.g. a wildcard advisory name: no MQTT spelling
    field = None
    if topic is not None:
        try:
            field = publish_topic_field(topic)
        except LocalProtocolError:
            pass  # encode_publish raises it again, on the general path
    if len(_OUT_TOPICS) > 10_000:
        _OUT_TOPICS.clear()
    entry = _OUT_TOPICS[name] = _OutTopic(topic, field,
                                          topic is not None and topic.startswith("$"))
    return entry


_OUT_TOPICS: Final[dict[str, _OutTopic]] = {}
_TOPIC: Final = DestKind.TOPIC
# Message.wire_cache key of the PUBLISH a plain subscription (see MqttSubscription) gets.
_WIRE_Q0: Final = "mqtt4-q0"


class MqttSession(BufferedOutput):
    """Per-connection MQTT state. Everything here runs on the event loop thread."""

    def __init__(self, host: SessionHost, transport: asyncio.Transport, remote: str,
                 *, push_topology: bool = False) -> None:
        self.host = host
        # Tell this client the peer brokers (its listener has update_cluster_clients).
        self.push_topology = push_topology
        self.broker = host.broker
        self.cfg = host.config.mqtt
        self.transport = transport
        self.remote = remote
        self.service: MqttService = host.mqtt
        now = time.monotonic()
        # The protocol: states, packet ids, in-flight windows, aliases, keep-alive.
        # Outbound packet ids hold (consumer, delivery tag) to acknowledge on settling.
        self.machine: ServerConnection[tuple[Consumer, int]] = ServerConnection(
            max_packet_size=self.cfg.max_packet_size,
            retain_available=self.cfg.retain_available,
            receive_maximum=self.cfg.receive_maximum, max_inflight=self.cfg.max_inflight,
            connect_timeout_s=self.cfg.connect_timeout_ms / 1000,
            keepalive_grace=self.cfg.keepalive_grace, now=now)
        self.conn: Connection | None = None
        self.state: SessionState | None = None
        self._auth_method: str | None = None  # CONNECT's MQTT 5 authentication method
        self._held: list[Packet | ProtocolViolation] = []  # for the next event-loop turn
        self._authenticating = False  # CONNECT received, its answer not yet given
        self._login_deferred = False  # ... and it will come later: reading is paused
        # On a node of shards: the client id's claim was granted, and its release.
        self._claimed = False
        self._release_claim: Callable[[], None] | None = None
        self._owner_record: bytes | None = None  # the session record its owner keeps
        self.persistent = False
        # MQTT 5 Request Problem Information: 0 means reason strings only on CONNACK and
        # DISCONNECT, never on acknowledgements (3.1.2.11.7).
        self._problem_info = True
        self.closing = False
        self.will: Will | None = None
        self._out: list[bytes] = []
        # PUBACK/PUBREC/PUBREL/PUBCOMP leave in order, each once what it confirms is
        # durable (the runtime's one confirm-once-durable path).
        self.confirms = host.durability.confirmations(
            flush=self.flush, closed=self.is_closing, fail=self._store_failed, who=remote)
        self._by_consumer: dict[Consumer, MqttSubscription] = {}
        self._denied_topics: set[str] = set()  # refusals already logged (bounded)
        self.last_write = now
        # Slow-subscriber push-back (transport/push_back.py): the topics this read
        # published to (each once in a row), and the hold while reading is paused.
        self._published: list[Destination] = []
        self._last_published: Destination | None = None
        self._hold = ProducerHold(host.push_back, self._push_back_released)
        # On a node of shards: offer this connection to the owner of the topic of its
        # first PUBLISH or SUBSCRIBE (transport/handoff.py); None once tried.
        self._handoff: Handoffs | None = None
        self.listener: str | None = None
        self._handing_off = False  # offered: reading paused until the owner answers
        self._handed = False  # taken by another shard: its end here ends nothing
        # The owner's confirmation of the last session record change sent to it.
        self._unstored: asyncio.Future[None] | None = None
        # A CONNECT another shard handed here: its login, already checked there.
        self._adopted_login: Principal | None = None

    def _write(self, data: bytes) -> None:
        # BufferedOutput's, repeated here so that the compiled build runs it natively:
        # every delivered message goes through it.
        out = self._out
        if not out:
            self.host.mark_flush(self)
        out.append(data)

    @property
    def level(self) -> int:
        return self.machine.level

    @property
    def keep_alive(self) -> int:
        return self.machine.keep_alive

    def is_closing(self) -> bool:
        return self.closing

    # ------------------------------------------------------------ input
    def data_received(self, data: bytes) -> None:
        packets = self.machine.receive_data(data, time.monotonic())
        if self.closing:
            return
        if self._held or self._authenticating:
            self._held.extend(packets)  # behind the packets still waiting their turn
            return
        self._handle_all(packets)
        if self._published:
            self._check_push_back()
        self.host.request_pump()
        self.flush()

    def _handle_all(self, packets: list[Packet | ProtocolViolation]) -> None:
        budget = PACKETS_PER_TURN
        for i, packet in enumerate(packets):
            if self.closing:
                break
            if self._handoff is not None and (packet.__class__ is Publish or
                                              packet.__class__ is Subscribe) and \
                    self._offer(packets, i):
                return
            if budget <= 0:
                # One client's burst must not hold the event loop: the rest waits for the
                # next turn, after the other connections.
                self._held = packets[i:]
                self.transport.pause_reading()
                asyncio.get_running_loop().call_soon(self._resume_turn)
                break
            try:  # _handle_safely inlined, PUBLISH dispatched first
                if packet.__class__ is Publish:
                    budget -= 1
                    self.on_publish(packet)
                else:
                    # A SUBSCRIBE counts once per topic filter: pipelined SUBSCRIBEs of a
                    # thousand filters each are taken one per turn.
                    budget -= len(packet.subscriptions) if isinstance(packet, Subscribe) \
                        else 1
                    self.handle(packet)
            except Exception as exc:
                self._handling_failed(packet, exc)
            if self._authenticating and not self.closing:
                # CONNECT is being authenticated: the rest waits for the answer.
                self._held = packets[i + 1:]
                break

    def _resume_turn(self) -> None:
        held, self._held = self._held, []
        if self.closing:
            return
        self._handle_all(held)
        if self._published:
            self._check_push_back()
        self.host.request_pump()
        self.flush()
        if not self._held and not self.closing and not self._hold.held and \
                not self._handing_off:
            self.transport.resume_reading()

    # ------------------------------------------------------------ slow subscribers
    # What is published for a subscriber that cannot take more waits in the broker:
    # instead of reading on, the producers of its topics are not read until it drains
    # (transport/push_back.py). Producers of other topics are unaffected.
    def _check_push_back(self) -> None:
        published, self._published = self._published, []
        self._last_published = None
        if self.conn is not None and not self.closing and \
                self._hold.check(published, self.conn.id):
            self.transport.pause_reading()

    def _push_back_released(self) -> None:
        if self.closing:
            return
        # The client's keep-alive clock restarts: it could not be read while held.
        self.machine.last_read = time.monotonic()
        if not self._held and not self._authenticating:
            self.transport.resume_reading()

    def _handling_failed(self, packet: Packet | ProtocolViolation, exc: Exception) -> None:
        """Answer an error from handling ``packet``: the reason code it carries for a
        protocol error, else a generic one (logged as a bug if not a MeshmqError)."""
        if isinstance(exc, MqttProtocolError):
            self.protocol_failure(exc)
        elif isinstance(exc, MeshmqError):
            self.disconnect(ReasonCode.UNSPECIFIED_ERROR, exc.message)
        else:
            log.error("internal error handling %s from %s", type(packet).__name__,
                      self.remote, exc_info=exc)
            self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal broker error")

    def handle(self, packet: Packet | ProtocolViolation) -> None:
        if isinstance(packet, Publish):
            self.on_publish(packet)
        elif isinstance(packet, Puback):
            self._settle(self.machine.puback_received(packet.packet_id))
        elif isinstance(packet, Pubrec):
            self.on_pubrec(packet)
        elif isinstance(packet, Pubcomp):
            if self.machine.pubcomp_received(packet.packet_id):
                self._save_state()
        elif isinstance(packet, ProtocolViolation):
            self.protocol_failure(packet.error)
        elif isinstance(packet, Pubrel):
            self.on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            self.on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self.on_unsubscribe(packet)
        elif isinstance(packet, Pingreq):
            self._write(self.machine.send(Pingresp()))
        elif isinstance(packet, Disconnect):
            self.on_disconnect(packet)
        elif isinstance(packet, Connect):
            self.on_connect(packet)
        elif isinstance(packet, Auth):
            self.on_auth(packet)
        else:  # the decoder only lets client-to-server packets through
            raise MqttProtocolError(f"unexpected {type(packet).__name__}",
                                    reason_code=ReasonCode.PROTOCOL_ERROR)

    # ------------------------------------------------------------ AUTH
    def on_auth(self, packet: Auth) -> None:
        """MQTT 5 re-authentication (SASL PLAIN, the method CONNECT used)."""
        method = packet.properties.authentication_method
        if self._auth_method is None:
            raise MqttProtocolError("AUTH sent, but CONNECT named no authentication method",
                                    reason_code=ReasonCode.PROTOCOL_ERROR)
        if packet.reason_code != ReasonCode.RE_AUTHENTICATE or method != self._auth_method:
            raise MqttProtocolError(
                "AUTH after CONNECT must re-authenticate (reason code 0x19) with the "
                f"method CONNECT used ({self._auth_method})",
                reason_code=ReasonCode.PROTOCOL_ERROR)
        credentials = _plain_credentials(packet.properties.authentication_data)
        assert self.conn is not None
        try:
            if credentials is None:
                raise AuthenticationError("malformed PLAIN data")
            principal = self.broker.authenticate(*credentials)
        except AuthenticationError:
            log.warning("MQTT re-authentication failed for %s", self.remote)
            self.disconnect(ReasonCode.NOT_AUTHORIZED, "re-authentication failed")
            return
        if principal.user != self.conn.principal.user:
            self.disconnect(ReasonCode.NOT_AUTHORIZED,
                            "re-authentication must name the same user")
            return
        self._write(self.machine.send(Auth(ReasonCode.SUCCESS,
                                           Properties(authentication_method=self._auth_method))))

    # ------------------------------------------------------------ CONNECT
    def on_connect(self, packet: Connect) -> None:
        v5 = self.level == PROTOCOL_LEVEL_5
        props = packet.properties
        if self._adopted_login is not None:
            # Handed over at its CONNECT by the shard that checked its login.
            principal, self._adopted_login = self._adopted_login, None
            self._auth_method = props.authentication_method if v5 else None
            self._authenticated(packet, packet.username, principal, None)
            return
        login = packet.username
        password = packet.password.decode("utf-8", "replace") if packet.password else None
        if v5 and props.authentication_method is not None:
            if props.authentication_method.upper() != "PLAIN":
                self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD,
                             f"authentication method {props.authentication_method!r} is not "
                             "supported (use PLAIN or username/password)")
                return
            credentials = _plain_credentials(props.authentication_data)
            if credentials is None:
                self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "malformed PLAIN data")
                return
            login, password = credentials
            self._auth_method = props.authentication_method
        # Answered at once, or later (a password hash checked off the event loop, a
        # refusal held back): until then the packets behind CONNECT wait (_handle_all).
        self._authenticating = True
        authenticate(self, self.broker.auth, login, password,
                     lambda principal, refused: self._authenticated(packet, login, principal,
                                                                    refused))
        if self._authenticating and not self.closing:
            self._login_deferred = True
            self.transport.pause_reading()

    def _authenticated(self, packet: Connect, login: str | None, principal: Principal | None,
                       refused: str | None) -> None:
        self._authenticating = False
        deferred, self._login_deferred = self._login_deferred, False
        if self.closing:
            return  # closed while the password was checked: no connection to open
        if principal is None:
            log.warning("MQTT authentication failed for %r from %s", login, self.remote)
            # A SecurityException in ActiveMQ: CONNACK 5, "not authorized".
            self._refuse(ReasonCode.NOT_AUTHORIZED, refused or "not authorized")
            return
        if self._claim(packet, login, principal, deferred):
            return
        if self._offer_resume(packet, principal):
            return
        if deferred:
            try:
                self._connected(packet, principal)
            except Exception as exc:
                self._handling_failed(packet, exc)
            self._resume_turn()  # the packets behind CONNECT, then reading again
        else:
            self._connected(packet, principal)

    def _claim(self, packet: Connect, login: str | None, principal: Principal,
               deferred: bool) -> bool:
        """On a node of shards: claim the client id from its owning shard first (which
        has a connection with it on another shard closed, as a take-over). True while
        the answer is awaited: the CONNACK and the packets behind CONNECT wait."""
        clients = self.host.durability.clients
        if clients is None or self._claimed or not packet.client_id:
            return False
        self._claimed = True
        answer, self._release_claim = clients.claim(packet.client_id, "mqtt",
                                                    self._taken_over, self._still_open)
        if answer.done() and not answer.cancelled() and answer.exception() is None:
            self._owner_record = answer.result()
            return False
        self._authenticating = True
        self._login_deferred = deferred

        def answered(fut: asyncio.Future[bytes | None]) -> None:
            if self.closing or fut.cancelled():
                self._authenticating = False
                return
            exc = fut.exception()
            if exc is None:
                self._owner_record = fut.result()
                self._authenticated(packet, login, principal, None)
                return
            self._authenticating = False
            code = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID if getattr(
                exc, "code", "") == "client-id-in-use" else ReasonCode.SERVER_UNAVAILABLE
            self._refuse(code, getattr(exc, "message", str(exc)))

        answer.add_done_callback(answered)
        return True

    def _still_open(self) -> bool:
        """Does the client still hold this connection? Asked when a STOMP connection
        claims its client id: on one broker an MQTT connection whose client has left
        holds it no longer, its end read or not."""
        return not self.closing and socket_open(self.transport)

    def _taken_over(self) -> None:
        """Another shard's connection took this client id over (docs/shards.md)."""
        client_id = self.conn.client_id if self.conn is not None else None
        if not self.closing:
            self.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection took over")
            self.connection_lost()
        pending = self.service.teardowns.get(client_id or "")
        if pending is not None:
            pending.finish()  # its durable subscriptions are free for the new connection

    def _connected(self, packet: Connect, principal: Principal) -> None:
        v5 = self.level == PROTOCOL_LEVEL_5
        props = packet.properties
        client_id = packet.client_id
        assigned = None
        if not client_id:
            client_id = assigned = "meshmq-" + secrets.token_hex(8)
        old = self.service.sessions.get(client_id)
        if old is not None and old is not self:
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection took over")
            old.connection_lost()
        pending = self.service.teardowns.get(client_id)
        if pending is not None:
            # The client id's previous connection (or expired session) is still being
            # taken apart: finish now, so that the client id is free, its durable
            # subscriptions have no consumer, and the session is found exactly as an
            # instantaneous close would have left it.
            pending.finish()
        if client_id in self.broker.client_ids:
            self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                         f"client id {client_id!r} is in use by a non-MQTT connection")
            return
        self.conn = self.broker.open_connection(principal, client_id=client_id,
                                                remote=self.remote, protocol="mqtt")
        self.host.register(self)
        self.service.sessions[client_id] = self
        if v5:
            self._problem_info = props.request_problem_information != 0
            expiry = min(props.session_expiry_interval or 0, self.cfg.max_session_expiry_s)
        else:
            expiry = 0 if packet.clean_start else SERVER_SESSION_FOREVER
        self.persistent = expiry > 0
        self.service.cancel_will(client_id)
        session_present = self._restore_session(client_id, packet.clean_start, expiry)
        self.will = packet.will
        keep_alive = packet.keep_alive
        server_keep_alive = None
        limit = self.cfg.max_keep_alive_s
        if v5 and limit and (keep_alive == 0 or keep_alive > limit):
            keep_alive = server_keep_alive = limit
        if v5:
            self.machine.accept(
                keep_alive=keep_alive, receive_maximum=props.receive_maximum,
                alias_max=props.topic_alias_maximum or 0
                if self.cfg.outbound_topic_aliases else 0,
                client_max_packet=props.maximum_packet_size or 0)
        else:
            self.machine.accept(keep_alive=keep_alive, receive_maximum=None, alias_max=0,
                                client_max_packet=0)
        ack_props = Properties()
        if v5:
            ack_props = Properties(
                receive_maximum=self.cfg.receive_maximum,
                maximum_packet_size=self.cfg.max_packet_size,
                topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
                retain_available=1 if self.cfg.retain_available else 0,
                assigned_client_identifier=assigned, server_keep_alive=server_keep_alive,
                session_expiry_interval=expiry if props.session_expiry_interval is not None
                and expiry != props.session_expiry_interval else None)
            peers = self.host.topology.header_value("mqtt") if self.push_topology \
                else None
            if peers is not None:
                ack_props.user_properties = [(PEERS_HEADER, peers)]  # topology push
        self._write(self.machine.send(Connack(session_present=session_present,
                                              reason_code=ReasonCode.SUCCESS,
                                              properties=ack_props)))
        self._resume_consumers()

    def _refuse(self, code: ReasonCode, reason: str) -> None:
        if self.closing:
            return
        data = self.machine.refuse(code, reason)
        if data:
            self._write(data)
        self.close()

    def _restore_session(self, client_id: str, clean_start: bool, expiry: int) -> bool:
        """Attach the stored session of ``client_id`` (or discard it on clean start)."""
        state = self.service.states.get(client_id)
        if state is not None and state.expiry_handle is not None:
            state.expiry_handle.cancel()
            state.expiry_handle = None
        durable = [name for cid, name in self.broker.durables
                   if cid == client_id and parse_durable_name(name) is not None]
        present = False
        body = self._session_record(client_id)
        if body is None and state is not None and self.host.durability.clients is not None:
            # On a node of shards the owner's record is the session: a copy kept here
            # without it was ended (expired) by the owner.
            self.service.states.pop(client_id, None)
            state = None
        if body is not None:  # its subscriptions on other shards' topics, too
            durable += [n for n in _record_subscriptions(body) if n not in durable]
        if clean_start:
            assert self.conn is not None
            for name in durable:
                self.broker.remove_durable(self.conn, name)
            # (On a node of shards, those other shards keep go too: no-op otherwise.)
            self.broker.drop_durables_elsewhere(client_id)
            durable = []
            self._drop_record(client_id)
            body = None
            self.service.states.pop(client_id, None)
            state = None
        elif state is not None or durable or body is not None:
            present = True
        # A resumed session keeps its durable subscriptions (and the messages queued for
        # them) while this connection lasts, even when CONNECT names no expiry: the new
        # interval applies when this connection ends (MQTT 5, 3.1.2.11.2).
        self.persistent = expiry > 0 or present
        if state is None:
            state = SessionState(client_id)
            for name in durable:  # subscriptions recovered from the store
                parsed = parse_durable_name(name)
                assert parsed is not None
                flt, options = parsed
                state.subscriptions[flt] = MqttSubscription(flt, options, None)
            if body is not None:  # QoS 2 exchanges in progress when the broker stopped
                state.inflight = InflightState.from_record(json.loads(body))
        state.expiry_s = expiry
        self.state = state
        self.machine.inflight = state.inflight
        if self.persistent:
            self.service.states[client_id] = state
            self._save_state()
        else:
            self._drop_record(client_id)
        return present

    def _session_record(self, client_id: str) -> bytes | None:
        """The stored record of ``client_id``'s session: on a node of shards, the one
        the client id's owning shard keeps (given with the claim); else this broker's."""
        if self.host.durability.clients is not None:
            return self._owner_record
        record = self.broker.records.get(_record_name(client_id))
        return None if record is None else record[1]

    def _drop_record(self, client_id: str) -> None:
        self.broker.drop_record(_record_name(client_id))
        clients = self.host.durability.clients
        if clients is not None:
            clients.drop_session(client_id)

    def _save_state(self, *, ended: bool = False) -> asyncio.Future[None] | None:
        """Persist what a persistent session needs beyond its subscriptions: that it
        exists, its expiry, and the packet ids of unfinished QoS 2 exchanges (on a node
        of shards, with the client id's owning shard, and its subscriptions' names: they
        may live on other shards; ``ended``: its connection ended now, the time its
        expiry runs from). Returns, on a node of shards, the owner's confirmation that it
        stored it (None when the local sync covers it)."""
        if not self.persistent or self.state is None:
            return None
        state = self.state
        record: dict[str, object] = {"expiry": state.expiry_s,
                                     **state.inflight.to_record()}
        clients = self.host.durability.clients
        if clients is None:
            self.broker.put_record(_record_name(state.client_id), json.dumps(record).encode())
            return None
        record["subs"] = [durable_name(s.filter, s.options)
                          for s in state.subscriptions.values()]
        if ended:
            record["ended"] = self.broker.now_ms()
        kept = self._unstored = clients.put_session(state.client_id,
                                                    json.dumps(record).encode())
        return kept

    def _resume_consumers(self) -> None:
        assert self.state is not None
        for sub in list(self.state.subscriptions.values()):
            try:
                self._open_consumer(sub)
            except AuthorizationError as exc:
                # The rights changed since the session subscribed: it loses this one.
                log.warning("MQTT client %s: subscription %r of its session dropped: %s",
                            self.remote, sub.filter, exc.message)
                del self.state.subscriptions[sub.filter]
        # Resend PUBREL for QoS 2 deliveries interrupted after PUBREC.
        for pid in self.machine.resume_pubrels():
            self._write(self.machine.send(Pubrel(pid)))

    # ------------------------------------------------------------ handoff
    def _offer_resume(self, packet: Connect, principal: Principal) -> bool:
        """On a node of shards: a CONNECT resuming a persistent session whose
        subscriptions are all on topics one other shard owns is handed to that shard
        before it is answered, so that the session runs where its messages are. True:
        it will be offered (the packets behind CONNECT wait)."""
        handoffs = self._handoff
        clients = self.host.durability.clients
        client_id = packet.client_id
        record = self._owner_record
        if handoffs is None or clients is None or record is None or self.closing or \
                packet.clean_start or not client_id or principal.internal or \
                self.listener is None or self.level not in (PROTOCOL_LEVEL_311,
                                                            PROTOCOL_LEVEL_5) or \
                client_id in self.service.sessions or client_id in self.service.teardowns \
                or any(cid == client_id for cid, _ in self.broker.durables):
            return False
        owners: set[int] = set()
        for name in _record_subscriptions(record):
            parsed = parse_durable_name(name)
            assert parsed is not None
            flt = parsed[0]
            if "+" in flt or "#" in flt or is_shared(flt):
                return False
            try:
                dest = _topic_dest(flt)
            except MeshmqError:
                return False
            if dest.is_temporary or dest.is_advisory:
                return False
            owners.add(handoffs.identity.owner(dest))
        if len(owners) != 1:
            return False
        owner = owners.pop()
        if owner == handoffs.identity.index or not handoffs.owner_up(owner) or \
                not clients.movable(client_id) or \
                self.transport.get_extra_info("socket") is None:
            return False
        # Offered once the packets behind CONNECT are in ``_held`` (this turn's end).
        self._handoff = None  # (once)
        self._authenticating = True
        self._handing_off = True
        self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._send_resume_offer, handoffs, owner,
                                             packet, principal)
        return True

    def _send_resume_offer(self, handoffs: Handoffs, owner: int, packet: Connect,
                           principal: Principal) -> None:
        clients = self.host.durability.clients
        client_id = packet.client_id
        claim = clients.movable(client_id) if clients is not None else None
        sock = self.transport.get_extra_info("socket")
        record = self._owner_record
        answer = None
        if not self.closing and claim and sock is not None and record is not None and \
                not any(isinstance(p, ProtocolViolation) for p in self._held):
            # The password stays here: the adopting shard takes this login as checked.
            props = Properties(**{k: v for k, v in vars(packet.properties).items()
                                  if k != "authentication_data"})
            parts = [encode(replace(packet, password=None, properties=props), self.level)]
            parts += [encode(p, self.level) for p in self._held
                      if not isinstance(p, ProtocolViolation)]
            parts.append(self.machine.decoder.unparsed())
            carried = handoff_bytes(self.transport, b"".join(parts))
            if carried is not None:
                pending, websocket = carried
                offer = HandoffOffer(
                    "mqtt", self.listener or "", str(self.level), 0.0, 0.0,
                    principal.user, tuple(sorted(principal.groups)), principal.anonymous,
                    pending, client_id, claim, handoffs.identity.index,
                    {"connect": True, "record": record.decode()}, websocket=websocket)
                answer = handoffs.offer(owner, offer, sock.fileno())
        handoff_tried(self.transport)  # offered at most once
        if answer is None:
            self._resume_answered(None, packet, principal, claim or "")
            return
        answer.add_done_callback(
            lambda fut: self._resume_answered(fut, packet, principal, claim or ""))

    def _resume_answered(self, answer: asyncio.Future[bool] | None, packet: Connect,
                         principal: Principal, claim: str) -> None:
        """The owner's answer to a CONNECT offered (None: not offered after all)."""
        self._handing_off = False
        clients = self.host.durability.clients
        client_id = packet.client_id
        if answer is not None and (answer.cancelled() or answer.exception() is not None):
            if not self.closing:
                log.warning("MQTT connection %s: the shard it was handed to did not "
                            "answer; closing it (the client reconnects)", self.remote)
            self.closing = True
            self.transport.abort()
            return
        if answer is not None and answer.result():
            if clients is not None:
                clients.handed(client_id, claim)
            self._release_claim = None
            self._handed = True
            self.service.forget_session(client_id)  # the other shard runs it now
            self.service.cancel_will(client_id)  # (as its CONNECT here would have)
            self.closing = True
            self.transport.abort()
            return
        if answer is not None and clients is not None:
            clients.kept(client_id, claim)
        self._authenticating = False
        if self.closing:
            return
        try:
            self._connected(packet, principal)
        except Exception as exc:
            self._handling_failed(packet, exc)
        self._resume_turn()  # the packets behind CONNECT, then reading again

    def _offer(self, packets: list[Packet | ProtocolViolation], index: int) -> bool:
        """Offer this connection to the shard that owns the topic of the PUBLISH or
        SUBSCRIBE at ``index``, if it holds nothing that lives on this shard: no
        subscription, no QoS 1/2 exchange or confirmation in progress on it (a
        persistent session's expiry and QoS 2 state go with it: the client id's owner
        keeps its record) (transport/handoff.py). True: it was offered (or waits for the
        owner to store the session's record first), and the packets from ``index`` on
        wait for the answer."""
        try:
            return self._try_offer(packets, index)
        finally:
            if self._handoff is None:  # (kept while the session's record is stored)
                handoff_tried(self.transport)  # offered at most once

    def _try_offer(self, packets: list[Packet | ProtocolViolation], index: int) -> bool:
        handoffs, self._handoff = self._handoff, None
        conn = self.conn
        state = self.state
        machine = self.machine
        packet = packets[index]
        if handoffs is None or conn is None or state is None or self.closing or \
                state.subscriptions or conn.consumers or conn.principal.internal or \
                not conn.client_id or len(self.confirms) or machine.inbound_pending or \
                machine.inflight_count or self._hold.held or self._authenticating or \
                self.listener is None:
            return False
        if not self.persistent and (state.inflight.inbound_qos2 or state.inflight.released
                                    or state.inflight.outbound_pubrel):
            return False  # (a persistent session's record carries them)
        if isinstance(packet, Publish):
            topic = packet.topic
            alias = packet.properties.topic_alias if self.level == PROTOCOL_LEVEL_5 \
                else None
            if alias is not None and not topic:
                topic = machine._in_aliases.get(alias, "")
        elif isinstance(packet, Subscribe) and len(packet.subscriptions) == 1:
            topic = packet.subscriptions[0][0]
        else:
            return False
        if not topic or "+" in topic or "#" in topic or is_shared(topic):
            return False
        try:
            dest = _topic_dest(topic)
        except MeshmqError:
            return False  # handled here, to answer with the error
        if dest.is_temporary or dest.is_wildcard or dest.is_advisory:
            return False
        identity = handoffs.identity
        owner = identity.owner(dest)
        if owner == identity.index or not handoffs.owner_up(owner):
            return False
        clients = self.host.durability.clients
        claim = clients.movable(conn.client_id) if clients is not None else None
        sock = self.transport.get_extra_info("socket")
        if not claim and clients is not None and self._unstored is not None and \
                not self._unstored.done() and sock is not None:
            # The session's record is on its way to the client id's owner (its
            # CONNECT's, say): offered once the owner has stored it.
            self._handoff = handoffs
            self._await_stored(packets[index:], self._unstored)
            return True
        if not claim or sock is None:
            return False
        self.flush()  # the CONNACK of a client that pipelined its first PUBLISH
        if self.transport.get_write_buffer_size():
            return False
        parts: list[bytes] = []
        for waiting in packets[index:]:
            if isinstance(waiting, ProtocolViolation):
                return False
            parts.append(encode(waiting, self.level))
        parts.append(machine.decoder.unparsed())
        carried = handoff_bytes(self.transport, b"".join(parts))
        if carried is None:
            return False  # a WebSocket part-way through a message
        pending, websocket = carried
        principal = conn.principal
        offer = HandoffOffer(
            "mqtt", self.listener, str(self.level), 0.0, 0.0, principal.user,
            tuple(sorted(principal.groups)), principal.anonymous, pending,
            conn.client_id, claim, identity.index, self.handoff_state(),
            websocket=websocket)
        answer = handoffs.offer(owner, offer, sock.fileno())  # None: too much pending
        if answer is None:
            return False
        self._handing_off = True
        self.transport.pause_reading()
        rest = packets[index:]
        client_id = conn.client_id
        answer.add_done_callback(lambda fut: self._offer_answered(fut, rest, client_id,
                                                                  claim))
        return True

    def _await_stored(self, waiting: list[Packet | ProtocolViolation],
                      stored: asyncio.Future[None]) -> None:
        """Hold ``waiting`` until the owner has stored the session's record, then take
        them again (the first one is offered then)."""
        self._handing_off = True
        self._held = list(waiting)
        self.transport.pause_reading()

        def done(_fut: asyncio.Future[None]) -> None:
            self._handing_off = False
            if not self.closing:
                self._resume_turn()

        stored.add_done_callback(done)

    def handoff_state(self) -> dict[str, object]:
        """What CONNECT negotiated, for the shard this connection is handed to (and a
        persistent session's state: its expiry and QoS 2 exchanges in progress)."""
        state = self.state
        if self.persistent and state is not None:
            return {**self._negotiated(), "expiry": state.expiry_s,
                    "inflight": state.inflight.to_record()}
        return self._negotiated()

    def _negotiated(self) -> dict[str, object]:
        machine = self.machine
        will = self.will
        clients = self.host.durability.clients
        assert self.conn is not None
        return {
            # The drop of its session record (its clean start) has not reached the
            # owner yet: the adopting shard sends it again, once the id is its own.
            "drop": clients is not None and self.conn.client_id in clients.unstored,
            "keep_alive": machine.keep_alive, "receive_max": machine.client_receive_max,
            "max_packet": machine.client_max_packet, "alias_max": machine.alias_max,
            "aliases": {str(k): v for k, v in machine._in_aliases.items()},
            "problem_info": self._problem_info, "auth_method": self._auth_method,
            "will": None if will is None else _encode_will(will)}

    def _offer_answered(self, answer: asyncio.Future[bool],
                        waiting: list[Packet | ProtocolViolation], client_id: str,
                        claim: str) -> None:
        self._handing_off = False
        clients = self.host.durability.clients
        if answer.cancelled() or answer.exception() is not None:
            if not self.closing:
                log.warning("MQTT connection %s: the shard it was handed to did not "
                            "answer; closing it (the client reconnects)", self.remote)
            self.closing = True
            self.transport.abort()
            return
        if answer.result():
            # The owner serves it now, its claim and will included: let go of our
            # descriptor, writing nothing and publishing no will.
            if clients is not None:
                clients.handed(client_id, claim)
            self._release_claim = None
            self._handed = True
            self.will = None
            self.transport.abort()
            return
        if clients is not None:
            clients.kept(client_id, claim)
        if self.closing:
            return  # the client went away, or was taken over, meanwhile
        self._held = waiting
        self.machine.last_read = time.monotonic()
        asyncio.get_running_loop().call_soon(self._resume_turn)

    def adopt(self, offer: HandoffOffer, release: Callable[[], None] | None) -> None:
        """Serve a connection another shard of the node handed here, as it was there:
        connected with what its CONNECT negotiated, its client id (whose claim moved
        here: ``release`` ends it), will and session (one that ends with it, or a
        persistent one without subscriptions, whose record this shard now sends its
        owner); then the bytes it had read and not handled. A CONNECT handed over
        (``_offer_resume``) is answered here instead."""
        state = offer.session or {}
        if state.get("connect"):
            self._adopt_connect(offer, release)
            return
        level = int(offer.version)
        if level not in (PROTOCOL_LEVEL_311, PROTOCOL_LEVEL_5):
            raise MeshmqError(f"a handed-over MQTT connection of level {level}")
        machine = self.machine
        machine.level = level
        machine.decoder = MqttDecoder(max_packet_size=self.cfg.max_packet_size,
                                      protocol_level=level,
                                      retain_available=self.cfg.retain_available)
        machine.state = ConnState.CONNECTED
        machine.accept(keep_alive=int(state.get("keep_alive", 0)),
                       receive_maximum=int(state.get("receive_max", 0)),
                       alias_max=int(state.get("alias_max", 0)),
                       client_max_packet=int(state.get("max_packet", 0)))
        aliases = state.get("aliases") or {}
        machine._in_aliases = {int(k): str(v) for k, v in aliases.items()}
        machine.last_read = time.monotonic()
        self._problem_info = bool(state.get("problem_info", True))
        method = state.get("auth_method")
        self._auth_method = method if isinstance(method, str) else None
        self.will = _decode_will(state.get("will"), level)
        self._claimed = True
        self._release_claim = release
        client_id = offer.client_id
        pending = self.service.teardowns.get(client_id)
        if pending is not None:
            pending.finish()  # an earlier connection of this id here, still ending
        principal = Principal(offer.user, frozenset(offer.groups), anonymous=offer.anonymous)
        self.conn = self.broker.open_connection(principal, client_id=client_id,
                                                remote=self.remote, protocol="mqtt")
        self.host.register(self)
        self.service.sessions[client_id] = self
        self.service.cancel_will(client_id)
        self.persistent = False
        session = self.state = SessionState(client_id)
        session.expiry_s = 0
        clients = self.host.durability.clients
        expiry = state.get("expiry")
        if isinstance(expiry, int):
            # A persistent session (without subscriptions): its expiry and QoS 2
            # exchanges come along, and from now on this shard sends its record.
            self.persistent = True
            session.expiry_s = expiry
            inflight = state.get("inflight")
            if isinstance(inflight, dict):
                session.inflight = InflightState.from_record(inflight)
            self.service.states[client_id] = session  # (replaces an earlier run's copy)
        machine.inflight = session.inflight
        if self.persistent:
            self._save_state()
        elif state.get("drop") and clients is not None:
            clients.drop_session(client_id)
        if offer.pending:
            self.data_received(offer.pending)

    def _adopt_connect(self, offer: HandoffOffer, release: Callable[[], None] | None
                       ) -> None:
        """A resumed session handed here at its CONNECT (``_offer_resume``): its
        CONNECT is answered here, with the login the other shard checked and the
        session record the client id's owner gave it."""
        record = (offer.session or {}).get("record")
        if not isinstance(record, str):
            raise MeshmqError("a handed-over MQTT CONNECT without its session record")
        self._claimed = True
        self._release_claim = release
        self._owner_record = record.encode()
        self._adopted_login = Principal(offer.user, frozenset(offer.groups),
                                        anonymous=offer.anonymous)
        self.data_received(offer.pending)

    # ------------------------------------------------------------ PUBLISH in
    def on_publish(self, packet: Publish) -> None:
        conn = self.conn
        assert conn is not None
        qos = packet.qos
        topic = packet.topic
        if qos or self.machine.level == PROTOCOL_LEVEL_5:  # else nothing to resolve or count
            resolved = self.machine.publish_received(packet)
            if resolved is None:
                # A retransmission of a QoS 2 message we already own: acknowledge only.
                self._confirm(Pubrec(packet.packet_id or 0), durable=False)
                return
            topic = resolved
        entry = _DEST_CACHE.get(topic)
        if entry is None:
            entry = _dest_entry(topic)
        broker = self.broker
        dest = entry[0]
        message = self._message(packet, dest)
        try:
            needs_sync = broker.send(conn, entry[1], message)
        except AuthorizationError as exc:
            self._refuse_publish(packet, topic, exc.message)
            return
        if dest is not self._last_published:  # checked for slow subscribers per read
            self._last_published = dest
            self._published.append(dest)
        if packet.retain:
            broker.retain(message)
            needs_sync = True
        if not qos:
            return  # QoS 0: nothing to acknowledge
        pid = packet.packet_id or 0
        if qos == 1:
            self._confirm(Puback(pid), durable=needs_sync)
            return
        self.machine.qos2_received(pid, topic, packet.payload)
        kept = None
        if self.persistent:
            kept = self._save_state()
            needs_sync = True  # the PUBREC promise must survive a crash
        # Counts against receive maximum until PUBREL (MQTT 5 section 3.3.4).
        self._confirm(Pubrec(pid), durable=needs_sync, after=kept)

    def _confirm(self, packet: Packet, *, durable: bool,
                 after: asyncio.Future[None] | None = None) -> None:
        """Send an acknowledgement in order, once what it confirms is durable (sending it
        through the machine settles what it ends); ``after``: on a node of shards, the
        owner's copy of the session record it depends on."""
        self.confirms.confirm(lambda: self._write(self.machine.send(packet)), durable=durable,
                              after=after)

    def _store_failed(self, reason: str) -> None:
        self.disconnect(ReasonCode.UNSPECIFIED_ERROR, reason)

    def _refuse_publish(self, packet: Publish, topic: str, why: str) -> None:
        """A PUBLISH this client may not make: MQTT 5 answers Not authorized (0x87) in its
        PUBACK/PUBREC; 3.1.1 has no refusal, so the exchange completes and the message is
        dropped. Nothing is routed or retained either way; the first refusal per topic is
        logged."""
        if topic not in self._denied_topics:
            if len(self._denied_topics) < 100:
                self._denied_topics.add(topic)
            log.info("MQTT client %s (user %s): publish to %r refused: %s", self.remote,
                     self.conn.principal.user if self.conn is not None else None, topic, why)
        qos = packet.qos
        if not qos:
            return
        pid = packet.packet_id or 0
        if self.level == PROTOCOL_LEVEL_5:
            props = Properties(reason_string=why[:200]) if self._problem_info \
                else Properties()
            ack: Packet = Puback(pid, ReasonCode.NOT_AUTHORIZED, props) if qos == 1 \
                else Pubrec(pid, ReasonCode.NOT_AUTHORIZED, props)
            self._confirm(ack, durable=False)  # ends the exchange either way
        elif qos == 1:
            self._confirm(Puback(pid), durable=False)
        else:
            self.machine.inflight.inbound_qos2.add(pid)  # PUBREL then completes as usual
            self._confirm(Pubrec(pid), durable=False)

    def _message(self, packet: Publish, dest: Destination) -> Message:
        conn = self.conn
        assert conn is not None
        broker = self.broker
        now = broker.now_ms()
        qos = packet.qos
        properties: dict[str, PropertyValue] = {QOS_PROPERTY: qos}
        if packet.retain:
            properties[RETAIN_PROPERTY] = True
        if self.level != PROTOCOL_LEVEL_5:
            # 3.1.1 carries nothing else: the other fields keep their defaults.
            return Message(message_id=broker.new_message_id(conn.id), destination=dest,
                           body=packet.payload, properties=properties, persistent=qos > 0,
                           timestamp=now, producer_id=conn.id, user_id=conn.principal.user)
        props = packet.properties
        reply_to = None
        correlation = None
        expiration = 0
        for key, value in props.user_properties:
            properties.setdefault(key, value)
        if props.response_topic:
            reply_to = _topic_dest(props.response_topic)
        if props.correlation_data is not None:
            # latin-1 maps bytes 1:1 to text, so binary correlation data survives.
            correlation = props.correlation_data.decode("latin-1")
        if props.message_expiry_interval is not None:
            expiration = now + props.message_expiry_interval * 1000
        if props.payload_format_indicator is not None:
            properties["mqtt.payloadFormat"] = props.payload_format_indicator
        return Message(message_id=broker.new_message_id(conn.id), destination=dest,
                       body=packet.payload, properties=properties, persistent=qos > 0,
                       timestamp=now, expiration=expiration, correlation_id=correlation,
                       reply_to=reply_to, producer_id=conn.id, user_id=conn.principal.user,
                       content_type=props.content_type)

    def on_pubrel(self, packet: Pubrel) -> None:
        pid = packet.packet_id
        code, changed = self.machine.pubrel_received(pid)
        durable = changed and self.persistent
        kept = None
        if durable:
            # Record the release durably before PUBCOMP: after a restart the client
            # may resend PUBREL (answered below) or, wrongly, the PUBLISH.
            kept = self._save_state()
        self._confirm(Pubcomp(pid, reason_code=code), durable=durable, after=kept)

    # ------------------------------------------------------------ SUBSCRIBE
    def on_subscribe(self, packet: Subscribe) -> None:
        assert self.state is not None and self.conn is not None
        codes: list[ReasonCode] = []
        fresh: list[MqttSubscription] = []
        sub_id = packet.properties.subscription_identifiers[0] \
            if packet.properties.subscription_identifiers else None
        refused = None
        denied: str | None = None
        for flt, options in packet.subscriptions:
            existing = self.state.subscriptions.get(flt)
            if existing is None and self._at_subscription_limit():
                # broker.max_subscriptions_per_connection: this filter is refused (0x97
                # Quota exceeded; 3.1.1 SUBACK says 0x80 Failure), the others stand.
                codes.append(ReasonCode.QUOTA_EXCEEDED)
                refused = flt
                continue
            if existing is not None:
                self._close_consumer(existing, drop_durable=existing.options != options)
            sub = MqttSubscription(flt, options, sub_id)
            try:
                self._open_consumer(sub)
            except AuthorizationError as exc:
                # 0x87 Not authorized (3.1.1 SUBACK says 0x80 Failure); the others stand.
                codes.append(ReasonCode.NOT_AUTHORIZED)
                denied = exc.message
                self.state.subscriptions.pop(flt, None)  # a replaced one is gone too
                continue
            self.state.subscriptions[flt] = sub
            codes.append(ReasonCode(min(options.qos, 2)))
            if options.retain_handling == RetainHandling.SEND_ON_SUBSCRIBE or (
                    options.retain_handling == RetainHandling.SEND_IF_NEW_SUBSCRIPTION
                    and existing is None):
                fresh.append(sub)
        props = Properties()
        problem_info = self.level == PROTOCOL_LEVEL_5 and self._problem_info
        if denied is not None and problem_info:
            props.reason_string = denied[:200]
        if refused is not None:
            limit = self.broker.config.max_subscriptions_per_connection
            log.info("MQTT client %s at its subscription limit (%d): %s refused", self.remote,
                     limit, refused)
            if problem_info:
                props.reason_string = (
                    f"subscription limit reached: a connection may hold at most {limit} "
                    "subscriptions (broker.max_subscriptions_per_connection)")
        if self.host.durability.clients is not None:
            self._save_state()  # the owning shard's record lists the subscriptions
        data = self.machine.send(Suback(packet.packet_id, codes, props))
        max_packet = self.machine.client_max_packet
        if max_packet and len(data) > max_packet:
            data = self.machine.send(Suback(packet.packet_id, codes))  # without the reason
        opened = self.host.durability.opened(
            sub.consumer for sub in (self.state.subscriptions.get(f)
                                     for f, _ in packet.subscriptions)
            if sub is not None and sub.consumer is not None)

        def suback() -> None:
            self._write(data)
            for sub in fresh:
                if not sub.shared:
                    self._send_retained(sub)

        if opened is None:
            suback()
        else:  # after the owners run the relayed consumers (Durability.opened)
            self.confirms.confirm(suback, durable=False, after=opened)

    def _at_subscription_limit(self) -> bool:
        assert self.conn is not None
        limit = self.broker.config.max_subscriptions_per_connection
        return bool(limit) and len(self.conn.consumers) >= limit

    def _patterns(self, sub: MqttSubscription) -> tuple[tuple[Destination, ...], str | None]:
        flt = sub.filter
        group = None
        shared = is_shared(flt) if self.level == PROTOCOL_LEVEL_5 else None
        if shared is not None:
            group, flt = shared
        mapped = mqtt_filter_to_destination(flt)
        sub.exclude_dollar = mapped.exclude_dollar_topics
        pats = [dst.topic(mapped.pattern)]
        if mapped.parent_pattern is not None:
            pats.append(dst.topic(mapped.parent_pattern))
        return tuple(pats), group

    def _open_consumer(self, sub: MqttSubscription) -> None:
        assert self.conn is not None
        patterns, group = self._patterns(sub)
        sub.shared = group is not None
        options = sub.options
        durable = durable_name(sub.filter, options) if self.persistent and group is None \
            else None
        spec = ConsumerSpec(
            destinations=patterns,
            ack_mode=AckMode.AUTO if options.qos == 0 else AckMode.CLIENT_INDIVIDUAL,
            prefetch=self.machine.client_receive_max, no_local=options.no_local,
            subscription_name=durable, shared_group=group)
        consumer = self.broker.subscribe(self.conn, sub.filter, spec)
        sub.plain = (self.level == PROTOCOL_LEVEL_311 and options.qos == 0
                     and consumer.ack_mode is AckMode.AUTO and not options.retain_as_published
                     and not self.machine.client_max_packet)
        sub.consumer = consumer
        self._by_consumer[consumer] = sub

    def _close_consumer(self, sub: MqttSubscription, *, drop_durable: bool) -> None:
        assert self.conn is not None
        consumer = sub.consumer
        if consumer is not None:
            self._by_consumer.pop(consumer, None)
            self.machine.forget_outbound(lambda held: held[0] is consumer)
            self.broker.unsubscribe(self.conn, consumer)
            sub.consumer = None
        if drop_durable:
            name = durable_name(sub.filter, sub.options)
            if (self.conn.client_id or "", name) in self.broker.durables:
                self.broker.remove_durable(self.conn, name)
            elif self.persistent and self.conn.client_id is not None:
                # Kept by the topic's owner on a node of shards (no-op otherwise).
                self.broker.drop_durables_elsewhere(self.conn.client_id, name)

    def _send_retained(self, sub: MqttSubscription) -> None:
        patterns, _ = self._patterns(sub)
        principal = self.conn.principal if self.conn is not None else None
        for msg in self.broker.retained_for(patterns, principal):
            out = _out_topic(msg.destination.name)
            topic = out.topic
            if topic is None or (sub.exclude_dollar and topic.startswith("$")):
                continue
            qos = min(sub.options.qos, self._message_qos(msg))
            pid = self.machine.allocate_pid(None) if qos else None
            self._write_publish(msg, topic, qos, pid, retain=True, dup=False, sub=sub,
                                field=out.field)

    def on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.state is not None
        codes = []
        for flt in packet.topic_filters:
            sub = self.state.subscriptions.pop(flt, None)
            if sub is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            self._close_consumer(sub, drop_durable=True)
            codes.append(ReasonCode.SUCCESS)
        if self.host.durability.clients is not None:
            self._save_state()
        self._write(self.machine.send(Unsuback(packet.packet_id, codes)))

    # ------------------------------------------------------------ PUBLISH out
    @staticmethod
    def _message_qos(msg: Message) -> int:
        qos = msg.properties.get(QOS_PROPERTY)
        if isinstance(qos, int) and not isinstance(qos, bool) and 0 <= qos <= 2:
            return qos
        if isinstance(qos, str) and qos in ("0", "1", "2"):
            return int(qos)
        return 1 if msg.persistent else 0

    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        if self.closing or isinstance(outcome, BrowseEnd):
            return
        sub = self._by_consumer.get(outcome.consumer)
        if sub is None:
            return
        msg = outcome.message
        if sub.plain:
            # The common case: a 3.1.1 QoS 0 subscription to a topic with an MQTT name.
            # The packet is the same for every such subscriber: encoded once per message.
            dest = msg.destination
            out = (_OUT_TOPICS.get(dest.name) or _out_topic(dest.name)) \
                if dest.kind is _TOPIC else None
            if out is not None and out.field is not None and not (
                    sub.exclude_dollar and (out.dollar or dest.is_advisory)):
                cache = msg.wire_cache
                data = cache.get(_WIRE_Q0) if cache is not None else None
                if data is None:
                    data = encode_publish_prepared(0, out.field, msg.body)
                    if cache is None:
                        msg.wire_cache = {_WIRE_Q0: data}
                    else:
                        cache[_WIRE_Q0] = data
                self._write(data)
                return
        self._deliver(outcome, sub, msg)

    def _deliver(self, outcome: Delivery, sub: MqttSubscription, msg: Message) -> None:
        consumer = outcome.consumer
        dest = msg.destination
        out = None
        if dest.kind is _TOPIC and not (sub.exclude_dollar and dest.is_advisory):
            out = _out_topic(dest.name)
        topic = out.topic if out is not None else None
        if topic is None or (sub.exclude_dollar and topic.startswith("$")):
            self._consume(consumer, outcome.tag)  # not for this MQTT subscription
            return
        assert out is not None
        qos = min(sub.options.qos, self._message_qos(msg))
        if qos == 0:
            pid = None
            self._consume(consumer, outcome.tag)
        else:
            pid = self.machine.allocate_pid((consumer, outcome.tag))
        retain = sub.options.retain_as_published and msg.properties.get(RETAIN_PROPERTY) is True
        self._write_publish(msg, topic, qos, pid, retain=retain,
                            dup=outcome.redelivered and qos > 0, sub=sub, field=out.field)

    def _consume(self, consumer: Consumer, tag: int) -> bool:
        """Acknowledge a delivered message; True if that must reach the store."""
        if consumer.ack_mode is not AckMode.AUTO and tag in consumer.dispatched:
            assert self.conn is not None
            return self.broker.ack(self.conn, consumer, tag, cumulative=False)
        return False

    def _write_publish(self, msg: Message, topic: str, qos: int, pid: int | None, *,
                       retain: bool, dup: bool, sub: MqttSubscription,
                       field: bytes | None = None) -> None:
        """``field``: the topic's encoded field when cached (see :func:`_out_topic`)."""
        props = self._outbound_properties(msg, sub) \
            if self.machine.level == PROTOCOL_LEVEL_5 else None
        data = self.machine.publish(topic, field, msg.body, qos, pid, retain=retain, dup=dup,
                                    props=props)
        if data is None:
            # MQTT 5: never send a packet larger than the client accepts; drop it instead.
            log.info("dropping %s for %s: more bytes than the client's maximum packet size",
                     msg.message_id, self.remote)
            if pid is not None:
                self._settle(self.machine.drop_outbound(pid))
            return
        self._write(data)

    def _outbound_properties(self, msg: Message, sub: MqttSubscription) -> Properties | None:
        user = [(k, v if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                 else str(v)) for k, v in msg.properties.items()
                if k not in _INTERNAL and not k.startswith("mqtt.") and v is not None]
        expiry = None
        if msg.expiration:
            expiry = max(0, (msg.expiration - self.broker.now_ms()) // 1000)
        fmt = msg.properties.get("mqtt.payloadFormat")
        if not (user or expiry is not None or msg.content_type or msg.reply_to
                or msg.correlation_id is not None or sub.subscription_id or fmt is not None):
            return None
        props = Properties(
            message_expiry_interval=expiry, content_type=msg.content_type,
            response_topic=destination_name_to_mqtt_topic(msg.reply_to.name)
            if msg.reply_to is not None and msg.reply_to.kind is DestKind.TOPIC else None,
            correlation_data=msg.correlation_id.encode("latin-1", "replace")
            if msg.correlation_id is not None else None,
            payload_format_indicator=fmt if isinstance(fmt, int) else None)
        if user:
            props.user_properties = user
        if sub.subscription_id:
            props.subscription_identifiers = [sub.subscription_id]
        return props

    def _settle(self, held: tuple[Consumer, int] | None) -> bool:
        """Acknowledge the delivery an outbound packet id held; True if that must reach
        the store."""
        return held is not None and self._consume(held[0], held[1])

    def on_pubrec(self, packet: Pubrec) -> None:
        held, pubrel = self.machine.pubrec_received(packet.packet_id,
                                                    packet.reason_code.is_failure)
        needs_sync = self._settle(held)  # the receiver owns the message now
        if not pubrel:
            return
        kept = self._save_state()
        # PUBREL lets the receiver hand the message to its application: the ack must be
        # durable first, or a crash would deliver the message again as a new one.
        self._confirm(Pubrel(packet.packet_id), durable=needs_sync or self.persistent,
                      after=kept)

    # ------------------------------------------------------------ DISCONNECT and close
    def on_disconnect(self, packet: Disconnect) -> None:
        if self.level == PROTOCOL_LEVEL_5 and self.state is not None \
                and not self.state.expiry_s and packet.properties.session_expiry_interval:
            # MQTT 5 3.14.2.2.2: a session that was to end with its connection (the
            # interval CONNECT asked for, as granted) cannot be kept by DISCONNECT. A
            # protocol error: the will stays, the session ends.
            self.disconnect(ReasonCode.PROTOCOL_ERROR, "a session expiry interval in "
                            "DISCONNECT needs a non-zero one in CONNECT")
            return
        if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
            self.will = None  # a normal DISCONNECT discards the will
        if self.level == PROTOCOL_LEVEL_5 and self.state is not None \
                and packet.properties.session_expiry_interval is not None:
            self.state.expiry_s = min(packet.properties.session_expiry_interval,
                                      self.cfg.max_session_expiry_s)
            self.persistent = self.state.expiry_s > 0
        self.machine.client_disconnected()
        self.close()

    def protocol_failure(self, exc: MqttProtocolError) -> None:
        log.info("MQTT protocol error from %s: %s", self.remote, exc.message)
        data = self.machine.fail(exc)
        if data:
            self._write(data)
        self.close()

    def disconnect(self, code: ReasonCode, reason: str) -> None:
        """Server-initiated close: DISCONNECT with a reason in v5, plain close in 3.1.1."""
        if self.closing:
            return
        data = self.machine.disconnect(code, reason)
        if data:
            self._write(data)
        self.close()

    def close_by_admin(self) -> None:
        # MQTT 5: DISCONNECT 0x98 (administrative action); 3.1.1 has no way to say it.
        self.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, "connection closed by an administrator")

    def close(self) -> None:
        self.closing = True
        self.flush()
        self.transport.close()

    def connection_lost(self) -> None:
        release, self._release_claim = self._release_claim, None
        try:
            self._lost()
        finally:
            if release is not None:  # after the session record it may have sent
                client_id = self.conn.client_id if self.conn is not None else None
                teardown = self.service.teardowns.get(client_id or "")
                if teardown is None:
                    release()
                else:
                    # On a node of shards the id is free once this connection's
                    # consumers are gone from their topics' owners too, or a connection
                    # granted it on another shard would find the session's durable
                    # subscriptions still attached.
                    teardown.then(release)

    def _lost(self) -> None:
        if self.conn is None or self.conn.closed:
            self.closing = True
            self._hold.end()
            return
        self.closing = True
        self._hold.end()
        client_id = self.conn.client_id or ""
        if self.service.sessions.get(client_id) is self:
            del self.service.sessions[client_id]
        self._by_consumer.clear()
        self.host.unregister(self)
        # The session tables, the saved state and the will are settled now, in this turn;
        # the consumers (unacked messages are redelivered) and, for a session that ends
        # here, its durable subscriptions go over as many turns as they need.
        state = self.state
        ends = state is not None and (not self.persistent or state.expiry_s == 0)
        if ends or self._handed:  # (handed: the shard that took it runs the session)
            self.service.states.pop(client_id, None)
        # A connection handed to another shard goes on there: its session ends nothing.
        SessionTeardown(self.host, client_id, self.conn,
                        drop_session=ends and not self._handed).start()
        if self.will is not None:
            delay = self.will.properties.will_delay_interval or 0
            if self.level == PROTOCOL_LEVEL_5 and self.state is not None:
                delay = min(delay, self.state.expiry_s)
            self.service.schedule_will(client_id, self._will_message(self.will), delay)
        if state is not None and not ends and not self._handed:
            self._save_state(ended=True)
            # (On a node of shards the client id's owner runs the expiry.)
            if self.host.durability.clients is None \
                    and state.expiry_s != SERVER_SESSION_FOREVER:
                state.expiry_handle = asyncio.get_running_loop().call_later(
                    state.expiry_s, self._expire_session, client_id, state)
        self.host.request_pump()

    def _expire_session(self, client_id: str, state: SessionState) -> None:
        if self.service.states.get(client_id) is state \
                and client_id not in self.service.sessions:
            log.info("MQTT session %s expired", client_id)
            del self.service.states[client_id]
            pending = self.service.teardowns.get(client_id)
            if pending is not None:
                pending.drop_session()  # its connection is still being taken apart
            else:
                SessionTeardown(self.host, client_id, None, drop_session=True).start()

    def _will_message(self, will: Will) -> Message:
        assert self.conn is not None
        packet = Publish(topic=will.topic, payload=will.payload, qos=will.qos,
                         retain=will.retain, properties=will.properties)
        msg = self._message(packet, _topic_dest(will.topic))
        msg.producer_id = ""  # the will is not "local" to anyone: the connection is gone
        return msg

    # ------------------------------------------------------------ output and timers
    def check_timeouts(self, now: float) -> None:
        if self.closing or self._hold.held or self._handing_off:
            return  # held back by a slow subscriber: its silence is ours
        overdue = self.machine.timeouts(now)
        if overdue is None:
            return
        if isinstance(overdue, ConnectTimeout):
            log.info("closing %s: no CONNECT in time", self.remote)
            self.close()
        else:
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT,
                            f"keep-alive timeout: silent for {overdue.silent_s:.1f}s")

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.broker.set_paused(self.conn, True)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.broker.set_paused(self.conn, False)
            self.host.request_pump()
            self.host.push_back.wake_after_pump()


def _record_name(client_id: str) -> str:
    return f"mqtt-session/{client_id}"


def _record_subscriptions(body: bytes) -> list[str]:
    """The subscriptions' durable names a node's session record lists."""
    try:
        subs = json.loads(body).get("subs")
    except (ValueError, AttributeError):
        return []
    return [n for n in subs if isinstance(n, str) and parse_durable_name(n) is not None] \
        if isinstance(subs, list) else []


class SessionTeardown:
    """What is left of an MQTT connection's end that costs O(subscriptions): closing the
    connection's consumers (:meth:`Broker.close_connection_step`) and, for a session
    that ends with it (clean, expiry 0, or expired), deleting its durable subscriptions
    and then its session record. Done ``CONSUMERS_CLOSED_PER_TURN`` at a time, one batch
    per event-loop turn, so that a client with 100,000 subscriptions does not hold up the
    others. Nothing is dispatched to the connection's consumers from the first turn on.

    One per client id at most (``runtime.mqtt.teardowns``); a CONNECT with that client id
    calls :meth:`finish` first, and so does the broker's shutdown."""

    def __init__(self, host: SessionHost, client_id: str, conn: Connection | None,
                 *, drop_session: bool) -> None:
        self.host = host
        self.client_id = client_id
        self._conn = conn
        self._drop = drop_session
        self._keys: list[tuple[str, str]] | None = None
        self._then: list[Callable[[], None]] = []
        self.done = False
        previous = host.mqtt.teardowns.get(client_id)
        if previous is not None:
            previous.finish()  # not expected: a CONNECT finishes it before anything else
        host.mqtt.teardowns[client_id] = self

    def start(self) -> None:
        self._turn()

    def drop_session(self) -> None:
        """The session ends too (it expired while its connection was taken apart)."""
        self._drop = True

    def then(self, call: Callable[[], None]) -> None:
        """Call ``call()`` once everything is taken apart, after the pump that sends
        what the last removals decided (a relayed consumer's close to its topic's
        owner)."""
        if self.done:
            self._after_pump(call)
        else:
            self._then.append(call)

    def _after_pump(self, call: Callable[[], None]) -> None:
        self.host.request_pump()  # (requested first: the pump runs ahead of ``call``)
        asyncio.get_running_loop().call_soon(call)

    def finish(self) -> None:
        """Everything left, now."""
        if not self.done:
            self._step(None)
            self._finished()

    def _turn(self) -> None:
        if self.done:
            return
        if self._step(CONSUMERS_CLOSED_PER_TURN):
            self._finished()
        else:
            asyncio.get_running_loop().call_soon(self._turn)
        self.host.request_pump()

    def _finished(self) -> None:
        self.done = True
        if self.host.mqtt.teardowns.get(self.client_id) is self:
            del self.host.mqtt.teardowns[self.client_id]
        then, self._then = self._then, []
        for call in then:
            self._after_pump(call)

    def _step(self, budget: int | None) -> bool:
        """At most ``budget`` removals (None: all); True when nothing is left."""
        broker = self.host.broker
        if self._conn is not None:
            if not broker.close_connection_step(self._conn, budget):
                return False
            self._conn = None
        if not self._drop:
            return True
        keys = self._keys
        if keys is None:
            keys = self._keys = [k for k in broker.durables if k[0] == self.client_id
                                 and parse_durable_name(k[1]) is not None]
        n = len(keys) if budget is None else budget
        while keys and n > 0:
            key = keys.pop()
            n -= 1
            sub = broker.durables.get(key)
            if sub is not None and sub.consumer is None:
                broker.drop_durable(key)
        if keys:
            return False
        clients = self.host.durability.clients
        if _record_name(self.client_id) in broker.records or clients is not None:
            # A persistent session's end: on a node of shards, those its subscriptions'
            # topic owners keep go too (after its consumers closed; no-op otherwise).
            broker.drop_durables_elsewhere(self.client_id)
        broker.drop_record(_record_name(self.client_id))
        if clients is not None:
            clients.drop_session(self.client_id)
        self._drop = False
        self._keys = None
        return True


class MqttProtocol(SessionProtocol[MqttSession]):
    """The asyncio adapter for MQTT: one per TCP (or WebSocket) connection.
    ``handoffs``: a shard's, for plain TCP (transport/handoff.py); ``adopted``: the
    offer of a connection another shard handed here (admitted by the caller)."""

    def __init__(self, host: SessionHost, listener: str | None = None, *,
                 handoffs: Handoffs | None = None, adopted: HandoffOffer | None = None
                 ) -> None:
        super().__init__(host, listener)
        self.handoffs = handoffs
        self.adopted = adopted
        self.claim = AdoptedClaim()  # an adopted connection's moved claim
        if adopted is not None:
            self.admitted = True

    def make_session(self, transport: asyncio.Transport, remote: str) -> MqttSession:
        session = MqttSession(self.host, transport, remote,
                              push_topology=self.host.pushes_topology(self.listener))
        session.listener = self.listener
        session._handoff = self.handoffs
        return session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        offer, self.adopted = self.adopted, None
        session = self.session
        if offer is not None and session is not None:
            try:
                session.adopt(offer, self.claim.take(session._taken_over,
                                                          session._still_open))
            except (MeshmqError, ValueError, TypeError) as exc:
                log.warning("a handed-over MQTT connection could not be adopted: %s", exc)
                session.close()
            self.claim.started()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is None:
            self.claim.lost()  # adopted, but gone before it was served
        super().connection_lost(exc)


def _encode_will(will: Will) -> dict[str, object]:
    """A will as JSON, for the shard a connection is handed to (``_decode_will``)."""
    return {"topic": will.topic, "payload": base64.b64encode(will.payload).decode(),
            "qos": will.qos, "retain": will.retain,
            "properties": base64.b64encode(
                encode_properties(will.properties, WILL_CONTEXT)).decode()}


def _decode_will(data: object, level: int) -> Will | None:
    """The will of a handed-over connection (``MqttSession.handoff_state``)."""
    if not isinstance(data, dict):
        return None
    props = Properties()
    raw = base64.b64decode(str(data.get("properties") or ""))
    if level == PROTOCOL_LEVEL_5 and raw:
        props, _ = decode_properties(raw, 0, len(raw), WILL_CONTEXT)
    return Will(topic=str(data["topic"]), payload=base64.b64decode(str(data["payload"])),
                qos=int(data.get("qos", 0)), retain=bool(data.get("retain")),
                properties=props)


def _plain_credentials(data: bytes | None) -> tuple[str, str] | None:
    """SASL PLAIN: [authzid] NUL authcid NUL passwd; None if malformed."""
    parts = (data or b"").split(b"\0")
    if len(parts) != 3:
        return None
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")

