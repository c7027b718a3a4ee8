"""Handing a client's connection to the shard that owns its destination.

On a node of shards a connection lands on whichever shard the kernel picks. When its
destination is owned by another shard, every message it sends or receives crosses an
in-host link: encoded, decoded and routed twice, about 1.6-1.8x the CPU of one broker
(docs/design.md, "What a crossing costs"). Most busy connections use one destination
(a producer to one queue, a consumer of one queue), so a shard hands such a connection,
at its first SEND or SUBSCRIBE, to the destination's owner instead: the socket itself
travels (``SCM_RIGHTS`` over a Unix ``SOCK_SEQPACKET`` socket in the node's private run
directory) with what the session had negotiated (STOMP version, heart-beats, the
authenticated user) and the bytes it had read but not handled, starting with that
frame (MQTT: what CONNECT negotiated, and the will). The owner adopts the socket as if
it had accepted it and goes on from there; the client sees nothing but its messages no
longer crossing. A connection that later uses destinations of other shards crosses for
those, as before.

Only a connection that holds nothing on this shard is handed over: no subscription,
transaction, temporary destination, confirmation or output waiting (MQTT: no QoS 1/2
exchange in progress; a persistent session's state travels with it, and a resumed one
subscribed to one shard's topics goes at its CONNECT), and only plain TCP or plain
WebSocket (a TLS session's keys live in this process). A WebSocket goes with what it
negotiated, and its pending bytes are the session's, then the client's bytes the
WebSocket codec had not parsed yet, which the adopting shard's codec goes on from
(transport/websocket.py). Each connection is offered at most once. A client id goes
with it: the offer names the claim this shard holds on it, and the adopting shard has
the id's owner move that claim to itself (network/shard_clients.py) before it says
yes, so the id is held throughout. The owner
says yes or no before the offering shard lets go: on no (its listener is full, it is
stopping, the claim could not move) the offering shard handles the frames itself, as
without handoff; with no answer in time the connection is closed (the
client's failover reconnects), since the owner may already be reading it.

Written by hand: no library passes asyncio connections between processes. One offer is
one datagram: a JSON head, a NUL, then the pending bytes, with the socket attached; a
producer that pipelines reads hundreds of KiB at a time, more than a datagram takes, so
larger pending bytes travel in a second descriptor, an anonymous memory file
(``memfd_create``; shards run on Linux only).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from meshmq.core.shards import ShardIdentity

__all__ = ["MAX_PENDING", "AdoptedClaim", "HandoffOffer", "HandoffStats", "Handoffs",
           "datagram"]

log = logging.getLogger("meshmq.shards")

# Bytes read but not handled that an offer may carry: up to INLINE_PENDING in the
# datagram (well under the default socket buffer that bounds one SOCK_SEQPACKET
# datagram), more in a memory file. A connection with more waiting is not handed over
# (the parser holds a frame's large body apart and is then not offered at all).
INLINE_PENDING = 32 * 1024
MAX_PENDING = 16 * 1024 * 1024
_MAX_DATAGRAM = INLINE_PENDING + 8 * 1024
# How long the offering shard waits for the owner's answer before it gives up on the
# connection (an owner that does not answer in this time is stuck or gone).
ANSWER_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class HandoffOffer:
    """What travels with a handed-over connection."""

    protocol: str  # "stomp" or "mqtt"
    listener: str  # the listener it was accepted on: its max_connections counts it
    version: str  # the negotiated STOMP version, or the MQTT protocol level
    send_interval: float  # negotiated heart-beats, seconds (0: none); MQTT: 0
    recv_interval: float
    user: str
    groups: tuple[str, ...]
    anonymous: bool
    pending: bytes = b""  # read but not handled, from the frame that caused the offer
    # The client id and the claim on it that the offering shard ``shard`` holds: the
    # adopting shard has the id's owner move the claim to it before it says yes.
    client_id: str = ""
    claim: str = ""
    shard: int = -1
    # MQTT: what CONNECT negotiated (transport/mqtt_server.py's ``handoff_state``).
    session: dict[str, Any] | None = None
    # Over WebSocket: what it negotiated (``subprotocol``, ``path``, ``text``) and
    # ``inner``: ``pending`` is the session's bytes up to there, then the WebSocket
    # codec's (transport/websocket.py's ``handoff_bytes``).
    websocket: dict[str, Any] | None = None

    @property
    def persistent_session(self) -> bool:
        """An MQTT persistent session's (handed at its CONNECT, or with its expiry)."""
        session = self.session or {}
        return bool(session.get("connect")) or "expiry" in session

    def encode(self, token: str, offer_id: int, *, inline: bool = True) -> bytes:
        """The datagram; ``inline=False``: the pending bytes travel in a memory file."""
        head = asdict(self)
        del head["pending"]
        head["token"] = token
        head["id"] = offer_id
        head["in_file"] = not inline
        return json.dumps(head, separators=(",", ":")).encode() + b"\0" + (
            self.pending if inline else b"")

    @staticmethod
    def decode(data: bytes) -> tuple[HandoffOffer, str, int, bool]:
        """The offer, the token it carried, its id and whether its pending bytes are in
        a memory file; ValueError if malformed."""
        head_bytes, sep, pending = data.partition(b"\0")
        if not sep:
            raise ValueError("no end of head")
        head: dict[str, Any] = json.loads(head_bytes)
        if not isinstance(head, dict):
            raise ValueError("the head is not an object")
        token = str(head.pop("token"))
        offer_id = int(head.pop("id"))
        in_file = bool(head.pop("in_file", False))
        head["groups"] = tuple(str(g) for g in head["groups"])
        if head.get("session") is not None and not isinstance(head["session"], dict):
            raise ValueError("the session is not an object")
        websocket = head.get("websocket")
        if websocket is not None and not _websocket_state(websocket):
            raise ValueError("the WebSocket state is not an object with a subprotocol")
        return HandoffOffer(pending=pending, **head), token, offer_id, in_file


