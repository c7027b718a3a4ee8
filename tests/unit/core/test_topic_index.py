"""The topic subscription index agrees with the wildcard rules, whatever the history."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from meshmq.core import destinations as dst
from meshmq.core.destinations import Destination, DestKind
from meshmq.core.topic_index import CACHE_LIMIT, TopicIndex


@dataclass(eq=False)
class Sub:
    patterns: tuple[Destination, ...]


SEGMENTS = st.sampled_from(["a", "b", "c"])
PATTERN_SEGMENTS = st.sampled_from(["a", "b", "c", "*"])
KINDS = st.sampled_from([DestKind.TOPIC, DestKind.TEMP_TOPIC])


@st.composite
def patterns(draw: st.DrawFn) -> Destination:
    segs = draw(st.lists(PATTERN_SEGMENTS, min_size=1, max_size=4))
    if draw(st.booleans()):
        segs.append(">")
    return Destination(draw(KINDS), ".".join(segs))


@st.composite
def names(draw: st.DrawFn) -> Destination:
    return Destination(draw(KINDS), ".".join(draw(st.lists(SEGMENTS, min_size=1,
                                                           max_size=5))))


OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(patterns(), min_size=1, max_size=3)),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("match"), names()),
), max_size=60)


def _expected(live: list[Sub], dest: Destination) -> list[Sub]:
    return [s for s in live if any(dst.matches(p, dest) for p in s.patterns)]


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_index_matches_brute_force(ops: list[tuple[str, object]]) -> None:
    index: TopicIndex[Sub] = TopicIndex()
    live: list[Sub] = []
    for op, arg in ops:
        if op == "add":
            assert isinstance(arg, list)
            sub = Sub(tuple(arg))
            index.add(sub)
            live.append(sub)
        elif op == "remove":
            assert isinstance(arg, int)
            if live:
                sub = live.pop(arg % len(live))
                index.discard(sub)
                assert sub not in index
        else:
            assert isinstance(arg, Destination)
            assert index.match(arg) == _expected(live, arg)
        assert len(index) == len(live)
        assert index.all() == live
    for sub in list(live):
        index.discard(sub)
    assert not index._roots and not index._exact  # every branch was pruned


def test_descendant_wildcard_needs_one_more_segment() -> None:
    index: TopicIndex[Sub] = TopicIndex()
    sub = Sub((dst.topic("a.>"),))
    index.add(sub)
    assert index.match(dst.topic("a")) == []
    assert index.match(dst.topic("a.b.c")) == [sub]


def test_cached_result_follows_changes() -> None:
    index: TopicIndex[Sub] = TopicIndex()
    first, second, wild = Sub((dst.topic("t"),)), Sub((dst.topic("t"),)), Sub((dst.topic("*"),))
    index.add(first)
    assert index.match(dst.topic("t")) == [first]
    index.add(second)
    index.add(wild)
    assert index.match(dst.topic("t")) == [first, second, wild]
    index.discard(first)
    assert index.match(dst.topic("t")) == [second, wild]
    index.discard(wild)
    assert index.match(dst.topic("t")) == [second]


def test_queues_and_topics_do_not_mix() -> None:
    index: TopicIndex[Sub] = TopicIndex()
    sub = Sub((dst.topic(">"),))
    index.add(sub)
    assert index.match(Destination(DestKind.TEMP_TOPIC, "x")) == []
    assert index.match(dst.topic("x")) == [sub]


def test_cache_is_bounded() -> None:
    index: TopicIndex[Sub] = TopicIndex()
    index.add(Sub((dst.topic(">"),)))
    for i in range(CACHE_LIMIT + 5):
        index.match(dst.topic(f"n{i}"))
    assert len(index._cache) <= CACHE_LIMIT
