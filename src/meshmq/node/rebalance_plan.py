"""Which stored keys move where when a node's shard count changes: pure, no I/O.

A store location is a shard index, or ``PLAIN`` for the store of one broker process
(``shards = 1``, no ``shards.json``). Every store key has a home under the new count:

* ``queue://X``, ``stream://X`` (a stream's offsets), ``retained://T`` (an MQTT retained
  message) and a durable subscription on one topic go to the owner of their destination
  (core/shards.py); the whole key moves with its sequence numbers.
* A durable subscription on a wildcard or on several topics is kept on every owner of
  what it matches: each stored entry goes to the owner of the message's destination,
  appended after what the target already holds for that key (new sequence numbers,
  planned here so that a resumed move writes the same ones), and the subscription's
  record is put on every target that should hold it.
* An MQTT session's record (``record://mqtt-session/<client id>``) goes to the client
  id's owner under the new count (core/shards.py's ``client_owner``), which arbitrates
  the id and keeps its session; its durable subscriptions move with their topics.
* Other records stay where they are, or go to the first target when their shard goes
  away.
* A two-phase transaction still undecided (``record://shard-txn/``) is refused: the node
  must finish it under the old count first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meshmq.core.destinations import Destination, DestKind
from meshmq.core.shards import HASH_NAME, client_owner, owner
from meshmq.errors import MeshmqError
from meshmq.store.base import DurableSubscription

PLAIN = -1  # the store of one broker process
_TXN_PREFIX = "record://shard-txn/"
# transport/mqtt_server.py's session record, as a store key.
SESSION_PREFIX = "record://mqtt-session/"
_PLACED_PREFIXES = (("stream://", DestKind.QUEUE), ("retained://", DestKind.TOPIC))


class RebalanceError(MeshmqError):
    """The stores cannot be rebalanced as they are (one line: what to do)."""

    code = "rebalance"


@dataclass(frozen=True, slots=True)
class StoredKey:
    """What planning needs to know of one key in one store. ``entries`` (live seq and
    the message's destination URI) is only needed for spread durable subscriptions."""

    key: str
    last_seq: int = 0
    durable: DurableSubscription | None = None
    entries: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class KeyMove:
    """Copy ``key`` whole from ``source`` to ``target`` (same seqs), then drop it there."""

    key: str
    source: int
    target: int


@dataclass(frozen=True, slots=True)
class EntryMove:
    """Copy entries of a spread durable subscription: ``seqs`` pairs (source seq, target
    seq). ``drop_source`` drops the whole key at the source (its store goes away)."""

    key: str
    source: int
    target: int
    seqs: tuple[tuple[int, int], ...]
    drop_source: bool


@dataclass(frozen=True, slots=True)
class RecordCopy:
    """Put a spread durable subscription's record into ``target``."""

    key: str
    source: int
    target: int


@dataclass(slots=True)
class Plan:
    moves: list[KeyMove] = field(default_factory=list)
    entry_moves: list[EntryMove] = field(default_factory=list)
    record_copies: list[RecordCopy] = field(default_factory=list)
    dropped_records: list[KeyMove] = field(default_factory=list)  # target kept its own

    @property
    def empty(self) -> bool:
        return not (self.moves or self.entry_moves or self.record_copies
                    or self.dropped_records)


def targets_of(count: int) -> list[int]:
    return [PLAIN] if count == 1 else list(range(count))


def _location(shard: int, count: int) -> int:
    return PLAIN if count == 1 else shard


def _patterns(record: DurableSubscription) -> list[Destination]:
    return [Destination.parse_uri(u) for u in record.destination.split(",")]


def is_spread(record: DurableSubscription) -> bool:
    """Whether a durable subscription is kept on several shards (a wildcard, or several
    topics), so that its entries are placed one by one."""
    patterns = _patterns(record)
    return len(patterns) > 1 or patterns[0].is_wildcard


def home(stored: StoredKey, count: int, node: str, here: int,
         placement: str = HASH_NAME) -> int | None:
    """The location ``stored`` belongs to under ``count`` shards, or None for a spread
    durable subscription (placed entry by entry)."""
    key = stored.key
    if key.startswith(_TXN_PREFIX):
        raise RebalanceError(
            f"a transaction across shards is still undecided ({key}): start the node "
            "once with its current shard count so it finishes it, stop it, and run the "
            "rebalance again")
    if stored.durable is not None:
        if is_spread(stored.durable):
            return None
        first = _patterns(stored.durable)[0]
        return _location(owner(first, count, node=node, placement=placement), count)
    for prefix, kind in _PLACED_PREFIXES:
        if key.startswith(prefix):
            return _location(owner(Destination(kind, key[len(prefix):]), count,
                                   node=node, placement=placement), count)
    if key.startswith(SESSION_PREFIX):
        return _location(client_owner(key[len(SESSION_PREFIX):], count), count)
    try:
        dest = Destination.parse_uri(key)
    except MeshmqError:
        dest = None
    if dest is not None and not dest.is_wildcard:
        return _location(owner(dest, count, node=node, placement=placement), count)
    # A record or a key this meshmq does not place: kept in place.
    targets = targets_of(count)
    return here if here in targets else targets[0]


def record_targets(record: DurableSubscription, count: int, node: str,
                   placement: str = HASH_NAME) -> list[int]:
    """Where a spread durable subscription's record must be: every target for a
    wildcard, the owners of its topics otherwise."""
    patterns = _patterns(record)
    if any(p.is_wildcard for p in patterns):
        return targets_of(count)
    return sorted({_location(owner(p, count, node=node, placement=placement), count)
                   for p in patterns})


def plan(stores: Mapping[int, Sequence[StoredKey]], count: int, node: str,
         placement: str = HASH_NAME) -> Plan:
    """The moves that give every stored key its home under ``count`` shards.
    ``stores``: every existing store location (old ones and new ones) and its keys."""
    result = Plan()
    targets = targets_of(count)
    held = {loc: {s.key: s for s in keys} for loc, keys in stores.items()}
    next_seq: dict[tuple[int, str], int] = {}
    spread_records: dict[str, tuple[int, DurableSubscription]] = {}
    claimed: set[tuple[int, str]] = set()  # (target, key) a whole move fills
    for loc in sorted(stores):
        for stored in stores[loc]:
            where = home(stored, count, node, loc, placement)
            if where is None:
                assert stored.durable is not None
                spread_records.setdefault(stored.key, (loc, stored.durable))
                by_target: dict[int, list[int]] = {}
                for seq, uri in stored.entries:
                    try:
                        dest = Destination.parse_uri(uri)
                    except MeshmqError:
                        dest = None
                    to = loc if dest is None else _location(
                        owner(dest, count, node=node, placement=placement), count)
                    if to == loc and loc not in targets:
                        to = targets[0]
                    if to != loc:
                        by_target.setdefault(to, []).append(seq)
                leaving = loc not in targets
                for to in sorted(by_target):
                    slot = (to, stored.key)
                    if slot not in next_seq:
                        there = held.get(to, {}).get(stored.key)
                        next_seq[slot] = there.last_seq if there is not None else 0
                    base = next_seq[slot]
                    seqs = tuple((s, base + i + 1) for i, s in enumerate(by_target[to]))
                    next_seq[slot] = base + len(seqs)
                    result.entry_moves.append(EntryMove(stored.key, loc, to, seqs, leaving))
                if leaving and not by_target:
                    result.entry_moves.append(EntryMove(stored.key, loc, targets[0], (),
                                                        True))
                continue
            if where == loc:
                continue
            move = KeyMove(stored.key, loc, where)
            there = held.get(where, {}).get(stored.key)
            if (where, stored.key) in claimed or (
                    there is not None and home(there, count, node, where) == where):
                if stored.key.startswith("record://"):
                    result.dropped_records.append(move)
                    continue
                raise RebalanceError(
                    f"{stored.key} is stored both in {_name(loc)} and in {_name(where)}: "
                    "start the node with its current shard count and drain one of them, "
                    "then run the rebalance again")
            claimed.add((where, stored.key))
            result.moves.append(move)
    for key, (source, record) in sorted(spread_records.items()):
        for to in record_targets(record, count, node, placement):
            there = held.get(to, {}).get(key)
            if there is None or there.durable is None:
                result.record_copies.append(RecordCopy(key, source, to))
    return result


def _name(loc: int) -> str:
    return "the one-process store" if loc == PLAIN else f"shard {loc}"


def location_name(loc: int) -> str:
    return "one process" if loc == PLAIN else f"shard {loc}"
