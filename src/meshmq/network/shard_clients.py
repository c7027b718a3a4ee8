"""Client ids across the shards of one node: one owner arbitrates each.

On one broker a client id names at most one connection: a second MQTT connection takes
the first one over (MQTT 3.1.4-3), a second STOMP ``client-id`` is refused (ActiveMQ's
``InvalidClientIDException``). On a node the two connections may land on different
shards, so each client id has an owning shard, ``client_owner`` (the destinations' hash
over ``client://<client id>``), that keeps the node's table of claims: which shard holds
the client id, under which claim, for which protocol.

A CONNECT with a client id claims it before its CONNACK or CONNECTED (``claim``): on the
owner itself at once, elsewhere with an ``INTEREST`` ``client-claim`` over the link. The
owner grants it when the id is free or held on the claimer's own shard (whose transport
applies one broker's rules itself); refuses it when either side is STOMP; and, for two
MQTT connections, asks the holder's shard to close its connection (``client-close``,
MQTT's "session taken over") and grants the claim once that shard answers
``client-closed``, so the old connection is gone before the new one is accepted. A
connection's end releases its claim (``client-release``); a shard's lost link releases
every claim it held. A release also withdraws a claim the owner has not answered yet
(its connection ended while a take-over was closing the old holder, or a newer claim of
the id on the same shard replaced it, the release sent ahead of the newer claim): the
owner never grants a claim nobody holds, nor an older claim after a newer one. A shard
whose link comes up announces the claims it holds for the peer's ids again (a restarted
owner starts with an empty table).

A release travels to the owner a link hop after the connection ended, so a client that
leaves and connects again at once through another shard may claim the id first. Before
it refuses a STOMP claim of an id held on another shard, the owner therefore asks the
holder whether that connection still exists (``client-check``, answered
``client-checked``, after any release already on that link): it grants the claim when
the connection is gone and refuses it, with one broker's words, while it lives.

The owner also keeps each MQTT persistent session's record (``mqtt-session/<client
id>``: its expiry, its subscriptions, its QoS 2 exchanges in progress), whichever shard
the client is connected to: the connection's shard sends every change
(``session-put``, ``session-drop``, numbered), and a granted MQTT claim carries the
record back, so a client that reconnects through any shard resumes its session. The
record names the shard that last ran the session; when another shard resumes it, that
one is told to forget its copy (``session-moved``).

A change is confirmed: the owner answers ``session-stored`` (the highest number it has
stored, once its store synced it), and the PUBREC or PUBCOMP the change belongs to waits
for that answer, as on one broker the state is stored before the answer. Until then the
change is held, the latest per client id (a record is the whole state, so only the
latest matters: at most one per session of this shard), and sent again, in order, when
the owner's link is back. Answers that wait for an owner unreachable for
``owner_wait_s`` fail, as after a failed store: the connection is closed with nothing
confirmed, and the held change still goes to the owner once it is back.

The owner also runs each session's expiry, from the record it keeps: armed when the
id's last connection ends (the record's ``ended``), cancelled when a claim resumes it,
armed again from the stored records when the owner restarts. An expired session is
ended by the owner's MQTT service (``session_expired``): its durable subscriptions on
every shard, then its record.

A connection handed to another shard of the node (transport/handoff.py) takes its claim
with it: the adopting shard asks the owner to move it (``client-move``, naming the old
holder's shard and claim), and the owner switches its table from the old holder to the
new one in one step, only while the old claim still holds the id and no take-over of it
is under way, so the id is never free meanwhile, and the old shard's later release (of
a claim the table no longer names) frees nothing. The owner answers ``client-claimed``;
only then does the adopting shard take the connection. A move that fails (refused, the
owner's link lost) leaves the connection where it was, its claim announced to the owner
again. A claim made on the adopting shard before the move is answered ends the move
there (the connection stays where it was): its release (``unmove``) gives the id back
to the claim the move replaced, unless that was released meanwhile, so the new claim
takes that connection over.

An owner unreachable for longer than ``owner_wait_s`` fails the claims waiting for it,
and new claims to it are refused at once, retriably: a client id whose owner is down
cannot connect until the node has restarted that shard (usually well under a second).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshmq.core.shards import client_owner
from meshmq.errors import MeshmqError, RemoteProtocolError
from meshmq.protocol.wire import FrameType, encode_json

if TYPE_CHECKING:
    from meshmq.network.shards import ShardPeers, _Peer

log = logging.getLogger("meshmq.shards")

# The owner's record of an MQTT persistent session (transport/mqtt_server.py's name).
SESSION_RECORD = "mqtt-session/{}"
# Frame kind of a JSON INTEREST in a peer's output (network/shards.py's ``_FRAME``).
_FRAME = 4
# An MQTT session expiry that never ends (transport/mqtt_server.py's
# SERVER_SESSION_FOREVER: 3.1.1 persistent sessions, MQTT 5's 0xFFFFFFFF).
_FOREVER = 0xFFFFFFFF


@dataclass(slots=True)
class _Holder:
    """The owner's entry: who holds a client id."""

    shard: int
    claim: str
    proto: str
    # The (shard, claim) a move gave the id away from, while that connection still
    # holds it: a move withdrawn before it was answered gives the id back to it.
    moved_from: tuple[int, str] | None = None


