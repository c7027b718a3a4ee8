"""The idempotent-producer window against a model of its bound (Hypothesis): an id is
remembered while fewer than N newer ids have been added, forgotten once 2N - 1 have,
and at most 2N ids are held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshmq.core.dedup import DuplicateWindow

KEYS = st.lists(st.sampled_from("abcdefghijklmnop"), max_size=80)


@given(capacity=st.integers(0, 8), keys=KEYS)
def test_an_id_is_remembered_for_at_least_the_window(capacity: int,
                                                     keys: list[str]) -> None:
    window = DuplicateWindow(capacity)
    accepted: list[str] = []  # newly accepted ids, oldest first
    duplicates = 0
    for key in keys:
        newer = accepted[::-1].index(key) if key in accepted else None  # ids added since
        result = window.check_and_add(key)
        if capacity <= 0:
            assert result is False
            continue
        if newer is not None and newer < capacity:
            assert result is True, f"{key!r} forgotten after {newer} newer ids"
        if newer is None or newer >= 2 * capacity - 1:
            assert result is False, f"{key!r} still remembered after {newer} newer ids"
        if result:
            duplicates += 1
        else:
            accepted.append(key)
        assert len(window) <= 2 * capacity
        if len(accepted) >= capacity:
            assert len(window) >= capacity  # never less than the window once it filled
    assert window.duplicates == duplicates
    assert len(window) == (0 if capacity <= 0 else
                           len(set(accepted[-(len(accepted) % capacity) - capacity:])
                               if len(accepted) >= capacity else set(accepted)))


def test_the_oldest_generation_goes_whole() -> None:
    window = DuplicateWindow(3)
    for key in "abc":  # fills the first generation: it becomes the older one
        assert window.check_and_add(key) is False
    for key in "de":
        assert window.check_and_add(key) is False
    assert all(key in window for key in "abcde")
    assert window.check_and_add("f") is False  # "a".."c" go: three newer than "c"
    assert [key in window for key in "abcdef"] == [False] * 3 + [True] * 3
    assert len(window) == 3


def test_remember_fills_the_window_without_counting() -> None:
    window = DuplicateWindow(2)
    for key in "abc":
        window.remember(key)
    window.remember("c")  # already there: nothing changes
    assert window.duplicates == 0
    assert "a" in window and "b" in window and "c" in window
    assert window.check_and_add("b") is True
    assert window.check_and_add("d") is False  # the second generation fills: "a", "b" go
    assert "a" not in window and "c" in window and "d" in window


def test_forget_lets_a_retry_through() -> None:
    window = DuplicateWindow(4)
    assert window.check_and_add("a") is False
    window.forget("a")
    assert window.check_and_add("a") is False
    assert window.check_and_add("a") is True
    for key in "bcd":  # "a" moves to the older generation; forget finds it there too
        window.check_and_add(key)
    window.forget("a")
    assert "a" not in window and window.check_and_add("a") is False
    window.forget("never-added")  # nothing to forget is fine