@dataclass(slots=True)
class HandoffStats:
    """Counters for ``/api/broker``'s ``handoffs``."""

    offered: int = 0  # connections this shard offered to their destination's owner
    handed: int = 0  # ... that the owner took
    declined: int = 0  # ... that the owner declined (handled here instead)
    lost: int = 0  # ... with no answer in time (closed)
    adopted: int = 0  # connections other shards handed to this one
    refused: int = 0  # offers this shard declined
    sessions: int = 0  # ... of the adopted: MQTT persistent sessions

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class AdoptedClaim:
    """The client-id claim that moved with an adopted connection, until its session
    holds it: a take-over that comes first closes the session as it starts, and a
    connection gone before its session started releases the claim."""

    def __init__(self) -> None:
        self.release: Callable[[], None] | None = None  # set once the claim moved here
        self._close: Callable[[], None] | None = None
        self._alive: Callable[[], bool] | None = None
        self._closed_early = False

    def alive(self) -> bool:
        """Does the connection still hold the id (asked for a STOMP claim of it)? Its
        session's answer once it started; until then, yes."""
        return self._alive() if self._alive is not None else True

    def close(self) -> None:
        """The owner gave the client id to another connection."""
        if self._close is not None:
            self._close()
        else:
            self._closed_early = True

    def take(self, close: Callable[[], None], alive: Callable[[], bool]
             ) -> Callable[[], None] | None:
        """The session's: its take-over ``close`` and whether its client is still there;
        returns the release it calls."""
        self._close = close
        self._alive = alive
        release, self.release = self.release, None
        return release

    def started(self) -> None:
        if self._closed_early and self._close is not None:
            self._closed_early = False
            self._close()

    def lost(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()


class _Channel:
    """This shard's connection to one owner's handoff socket and the offers waiting
    for its answers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.waiting: dict[int, asyncio.Future[bool]] = {}


class Handoffs:
    """A shard's end of connection handoff: offers connections to their owners and
    adopts those offered to it. ``adopt(offer, sock)`` makes a session of a received
    socket and says whether it did, at once or, when a client id's claim must move
    first, as a future; ``owner_up(k)`` whether shard k's link is up."""

    def __init__(self, identity: ShardIdentity, owner_up: Callable[[int], bool],
                 adopt: Callable[[HandoffOffer, socket.socket],
                                 bool | asyncio.Future[bool]]) -> None:
        self.identity = identity
        self.owner_up = owner_up
        self._adopt = adopt
        self.stats = HandoffStats()
        self._ids = itertools.count(1)
        self._server: socket.socket | None = None
        self._accepted: set[socket.socket] = set()
        self._channels: dict[int, _Channel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        path = self.identity.handoff_socket(self.identity.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a shard that was killed
        server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen(64)
        server.setblocking(False)
        self._server = server
        loop.add_reader(server.fileno(), self._accept)

    def stop(self) -> None:
        loop = self._loop
        if self._server is not None and loop is not None:
            loop.remove_reader(self._server.fileno())
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.identity.handoff_socket(self.identity.index))
        for sock in list(self._accepted):
            self._drop_accepted(sock)
        for index in list(self._channels):
            self._drop_channel(index)

    # ------------------------------------------------------------ offering
    def offer(self, owner: int, offer: HandoffOffer, fd: int) -> asyncio.Future[bool] | None:
        """Offer the connection on socket ``fd`` to shard ``owner``: a future of its answer
        (True: taken; False: declined, handle it here; an exception: no answer in time,
        so its fate is unknown), or None when the offer could not be sent (handle it here)."""
        loop = self._loop
        if loop is None or len(offer.pending) > MAX_PENDING:
            return None
        channel = self._channel(owner)
        if channel is None:
            return None
        offer_id = next(self._ids)
        encoded = datagram(offer, self.identity.token, offer_id)
        if encoded is None:
            log.debug("a connection not offered to shard %d: its head is too large", owner)
            return None
        data, inline = encoded
        fds = [fd]
        try:
            if not inline:
                fds.append(_memory_file(offer.pending))
            socket.send_fds(channel.sock, [data], fds)
        except OSError as exc:  # a full or broken channel: not offered
            log.debug("handoff to shard %d not sent: %s", owner, exc)
            self._drop_channel(owner)
            return None
        finally:
            for extra in fds[1:]:
                os.close(extra)  # the owner has its own copy
        self.stats.offered += 1
        answer: asyncio.Future[bool] = loop.create_future()
        channel.waiting[offer_id] = answer
        timer = loop.call_later(ANSWER_TIMEOUT_S, self._no_answer, owner, offer_id)
        answer.add_done_callback(lambda _f: timer.cancel())
        return answer

    def _channel(self, owner: int) -> _Channel | None:
        channel = self._channels.get(owner)
        if channel is not None:
            return channel
        assert self._loop is not None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self.identity.handoff_socket(owner))
        except OSError as exc:
            sock.close()
            log.debug("no handoff channel to shard %d: %s", owner, exc)
            return None
        sock.setblocking(False)
        channel = self._channels[owner] = _Channel(sock)
        self._loop.add_reader(sock.fileno(), self._answers, owner)
        return channel

    def _answers(self, owner: int) -> None:
        channel = self._channels.get(owner)
        if channel is None:
            return
        while True:
            try:
                data = channel.sock.recv(256)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the owner closed its end (it stopped or died)
                self._drop_channel(owner)
                return
            try:
                answer = json.loads(data)
                offer_id, taken = int(answer["id"]), bool(answer["taken"])
            except (ValueError, KeyError, TypeError):
                log.warning("shard %d sent a malformed handoff answer; closing the channel",
                            owner)
                self._drop_channel(owner)
                return
            fut = channel.waiting.pop(offer_id, None)
            if fut is not None and not fut.done():
                if taken:
                    self.stats.handed += 1
                else:
                    self.stats.declined += 1
                fut.set_result(taken)

    def _no_answer(self, owner: int, offer_id: int) -> None:
        channel = self._channels.get(owner)
        fut = channel.waiting.pop(offer_id, None) if channel is not None else None
        if fut is not None and not fut.done():
            self.stats.lost += 1
            fut.set_exception(TimeoutError(f"shard {owner} did not answer a handoff"))

    def _drop_channel(self, owner: int) -> None:
        channel = self._channels.pop(owner, None)
        if channel is None:
            return
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(channel.sock.fileno())
        channel.sock.close()
        for fut in channel.waiting.values():
            if not fut.done():
                self.stats.lost += 1
                fut.set_exception(ConnectionError(f"the handoff channel to shard {owner} "
                                                  "closed before its answer"))
        channel.waiting.clear()

    # ------------------------------------------------------------ adopting
    def _accept(self) -> None:
        assert self._server is not None and self._loop is not None
        while True:
            try:
                sock, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("handoff socket: %s", exc)
                return
            sock.setblocking(False)
            self._accepted.add(sock)
            self._loop.add_reader(sock.fileno(), self._offers, sock)

    def _drop_accepted(self, sock: socket.socket) -> None:
        self._accepted.discard(sock)
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(sock.fileno())
        sock.close()

    def _offers(self, sock: socket.socket) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_DATAGRAM, 2)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                self._drop_accepted(sock)
                return
            self._offered(sock, data, fds)

    def _offered(self, channel: socket.socket, data: bytes, fds: list[int]) -> None:
        try:
            offer, token, offer_id, in_file = HandoffOffer.decode(data)
            if in_file:
                if len(fds) != 2:
                    raise ValueError("its pending bytes' file is missing")
                offer = replace(offer, pending=_read_memory_file(fds.pop()))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("malformed connection handoff ignored: %s", exc)
            for fd in fds:
                os.close(fd)
            return
        taken: bool | asyncio.Future[bool] = False
        if token == self.identity.token and len(fds) == 1:
            client = socket.socket(fileno=fds[0])
            fds = []
            try:
                taken = self._adopt(offer, client)
            except Exception:
                log.exception("adopting a handed-over connection failed")
                taken = False
            if isinstance(taken, asyncio.Future):
                # Its client id's claim moves first: answered once the owner has.
                session = offer.persistent_session
                taken.add_done_callback(lambda fut: self._adopted(
                    channel, offer_id, client, _taken(fut), session))
                return
            if not taken:
                client.close()  # ours only: the offering shard still holds its own
        for fd in fds:
            os.close(fd)
        self._answer(channel, offer_id, taken is True)

    def _adopted(self, channel: socket.socket, offer_id: int, client: socket.socket,
                 taken: bool, session: bool) -> None:
        if not taken:
            client.close()
        self._answer(channel, offer_id, taken is True, session)

    def _answer(self, channel: socket.socket, offer_id: int, taken: bool,
                session: bool = False) -> None:
        if taken:
            self.stats.adopted += 1
            if session:
                self.stats.sessions += 1
        else:
            self.stats.refused += 1
        reply = json.dumps({"id": offer_id, "taken": taken}).encode()
        try:
            channel.send(reply)
        except OSError as exc:
            # The offering shard is gone: what it offered is closed with it, or
            # (taken) served here.
            log.debug("handoff answer not sent: %s", exc)