@dataclass(slots=True)
class _Change:
    """A session record change not yet stored by its owner (``record`` None: a drop)."""

    owner: int
    seq: int
    record: str | None
    sent: bool = False


@dataclass(slots=True)
class _Held:
    """A claim made on this shard: its connection's close, and whether it was granted."""

    claim: str
    proto: str
    close: Callable[[], None]
    future: asyncio.Future[bytes | None]
    # Whether the connection is still open (its end may not have been read yet).
    alive: Callable[[], bool] | None = None
    moving: bool = False  # a move of another shard's claim (``move``), not yet answered


class ClientClaims:
    """This shard's side of the client-id claims, as claimer, holder and owner."""

    def __init__(self, peers: ShardPeers) -> None:
        self.peers = peers
        self.index = peers.identity.index
        self.count = peers.identity.count
        self._seq = itertools.count(1)
        self.held: dict[str, _Held] = {}  # client id -> this shard's claim
        self.table: dict[str, _Holder] = {}  # as owner: client id -> its holder
        # As owner: claims waiting for a holder to close, by (holder shard, claim).
        self._closing: dict[tuple[int, str], list[tuple[str, _Holder]]] = {}
        # As owner: claims waiting for a holder on another shard to say whether its
        # connection still exists, by (holder shard, its claim).
        self._checking: dict[tuple[int, str], list[tuple[str, _Holder]]] = {}
        # The MQTT service's: forget the session of a client id another shard resumed.
        self.session_moved: Callable[[str], None] | None = None
        # ... and, as owner, end a session whose expiry ran out.
        self.session_expired: Callable[[str], None] | None = None
        # Session record changes not yet stored by their owner: the latest per client
        # id, in the order made; and the answers waiting for them, by owner.
        self.unstored: dict[str, _Change] = {}
        self._waits: dict[int, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._change_seq = itertools.count(1)
        self._sending = False
        # As owner: the highest change number stored, to answer per peer; the expiry
        # timers of the sessions kept here that no connection holds.
        self._stored: dict[int, int] = {}
        self.expiries: dict[str, asyncio.TimerHandle] = {}
        # (shard, client id): a session-moved for a shard whose link was down.
        self._moved_later: set[tuple[int, str]] = set()

    # ------------------------------------------------------------ as the claimer
    def claim(self, client_id: str, proto: str, close: Callable[[], None],
              alive: Callable[[], bool] | None = None
              ) -> tuple[asyncio.Future[bytes | None], Callable[[], None]]:
        """Claim ``client_id`` for a connection of ``proto`` (``mqtt``, ``stomp``);
        ``close`` ends that connection if the owner gives the id to another; ``alive``
        says whether it is still open when the owner asks (a client that has just
        dropped it, its end not yet read, no longer holds the id). Returns
        what the CONNACK/CONNECTED waits for (failing with the refusal; for MQTT, the
        owner's session record or None) and the release to call when the connection
        ends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes | None] = loop.create_future()
        claim = f"{self.peers.boot}/{next(self._seq)}"

        def release() -> None:
            self.release(client_id, claim)

        previous = self.held.get(client_id)
        if previous is not None and "stomp" in (proto, previous.proto) and \
                previous.future.done() and previous.alive is not None and \
                not previous.alive():
            # Its connection has ended (its end not read yet, or its release waiting
            # for its teardown): as on one broker, it holds the id no longer.
            self.release(client_id, previous.claim)
            previous = None
        if previous is not None and "stomp" in (proto, previous.proto):
            # Held on this shard: one broker's rules, at once (a STOMP duplicate).
            future.set_exception(_in_use(client_id, self.peers.identity.node))
            return future, release
        owner = client_owner(client_id, self.count)
        if previous is not None and not previous.future.done():
            # Still waiting at the owner (a take-over under way): the newer claim
            # replaces it here, so it is withdrawn there too, ahead of the newer one on
            # the same link; else the owner could grant it after the newer one, or once
            # the newer one is released, to a claim nobody holds.
            moving = previous.moving
            previous.future.set_exception(_in_use(client_id, self.peers.identity.node))
            self._withdraw(owner, client_id, previous.claim, unmove=moving)
        self.held[client_id] = _Held(claim, proto, close, future, alive)

        if owner == self.index:
            self._arbitrate(client_id, _Holder(self.index, claim, proto))
            return future, release
        peer = self.peers.peers[owner]
        if peer.down:
            self._answered(client_id, claim, _unreachable(peer.label))
            return future, release
        self._send(peer, {"op": "client-claim", "client": client_id, "claim": claim,
                          "proto": proto})
        return future, release

    def release(self, client_id: str, claim: str) -> None:
        held = self.held.get(client_id)
        if held is None or held.claim != claim:
            return
        del self.held[client_id]
        unmove = held.moving and not held.future.done()
        if not held.future.done():
            held.future.cancel()
        self._withdraw(client_owner(client_id, self.count), client_id, claim, unmove)

    def _withdraw(self, owner: int, client_id: str, claim: str, unmove: bool) -> None:
        """Tell ``owner`` that ``claim`` no longer holds (or asks for) ``client_id``:
        granted, it is freed; still waiting (for a take-over, a holder's answer), it is
        no longer made. ``unmove``: a move not yet answered, so its connection stays on
        the shard that offered it: a move the owner made is undone."""
        if owner == self.index:
            self._released(self.index, client_id, claim, unmove)
            return
        body: dict[str, Any] = {"op": "client-release", "client": client_id,
                                "claim": claim}
        if unmove:
            body["unmove"] = True
        self._send(self.peers.peers[owner], body)

    # ------------------------------------------------------------ moving a claim
    def movable(self, client_id: str) -> str | None:
        """The claim this shard holds on ``client_id``, for a connection handed to
        another shard: granted, with no session record on its way to the owner (it
        would arrive from a shard the id has left, and be ignored); None otherwise. A
        drop on its way is no obstacle: the adopting shard sends it again once the
        claim is its own (``drop_session``), and the two are one."""
        held = self.held.get(client_id)
        change = self.unstored.get(client_id)
        if held is None or held.moving or not held.future.done() or \
                held.future.cancelled() or held.future.exception() is not None or \
                (change is not None and change.record is not None):
            return None
        return held.claim

    def move(self, client_id: str, proto: str, shard: int, claim: str,
             close: Callable[[], None], alive: Callable[[], bool] | None = None
             ) -> tuple[asyncio.Future[bytes | None], Callable[[], None]] | None:
        """Take over ``claim``, which shard ``shard`` holds on ``client_id``, for its
        connection handed here (``close``, ``alive``: as for ``claim``). Returns the
        owner's answer (failing if it refused or is unreachable) and the release, or
        None when it cannot be asked now (this shard holds or claims the id itself, or
        the owner's link is down)."""
        if client_id in self.held:
            return None
        owner = client_owner(client_id, self.count)
        if owner != self.index:
            peer = self.peers.peers[owner]
            if peer.down or peer.link is None:
                return None
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        new = f"{self.peers.boot}/{next(self._seq)}"
        self.held[client_id] = _Held(new, proto, close, future, alive, moving=True)

        def release() -> None:
            self.release(client_id, new)

        if owner == self.index:
            self._move(client_id, shard, claim, _Holder(self.index, new, proto))
        else:
            self._send(self.peers.peers[owner], {
                "op": "client-move", "client": client_id, "claim": new, "proto": proto,
                "from": shard, "from_claim": claim})
        return future, release

    def handed(self, client_id: str, claim: str) -> None:
        """The connection holding ``claim`` went to another shard, its claim moved with
        it: forget it here without a release (the owner names the new holder)."""
        held = self.held.get(client_id)
        if held is not None and held.claim == claim:
            del self.held[client_id]

    def kept(self, client_id: str, claim: str) -> None:
        """A move of ``claim`` failed and its connection stays here: announce the claim
        to the owner again, in case the move was made and then undone (its new holder's
        link lost), so the owner holds it for this shard again or, if another connection
        took the id meanwhile, closes this one."""
        held = self.held.get(client_id)
        if held is None or held.claim != claim:
            return
        owner = client_owner(client_id, self.count)
        if owner == self.index:
            self._announced(self.index, client_id, _Holder(self.index, claim, held.proto))
        elif not self.peers.peers[owner].down:
            self._send(self.peers.peers[owner], {
                "op": "client-claim", "client": client_id, "claim": claim,
                "proto": held.proto, "held": True})

    def put_session(self, client_id: str, body: bytes) -> asyncio.Future[None] | None:
        """Keep MQTT session record ``body`` (JSON) on the client id's owner. Returns
        what an answer that depends on it waits for: the owner's ``session-stored`` (None
        when this shard is the owner: the local sync covers it)."""
        owner = client_owner(client_id, self.count)
        record = json.loads(body)
        record["shard"] = self.index
        data = json.dumps(record).encode()
        if owner == self.index:
            self._put_here(client_id, data)
            return None
        return self._change(owner, client_id, data.decode())

    def drop_session(self, client_id: str) -> asyncio.Future[None] | None:
        owner = client_owner(client_id, self.count)
        if owner == self.index:
            self._drop_here(client_id)
            return None
        return self._change(owner, client_id, None)

    def _change(self, owner: int, client_id: str, record: str | None
                ) -> asyncio.Future[None]:
        """Hold a change for ``owner`` until it is stored; the changes made in one turn
        go as one (the latest record per client id)."""
        loop = asyncio.get_running_loop()
        change = self.unstored.get(client_id)
        if change is not None and not change.sent and change.owner == owner:
            change.record = record
        else:
            if change is not None:
                del self.unstored[client_id]  # in the order made: the newest last
            change = self.unstored[client_id] = _Change(owner, next(self._change_seq),
                                                        record)
        fut: asyncio.Future[None] = loop.create_future()
        peer = self.peers.peers[owner]
        if peer.down:
            _fail(fut, _not_kept(peer.label))  # held all the same, for its return
        else:
            self._waits.setdefault(owner, deque()).append((change.seq, fut))
        if not self._sending:
            self._sending = True
            loop.call_soon(self._send_changes)
        return fut

    def _send_changes(self) -> None:
        self._sending = False
        for client_id, change in self.unstored.items():
            if not change.sent:
                peer = self.peers.peers[change.owner]
                if peer.link is not None:
                    self._send_change(peer, client_id, change)

    def _send_change(self, peer: _Peer, client_id: str, change: _Change) -> None:
        change.sent = True
        if change.record is None:
            self._send(peer, {"op": "session-drop", "client": client_id,
                              "seq": change.seq})
        else:
            self._send(peer, {"op": "session-put", "client": client_id,
                              "record": change.record, "seq": change.seq})

    def _session_stored(self, peer: _Peer, seq: int) -> None:
        """The owner ``peer`` stored the changes numbered up to ``seq``."""
        for client_id, change in list(self.unstored.items()):
            if change.owner == peer.index and change.seq <= seq:
                del self.unstored[client_id]
        waits = self._waits.get(peer.index)
        while waits and waits[0][0] <= seq:
            _, fut = waits.popleft()
            if not fut.done():
                fut.set_result(None)

    def _answered(self, client_id: str, claim: str, refused: MeshmqError | None,
                  record: bytes | None = None) -> None:
        held = self.held.get(client_id)
        if held is None or held.claim != claim or held.future.done():
            return
        held.moving = False
        if refused is None:
            held.future.set_result(record)
        else:
            del self.held[client_id]
            held.future.set_exception(refused)

    def _close_here(self, client_id: str, claim: str) -> None:
        """The owner gives ``client_id`` to another connection: this one ends."""
        held = self.held.get(client_id)
        if held is None or held.claim != claim:
            return
        del self.held[client_id]
        log.info("shard %s: client id %r was taken over on another shard",
                 self.peers.identity.label, client_id)
        held.close()
        self.peers.host.request_pump()

    # ------------------------------------------------------------ as the owner
    def _arbitrate(self, client_id: str, new: _Holder,
                   asked: tuple[int, str] | None = None) -> None:
        """Grant, refuse or take over; ``asked``: the holder (shard, claim) that has
        just said its connection still exists."""
        old = self.table.get(client_id)
        if old is None or old.shard == new.shard or old.claim == new.claim:
            self.table[client_id] = new
            self._disarm(client_id)  # held again: its session does not expire
            self._reply(new, client_id, None, self._session_for(client_id, new))
        elif old.proto != "mqtt" or new.proto != "mqtt":
            if old.shard == self.index and not self._live(client_id, old.claim):
                self._released(self.index, client_id, old.claim)  # ended, not yet read
                self._arbitrate(client_id, new)
            elif old.shard == self.index or (old.shard, old.claim) == asked:
                self._reply(new, client_id, _in_use(client_id, self.peers.identity.node))
            else:  # its release may be on the way: the holder says
                self._check(client_id, old, new)
        else:  # MQTT take-over: the holder's connection goes first
            key = (old.shard, old.claim)
            asked_before = key in self._closing
            self._closing.setdefault(key, []).append((client_id, new))
            if not asked_before:
                if old.shard == self.index:
                    self._close_here(client_id, old.claim)
                    # After the pump, as client-closed from another shard (below).
                    self._after_pump(lambda: self._closed(self.index, client_id, old.claim))
                else:
                    self._send(self.peers.peers[old.shard], {
                        "op": "client-close", "client": client_id, "claim": old.claim})

    def _live(self, client_id: str, claim: str) -> bool:
        """As holder: does ``claim``'s connection still hold ``client_id``?"""
        held = self.held.get(client_id)
        return held is not None and held.claim == claim and (
            held.alive is None or held.alive())

    def _check(self, client_id: str, old: _Holder, new: _Holder) -> None:
        peer = self.peers.peers[old.shard]
        if peer.link is None:  # its connections are gone with its link
            self._checked(old.shard, client_id, old.claim, False)
            self._arbitrate(client_id, new)
            return
        waiting = self._checking.setdefault((old.shard, old.claim), [])
        waiting.append((client_id, new))
        if len(waiting) == 1:
            self._send(peer, {"op": "client-check", "client": client_id,
                              "claim": old.claim})

    def _checked(self, shard: int, client_id: str, claim: str, live: bool) -> None:
        """The holder ``shard`` answered whether ``claim``'s connection still exists:
        gone, it is released; the claims that waited are arbitrated again."""
        if not live:
            self._released(shard, client_id, claim)
        for cid, new in self._checking.pop((shard, claim), ()):
            self._arbitrate(cid, new, (shard, claim))

    def _unwait(self, shard: int, client_id: str, claim: str) -> None:
        """A claim waiting for a holder's answer, or for a take-over's close, was
        released (its connection ended, or a newer claim on its shard replaced it): it
        is no longer made, so it is never granted to a connection that is gone."""
        for waiting in itertools.chain(self._checking.values(), self._closing.values()):
            waiting[:] = [(c, h) for c, h in waiting
                          if not (c == client_id and h.shard == shard and h.claim == claim)]

    def _move(self, client_id: str, shard: int, claim: str, new: _Holder) -> None:
        """Give ``client_id`` to ``new`` if ``claim`` of shard ``shard`` still holds it
        (for the same protocol) and no take-over is closing it: one step, so the id is
        never free and never held twice."""
        old = self.table.get(client_id)
        if old is None or old.shard != shard or old.claim != claim or \
                old.proto != new.proto or (shard, claim) in self._closing:
            self._reply(new, client_id, MeshmqError(
                f"client id {client_id} is no longer held by the connection handed over",
                code="client-moved", retriable=True))
            return
        new.moved_from = (shard, claim)
        self.table[client_id] = new
        self._reply(new, client_id, None)

    def _announced(self, shard: int, client_id: str, holder: _Holder) -> None:
        """A claim announced again as held: the one claimed since, if any, keeps the id."""
        current = self.table.get(client_id)
        if current is not None and current.shard != shard:
            if shard == self.index:
                self._close_here(client_id, holder.claim)
            else:
                self._send(self.peers.peers[shard], {
                    "op": "client-close", "client": client_id, "claim": holder.claim})
        else:
            self._arbitrate(client_id, holder)

    def _session_for(self, client_id: str, holder: _Holder) -> bytes | None:
        """The MQTT session record kept here for ``client_id``, given to the shard that
        now holds it; the shard that ran it before forgets its copy."""
        if holder.proto != "mqtt":
            return None
        record = self.peers.broker.records.get(SESSION_RECORD.format(client_id))
        if record is None:
            return None
        body = record[1]
        try:
            last = json.loads(body).get("shard")
        except ValueError:
            last = None
        if isinstance(last, int) and last != holder.shard:
            if last == self.index:
                self._forget_session(client_id)
            elif last in self.peers.peers:
                self._tell_moved(last, client_id)
        return body

    def _forget_session(self, client_id: str) -> None:
        if self.session_moved is not None:
            self.session_moved(client_id)

    def _reply(self, holder: _Holder, client_id: str, refused: MeshmqError | None,
               record: bytes | None = None) -> None:
        if holder.shard == self.index:
            self._answered(client_id, holder.claim, refused, record)
        else:
            self._send(self.peers.peers[holder.shard], {
                "op": "client-claimed", "client": client_id, "claim": holder.claim,
                "ok": refused is None, "reason": refused.message if refused else "",
                "code": refused.code if refused else "",
                "session": None if record is None else record.decode()})

    def _released(self, shard: int, client_id: str, claim: str,
                  unmove: bool = False) -> None:
        if self._checking or self._closing:
            self._unwait(shard, client_id, claim)
        holder = self.table.get(client_id)
        if holder is None:
            return
        if holder.shard == shard and holder.claim == claim:
            if unmove and holder.moved_from is not None:
                # The handoff did not happen: the offering shard's connection holds
                # the id again (it announces it again too, ``kept``).
                old_shard, old_claim = holder.moved_from
                self.table[client_id] = _Holder(old_shard, old_claim, holder.proto)
                return
            del self.table[client_id]
            self._arm(client_id)  # (after the session's last record: the same link)
        elif holder.moved_from == (shard, claim):
            holder.moved_from = None  # the connection a move left is gone too

    # ------------------------------------------------------------ as the owner: records
    def _put_here(self, client_id: str, data: bytes) -> None:
        self.peers.broker.put_record(SESSION_RECORD.format(client_id), data)
        if client_id not in self.table:
            self._arm(client_id)  # a connection that ended while this owner was away

    def _drop_here(self, client_id: str) -> None:
        self._disarm(client_id)
        self.peers.broker.drop_record(SESSION_RECORD.format(client_id))

    def _stored_for(self, peer: _Peer, seq: int) -> None:
        """Answer ``peer`` once the change ``seq`` it sent is stored: one answer per
        sync, with the highest number it covers."""
        waiting = peer.index in self._stored
        self._stored[peer.index] = max(seq, self._stored.get(peer.index, 0))
        if waiting:
            return

        def stored() -> None:
            upto = self._stored.pop(peer.index, None)
            if upto is not None:
                self._send(peer, {"op": "session-stored", "seq": upto})

        def failed(reason: str) -> None:
            # Not stored: never answered; the link goes, and the shard sends it again.
            self._stored.pop(peer.index, None)
            if peer.link is not None:
                peer.link.abort(reason)

        self.peers.host.durability.when_durable(
            stored, failed, who=f"shard link {peer.label}", owners=False)

    # ------------------------------------------------------------ as the owner: expiry
    def start(self) -> None:
        """After the store's recovery: the expiry of every session kept here runs
        again (a claim that comes back with its link cancels it)."""
        prefix = SESSION_RECORD.format("")
        for name in list(self.peers.broker.records):
            if name.startswith(prefix):
                self._arm(name[len(prefix):])

    def stop(self) -> None:
        for handle in self.expiries.values():
            handle.cancel()
        self.expiries.clear()

    def _record(self, client_id: str) -> dict[str, Any] | None:
        stored = self.peers.broker.records.get(SESSION_RECORD.format(client_id))
        if stored is None:
            return None
        try:
            record = json.loads(stored[1])
        except ValueError:
            return None
        return record if isinstance(record, dict) else None

    def _arm(self, client_id: str) -> None:
        """Run ``client_id``'s session expiry from when its connection ended (now, if
        the record does not say: that time is stored, so a restart keeps it)."""
        self._disarm(client_id)
        record = self._record(client_id)
        if record is None:
            return
        expiry = record.get("expiry")
        if not isinstance(expiry, int) or expiry <= 0 or expiry >= _FOREVER:
            return
        now = self.peers.broker.now_ms()
        ended = record.get("ended")
        if not isinstance(ended, int):
            record["ended"] = ended = now
            self.peers.broker.put_record(SESSION_RECORD.format(client_id),
                                         json.dumps(record).encode())
            self.peers.host.request_pump()
        delay = max(0.0, (ended + expiry * 1000 - now) / 1000)
        self.expiries[client_id] = asyncio.get_running_loop().call_later(
            delay, self._expire, client_id)

    def _disarm(self, client_id: str) -> None:
        handle = self.expiries.pop(client_id, None)
        if handle is not None:
            handle.cancel()

    def _expire(self, client_id: str) -> None:
        self.expiries.pop(client_id, None)
        if client_id in self.table:
            return  # held again (a claim re-announced after this owner restarted)
        record = self._record(client_id)
        if record is None:
            return
        log.info("MQTT session %s expired", client_id)
        last = record.get("shard")
        if isinstance(last, int) and last in self.peers.peers:
            # Its in-memory copy there goes too (durables: durable-drop, below).
            self._tell_moved(last, client_id)
        if self.session_expired is not None:
            self.session_expired(client_id)  # its durables everywhere, then the record
        else:
            self._drop_here(client_id)
        self.peers.host.request_pump()

    def _tell_moved(self, shard: int, client_id: str) -> None:
        """Tell ``shard`` to forget its copy of ``client_id``'s session; if its link is
        not up (this owner has just restarted and runs the expiries it stored), when it
        comes up: output for a shard without a link is dropped."""
        peer = self.peers.peers[shard]
        if peer.link is None:
            self._moved_later.add((shard, client_id))
        else:
            self._send(peer, {"op": "session-moved", "client": client_id})

    def _closed(self, shard: int, client_id: str, claim: str) -> None:
        self._released(shard, client_id, claim)
        for cid, new in self._closing.pop((shard, claim), ()):
            self._arbitrate(cid, new)

    # ------------------------------------------------------------ the link
    def on_interest(self, peer: _Peer, body: dict[str, Any]) -> None:
        op = body.get("op")
        client = body.get("client")
        if op == "session-stored":
            seq = body.get("seq")
            if isinstance(seq, int):
                self._session_stored(peer, seq)
            return
        if op in ("session-put", "session-drop") and isinstance(client, str):
            holder = self.table.get(client)
            if holder is not None and holder.shard != peer.index:
                # From a shard the id has since left (a change held while this owner
                # was away): the shard that holds it now has the newer session. (A
                # drop overtaken by a handoff's move is expected: the adopting shard
                # sends it again.)
                (log.debug if op == "session-drop" else log.info)(
                    "shard %s: a stale session record of %r from shard %s ignored",
                    self.peers.identity.label, client, peer.label)
            elif op == "session-drop":
                self._drop_here(client)
            else:
                record = body.get("record")
                if not isinstance(record, str):
                    raise RemoteProtocolError("shard session-put needs a record")
                self._put_here(client, record.encode())
            seq = body.get("seq")
            if isinstance(seq, int):
                self._stored_for(peer, seq)
            self.peers.host.request_pump()  # (the record goes to the store with the pump)
            return
        if op == "session-moved" and isinstance(client, str):
            self._forget_session(client)
            return
        claim = body.get("claim")
        if not isinstance(client, str) or not isinstance(claim, str):
            raise RemoteProtocolError(f"shard {op} needs a client id and a claim")
        if op == "client-claim":
            proto = str(body.get("proto") or "mqtt")
            if body.get("held") is True:
                # Announced again (after this owner restarted, or a failed move): if
                # another shard claimed the id meanwhile, the one claimed since keeps it.
                self._announced(peer.index, client, _Holder(peer.index, claim, proto))
            else:
                self._arbitrate(client, _Holder(peer.index, claim, proto))
        elif op == "client-move":
            old_shard, old_claim = body.get("from"), body.get("from_claim")
            if not isinstance(old_shard, int) or not isinstance(old_claim, str):
                raise RemoteProtocolError("shard client-move needs the old holder")
            self._move(client, old_shard, old_claim,
                       _Holder(peer.index, claim, str(body.get("proto") or "mqtt")))
        elif op == "client-claimed":
            session = body.get("session")
            self._answered(client, claim, None if body.get("ok") is True else MeshmqError(
                str(body.get("reason")), code=str(body.get("code") or "client-id-in-use"),
                retriable=True), session.encode() if isinstance(session, str) else None)
        elif op == "client-close":
            self._close_here(client, claim)
            # After the pump: the closed connection's relayed consumers are closed on
            # their owners before the owner gives the id to another connection.
            self._after_pump(lambda: self._send(peer, {
                "op": "client-closed", "client": client, "claim": claim}))
        elif op == "client-closed":
            self._closed(peer.index, client, claim)
        elif op == "client-check":
            self._send(peer, {"op": "client-checked", "client": client, "claim": claim,
                              "live": self._live(client, claim)})
        elif op == "client-checked":
            self._checked(peer.index, client, claim, body.get("live") is True)
        else:  # client-release
            self._released(peer.index, client, claim, body.get("unmove") is True)

    def link_up(self, peer: _Peer) -> None:
        """The session-moved ``peer`` missed while its link was down, the session
        changes it has not stored yet, in order, then the claims this shard holds, or
        waits for, whose owner is ``peer``: (again)."""
        for shard, client_id in sorted(self._moved_later):
            if shard == peer.index:
                self._moved_later.discard((shard, client_id))
                self._send(peer, {"op": "session-moved", "client": client_id})
        for client_id, change in self.unstored.items():
            if change.owner == peer.index:
                self._send_change(peer, client_id, change)
        for client_id, held in self.held.items():
            if client_owner(client_id, self.count) == peer.index and not held.moving:
                self._send(peer, {"op": "client-claim", "client": client_id,
                                  "claim": held.claim, "proto": held.proto,
                                  "held": held.future.done()})

    def link_down(self, peer: _Peer) -> None:
        """``peer``'s connections are gone with it (or will be): its claims end, and
        take-overs waiting for it go on."""
        pendings = (self._closing, self._checking)
        for pending in pendings:
            # Its claims waiting for a holder (to close, or to answer) end with it, first
            # (it announces those it still makes again when the link is back) ...
            for waiting in pending.values():
                waiting[:] = [(c, h) for c, h in waiting if h.shard != peer.index]
        for client_id, holder in list(self.table.items()):
            if holder.shard == peer.index:
                self._closed(peer.index, client_id, holder.claim)
            elif holder.moved_from is not None and holder.moved_from[0] == peer.index:
                holder.moved_from = None
        for pending in pendings:
            # ... and those waiting for it as the holder find the id free.
            for shard, claim in list(pending):
                if shard == peer.index:
                    for cid, new in pending.pop((shard, claim), ()):
                        self._arbitrate(cid, new)
        # Moves asked of ``peer`` fail: whether it made one is unknown, and it undoes
        # any with this link (above, on its side); the connection stays where it was.
        for client_id, held in list(self.held.items()):
            if held.moving and not held.future.done() and \
                    client_owner(client_id, self.count) == peer.index:
                self._answered(client_id, held.claim, _unreachable(peer.label))

    def owner_down(self, peer: _Peer) -> None:
        """``peer`` was unreachable for ``owner_wait_s``: connects waiting on it fail."""
        for client_id, held in list(self.held.items()):
            if client_owner(client_id, self.count) == peer.index and not held.future.done():
                self._answered(client_id, held.claim, _unreachable(peer.label))
        # Answers waiting for session changes fail (as after a failed store); the
        # changes stay held for its return.
        for _, fut in self._waits.pop(peer.index, ()):
            if not fut.done():
                _fail(fut, _not_kept(peer.label))

    def _send(self, peer: _Peer, body: dict[str, Any]) -> None:
        if self._sending and body["op"] not in ("session-put", "session-drop"):
            # Session changes made before go first: a client-release or client-closed
            # must reach the owner after the connection's last record.
            self._send_changes()
        self._queue(peer, body)

    def _after_pump(self, call: Callable[[], None]) -> None:
        self.peers.host.request_pump()  # (requested first: the pump runs ahead of it)
        asyncio.get_running_loop().call_soon(call)

    def _queue(self, peer: _Peer, body: dict[str, Any]) -> None:
        self.peers.queue(peer, _FRAME, encode_json(FrameType.INTEREST, body))


def _in_use(client_id: str, node: str) -> MeshmqError:
    # One broker's words (core/connections.py), so clients see the same refusal.
    return MeshmqError(f"Broker: {node} - Client: {client_id} already connected",
                       code="client-id-in-use", retriable=True)


def _fail(fut: asyncio.Future[None], exc: MeshmqError) -> None:
    fut.set_exception(exc)
    fut.exception()  # seen: a change nothing waits for (a connection's end) is no error


def _not_kept(label: str) -> MeshmqError:
    return MeshmqError(f"shard {label}, which keeps this client's session, is unreachable",
                       code="shard-unreachable", retriable=True)


def _unreachable(label: str) -> MeshmqError:
    return MeshmqError(f"shard {label}, which arbitrates this client id, is unreachable: "
                       "connect again shortly", code="shard-unreachable", retriable=True)
