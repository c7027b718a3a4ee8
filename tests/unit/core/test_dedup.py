"""The idempotent-producer window against a simple model (Hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshmq.core.dedup import DuplicateWindow


@given(capacity=st.integers(0, 8), keys=st.lists(st.sampled_from("abcdefghij"), max_size=60))
def test_window_matches_a_model_of_the_last_n_new_ids(capacity: int, keys: list[str]) -> None:
    window = DuplicateWindow(capacity)
    remembered: list[str] = []  # the model: newly accepted ids, oldest first, at most capacity
    duplicates = 0
    for key in keys:
        expected_dup = capacity > 0 and key in remembered
        assert window.check_and_add(key) is expected_dup
        if expected_dup:
            duplicates += 1
        elif capacity > 0:
            remembered.append(key)
            del remembered[:-capacity]
        assert len(window) == len(remembered) <= max(capacity, 0)
    assert window.duplicates == duplicates


def test_forget_lets_a_retry_through() -> None:
    window = DuplicateWindow(4)
    assert window.check_and_add("a") is False
    window.forget("a")
    assert window.check_and_add("a") is False
    assert window.check_and_add("a") is True
