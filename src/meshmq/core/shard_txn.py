"""Transactions across the shards of a node: a two-phase commit, presumed abort.

On one shard, a transaction's sends and acknowledgements are held until COMMIT and
applied in one store batch (core/transactions.py). When some of them belong to
destinations other shards own, one batch cannot cover them, so the shard the client
is connected to (the **coordinator**) runs a two-phase commit (docs/design.md,
"Transactions across shards"):

1. COMMIT: the work for each other owner (a **participant**) goes to it as a
   ``TxnPrepare``; the coordinator's own part stays held here. A participant checks
   it, acknowledges the relayed deliveries it names (their messages leave the queue)
   and writes everything as one **prepared record** (``shard-txn/p/<txn>``: the sends,
   and copies of the acknowledged messages), in one batch; once synced it votes.
2. Every vote yes: the coordinator applies its own part and writes its **decision
   record** (``shard-txn/c/<txn>``: the participants) in one batch, and once synced
   the COMMIT is confirmed and every participant is told to commit: it routes the
   prepared sends and drops its record in one batch, and answers; with every answer
   in, the decision record is dropped. A no, or a participant's link lost before the
   decision, aborts: a participant drops its record and puts the acknowledged
   messages back in their queues, flagged redelivered.

Presumed abort: a transaction without a decision record was not committed. A
participant that restarts with a prepared record asks its coordinator once linked
(``TxnAsk``); the coordinator answers commit if it holds the decision record, abort
if it holds nothing; a coordinator that restarts with a decision record tells its
participants to commit again (committing twice is a no-op: the record is gone).

One phase: a transaction whose whole work belongs to ONE other shard (nothing of it is
the coordinator's: no send, no acknowledgement of its own consumers, no NACK) needs no
vote. Its owner gets ``TxnPrepare(one_phase=True)`` and commits it at once in one
batch, with a **one-phase record** (``shard-txn/1/<txn>``) saying it did; once synced it
answers, and the COMMIT is confirmed: one sync instead of two, no decision record. The
owner keeps the record until the coordinator has heard (``TxnForget``), so a
coordinator that lost the link meanwhile waits for the next one and asks: the record
says committed, its absence that the owner never synced it (rolled back, as a
restarted owner lost the batch). An owner that restarts with records re-sends their
outcome (``TxnCommitted``), so they go even when the coordinator restarted too.

The coordinator waits for that answer as long as for any owner (``owner_wait_ms``):
then it gives the transaction up (``give_up``), and the COMMIT fails with
``OutcomeUnknownError`` (it may have committed: the owner may have synced it before it
stopped answering). An answer that comes later changes nothing here but the owner's
record, which it is told to forget.

Two phases wait for the votes as long (a participant stopped with its link up would
otherwise hold the COMMIT until the link's keep-alive gives up): then, the decision not
being made, the outcome is certain: the transaction aborts (``time_out``), every
participant is told so, and one that prepares later (it wakes up and reads the prepare,
then the abort behind it on the same link; or asks once linked again) drops its part.

The sends are held on the coordinator until COMMIT, not prepared on their owners as
they arrive: an ABORT or a disconnect then costs nothing on the other shards, and a
transaction that touches no other shard costs exactly what it does on one broker.

``CoordinatorTxn`` is the coordinator's state machine for one transaction, pure and
tested on its own; ``ShardTransactions`` holds the transactions in flight and the
records, and records decisions for the shard links (``network/shards.py``).
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field

from meshmq.core.acks import Acks, select_lenient
from meshmq.core.consumer import Consumer
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.message import Message
from meshmq.core.message_codec import decode_message, encoded
from meshmq.core.queue import DONE
from meshmq.core.routing import Router
from meshmq.core.shard_relay import RelayQueue
from meshmq.core.state import Connection, CoreState, Transaction
from meshmq.errors import DestinationError, ResourceLimitError, TransactionError

PREPARED_PREFIX = "shard-txn/p/"
DECIDED_PREFIX = "shard-txn/c/"
ONE_PHASE_PREFIX = "shard-txn/1/"

_LEN = struct.Struct(">I")


class OutcomeUnknownError(TransactionError):
    """A one-phase commit's owner did not answer in time: the transaction may have
    committed there, or not; only that shard knows."""

    code = "transaction-in-doubt"


# ------------------------------------------------------------------ decisions
@dataclass(frozen=True, slots=True)
class TxnPrepare:
    """Decision: ask shard ``owner`` to prepare its part of transaction ``txn``:
    ``sends`` to destinations it owns, ``acks`` of deliveries of its relays to this
    shard as (relay id, owner's tag). ``one_phase``: that part is the whole
    transaction, so the owner commits it at once instead of preparing it."""

    owner: int
    txn: str
    sends: tuple[Message, ...]
    acks: tuple[tuple[int, int], ...]
    one_phase: bool = False


@dataclass(frozen=True, slots=True)
class TxnDecide:
    """Decision: tell participant ``owner`` that ``txn`` commits (or aborts)."""

    owner: int
    txn: str
    commit: bool


@dataclass(frozen=True, slots=True)
class TxnAsk:
    """Decision: ask shard ``peer`` what became of ``txn``: a participant asks the
    coordinator of a transaction it holds prepared; a coordinator asks the owner of a
    one-phase commit whose answer a lost link took."""

    peer: int
    txn: str


@dataclass(frozen=True, slots=True)
class TxnCommitted:
    """Decision: tell coordinator ``coordinator`` that its one-phase ``txn`` committed
    here (sent once that is durable)."""

    coordinator: int
    txn: str


@dataclass(frozen=True, slots=True)
class TxnForget:
    """Decision: tell ``owner`` that the outcome of one-phase ``txn`` has been heard,
    so its one-phase record can go."""

    owner: int
    txn: str


TxnDecision = TxnPrepare | TxnDecide | TxnAsk | TxnCommitted | TxnForget


# ------------------------------------------------------------------ the coordinator
class Phase(enum.Enum):
    PREPARING = "preparing"  # prepares sent, votes coming in
    IN_DOUBT = "in doubt"  # one phase: the link to its owner was lost before its answer
    COMMITTING = "committing"  # decided to commit (logged); participants applying
    ABORTED = "aborted"
    DONE = "done"  # committed, every participant has applied it


class Outcome(enum.Enum):
    COMMIT = "commit"  # two phases: decided, to be logged, then applied by each participant
    COMMITTED = "committed"  # one phase: applied and durable on its one owner
    ABORT = "abort"


class CoordinatorTxn:
    """One transaction on its coordinator: commit once every participant voted yes,
    abort on a no or on a participant lost before then, done once every participant
    confirmed the commit. Events after the outcome change nothing but ``confirmed``.

    ``one_phase`` (one participant, which commits at once): its yes is the commit,
    already applied (``COMMITTED``, done); a lost link leaves the outcome to that
    owner (``IN_DOUBT``) until its answer to an ask, a yes or a no, arrives."""

    __slots__ = ("confirmed_by", "one_phase", "participants", "phase", "yes")

    def __init__(self, participants: frozenset[int], *,
                 phase: Phase = Phase.PREPARING, one_phase: bool = False) -> None:
        if not participants:
            raise ValueError("a transaction across shards has participants")
        if one_phase and len(participants) != 1:
            raise ValueError("a one-phase commit has exactly one participant")
        self.participants = participants
        self.phase = phase
        self.one_phase = one_phase
        self.yes: set[int] = set()
        self.confirmed_by: set[int] = set()

    def vote(self, owner: int, ok: bool) -> Outcome | None:
        """``owner`` prepared (or refused): the outcome once it is known now."""
        open_phases = (Phase.PREPARING, Phase.IN_DOUBT) if self.one_phase \
            else (Phase.PREPARING,)
        if self.phase not in open_phases or owner not in self.participants:
            return None
        if not ok:
            self.phase = Phase.ABORTED
            return Outcome.ABORT
        self.yes.add(owner)
        if self.yes == self.participants:
            if self.one_phase:
                self.confirmed_by.add(owner)
                self.phase = Phase.DONE
                return Outcome.COMMITTED
            self.phase = Phase.COMMITTING
            return Outcome.COMMIT
        return None

    def lost(self, owner: int) -> Outcome | None:
        """The link to ``owner`` dropped: before the decision, that aborts (its vote,
        or its prepared record, may be gone); after it, the commit is driven again.
        One phase: the owner may have committed, so it is asked on the next link."""
        if self.phase is Phase.PREPARING and owner in self.participants:
            if self.one_phase:
                self.phase = Phase.IN_DOUBT
                return None
            self.phase = Phase.ABORTED
            return Outcome.ABORT
        return None

    def timed_out(self) -> Outcome | None:
        """Two phases: the votes did not all come in time. Undecided, it aborts (the
        decision is this coordinator's, and it has not made it); else nothing."""
        if self.one_phase or self.phase is not Phase.PREPARING:
            return None
        self.phase = Phase.ABORTED
        return Outcome.ABORT

    @property
    def unvoted(self) -> frozenset[int]:
        """The participants whose vote has not come."""
        return self.participants - self.yes

    def confirmed(self, owner: int) -> bool:
        """``owner`` applied the commit; True once every participant has."""
        if self.phase is Phase.COMMITTING and owner in self.participants:
            self.confirmed_by.add(owner)
            if self.confirmed_by == self.participants:
                self.phase = Phase.DONE
                return True
        return False

    @property
    def unconfirmed(self) -> frozenset[int]:
        return self.participants - self.confirmed_by


@dataclass(slots=True)
class _Pending:
    """The coordinator's own part of a transaction, held until the decision."""

    conn: Connection
    machine: CoordinatorTxn | None  # None: applied at once, nothing to decide
    sends: list[tuple[tuple[Destination, ...], Message]] = field(default_factory=list)
    acks: list[tuple[Consumer, int]] = field(default_factory=list)  # local entries
    relayed: list[tuple[Consumer, int]] = field(default_factory=list)  # settled there
    nacks: list[tuple[Consumer, int, bool]] = field(default_factory=list)


def one_phase(participants: frozenset[int], local_sends: bool, local_acks: bool,
              nacks: bool) -> bool:
    """May a transaction commit in one phase on its one participant? Only when that
    participant holds all of it: nothing of it is applied on the coordinator but the
    windows of its relayed consumers (a NACK, even of a relayed delivery, is applied
    by the coordinator at the decision, so it keeps two phases)."""
    return len(participants) == 1 and not (local_sends or local_acks or nacks)


# ------------------------------------------------------------------ the records
def encode_prepared(coordinator: int, sends: list[Message], acked: list[Message]) -> bytes:
    """A participant's prepared record: its coordinator, the sends, and copies of the
    messages it acknowledged (put back on abort)."""
    head = json.dumps({"coordinator": coordinator, "sends": len(sends)},
                      separators=(",", ":")).encode()
    parts = [_LEN.pack(len(head)), head]
    for msg in (*sends, *acked):
        data = encoded(msg)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_prepared(body: bytes) -> tuple[int, list[Message], list[Message]]:
    """Inverse of ``encode_prepared``: (coordinator, sends, acknowledged messages)."""
    (size,) = _LEN.unpack_from(body, 0)
    head = json.loads(body[4:4 + size])
    pos = 4 + size
    messages = []
    while pos < len(body):
        (length,) = _LEN.unpack_from(body, pos)
        pos += 4
        messages.append(decode_message(body[pos:pos + length]))
        pos += length
    sends = int(head["sends"])
    return int(head["coordinator"]), messages[:sends], messages[sends:]


# ------------------------------------------------------------------ both roles
class ShardTransactions:
    """The transactions across shards this shard coordinates or takes part in."""

    def __init__(self, state: CoreState, router: Router, acks: Acks) -> None:
        self._state = state
        self._router = router
        self._acks = acks
        self._pending: dict[str, _Pending] = {}  # coordinated, not yet decided
        self._committing: dict[str, CoordinatorTxn] = {}  # decided commit (logged)
        self._decisions: list[TxnDecision] = []
        self._started: dict[str, str] = {}  # connection id -> its last commit's txn id
        self._next = 0
        self._loaded = False
        self._queue_owners: dict[str, int] = {}  # queue name -> owning shard

    # -------------------------------------------------------- the coordinator
    def remote_owners(self, txn: Transaction) -> bool:
        """Does ``txn`` touch a destination another shard owns? (One shard: False.)"""
        # Plain loops: this runs at every COMMIT on a shard, local ones included.
        state = self._state
        shard = state.shard
        if shard is None:
            return False
        here = shard.index
        queues = self._queue_owners  # by name: a str's hash is cached, a Destination's not
        for dests, _ in txn.sends:
            for d in dests:
                if d.kind is DestKind.QUEUE:
                    owner = queues.get(d.name)
                    if owner is None:
                        if len(queues) > 100_000:
                            queues.clear()
                        owner = queues[d.name] = state.owner_of(shard, d)
                else:
                    owner = state.owner_of(shard, d)
                if owner != here:
                    return True
        for consumer, _, _ in txn.acks:
            for source in consumer.sources:
                if type(source) is RelayQueue:
                    return True
        return False

    def commit(self, conn: Connection, txn: Transaction) -> bool:
        """Start the two-phase commit of ``txn`` (taken off the connection): the
        prepares are decisions; ``started(conn)`` names it for the confirmation. True
        when it turned out to touch this shard alone and was applied at once, with
        writes that need a sync."""
        state = self._state
        shard = state.shard
        assert shard is not None
        self._load()
        local_sends: list[tuple[tuple[Destination, ...], Message]] = []
        local_acks: list[tuple[Consumer, int]] = []
        relayed: list[tuple[Consumer, int]] = []
        remote_sends: dict[int, list[Message]] = {}
        for dests, message in txn.sends:
            local = []
            for i, d in enumerate(dests):
                owner = state.owner_of(shard, d)
                if owner == shard.index:
                    local.append(d)
                else:
                    msg = message if i == 0 and d == message.destination \
                        else message.copy_to(d)
                    remote_sends.setdefault(owner, []).append(msg)
            if local:
                local_sends.append((tuple(local), message))
        remote_acks: dict[int, list[tuple[int, int]]] = {}
        seen: set[tuple[int, int]] = set()
        for consumer, tag, cumulative in txn.acks:
            for t in select_lenient(consumer, tag, cumulative):
                if (id(consumer), t) in seen:
                    continue
                seen.add((id(consumer), t))
                entry = consumer.dispatched[t]
                queue = entry.queue
                if isinstance(queue, RelayQueue):
                    remote_acks.setdefault(queue.owner, []).append((queue.relay_id, entry.seq))
                    relayed.append((consumer, t))
                else:
                    local_acks.append((consumer, t))
        participants = frozenset(remote_sends) | frozenset(remote_acks)
        if not participants:  # its relayed acks left their windows meanwhile
            return self._apply(_Pending(conn, None, local_sends, local_acks, relayed,
                                        list(txn.nacks)))
        one = one_phase(participants, bool(local_sends), bool(local_acks),
                        bool(txn.nacks))
        self._next += 1
        txn_id = f"{shard.index}.{state.boot}.{self._next}"
        self._pending[txn_id] = _Pending(conn, CoordinatorTxn(participants, one_phase=one),
                                         local_sends, local_acks, relayed, list(txn.nacks))
        self._started[conn.id] = txn_id
        for owner in sorted(participants):
            self._decisions.append(TxnPrepare(owner, txn_id,
                                              tuple(remote_sends.get(owner, ())),
                                              tuple(remote_acks.get(owner, ())), one))
        return False

    def started(self, conn: Connection) -> str | None:
        """The transaction the last COMMIT of ``conn`` started across shards (once)."""
        return self._started.pop(conn.id, None)

    def voted(self, txn_id: str, owner: int, ok: bool) -> Outcome | None:
        """Participant ``owner`` prepared (synced) or refused. COMMIT: the coordinator's
        part and the decision record are in the current batch; confirm the COMMIT
        and send the commits once it is durable (``participants``). ABORT: the
        participants' aborts are decisions. COMMITTED (one phase: ``owner`` committed
        it, durably): confirm the COMMIT now; the owner is told to forget it."""
        pending = self._pending.get(txn_id)
        if pending is None:
            return None
        machine = pending.machine
        assert machine is not None
        outcome = machine.vote(owner, ok)
        if outcome is Outcome.COMMITTED:
            del self._pending[txn_id]
            self._apply(pending)  # the windows of its relayed acks: nothing to store
            self._decisions.append(TxnForget(owner, txn_id))
        elif outcome is Outcome.COMMIT:
            del self._pending[txn_id]
            self._apply(pending)
            self._committing[txn_id] = machine
            self._router.put_record(DECIDED_PREFIX + txn_id, json.dumps(
                sorted(machine.participants)).encode())
        elif outcome is Outcome.ABORT:
            self._abort(txn_id, pending)
        return outcome

    def committed_one(self, txn_id: str, owner: int) -> Outcome | None:
        """``owner`` says one-phase ``txn_id`` committed there (its answer, or sent
        again after it restarted): the outcome if this shard still waited for it. The
        owner is told to forget it either way."""
        if txn_id in self._pending:
            return self.voted(txn_id, owner, True)
        self._decisions.append(TxnForget(owner, txn_id))
        return None

    def give_up(self, txn_id: str) -> bool:
        """Stop waiting for one-phase ``txn_id``'s owner (its answer did not come in
        time): True if it was still undecided here. Nothing is applied or undone: its
        outcome is the owner's, whose later answer is only told to forget it."""
        pending = self._pending.get(txn_id)
        if pending is None or pending.machine is None or not pending.machine.one_phase:
            return False
        del self._pending[txn_id]
        return True

    def time_out(self, txn_id: str) -> list[int] | None:
        """Two-phase ``txn_id``'s votes did not all come within the wait: if it is still
        undecided, it aborts (the participants' aborts are decisions) and the
        participants that did not vote are returned; None when it was decided meanwhile
        (or is one phase: ``give_up``)."""
        pending = self._pending.get(txn_id)
        if pending is None or pending.machine is None:
            return None
        unvoted = pending.machine.unvoted
        if pending.machine.timed_out() is not Outcome.ABORT:
            return None
        self._abort(txn_id, pending)
        return sorted(unvoted)

    def participants(self, txn_id: str) -> list[int]:
        """The participants still to apply decided ``txn_id``."""
        machine = self._committing.get(txn_id)
        return sorted(machine.unconfirmed) if machine is not None else []

    def link_lost(self, owner: int) -> list[str]:
        """The link to ``owner`` dropped: the undecided transactions it takes part in
        abort (returned, to fail their COMMITs)."""
        aborted = []
        for txn_id, pending in list(self._pending.items()):
            if pending.machine is not None and pending.machine.lost(owner) is Outcome.ABORT:
                self._abort(txn_id, pending)
                aborted.append(txn_id)
        return aborted

    def confirmed(self, txn_id: str, owner: int) -> None:
        """Participant ``owner`` applied the commit: the record goes once all have."""
        machine = self._committing.get(txn_id)
        if machine is not None and machine.confirmed(owner):
            del self._committing[txn_id]
            self._router.drop_record(DECIDED_PREFIX + txn_id)

    def answer(self, txn_id: str) -> bool | None:
        """A participant asks about prepared ``txn_id``: commit (True) if the decision
        is logged, None while it is still being decided, else abort (presumed)."""
        self._load()
        if txn_id in self._committing:
            return True
        if txn_id in self._pending:
            return None
        return False

    def _apply(self, pending: _Pending) -> bool:
        """The coordinator's own part, as core/transactions.py applies a transaction;
        True when its writes need a sync."""
        conn = pending.conn
        needs_sync = False
        for dests, message in pending.sends:
            needs_sync |= self._router.route(conn, dests, message)
        for consumer, tag in pending.acks:
            if not consumer.closed:
                needs_sync |= self._acks.settle(consumer, (tag,), True)
        for consumer, tag in pending.relayed:
            # Acknowledged on its owner when it prepared: only the window here.
            entry = consumer.dispatched.pop(tag, None)
            if entry is not None:
                consumer.by_message_id.pop(entry.message.message_id, None)
                consumer.acked_count += 1
                entry.state = DONE
                entry.consumer = None
        for consumer, tag, cumulative in pending.nacks:
            if not consumer.closed:
                needs_sync |= self._acks.settle(
                    consumer, select_lenient(consumer, tag, cumulative), False)
        return needs_sync

    def _abort(self, txn_id: str, pending: _Pending) -> None:
        # Its acknowledged deliveries stay unacknowledged in their windows, as after
        # ABORT; every participant is told (one that never prepared ignores it). A
        # one-phase owner that refused, or never synced it, holds nothing to drop.
        self._pending.pop(txn_id, None)
        assert pending.machine is not None
        if pending.machine.one_phase:
            return
        for owner in sorted(pending.machine.participants):
            self._decisions.append(TxnDecide(owner, txn_id, False))

    # -------------------------------------------------------- a participant
    def prepare(self, coordinator: int, txn_id: str, sends: list[Message],
                acks: list[tuple[Consumer, int]]) -> None:
        """Prepare this shard's part of ``txn_id``, in the current batch: the acked
        deliveries leave their queues, and the prepared record keeps the sends and
        copies of them. Raises (a refusal, nothing changed) when it cannot commit."""
        name = PREPARED_PREFIX + txn_id
        if name in self._state.records:
            return  # prepared already
        acked = self._check(sends, acks)
        for consumer, tag in acks:
            self._acks.settle(consumer, (tag,), True)
        self._router.put_record(name, encode_prepared(coordinator, sends, acked))

    def commit_one(self, coordinator: int, txn_id: str, sends: list[Message],
                   acks: list[tuple[Consumer, int]]) -> None:
        """Commit one-phase ``txn_id`` (all of it is this shard's) in the current
        batch: the acked deliveries leave their queues, the sends are routed, and the
        one-phase record says it committed until the coordinator has heard. Raises (a
        refusal, nothing changed) when it cannot commit."""
        name = ONE_PHASE_PREFIX + txn_id
        if name in self._state.records:
            return  # committed already
        self._check(sends, acks)
        for consumer, tag in acks:
            self._acks.settle(consumer, (tag,), True)
        for msg in sends:
            self._router.route(None, (msg.destination,), msg, owned=True)
        self._router.put_record(name, json.dumps({"coordinator": coordinator},
                                                 separators=(",", ":")).encode())

    def committed_here(self, txn_id: str) -> bool:
        """Did one-phase ``txn_id`` commit on this shard (and is not yet forgotten)?"""
        return ONE_PHASE_PREFIX + txn_id in self._state.records

    def forget(self, txn_id: str) -> None:
        """The coordinator heard one-phase ``txn_id``'s outcome: its record goes."""
        if self.committed_here(txn_id):
            self._router.drop_record(ONE_PHASE_PREFIX + txn_id)

    def _check(self, sends: list[Message], acks: list[tuple[Consumer, int]]
               ) -> list[Message]:
        """Raise if this shard cannot take ``sends`` and ``acks``; else the messages
        the acks take off queues (kept to put back on abort)."""
        state = self._state
        for msg in sends:
            d = msg.destination
            if d.is_temporary and not state.temp_exists(d):
                raise DestinationError(f"temporary destination {d} no longer exists")
        if state.persistent_refusal is not None and any(m.persistent for m in sends):
            raise ResourceLimitError(f"persistent message refused: "
                                     f"{state.persistent_refusal}")
        acked: list[Message] = []
        for consumer, tag in acks:
            entry = consumer.dispatched.get(tag)
            if entry is None or consumer.closed:
                raise TransactionError("a message acknowledged in the transaction was "
                                       "delivered again meanwhile")
            if entry.message.destination.kind is DestKind.QUEUE:
                acked.append(entry.message)
        return acked

    def finish(self, txn_id: str, commit: bool) -> bool:
        """The coordinator decided: apply (or discard) the prepared part, and drop the
        record, in the current batch. True when there was one (else: done before)."""
        name = PREPARED_PREFIX + txn_id
        record = self._state.records.get(name)
        if record is None:
            return False
        _, sends, acked = decode_prepared(record[1])
        if commit:
            for msg in sends:
                self._router.route(None, (msg.destination,), msg, owned=True)
        else:
            state = self._state
            for msg in acked:  # back in its queue, flagged
                self._router.route_queue(state.get_queue(msg.destination), msg, True)
        self._router.drop_record(name)
        return True

    # -------------------------------------------------------- after a new link
    def resume(self, peer: int) -> list[TxnDecision]:
        """What to tell ``peer`` on a new link: ask it about transactions prepared
        here that it coordinates, and tell it again to commit those decided here."""
        self._load()
        out: list[TxnDecision] = []
        for name, (_, body) in list(self._state.records.items()):
            if name.startswith(PREPARED_PREFIX):
                coordinator, _, _ = decode_prepared(body)
                if coordinator == peer:
                    out.append(TxnAsk(peer, name[len(PREPARED_PREFIX):]))
            elif name.startswith(ONE_PHASE_PREFIX) \
                    and int(json.loads(body)["coordinator"]) == peer:
                out.append(TxnCommitted(peer, name[len(ONE_PHASE_PREFIX):]))
        for txn_id, machine in self._committing.items():
            if peer in machine.unconfirmed:
                out.append(TxnDecide(peer, txn_id, True))
        for txn_id, pending in self._pending.items():
            doubt = pending.machine
            if doubt is not None and doubt.phase is Phase.IN_DOUBT \
                    and peer in doubt.participants:
                out.append(TxnAsk(peer, txn_id))
        return out

    def _load(self) -> None:
        """Decision records recovered from the store (once, after a restart)."""
        if self._loaded:
            return
        self._loaded = True
        for name, (_, body) in self._state.records.items():
            if name.startswith(DECIDED_PREFIX):
                txn_id = name[len(DECIDED_PREFIX):]
                if txn_id not in self._committing:
                    self._committing[txn_id] = CoordinatorTxn(
                        frozenset(int(k) for k in json.loads(body)), phase=Phase.COMMITTING)

    def take(self) -> list[TxnDecision]:
        out, self._decisions = self._decisions, []
        return out

    @property
    def in_flight(self) -> int:
        """Transactions coordinated here not yet done (statistics, tests)."""
        return len(self._pending) + len(self._committing)
