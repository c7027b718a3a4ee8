"""Rebalance planning (node/rebalance_plan.py): which stored keys move where when a
node's shard count changes. Properties over random stores and counts: after the plan,
every key lives exactly once, on its owner under the new count (an MQTT session's
record on its client id's owner); nothing stays on a store that goes away; growing by
one moves keys only to the new shard; spread durable subscriptions get fresh, growing
seqs after what their target holds."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.core.destinations import Destination
from meshmq.core.shards import HASH_NAME, NUMBERED_NAME, client_owner, owner
from meshmq.node.rebalance_plan import (
    PLAIN,
    SESSION_PREFIX,
    RebalanceError,
    StoredKey,
    home,
    plan,
    targets_of,
)
from meshmq.store.base import DurableSubscription

NODE = "node"
names = st.text(alphabet="abcdefgh.", min_size=1, max_size=8).filter(
    lambda s: not s.startswith(".") and not s.endswith(".") and ".." not in s)
counts = st.integers(min_value=1, max_value=9)


def _loc(shard: int, count: int) -> int:
    return PLAIN if count == 1 else shard


def _owner_loc(uri: str, count: int) -> int:
    return _loc(owner(Destination.parse_uri(uri), count, node=NODE), count)


def _durable(key: str, destination: str) -> DurableSubscription:
    return DurableSubscription(key, "c", key, destination)


@st.composite
def stores(draw: st.DrawFn) -> tuple[int, dict[int, list[StoredKey]]]:
    """A node of ``old`` shards whose queues, single-topic durable subscriptions and
    MQTT session records sit on their owners (as a node keeps them)."""
    old = draw(counts)
    queues = draw(st.sets(names, max_size=30))
    topics = draw(st.sets(names, max_size=8))
    sessions = draw(st.sets(names, max_size=12))
    held: dict[int, list[StoredKey]] = {loc: [] for loc in targets_of(old)}
    for client_id in sorted(sessions):
        held[_loc(client_owner(client_id, old), old)].append(
            StoredKey(SESSION_PREFIX + client_id))
    for q in sorted(queues):
        uri = f"queue://{q}"
        held[_owner_loc(uri, old)].append(StoredKey(uri, 3))
    for t in sorted(topics):
        uri = f"topic://{t}"
        key = f"durable://c:{t}"
        held[_owner_loc(uri, old)].append(StoredKey(key, 2, _durable(key, uri)))
        held[_owner_loc(uri, old)].append(StoredKey(f"retained://{t}", 1))
    return old, held


def _after(held: dict[int, list[StoredKey]], new: int) -> dict[str, list[int]]:
    """Where each key is once the plan is carried out."""
    result = plan(held, new, NODE)
    where = {loc: {s.key for s in keys} for loc, keys in held.items()}
    for move in result.moves:
        where[move.source].discard(move.key)
        where.setdefault(move.target, set()).add(move.key)
    placed: dict[str, list[int]] = {}
    for loc, keys in where.items():
        for key in keys:
            placed.setdefault(key, []).append(loc)
    return placed


@given(stores(), counts)
def test_every_key_ends_once_on_its_new_owner(layout: tuple[int, dict[int, list[StoredKey]]],
                                               new: int) -> None:
    _old, held = layout
    placed = _after(held, new)
    for key, locs in placed.items():
        if key.startswith(SESSION_PREFIX):
            client_id = key[len(SESSION_PREFIX):]
            assert locs == [_loc(client_owner(client_id, new), new)], key
            continue
        uri = key.replace("durable://c:", "topic://").replace("retained://", "topic://")
        assert locs == [_owner_loc(uri, new)], key
    assert sum(len(v) for v in held.values()) == len(placed)


@given(stores(), counts)
def test_keys_that_keep_their_owner_do_not_move(
        layout: tuple[int, dict[int, list[StoredKey]]], new: int) -> None:
    _old, held = layout
    moved = {m.key for m in plan(held, new, NODE).moves}
    for loc, keys in held.items():
        for s in keys:
            if home(s, new, NODE, loc) == loc:
                assert s.key not in moved


@given(stores())
def test_growing_by_one_moves_only_to_the_new_shard(
        layout: tuple[int, dict[int, list[StoredKey]]]) -> None:
    old, held = layout
    if old == 1:
        return  # from one process every key moves into a shard's store
    assert {m.target for m in plan(held, old + 1, NODE).moves} <= {old}


@given(stores())
def test_the_same_count_moves_nothing(layout: tuple[int, dict[int, list[StoredKey]]]) -> None:
    old, held = layout
    assert plan(held, old, NODE).empty


numbered_names = st.tuples(names, st.integers(0, 40)).map(lambda t: f"{t[0]}{t[1]}")


@st.composite
def numbered_stores(draw: st.DrawFn) -> tuple[int, str, dict[int, list[StoredKey]]]:
    """A node of ``old`` shards under either placement whose queues (many of them
    numbered) sit on their owners."""
    old = draw(st.integers(min_value=2, max_value=9))
    was = draw(st.sampled_from([HASH_NAME, NUMBERED_NAME]))
    queues = draw(st.sets(st.one_of(names, numbered_names), max_size=40))
    held: dict[int, list[StoredKey]] = {loc: [] for loc in targets_of(old)}
    for q in sorted(queues):
        uri = f"queue://{q}"
        held[owner(Destination.parse_uri(uri), old, node=NODE, placement=was)].append(
            StoredKey(uri, 2))
    return old, was, held


@given(numbered_stores(), st.integers(min_value=1, max_value=9),
       st.sampled_from([HASH_NAME, NUMBERED_NAME]))
def test_every_key_ends_on_its_owner_under_the_new_placement(
        layout: tuple[int, str, dict[int, list[StoredKey]]], new: int, placement: str) -> None:
    old, was, held = layout
    result = plan(held, new, NODE, placement)
    where = {s.key: loc for loc, keys in held.items() for s in keys}
    for move in result.moves:
        assert where[move.key] == move.source
        where[move.key] = move.target
    for key, loc in where.items():
        assert loc == _loc(owner(Destination.parse_uri(key), new, node=NODE,
                                 placement=placement), new), key
    if new == old and placement == was:
        assert result.empty


@given(st.integers(min_value=2, max_value=6), st.integers(min_value=1, max_value=6),
       st.lists(names, min_size=1, max_size=20), st.integers(min_value=0, max_value=50))
def test_a_wildcard_durable_is_split_by_message_destination(
        old: int, new: int, topics: list[str], target_last: int) -> None:
    """A durable wildcard kept on every shard: each entry goes to its destination's new
    owner, appended after the target's last seq in source order, and every target ends
    with the subscription's record."""
    key = "durable://c:all"
    record = _durable(key, "topic://>")
    held: dict[int, list[StoredKey]] = {}
    per_shard: dict[int, list[tuple[int, str]]] = {k: [] for k in range(old)}
    for i, t in enumerate(topics):
        uri = f"topic://{t}"
        shard = owner(Destination.parse_uri(uri), old, node=NODE)
        per_shard[shard].append((i + 1, uri))
    for k in range(old):
        held[k] = [StoredKey(key, target_last, record, tuple(per_shard[k]))]
    result = plan(held, new, NODE)
    landed: Counter[str] = Counter()
    seen_targets: dict[int, list[int]] = {}
    for em in result.entry_moves:
        entries = dict(per_shard[em.source])
        for src, dst in em.seqs:
            uri = entries[src]
            assert _owner_loc(uri, new) == em.target
            landed[uri] += 1
            seen_targets.setdefault(em.target, []).append(dst)
        assert em.drop_source == (em.source not in targets_of(new))
    for tgt, seqs in seen_targets.items():
        base = target_last if tgt in held else 0
        assert seqs == list(range(base + 1, base + 1 + len(seqs)))
    staying = Counter(uri for k in range(old) for _, uri in per_shard[k]
                      if _owner_loc(uri, new) == k)
    assert landed + staying == Counter(f"topic://{t}" for t in topics)
    with_record = set(held) | {c.target for c in result.record_copies}
    assert set(targets_of(new)) <= with_record


