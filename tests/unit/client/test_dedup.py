"""The consumer's duplicate filter: the last N keys done with, and the copies in hand."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.client.dedup import DuplicateFilter

KEYS = st.sampled_from([f"k{i}" for i in range(8)])


def test_a_repeat_within_the_window_is_seen() -> None:
    f = DuplicateFilter(3)
    assert [f.seen(k) for k in ["a", "b", "a", "c"]] == [False, False, True, False]
    assert len(f) == 3


def test_the_oldest_key_leaves_the_window_first() -> None:
    f = DuplicateFilter(2)
    for k in ["a", "b", "c"]:
        f.seen(k)
    assert "a" not in f and "b" in f and "c" in f
    assert f.seen("a") is False  # forgotten: it counts as new again


def test_seeing_a_key_again_keeps_it_in_the_window() -> None:
    f = DuplicateFilter(3)
    for k in ["a", "b", "c", "a", "d"]:  # "a" was refreshed: "b" is the oldest now
        f.seen(k)
    assert "a" in f and "b" not in f


def test_add_and_forget() -> None:
    f = DuplicateFilter(4)
    f.add("x")
    assert "x" in f and f.is_duplicate("x", redelivered=False)
    f.forget("x")
    assert "x" not in f and not f.is_duplicate("x", redelivered=False)
    f.forget("never-added")  # nothing to forget is fine
    assert len(f) == 0


def test_add_refreshes_a_key_already_there() -> None:
    f = DuplicateFilter(2)
    f.add("a")
    f.add("b")
    f.add("a")
    f.add("c")
    assert "a" in f and "b" not in f


def test_a_message_without_a_key_is_never_a_duplicate() -> None:
    f = DuplicateFilter(4)
    f.add(None)
    f.hold(None)
    assert not f.seen(None) and not f.seen(None)
    assert not f.is_duplicate(None, redelivered=False)
    assert len(f) == 0


def test_window_zero_turns_the_filter_off() -> None:
    f = DuplicateFilter(0)
    f.add("a")
    f.hold("a")
    assert not f.seen("a") and not f.seen("a")
    assert not f.is_duplicate("a", redelivered=False)
    assert len(f) == 0


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be >= 0"):
        DuplicateFilter(-1)


def test_a_second_copy_of_a_message_in_hand_is_a_duplicate() -> None:
    f = DuplicateFilter(10)
    f.hold("k")  # handed to the application, not acked yet
    assert f.is_duplicate("k", redelivered=False)  # a producer's resend, say


def test_the_brokers_redelivery_of_a_message_in_hand_is_not_a_duplicate() -> None:
    # After a failover it may be the only copy left: the application must get it.
    f = DuplicateFilter(10)
    f.hold("k")
    assert not f.is_duplicate("k", redelivered=True)


def test_a_released_message_is_not_in_hand_any_more() -> None:
    f = DuplicateFilter(10)
    f.hold("k")
    f.release("k")  # nacked: the broker's next copy must reach the application
    assert not f.is_duplicate("k", redelivered=False)


def test_an_acknowledged_message_is_a_duplicate_even_when_redelivered() -> None:
    f = DuplicateFilter(10)
    f.hold("k")
    f.release("k")
    f.add("k")  # acked
    assert f.is_duplicate("k", redelivered=True)


def test_messages_in_hand_are_bounded_by_the_window() -> None:
    f = DuplicateFilter(2)
    for k in ["a", "b", "c"]:
        f.hold(k)
    assert not f.is_duplicate("a", redelivered=False)
    assert f.is_duplicate("b", redelivered=False) and f.is_duplicate("c", redelivered=False)


class FilterModel(RuleBasedStateMachine):
    """DuplicateFilter against a plain model: a recency-ordered list of keys done with
    and an insertion-ordered list of keys in hand, each cut to the window."""

    def __init__(self) -> None:
        super().__init__()
        self.window = 0
        self.filter: DuplicateFilter | None = None
        self.done: list[str] = []
        self.held: list[str] = []

    @precondition(lambda self: self.filter is None)
    @rule(window=st.integers(1, 5))
    def start(self, window: int) -> None:
        self.window = window
        self.filter = DuplicateFilter(window)

    def _touch(self, key: str) -> None:
        if key in self.done:
            self.done.remove(key)
        self.done.append(key)
        del self.done[:-self.window]

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS)
    def seen(self, key: str) -> None:
        assert self.filter is not None
        expected = key in self.done
        self._touch(key)
        assert self.filter.seen(key) is expected

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS)
    def add(self, key: str) -> None:
        assert self.filter is not None
        self._touch(key)
        self.filter.add(key)

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS)
    def forget(self, key: str) -> None:
        assert self.filter is not None
        if key in self.done:
            self.done.remove(key)
        self.filter.forget(key)

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS)
    def hold(self, key: str) -> None:
        assert self.filter is not None
        if key not in self.held:
            self.held.append(key)
        del self.held[:-self.window]
        self.filter.hold(key)

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS)
    def release(self, key: str) -> None:
        assert self.filter is not None
        if key in self.held:
            self.held.remove(key)
        self.filter.release(key)

    @precondition(lambda self: self.filter is not None)
    @rule(key=KEYS, redelivered=st.booleans())
    def is_duplicate(self, key: str, redelivered: bool) -> None:
        assert self.filter is not None
        expected = key in self.done or (key in self.held and not redelivered)
        assert self.filter.is_duplicate(key, redelivered) is expected

    @invariant()
    def same_keys(self) -> None:
        if self.filter is not None:
            assert len(self.filter) == len(self.done) <= self.window
            assert all(k in self.filter for k in self.done)


TestDuplicateFilterModel = FilterModel.TestCase
TestDuplicateFilterModel.settings = settings(max_examples=30, stateful_step_count=25)