def _websocket_state(value: object) -> bool:
    """Is ``value`` an offer's WebSocket state (``HandoffOffer.websocket``)?"""
    if not isinstance(value, dict):
        return False
    inner = value.get("inner", 0)
    return (isinstance(value.get("subprotocol"), str)
            and isinstance(value.get("path"), str | None)
            and isinstance(value.get("text", True), bool)
            and isinstance(inner, int) and not isinstance(inner, bool) and inner >= 0)


def datagram(offer: HandoffOffer, token: str, offer_id: int) -> tuple[bytes, bool] | None:
    """The offer's datagram and whether its pending bytes ride in it (else in a memory
    file); None when its head alone (a large will, a session record) exceeds what the
    owner reads of one datagram: a longer one would arrive cut short."""
    if len(offer.pending) <= INLINE_PENDING:
        data = offer.encode(token, offer_id)
        if len(data) <= _MAX_DATAGRAM:
            return data, True
    data = offer.encode(token, offer_id, inline=False)
    return (data, False) if len(data) <= _MAX_DATAGRAM else None


def _taken(fut: asyncio.Future[bool]) -> bool:
    return not fut.cancelled() and fut.exception() is None and fut.result()


def _memory_file(data: bytes) -> int:
    """An anonymous memory file holding ``data``, its offset back at 0."""
    fd = os.memfd_create("meshmq-handoff", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        raise
    return fd


def _read_memory_file(fd: int) -> bytes:
    """What a memory file holds (``_memory_file``); the descriptor is closed."""
    try:
        size = os.fstat(fd).st_size
        if size > MAX_PENDING:
            raise ValueError(f"pending bytes of {size} exceed {MAX_PENDING}")
        parts = []
        offset = 0
        while offset < size:
            chunk = os.pread(fd, size - offset, offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)
