"""STOMP 1.0-1.2 server connections: the asyncio adapter around the protocol machine.

The protocol itself (states, version and heart-beat negotiation, which frame is
allowed when, escaping, timers) is ``meshmq.protocol.stomp.connection.StompConnection``,
which does no I/O. ``StompSession`` feeds it bytes and the clock, turns its events into
broker calls, renders deliveries through it and writes its bytes, and owns what is
asyncio's: output buffering, pausing reading under producer flow control or a slow
store, pausing dispatch when the socket's write buffer is full, and timers.
Confirmations that wait for the store (RECEIPTs) go through the runtime's
``Durability``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from meshmq import __version__
from meshmq.core.auth import Principal
from meshmq.core.consumer import AckMode, Consumer, ConsumerSpec
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import MAX_PRIORITY, MIN_PRIORITY, Message, PropertyValue
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.core.shard_txn import OutcomeUnknownError
from meshmq.core.stream import (
    FIRST_HEADER,
    NEXT_HEADER,
    OFFSET_HEADER,
    StreamQueue,
    parse_offset,
)
from meshmq.errors import (
    AuthorizationError,
    MeshmqError,
    ProtocolError,
)
from meshmq.protocol.stomp import OUTCOME_HEADER, Frame, encode_frame
from meshmq.protocol.stomp.connection import (
    HEARTBEAT_DUE,
    Connected,
    ConnectionState,
    Error,
    Event,
    PeerTimedOut,
    ProtocolViolation,
    Receipt,
    StompConnection,
)
from meshmq.protocol.stomp.encoder import FRAME_END, message_head_end
from meshmq.transport import stomp_names
from meshmq.transport.adapter import BufferedOutput, SessionProtocol, socket_open
from meshmq.transport.durability import NOT_STORED
from meshmq.transport.handoff import AdoptedClaim, HandoffOffer
from meshmq.transport.login import authenticate
from meshmq.transport.push_back import ProducerHold
from meshmq.transport.topology import PEERS_HEADER
from meshmq.transport.websocket import handoff_bytes, handoff_tried

if TYPE_CHECKING:
    from collections.abc import Callable

    from meshmq.core.broker import Connection
    from meshmq.transport.handoff import Handoffs
    from meshmq.transport.host import SessionHost

log = logging.getLogger("meshmq.stomp")

# Headers of SEND that are not user properties.
_SEND_RESERVED: Final = frozenset({
    "destination", "receipt", "transaction", "content-length", "content-type", "persistent",
    "priority", "expires", "JMSXGroupID", "JMSXGroupSeq", "reply-to", "correlation-id", "type",
    "message-id", "timestamp", "redelivered", "subscription", "ack", "JMSXUserID",
    "original-destination", "amq-msg-type", "x-stream-offset",
})
_ACK_MODES: Final = {"auto": AckMode.AUTO, "client": AckMode.CLIENT,
              "client-individual": AckMode.CLIENT_INDIVIDUAL}
_TRUE: Final = ("true", "1", "yes")
# Java's bounds for the fields ActiveMQ parses these headers into.
_INT_MAX: Final = 2**31 - 1
_LONG_MAX: Final = 2**63 - 1
_SCHEDULING_HEADERS: Final = ("AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT")
UNSYNCED_LIMIT: Final = 8 * 1024 * 1024
# Receipts before reading more: a connection with this many confirmations waiting for the
# store is not read (its frames already parsed wait too) until at most half of them wait.
# So a client pipelining receipted persistent SENDs gets receipt k before the broker reads
# SEND k + UNCONFIRMED_LIMIT, and the receipts it waits on to free its memory keep pace.
UNCONFIRMED_LIMIT: Final = 1024
# Frames of one connection handled per event-loop turn before the rest waits for the next.
FRAMES_PER_TURN: Final = 256
# The frames at which a shard offers a connection to its destination's owner.
_OFFER_COMMANDS: Final = frozenset({"SEND", "SUBSCRIBE"})
# Consumers of a closed connection unsubscribed per event-loop turn.
CONSUMERS_CLOSED_PER_TURN = 1000
# A MESSAGE body at least this large is written by reference, not copied into a frame.
LARGE_BODY: Final = 64 * 1024


class StompSession(BufferedOutput):
    """Per-connection STOMP state. Everything here runs on the event loop thread."""

    def __init__(self, host: SessionHost, transport: asyncio.Transport, remote: str,
                 *, push_topology: bool = False) -> None:
        self.host = host
        # Tell this client the peer brokers (its listener has update_cluster_clients).
        self.push_topology = push_topology
        self.broker = host.broker
        self.transport = transport
        self.remote = remote
        cfg = host.config.stomp
        self.cfg = cfg
        now = time.monotonic()
        self.machine = StompConnection(
            now, max_frame_size=cfg.max_frame_size, max_headers=cfg.max_headers,
            max_header_size=cfg.max_header_size, default_heartbeat=cfg.default_heartbeat,
            server_heartbeat_ms=cfg.server_heartbeat_ms, max_heartbeat_ms=cfg.max_heartbeat_ms,
            heartbeat_grace=cfg.heartbeat_grace, connect_timeout_s=cfg.connect_timeout_ms / 1000,
            frame_timeout_s=cfg.frame_timeout_ms / 1000)
        self.version = "1.0"
        self.conn: Connection | None = None
        self.closing = False
        self._out: list[bytes] = []
        self.confirms = host.durability.confirmations(
            flush=self.flush, closed=transport.is_closing, fail=self._not_stored,
            who=f"STOMP connection {remote}")
        self._consumer_index: dict[int, Consumer] = {}
        self._consumer_numbers: dict[Consumer, int] = {}
        # Per consumer, the start of its MESSAGE frames when nothing but the
        # subscription header is its own (no ack id, not redelivered).
        self._message_starts: dict[Consumer, bytes] = {}
        self._next_consumer_number = 1
        self._temp_names: dict[tuple[DestKind, str], Destination] = {}
        self._local_names: dict[Destination, str] = {}
        self.last_write = now
        self._hb_handle: asyncio.TimerHandle | None = None
        self.flow_blocked = False
        self._turn_yielded = False  # reading paused until the next loop turn
        self.blocked_since = 0.0  # monotonic time the current flow-control block began
        self._held: list[Event] = []  # events parsed but not handled while flow-blocked
        self._dest_cache: dict[str, tuple[Destination, ...]] = {}
        self._render_cache: dict[Destination, str] = {}
        self._cache_key = "stomp1.0"
        self._escape = self.machine.escape
        self._unsynced = 0  # bytes of persistent sends without receipt since the last sync
        self._store_waits = 0
        self._confirm_wait = False  # not read until its waiting receipts are out
        self.write_paused = False
        self._login_deferred = False  # CONNECT's answer comes later: reading is paused
        # On a node of shards: the client id's claim was asked, and its release.
        self._claimed = False
        self._release_claim: Callable[[], None] | None = None
        # On a node of shards: offer this connection to the owner of the destination of
        # its first SEND or SUBSCRIBE (transport/handoff.py); None once tried.
        self._handoff: Handoffs | None = None
        self.listener: str | None = None
        self._handing_off = False  # offered: reading paused until the owner answers
        # Slow-consumer push-back (transport/push_back.py): the destinations this read
        # sent to outside transactions (each once in a row), and the hold while reading
        # is paused for them.
        self._published: list[Destination] = []
        self._last_published: Destination | None = None
        self._hold = ProducerHold(host.push_back, self._push_back_released)
        self._settled = False  # this read ACKed or NACKed: held producers look again

    def _write(self, data: bytes) -> None:
        # BufferedOutput's, repeated here so that the compiled build runs it natively:
        # every delivered message and receipt goes through it.
        out = self._out
        if not out:
            self.host.mark_flush(self)
        out.append(data)

    # ------------------------------------------------------------ input

    def data_received(self, data: bytes) -> None:
        if self.closing:
            self.machine.last_read = time.monotonic()
            return
        events = self.machine.receive_data(data, time.monotonic())
        if not events:
            return
        if self._held:
            self._held.extend(events)  # still blocked: keep order behind held frames
            return
        self._process(events)

    def _process(self, events: list[Event]) -> None:
        for i, event in enumerate(events):
            if self.is_closing():
                break
            if i == FRAMES_PER_TURN:
                # One client's burst (say 100,000 pipelined SUBSCRIBEs) must not hold the
                # event loop: the rest waits for the next turn, after other connections.
                self._held = events[i:]
                self._yield_turn()
                break
            if not isinstance(event, Frame):
                if isinstance(event, ProtocolViolation):
                    self._violation(event)
                continue
            if self._handoff is not None and self.conn is not None and (
                    event.command in _OFFER_COMMANDS) and \
                    self._offer(events, i):
                return
            try:
                self.handle(event)
            except AuthorizationError as exc:
                self.refuse(exc.message, event)
            except MeshmqError as exc:
                self.fail(exc.message, event)
            except Exception:
                log.exception("internal error handling %s from %s", event.command, self.remote)
                self.fail("internal broker error", event)
            if event.command == "SEND" and self.broker.usage.full and not self.is_closing() \
                    and self.host.config.usage.on_limit == "block":
                # Producer flow control: hold this connection's remaining frames and stop
                # reading it until memory drains. Other connections are unaffected.
                self._held = list(events[i + 1:])
                self._block_producer()
                break
            if len(self.confirms) >= UNCONFIRMED_LIMIT and not self.is_closing():
                self._held = list(events[i + 1:])
                self._wait_for_confirms()
                break
        if self._published:
            self._check_push_back()
        self.host.request_pump()
        if self._settled:  # a window opened: look again once the pump refilled it
            self._settled = False
            self.host.push_back.wake_after_pump()
        self.flush()

    def _violation(self, event: ProtocolViolation) -> None:
        if event.unsupported_version:
            self._write(self.machine.send(Error(event.reason, event.frame,
                                                unsupported_version=True)))
            self.close()
            return
        self.fail(event.reason, event.frame)

    def is_closing(self) -> bool:
        return self.closing

    def handle(self, frame: Frame) -> None:
        """One client frame the machine allowed: the broker call it stands for."""
        if self.conn is None:
            self.on_connect(frame)
            return
        _HANDLERS[frame.command](self, frame)

    # ------------------------------------------------------------ CONNECT
    def on_connect(self, frame: Frame) -> None:
        # The machine has negotiated the version.
        version = self.version = self.machine.version
        self._cache_key = f"stomp{version}"
        self._escape = self.machine.escape
        # Answered at once, or later (a password hash checked off the event loop, a
        # refusal held back): until then this connection's input waits in the machine.
        authenticate(self, self.broker.auth, frame.get("login"), frame.get("passcode"),
                     lambda principal, refused: self._authenticated(frame, principal, refused))
        if self.machine.state is ConnectionState.AUTHENTICATING and not self.closing:
            self._login_deferred = True
            self.transport.pause_reading()

    def _authenticated(self, frame: Frame, principal: Principal | None,
                       refused: str | None) -> None:
        if principal is None:
            log.warning("authentication failed for %r from %s", frame.get("login"), self.remote)
            self.fail(refused or "authentication failed", frame)
            return
        if self._claim(frame, principal):
            return
        try:
            self._connected(frame, principal)
        except MeshmqError as exc:
            self.fail(exc.message, frame)
            return
        deferred = self._login_deferred
        if deferred:
            self._login_deferred = False
            self.transport.resume_reading()
        # What the client pipelined behind CONNECT (or sent while it was authenticated),
        # parsed with the negotiated version's escaping.
        events = self.machine.received_while_authenticating()
        if events:
            self._process(events)
        elif deferred:
            self.host.request_pump()
            self.flush()

    def _claim(self, frame: Frame, principal: Principal) -> bool:
        """On a node of shards: claim the client id from its owning shard first, so
        that it names one connection node-wide. True while the answer is awaited (the
        CONNECTED and the frames behind CONNECT wait)."""
        clients = self.host.durability.clients
        client_id = frame.get("client-id")
        if clients is None or self._claimed or not client_id:
            return False
        self._claimed = True
        answer, self._release_claim = clients.claim(client_id, "stomp", self._taken_over,
                                                    self._still_open)
        if answer.done() and not answer.cancelled() and answer.exception() is None:
            return False
        if not self._login_deferred:  # as for a password checked later
            self._login_deferred = True
            self.transport.pause_reading()

        def answered(fut: asyncio.Future[bytes | None]) -> None:
            if self.closing or fut.cancelled():
                return
            exc = fut.exception()
            if exc is None:
                self._authenticated(frame, principal, None)
            else:
                self.fail(getattr(exc, "message", str(exc)), frame)

        answer.add_done_callback(answered)
        return True

    def _still_open(self) -> bool:
        """Does the client still hold this connection? Asked when another shard claims
        its client id: the client's end may be in the socket, not yet read."""
        return not self.closing and socket_open(self.transport)

    def _taken_over(self) -> None:
        if not self.closing:
            self.fail("the client id was claimed by another connection to this node")

    def _connected(self, frame: Frame, principal: Principal) -> None:
        client_id = frame.get("client-id")
        self.conn = self.broker.open_connection(principal, client_id=client_id,
                                                remote=self.remote, protocol="stomp")
        self.host.register(self)
        peers = self.host.topology.header_value("stomp") if self.push_topology else None
        extra = ((PEERS_HEADER, peers),) if peers is not None else ()  # docs/client.md
        # Raises for an invalid heart-beat header (then connection_lost closes self.conn).
        self._write(self.machine.send(Connected(self.conn.id, f"meshmq/{__version__}",
                                                extra)))
        receipt = frame.get("receipt")
        if receipt:
            self.receipt(receipt)
        self._schedule_heartbeat()

    # ------------------------------------------------------------ handoff
    def _offer(self, events: list[Event], index: int) -> bool:
        """Offer this connection to the shard that owns the destination of the frame at
        ``index``, if the connection holds nothing yet (transport/handoff.py). True: it
        was offered, and the frames from ``index`` on wait for the owner's answer."""
        try:
            return self._try_offer(events, index)
        finally:
            handoff_tried(self.transport)  # offered at most once

    def _try_offer(self, events: list[Event], index: int) -> bool:
        handoffs, self._handoff = self._handoff, None
        conn = self.conn
        frame = events[index]
        if handoffs is None or conn is None or not isinstance(frame, Frame) or \
                conn.consumers or conn.transactions or \
                conn.temp_destinations or conn.principal.internal or self._temp_names or \
                len(self.confirms) or self.flow_blocked or \
                self.write_paused or self.closing or self.listener is None or \
                frame.get("transaction") is not None:
            return False
        text = frame.get("destination")
        if text is None:
            return False
        try:
            dests = self.destinations(text)
        except MeshmqError:
            return False  # handled here, to answer with the error
        if len(dests) != 1:
            return False
        dest = dests[0]
        if dest.is_temporary or dest.is_wildcard or dest.is_advisory:
            return False
        identity = handoffs.identity
        owner = identity.owner(dest)
        if owner == identity.index or not handoffs.owner_up(owner):
            return False
        # A client id goes with its claim, which the owner moves to the adopting shard.
        client_id = conn.client_id or ""
        claim = ""
        if client_id:
            clients = self.host.durability.clients
            claim = (clients.movable(client_id) if clients is not None else None) or ""
            if not claim:
                return False
        rest = self.machine.parser.unparsed()
        sock = self.transport.get_extra_info("socket")
        if rest is None or sock is None:
            return False
        # What this shard answered so far (the CONNECTED of a client that pipelined its
        # first SEND behind CONNECT) goes out first; only what reached the socket stays
        # in order with what the owner writes.
        self.flush()
        if self.transport.get_write_buffer_size():
            return False
        parts: list[bytes] = []
        for event in events[index:]:
            if isinstance(event, Frame):
                parts.append(encode_frame(event.command, event.headers, event.body,
                                          version=self.version, content_length=False))
            elif isinstance(event, ProtocolViolation):
                return False
        parts.append(rest)
        carried = handoff_bytes(self.transport, b"".join(parts))
        if carried is None:
            return False  # a WebSocket part-way through a message
        pending, websocket = carried
        principal = conn.principal
        machine = self.machine
        offer = HandoffOffer(
            "stomp", self.listener, self.version, machine.send_interval,
            machine.recv_interval, principal.user, tuple(sorted(principal.groups)),
            principal.anonymous, pending, client_id, claim, identity.index,
            websocket=websocket)
        answer = handoffs.offer(owner, offer, sock.fileno())  # None: too much pending
        if answer is None:
            return False
        self._handing_off = True
        self.transport.pause_reading()
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        waiting = events[index:]
        answer.add_done_callback(lambda fut: self._offer_answered(fut, waiting, client_id,
                                                                  claim))
        return True

    def _offer_answered(self, answer: asyncio.Future[bool], waiting: list[Event],
                        client_id: str = "", claim: str = "") -> None:
        self._handing_off = False
        clients = self.host.durability.clients
        if client_id and clients is not None and not answer.cancelled() and \
                answer.exception() is None:
            if answer.result():
                clients.handed(client_id, claim)  # moved: this shard releases nothing
                self._release_claim = None
            else:
                clients.kept(client_id, claim)
        if answer.cancelled() or answer.exception() is not None:
            if not self.closing:
                log.warning("STOMP connection %s: the shard it was handed to did not "
                            "answer; closing it (the client reconnects)", self.remote)
            self.closing = True
            self.transport.abort()
            return
        if answer.result():
            # The owner serves it now: let go of our descriptor, writing nothing.
            self.closing = True
            self.transport.abort()
            return
        if self.closing:
            return  # the client went away meanwhile
        self.transport.resume_reading()
        self.machine.reading_resumed(time.monotonic())
        self._schedule_heartbeat()
        self._process(waiting)

    def adopt(self, offer: HandoffOffer, release: Callable[[], None] | None = None) -> None:
        """Serve a connection another shard of the node handed here, as it was there:
        connected, with its negotiated version and heart-beats (and its client id, whose
        claim moved here: ``release`` ends it), then the bytes it had read and not
        handled."""
        machine = self.machine
        machine.adopt(offer.version, offer.send_interval, offer.recv_interval,
                      time.monotonic())
        self.version = offer.version
        self._cache_key = f"stomp{offer.version}"
        self._escape = machine.escape
        principal = Principal(offer.user, frozenset(offer.groups), anonymous=offer.anonymous)
        self._claimed = True  # (a CONNECT after this one is refused by the machine)
        self._release_claim = release
        self.conn = self.broker.open_connection(principal, client_id=offer.client_id or None,
                                                remote=self.remote, protocol="stomp")
        self.host.register(self)
        self._schedule_heartbeat()
        if offer.pending:
            self.data_received(offer.pending)

    # ------------------------------------------------------------ helpers
    def _resolve_temp(self, kind: DestKind, name: str) -> Destination:
        assert self.conn is not None
        key = (kind, name)
        dest = self._temp_names.get(key)
        if dest is None or not self.broker.temp_exists(dest):
            dest = self.broker.create_temp(self.conn, kind)
            self._temp_names[key] = dest
            self._local_names[dest] = name
        return dest

    def destinations(self, text: str) -> tuple[Destination, ...]:
        cached = self._dest_cache.get(text)
        if cached is not None:
            return cached
        dests = stomp_names.parse(text, self._resolve_temp)
        # Temporary destinations can be deleted and re-created; only cache the others.
        if not any(d.is_temporary for d in dests):
            if len(self._dest_cache) > 1000:
                self._dest_cache.clear()
            self._dest_cache[text] = dests
        return dests

    def receipt(self, receipt_id: str, extra: tuple[tuple[str, str], ...] = (), *,
                durable: bool = False, after: asyncio.Future[None] | None = None) -> None:
        """Send RECEIPT in order; ``durable``: only once the store has synced what the
        frame wrote; ``after``: and once that is done. ``extra``: more headers (a stream
        subscription's offsets)."""
        machine = self.machine
        self.confirms.confirm(lambda: self._write(machine.send(Receipt(receipt_id, extra))),
                              durable=durable, after=after)

    def _confirm(self, frame: Frame, needs_sync: bool) -> None:
        receipt = frame.get("receipt")
        if not receipt:
            return  # the store batch is written by the next pump; nobody waits for it
        self.receipt(receipt, durable=needs_sync)

    def _not_stored(self, reason: str) -> None:
        """A store sync failed under a pending RECEIPT: never confirm (see Durability)."""
        if self.closing:
            self.close()  # after DISCONNECT: the receipts are withheld, the close goes on
        else:
            self.fail(reason)

    # ------------------------------------------------------------ SEND
    def on_send(self, frame: Frame) -> None:
        assert self.conn is not None
        headers = frame.header_map()
        dest_text = headers.get("destination")
        if dest_text is None:
            raise ProtocolError("SEND frame is missing the required header 'destination'")
        dests = self.destinations(dest_text)
        message = self._message(headers, frame.body, dests[0])
        txn = headers.get("transaction")
        needs_sync = self.broker.send(self.conn, dests, message, txn)
        if txn is None:  # a transaction's sends wait for COMMIT: they hold nobody
            for dest in dests:
                if dest is not self._last_published:
                    self._last_published = dest
                    self._published.append(dest)
        self._confirm(frame, needs_sync)
        if needs_sync and "receipt" not in headers:
            self._unsynced += len(frame.body) + 256
            if self._unsynced > UNSYNCED_LIMIT:
                self._wait_for_store()

    def _wait_for_store(self) -> None:
        """Back-pressure for persistent sends without receipts: once a connection has
        this much unconfirmed data in the store's write queue, stop reading it until the
        store has caught up, so a disk slower than the producer cannot grow memory."""
        self._unsynced = 0
        synced = self.host.durability.sync_after_writes()
        self.transport.pause_reading()
        self._store_waits += 1

        def resume(fut: asyncio.Future[None]) -> None:
            self._store_waits -= 1
            failure = asyncio.CancelledError("store sync cancelled") if fut.cancelled() \
                else fut.exception()
            if failure is not None:
                self.fail(f"{NOT_STORED}: {failure}")
                return
            if not self.closing and not self.reading_held():
                self._resume_reading()

        synced.add_done_callback(resume)

    def _wait_for_confirms(self) -> None:
        """Receipts before reading more (UNCONFIRMED_LIMIT): stop reading until the store
        has let at least half of this connection's waiting confirmations out."""
        if self._confirm_wait:
            return
        self._confirm_wait = True
        self.transport.pause_reading()
        self.confirms.when_drained(UNCONFIRMED_LIMIT // 2, self._confirms_drained)

    def _confirms_drained(self) -> None:
        # A sync's done-callback, never inside the core: frames may be handled here.
        self._confirm_wait = False
        if self.closing or self._turn_yielded or self.flow_blocked:
            return  # closed, or _resume_turn / _resume_after_block go on with the frames
        held, self._held = self._held, []
        if held:
            self._process(held)
        if not self.closing and not self.reading_held():
            self._resume_reading()

    def _message(self, headers: dict[str, str], body: bytes, dest: Destination) -> Message:
        assert self.conn is not None
        now = self.broker.now_ms()
        priority = 4
        if "priority" in headers:
            priority = _int_header(headers, "priority", MIN_PRIORITY, MAX_PRIORITY)
        expiration = _int_header(headers, "expires", 0, _LONG_MAX) if "expires" in headers \
            else 0
        group_seq = 0
        if "JMSXGroupSeq" in headers:
            # -1 closes the group; other sequence numbers count from 1 (0: not set).
            group_seq = _int_header(headers, "JMSXGroupSeq", -1, _INT_MAX)
        if "AMQ_SCHEDULED_DELAY" in headers or "AMQ_SCHEDULED_PERIOD" in headers \
                or "AMQ_SCHEDULED_REPEAT" in headers:
            _check_scheduling(headers)
        reply_to = None
        if headers.get("reply-to"):
            reply_dests = self.destinations(headers["reply-to"])
            reply_to = reply_dests[0]
        props: dict[str, PropertyValue] = {k: v for k, v in headers.items()
                                           if k not in _SEND_RESERVED}
        return Message(
            message_id=self.broker.new_message_id(self.conn.id),
            destination=dest, body=body, properties=props,
            persistent=headers.get("persistent", "").lower() in _TRUE,
            priority=priority, timestamp=now, expiration=expiration,
            correlation_id=headers.get("correlation-id"), reply_to=reply_to,
            type=headers.get("type"), group_id=headers.get("JMSXGroupID"),
            group_seq=group_seq, producer_id=self.conn.id,
            user_id=self.conn.principal.user, content_type=headers.get("content-type"))

    # ------------------------------------------------------------ SUBSCRIBE
    def on_subscribe(self, frame: Frame) -> None:
        assert self.conn is not None
        h = frame.header_map()
        dest_text = h["destination"]
        sub_id = h.get("id") or dest_text  # STOMP 1.0 allows no id
        ack_text = h.get("ack", "auto")
        ack_mode = _ACK_MODES.get(ack_text)
        if ack_mode is None:
            raise ProtocolError(f"invalid ack mode {ack_text!r}: use auto, client or "
                                "client-individual")
        prefetch = _int_header(h, "activemq.prefetchSize", 0, _INT_MAX) \
            if "activemq.prefetchSize" in h else None
        # A consumer's priority is a Java byte in ActiveMQ.
        priority = _int_header(h, "activemq.priority", -128, 127) if "activemq.priority" in h \
            else 0
        selector = h.get("selector")
        if selector is not None and not selector.strip():
            selector = None
        spec = ConsumerSpec(
            destinations=self.destinations(dest_text), ack_mode=ack_mode, prefetch=prefetch,
            priority=priority, exclusive=h.get("activemq.exclusive", "").lower() in _TRUE,
            selector=selector, no_local=h.get("activemq.noLocal", "").lower() in _TRUE,
            browser=h.get("browser", "").lower() in _TRUE,
            subscription_name=h.get("activemq.subscriptionName")
            or h.get("durable-subscription-name"),
            retroactive=h.get("activemq.retroactive", "").lower() in _TRUE)
        # RECEIPT goes out before any MESSAGE of the new subscription.
        receipt = frame.get("receipt")
        offset_text = h.get(OFFSET_HEADER)
        stream_offset = parse_offset(offset_text) if offset_text is not None else None
        consumer = self.broker.subscribe(self.conn, sub_id, spec, stream_offset=stream_offset)
        number = self._next_consumer_number
        self._next_consumer_number += 1
        self._consumer_index[number] = consumer
        self._consumer_numbers[consumer] = number
        if receipt:
            # meshmq extension: a stream subscription's receipt tells its offsets.
            streams = [q for q in consumer.sources if isinstance(q, StreamQueue)]
            extra = ((FIRST_HEADER, str(streams[0].first_offset)),
                     (NEXT_HEADER, str(streams[0].next_offset))) if streams else ()
            self.receipt(receipt, extra, after=self.host.durability.opened((consumer,)))
        self.host.request_pump()

    def on_unsubscribe(self, frame: Frame) -> None:
        assert self.conn is not None
        sub_id = frame.get("id") or frame.get("destination")
        durable_name = frame.get("activemq.subscriptionName") or \
            frame.get("durable-subscription-name")
        consumer = self.conn.consumers.get(sub_id or "")
        if consumer is None and durable_name is None:
            raise ProtocolError(f"no subscription with id {sub_id!r}")
        if consumer is not None:
            self.broker.unsubscribe(self.conn, consumer)
            number = self._consumer_numbers.pop(consumer, None)
            if number is not None:
                del self._consumer_index[number]
            self._message_starts.pop(consumer, None)
        if durable_name is not None:
            self.broker.remove_durable(self.conn, durable_name)
        self._confirm(frame, False)

    # ------------------------------------------------------------ ACK / NACK
    def _find_ack(self, frame: Frame) -> tuple[Consumer, int]:
        assert self.conn is not None
        if self.version == "1.2":
            ack_id = frame.get("id") or ""
            number_text, _, tag_text = ack_id.partition("-")
            try:
                consumer = self._consumer_index[int(number_text)]
                return consumer, int(tag_text)
            except (KeyError, ValueError):
                raise ProtocolError(f"unexpected ACK/NACK: unknown ack id {ack_id!r}",
                                    code="unknown-ack") from None
        message_id = frame.get("message-id") or ""
        sub_id = frame.get("subscription")
        candidates = [self.conn.consumers[sub_id]] if sub_id in self.conn.consumers else \
            list(self.conn.consumers.values())
        for consumer in candidates:
            tag = consumer.by_message_id.get(message_id)
            if tag is not None:
                return consumer, tag
        raise ProtocolError(f"unexpected ACK/NACK for message-id {message_id!r}: it is not "
                            "awaiting acknowledgement", code="unknown-ack")

    def on_ack(self, frame: Frame) -> None:
        assert self.conn is not None
        consumer, tag = self._find_ack(frame)
        needs_sync = self.broker.ack(self.conn, consumer, tag,
                                     cumulative=consumer.ack_mode is AckMode.CLIENT,
                                     txn=frame.get("transaction"))
        self._settled = True
        self._confirm_settle(frame, consumer, needs_sync)

    def on_nack(self, frame: Frame) -> None:
        assert self.conn is not None  # the machine refuses NACK in STOMP 1.0
        consumer, tag = self._find_ack(frame)
        needs_sync = self.broker.nack(self.conn, consumer, tag,
                                      cumulative=consumer.ack_mode is AckMode.CLIENT,
                                      txn=frame.get("transaction"))
        self._settled = True
        self._confirm_settle(frame, consumer, needs_sync)

    def _confirm_settle(self, frame: Frame, consumer: Consumer, needs_sync: bool) -> None:
        """An ACK's or NACK's RECEIPT: after the local sync, and on a shard of several
        after the owner of a relayed consumer's messages stored the settlement."""
        receipt = frame.get("receipt")
        if receipt:
            self.receipt(receipt, durable=needs_sync,
                         after=self.host.durability.settled((consumer,)))

    # ------------------------------------------------------------ transactions
    def on_begin(self, frame: Frame) -> None:
        assert self.conn is not None
        self.broker.begin(self.conn, frame.get("transaction") or "")
        self._confirm(frame, False)

    def on_commit(self, frame: Frame) -> None:
        assert self.conn is not None
        needs_sync = self.broker.commit(self.conn, frame.get("transaction") or "")
        across = self.host.durability.committed(self.conn)
        if across is None:
            self._confirm(frame, needs_sync)
            return
        # Across shards: confirmed once the decision to commit is durable; if the
        # transaction rolls back instead, the connection fails (RECEIPT or not) with
        # why, and nothing after the COMMIT is confirmed.
        txn_id = frame.get("transaction") or ""
        decided: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def outcome(fut: asyncio.Future[None]) -> None:
            # The ERROR answers the COMMIT (its receipt echoed) and says, in a header
            # clients read instead of the text, whether the outcome is known.
            why = "cancelled" if fut.cancelled() else fut.exception()
            if why is None:
                decided.set_result(None)
            elif isinstance(why, OutcomeUnknownError):  # not rolled back: not known
                self.fail(f"transaction {txn_id!r} {why}", frame,
                          headers=((OUTCOME_HEADER, "unknown"),))
            else:
                self.fail(f"transaction {txn_id!r} was rolled back: {why}", frame,
                          headers=((OUTCOME_HEADER, "rolled-back"),))

        across.add_done_callback(outcome)
        receipt = frame.get("receipt")
        if receipt:
            self.receipt(receipt, durable=needs_sync, after=decided)
        else:
            self.confirms.confirm(lambda: None, durable=needs_sync, after=decided)

    def on_abort(self, frame: Frame) -> None:
        assert self.conn is not None
        self.broker.abort(self.conn, frame.get("transaction") or "")
        self._confirm(frame, False)

    def on_disconnect(self, frame: Frame) -> None:
        # On a node: the client id's release is on its way to its owner before the
        # RECEIPT, so a CONNECT right after it through another shard finds the id free.
        release, self._release_claim = self._release_claim, None
        if release is not None:
            release()
        receipt = frame.get("receipt")
        if receipt:
            self.receipt(receipt)
        self.closing = True
        # Closed once every receipt before it (the DISCONNECT's own included) is out.
        self.confirms.confirm(self.close, durable=False)

    # ------------------------------------------------------------ output
    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        if self.closing:
            return
        consumer = outcome.consumer
        if isinstance(outcome, BrowseEnd):
            self._write(encode_frame("MESSAGE", [
                ("subscription", consumer.subscription_id), ("message-id", "BrowserDone"),
                ("destination", stomp_names.render(consumer.spec.destinations[0],
                                                   self._local_names)),
                ("browser", "end")], version=self.version))
            return
        msg = outcome.message
        head_end = self._head_end(msg)
        # message-id is in the shared block: it is the same for every subscriber.
        acked = self.version == "1.2" and consumer.ack_mode is not AckMode.AUTO \
            and not consumer.spec.browser
        if acked or outcome.delivery_count > 1:
            per: list[tuple[str, str]] = [("subscription", consumer.subscription_id)]
            if acked:
                per.append(("ack", f"{self._consumer_numbers.get(consumer, 0)}-{outcome.tag}"))
            if outcome.redelivered:
                per.append(("redelivered", "true"))
            if outcome.delivery_count > 1:
                per.append(("JMSXDeliveryCount", str(outcome.delivery_count)))
            start = self.machine.message_start(per)
        else:
            # The common case (auto ack, first delivery): the same start every time.
            plain = self._message_starts.get(consumer)
            if plain is None:
                plain = self.machine.message_start([("subscription",
                                                     consumer.subscription_id)])
                self._message_starts[consumer] = plain
            start = plain
        body = msg.body
        if len(body) < LARGE_BODY:
            self._write(b"".join((start, head_end, body, FRAME_END)))
        else:
            self._write_parts(start + head_end, body, FRAME_END)

    def _head_end(self, msg: Message) -> bytes:
        """The MESSAGE head every subscriber of ``msg`` shares (its header block, the
        body's content-length and the blank line), encoded once per message and STOMP
        version (per connection when temporary destinations appear, since they render
        differently for their owner)."""
        cache_key = self._cache_key
        cache = msg.wire_cache
        if cache is not None:
            # Only a message without temporary destinations is ever cached here.
            cached = cache.get(cache_key)
            if cached is not None:
                return cached
        temp = msg.destination.is_temporary or (msg.reply_to is not None
                                                and msg.reply_to.is_temporary)
        esc = self._escape
        parts = [f"message-id:{esc(msg.message_id)}\n"
                 f"destination:{self._rendered(msg.destination, temp)}\n"
                 f"timestamp:{msg.timestamp}\nexpires:{msg.expiration}\n"
                 f"priority:{msg.priority}\n"]
        if msg.persistent:
            parts.append("persistent:true\n")
        if msg.correlation_id is not None:
            parts.append(f"correlation-id:{esc(msg.correlation_id)}\n")
        if msg.reply_to is not None:
            parts.append(f"reply-to:{self._rendered(msg.reply_to, temp)}\n")
        if msg.type is not None:
            parts.append(f"type:{esc(msg.type)}\n")
        if msg.group_id is not None:
            parts.append(f"JMSXGroupID:{esc(msg.group_id)}\nJMSXGroupSeq:{msg.group_seq}\n")
        if msg.original_destination is not None:
            parts.append(f"original-destination:"
                         f"{self._rendered(msg.original_destination, temp)}\n")
        if msg.content_type is not None:
            parts.append(f"content-type:{esc(msg.content_type)}\n")
        for key, value in msg.properties.items():
            if key and key != "content-length":  # content-length is the body's own
                parts.append(f"{esc(key)}:{esc(_prop_text(value))}\n")
        block = message_head_end("".join(parts).encode("utf-8", "surrogateescape"), msg.body)
        if not temp:
            if msg.wire_cache is None:
                msg.wire_cache = {}
            msg.wire_cache[cache_key] = block
        return block

    def _rendered(self, dest: Destination, temp: bool) -> str:
        """The escaped STOMP name of ``dest`` for this connection (cached)."""
        if temp and dest.is_temporary:
            return self._escape(stomp_names.render(dest, self._local_names))
        text = self._render_cache.get(dest)
        if text is None:
            text = self._escape(stomp_names.render(dest, self._local_names))
            if len(self._render_cache) > 1000:
                self._render_cache.clear()
            self._render_cache[dest] = text
        return text

    # ------------------------------------------------------------ failure and close
    def refuse(self, reason: str, frame: Frame) -> None:
        """A frame the user may not send (not authorized): ERROR, with the frame's
        receipt-id and no RECEIPT, and the connection stays open, as in ActiveMQ
        (the core has logged it)."""
        if self.closing:
            return
        self._error(reason, frame, fatal=False)

    def fail(self, reason: str, frame: Frame | None = None, *,
             headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Send ERROR with ``reason`` and close; only this connection is affected."""
        if self.closing:
            return
        log.info("closing STOMP connection %s: %s", self.remote, reason)
        self._error(reason, frame, fatal=True, headers=headers)
        self.flush()
        self.close()

    def _error(self, reason: str, frame: Frame | None, *, fatal: bool,
               headers: tuple[tuple[str, str], ...] = ()) -> None:
        self._write(self.machine.send(Error(reason, frame, fatal=fatal, headers=headers)))

    def close_by_admin(self) -> None:
        self.fail("connection closed by an administrator")

    def close(self) -> None:
        if not self.closing:
            self.closing = True
        self.flush()
        self.transport.close()

    def connection_lost(self) -> None:
        self.closing = True
        release, self._release_claim = self._release_claim, None
        if release is not None:
            release()
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        if self.flow_blocked:
            self.broker.usage.cancel_wait(self._unblock_producer)
        self._hold.end()
        if self.conn is not None:
            self.host.unregister(self)
            self._close_step(self.conn)

    def _close_step(self, conn: Connection) -> None:
        # A connection with very many subscriptions is taken apart over several event-loop
        # turns, so that other clients are served in between.
        done = self.broker.close_connection_step(conn, CONSUMERS_CLOSED_PER_TURN)
        self.host.request_pump()
        if not done:
            asyncio.get_running_loop().call_soon(self._close_step, conn)

    # ------------------------------------------------------------ timers
    def check_timeouts(self, now: float) -> None:
        """Called about every half second by the runtime."""
        if self.closing or self._handing_off:
            return
        if self.flow_blocked:
            block_timeout = self.host.config.usage.block_timeout_ms
            if block_timeout and now - self.blocked_since > block_timeout / 1000:
                self.fail(f"send refused: the broker's memory limit was reached and this "
                          f"producer was blocked for more than {block_timeout} ms "
                          "(usage.block_timeout_ms); frames after the last receipt were "
                          "not accepted")
                return
        self._due(now)

    def _due(self, now: float) -> None:
        """Act on what the machine says is due: a heart-beat to send, a client that
        missed a deadline (a paused client is ours to blame, so its clocks stop)."""
        machine = self.machine
        machine.last_write = self.last_write
        for due in machine.timeouts(now, reading_held=self.reading_held()):
            if due is HEARTBEAT_DUE:
                self._write(machine.send(HEARTBEAT_DUE))
                self.flush()
            elif isinstance(due, PeerTimedOut):
                self.fail(due.reason)
                return

    def _schedule_heartbeat(self) -> None:
        delay = self.machine.heartbeat_delay()
        if delay is not None:
            self._hb_handle = asyncio.get_running_loop().call_later(delay,
                                                                    self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        if self.closing:
            return
        self._due(time.monotonic())
        if not self.closing:
            self._schedule_heartbeat()

    # ------------------------------------------------------------ flow control
    def _block_producer(self) -> None:
        """The broker's memory is full after this connection's SEND: stop reading it
        until memory drains. (With ``on_limit = "fail"`` the core rejects sends.)"""
        self.flow_blocked = True
        self.blocked_since = time.monotonic()
        self.transport.pause_reading()
        self.broker.usage.wait_for_space(self._unblock_producer)

    def _yield_turn(self) -> None:
        self._turn_yielded = True
        self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._resume_turn)

    def _resume_turn(self) -> None:
        self._turn_yielded = False
        if self.closing or self._confirm_wait:
            return  # _confirms_drained goes on with the held frames
        held, self._held = self._held, []
        self._process(held)
        if not self.reading_held():
            self._resume_reading()

    def reading_held(self) -> bool:
        """Whether the broker, not the client, stopped reading this connection."""
        return self.flow_blocked or self._turn_yielded or self._store_waits > 0 or \
            self._confirm_wait or bool(self._hold.held)

    def _check_push_back(self) -> None:
        """After a read: stop reading while a destination it sent to is slow."""
        published, self._published = self._published, []
        self._last_published = None
        if self.conn is not None and not self.closing and \
                self._hold.check(published, self.conn.id):
            self.transport.pause_reading()

    def _push_back_released(self) -> None:
        if not self.closing and not self.reading_held():
            self._resume_reading()

    def _unblock_producer(self) -> None:
        # Called from inside the core (a refund during someone else's ack): never
        # re-enter the broker from here; continue on the next loop turn.
        asyncio.get_running_loop().call_soon(self._resume_after_block)

    def _resume_after_block(self) -> None:
        self.flow_blocked = False
        if self.closing:
            return
        if self._turn_yielded or self._confirm_wait:
            return  # _resume_turn / _confirms_drained go on with the held frames
        held, self._held = self._held, []
        if held:
            self._process(held)
        if not self.closing and not self.reading_held():
            self._resume_reading()

    def _resume_reading(self) -> None:
        # The client's clocks restart: it could not be read while we held it.
        self.machine.reading_resumed(time.monotonic())
        self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.conn is not None:
            self.broker.set_paused(self.conn, True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.conn is not None:
            self.broker.set_paused(self.conn, False)
            self.host.request_pump()
            self.host.push_back.wake_after_pump()


def _int_header(headers: dict[str, str], name: str, low: int, high: int) -> int:
    """The integer value of header ``name``, refused unless ``low <= value <= high``.

    The bounds are those of the Java type ActiveMQ gives the header (a byte, int or long
    field), so a value ActiveMQ would reject is refused here too, with the header named.
    """
    value = headers[name]
    text = value.strip()
    # Digits are counted before int() so a huge number costs nothing and fails cleanly.
    if len(text) <= 20:
        try:
            number = int(text)
        except ValueError:
            pass
        else:
            if low <= number <= high:
                return number
    raise ProtocolError(f"header {name!r} must be an integer from {low} to {high}, "
                        f"got {_short(value)!r}")


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _check_scheduling(headers: dict[str, str]) -> None:
    """ActiveMQ's scheduler headers are kept as message properties (meshmq has no
    scheduler, as ActiveMQ with ``schedulerSupport=false``), but nonsense is refused."""
    for name in _SCHEDULING_HEADERS:
        if name in headers:
            _int_header(headers, name, 0, _LONG_MAX)


def _prop_text(value: PropertyValue) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


_HANDLERS: Final = {
    "SEND": StompSession.on_send,
    "SUBSCRIBE": StompSession.on_subscribe,
    "UNSUBSCRIBE": StompSession.on_unsubscribe,
    "ACK": StompSession.on_ack,
    "NACK": StompSession.on_nack,
    "BEGIN": StompSession.on_begin,
    "COMMIT": StompSession.on_commit,
    "ABORT": StompSession.on_abort,
    "DISCONNECT": StompSession.on_disconnect,
}


class StompProtocol(SessionProtocol[StompSession]):
    """The asyncio adapter for STOMP: one per TCP (or WebSocket) connection.
    ``handoffs``: a shard's, for plain TCP (transport/handoff.py); ``adopted``: the
    offer of a connection another shard handed here (admitted by the caller)."""

    def __init__(self, host: SessionHost, listener: str | None = None, *,
                 handoffs: Handoffs | None = None, adopted: HandoffOffer | None = None
                 ) -> None:
        super().__init__(host, listener)
        self.handoffs = handoffs
        self.adopted = adopted
        # An adopted connection's moved claim (transport/handoff.py's AdoptedClaim).
        self.claim = AdoptedClaim()
        if adopted is not None:
            self.admitted = True

    def make_session(self, transport: asyncio.Transport, remote: str) -> StompSession:
        session = StompSession(self.host, transport, remote,
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
            except MeshmqError as exc:
                session.fail(exc.message)
            self.claim.started()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is None:
            self.claim.lost()  # adopted, but gone before it was served
        super().connection_lost(exc)
