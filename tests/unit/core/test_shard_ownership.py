"""Destination ownership across a node's shards: the hash is part of the store format."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshmq.config.model import SHARD_PLACEMENTS
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.shards import (
    FRONT_SHARD,
    HASH_NAME,
    NUMBERED_NAME,
    PLACEMENTS,
    ShardIdentity,
    client_owner,
    jump_hash,
    numbered_member,
    owner,
    placement_word,
    temp_name,
    temp_shard,
)
from meshmq.errors import ConfigError


def dest(uri: str) -> Destination:
    kind, name = uri.split("://", 1)
    return Destination(DestKind(kind), name)


# Published vectors of the jump consistent hash (the reference implementations agree).
@pytest.mark.parametrize(("key", "buckets", "expected"), [
    (1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520),
])
def test_jump_hash_matches_the_published_vectors(key: int, buckets: int, expected: int) -> None:
    assert jump_hash(key, buckets) == expected


# Changing any of these moves stored destinations to another shard's journal: it is a
# store-format change (HASH_NAME in shards.json), not a refactoring.
GOLDEN = {
    "queue://orders": [0, 1, 2, 2, 2, 2, 2, 7, 7, 7, 7, 7, 7, 7, 7, 7],
    "queue://orders.eu": [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    "topic://prices": [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    "queue://a": [0, 0, 0, 0, 4, 4, 4, 4, 4, 9, 9, 11, 11, 11, 11, 11],
    "topic://ActiveMQ.Advisory.Queue": [0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 11, 11, 11, 11, 11],
    "queue://DLQ": [0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4],
}


# The same, under numbered placement (NUMBERED_NAME in shards.json).
GOLDEN_NUMBERED = {
    "queue://orders.0": [0, 1, 1, 1, 1, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6],
    "queue://orders.1": [0, 0, 2, 2, 2, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7],
    "queue://orders.15": [0, 0, 1, 0, 1, 2, 0, 5, 3, 1, 10, 9, 8, 7, 6, 5],
    "topic://sensors/7": [0, 0, 2, 0, 3, 0, 5, 4, 3, 2, 1, 0, 6, 5, 4, 3],
}
PINNED = {HASH_NAME: GOLDEN, NUMBERED_NAME: GOLDEN_NUMBERED}


@pytest.mark.parametrize(("scheme", "uri"), [(scheme, uri) for scheme, table in PINNED.items()
                                             for uri in sorted(table)])
def test_owners_are_pinned_for_one_to_sixteen_shards(scheme: str, uri: str) -> None:
    assert [owner(dest(uri), n, placement=scheme) for n in range(1, 17)] == PINNED[scheme][uri]
    assert (HASH_NAME, NUMBERED_NAME) == ("jump-blake2b-1", "jump-blake2b-numbered-1")


def test_a_queue_and_a_topic_of_one_name_are_owned_independently() -> None:
    owners = {(owner(dest(f"queue://q{i}"), 8), owner(dest(f"topic://q{i}"), 8))
              for i in range(200)}
    assert any(q != t for q, t in owners)


names = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="*>"),
                min_size=1, max_size=40)


@given(name=names, count=st.integers(1, 63))
def test_growing_by_one_shard_moves_a_destination_only_to_the_new_shard(
        name: str, count: int) -> None:
    before = owner(Destination(DestKind.QUEUE, name), count)
    after = owner(Destination(DestKind.QUEUE, name), count + 1)
    assert 0 <= before < count
    assert after in (before, count)


def test_destinations_spread_evenly() -> None:
    counts = collections.Counter(owner(dest(f"queue://orders.{i}"), 16) for i in range(16_000))
    assert len(counts) == 16
    assert min(counts.values()) > 800 and max(counts.values()) < 1200


def test_about_one_in_n_plus_one_destinations_move_when_a_shard_is_added() -> None:
    queues = [dest(f"queue://load.{i}") for i in range(10_000)]
    moved = sum(owner(q, 4) != owner(q, 5) for q in queues)
    assert 1600 < moved < 2400  # 1/5 of 10,000


def test_a_wildcard_has_no_owner() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        owner(dest("topic://prices.>"), 4)
    assert owner(dest("topic://prices.>"), 1) == 0


def test_a_temporary_destination_lives_on_the_shard_that_named_it() -> None:
    name = temp_name("node-a", 3, "18c2f", "c-17", 4)
    assert name == "ID:node-a-s3-18c2f-c-17:4"
    assert temp_shard(name, "node-a") == 3
    assert owner(Destination(DestKind.TEMP_QUEUE, name), 4, node="node-a") == 3
    assert owner(Destination(DestKind.TEMP_TOPIC, name), 4, node="node-a") == 3


@pytest.mark.parametrize("name", [
    "ID:other-s3-18c2f-c-17:4",      # another broker's, adopted across a bridge
    "ID:node-a-18c2f-c-17:4",        # named without a shard
    "ID:node-a-s9-18c2f-c-17:4",     # a shard this node no longer has
])
def test_a_temporary_destination_the_node_cannot_place_belongs_to_the_front_shard(
        name: str) -> None:
    assert owner(Destination(DestKind.TEMP_QUEUE, name), 4, node="node-a") == FRONT_SHARD


def test_client_ids_are_owned_apart_from_destinations() -> None:
    owners = collections.Counter(client_owner(f"sensor-{i}", 4) for i in range(4000))
    assert set(owners) == {0, 1, 2, 3}
    assert client_owner("anything", 1) == 0


def test_a_shard_identity_knows_its_sockets_and_what_it_owns() -> None:
    me = ShardIdentity(index=1, count=2, node="n", run_dir="/tmp/run", token="t")
    assert me.label == "n#1" and not me.is_front
    assert me.link_socket(0) == "/tmp/run/shard-0.sock"
    assert me.owns(dest("queue://orders")) == (owner(dest("queue://orders"), 2) == 1)


@pytest.mark.parametrize(("index", "count"), [(2, 2), (-1, 2), (0, 0), (0, 257)])
def test_a_shard_identity_out_of_range_is_a_config_error(index: int, count: int) -> None:
    with pytest.raises(ConfigError):
        ShardIdentity(index=index, count=count, node="n", run_dir="/r", token="t")


# --------------------------------------------------------------- numbered placement


families = st.text(st.characters(exclude_categories=["Cs", "Nd"], exclude_characters="*>"),
                   max_size=20)


@given(family=families, first=st.integers(0, 10**6), members=st.integers(1, 200),
       count=st.integers(1, 64))
def test_a_numbered_family_spreads_over_the_shards_within_one(
        family: str, first: int, members: int, count: int) -> None:
    per = collections.Counter(
        owner(Destination(DestKind.QUEUE, f"{family}{n}"), count, placement=NUMBERED_NAME)
        for n in range(first, first + members))
    if members >= count:
        assert len(per) == count
    assert max(per.values()) - min(per.values()) <= 1
    assert max(per.values()) == -(-members // count)


def test_numbered_placement_gives_a_family_of_sixty_four_four_queues_a_shard() -> None:
    """Where a hash of each name leaves the busiest of 16 shards about twice the mean."""
    for family in ("bench.r1234x99.", "orders-", "q"):
        per = collections.Counter(owner(dest(f"queue://{family}{n}"), 16,
                                        placement=NUMBERED_NAME) for n in range(64))
        assert sorted(per.values()) == [4] * 16
    hashed = collections.Counter(owner(dest(f"queue://orders-{n}"), 16) for n in range(64))
    assert max(hashed.values()) > 4


@pytest.mark.parametrize("name", ["orders", "orders.eu", "q1234567890", "orders.\u0663",
                                  "", "a.b-c"])
def test_a_name_without_a_short_ascii_number_is_hashed_whole(name: str) -> None:
    assert numbered_member(name) is None
    if name:
        for count in (2, 5, 16):
            assert owner(Destination(DestKind.QUEUE, name), count,
                         placement=NUMBERED_NAME) == owner(Destination(DestKind.QUEUE, name),
                                                           count)


def test_a_member_number_is_the_trailing_digits() -> None:
    assert numbered_member("orders.007") == ("orders.", 7)
    assert numbered_member("sensors/12") == ("sensors/", 12)
    assert numbered_member("42") == ("", 42)
    assert numbered_member("x999999999") == ("x", 999_999_999)


def test_a_family_of_queues_and_one_of_topics_are_placed_apart() -> None:
    starts = {(owner(dest(f"queue://f{i}.0"), 16, placement=NUMBERED_NAME),
               owner(dest(f"topic://f{i}.0"), 16, placement=NUMBERED_NAME)) for i in range(50)}
    assert any(q != t for q, t in starts)


def test_numbered_placement_keeps_the_rules_for_temporary_and_advisory_topics() -> None:
    name = temp_name("node-a", 3, "18c2f", "c-17", 4)
    assert owner(Destination(DestKind.TEMP_QUEUE, name), 4, node="node-a",
                 placement=NUMBERED_NAME) == 3
    advisory = dest("topic://ActiveMQ.Advisory.Consumer.Queue.orders.5")
    assert owner(advisory, 16, placement=NUMBERED_NAME) == owner(
        dest("queue://orders.5"), 16, placement=NUMBERED_NAME)


def test_a_shard_identity_owns_by_its_placement() -> None:
    me = ShardIdentity(index=1, count=4, node="n", run_dir="/r", token="t",
                       placement=NUMBERED_NAME)
    owned = [n for n in range(8) if me.owns(dest(f"queue://jobs.{n}"))]
    assert len(owned) == 2 and owned[1] - owned[0] == 4
    with pytest.raises(ConfigError, match="placement"):
        ShardIdentity(index=0, count=2, node="n", run_dir="/r", token="t", placement="x")


def test_the_configuration_words_name_the_recorded_schemes() -> None:
    assert tuple(PLACEMENTS) == SHARD_PLACEMENTS
    assert PLACEMENTS["hash"] == HASH_NAME
    assert [placement_word(PLACEMENTS[w]) for w in SHARD_PLACEMENTS] == list(SHARD_PLACEMENTS)
    assert placement_word("other-9") == "other-9"