def test_an_undecided_transaction_is_refused() -> None:
    held = {0: [StoredKey("record://shard-txn/p/x")], 1: []}
    with pytest.raises(RebalanceError, match="still undecided"):
        plan(held, 3, NODE)


def test_a_key_stored_on_two_shards_is_refused_but_a_session_record_is_kept() -> None:
    q = "queue://rb.twice"
    with pytest.raises(RebalanceError, match="stored both"):
        plan({0: [StoredKey(q)], 1: [StoredKey(q)], PLAIN: []}, 1, NODE)
    session = "record://mqtt/c1"
    result = plan({0: [StoredKey(session)], 1: [StoredKey(session)], PLAIN: []}, 1, NODE)
    assert [m.source for m in result.moves] == [0]
    assert [m.source for m in result.dropped_records] == [1]


@given(st.lists(names, min_size=1, max_size=20, unique=True),
       st.integers(min_value=2, max_value=6), st.integers(min_value=1, max_value=6))
def test_a_session_record_left_on_any_shard_goes_to_its_client_ids_owner(
        client_ids: list[str], old: int, new: int) -> None:
    """Wherever an MQTT session's record was kept (an older node kept it on the shard
    the session was made on), it ends on the client id's owner under the new count."""
    held: dict[int, list[StoredKey]] = {loc: [] for loc in targets_of(old)}
    for i, client_id in enumerate(client_ids):
        held[i % old].append(StoredKey(SESSION_PREFIX + client_id))
    placed = _after(held, new)
    for client_id in client_ids:
        assert placed[SESSION_PREFIX + client_id] == [_loc(client_owner(client_id, new), new)]
