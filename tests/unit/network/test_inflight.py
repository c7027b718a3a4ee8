"""The in-flight set of a link against a plain dict model: any mix of adds (holes
included), single answers and answered runs, in or out of order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from meshmq.network.inflight import InFlight


class InFlightMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.held: InFlight[str] = InFlight()
        self.model: dict[int, str] = {}
        self.next_seq = 1

    @rule(hole=st.booleans(), skip=st.integers(0, 3))
    def add(self, hole: bool, skip: int) -> None:
        seq = self.next_seq + skip
        self.next_seq = seq + 1
        if hole:
            self.held.add(seq, None)
        else:
            self.held.add(seq, f"m{seq}")
            self.model[seq] = f"m{seq}"

    @rule(offset=st.integers(-3, 40))
    def pop_one(self, offset: int) -> None:
        seq = min(self.model, default=self.next_seq) + offset
        assert self.held.pop(seq) == self.model.pop(seq, None)

    @rule(offset=st.integers(-5, 40), width=st.integers(0, 60))
    def pop_run(self, offset: int, width: int) -> None:
        first = min(self.model, default=self.next_seq) + offset
        last = first + width
        expected = [self.model.pop(s) for s in sorted(self.model) if first <= s <= last]
        assert self.held.pop_range(first, last) == expected

    @precondition(lambda self: self.next_seq > 1)
    @rule()
    def run_in_order(self) -> None:
        """The usual answer: everything sent so far, from the front."""
        expected = [self.model.pop(s) for s in sorted(self.model)]
        assert self.held.pop_range(1, self.next_seq - 1) == expected

    @invariant()
    def same_items(self) -> None:
        assert len(self.held) == len(self.model)
        assert self.held.items() == [self.model[s] for s in sorted(self.model)]


TestInFlight = InFlightMachine.TestCase
TestInFlight.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_a_sequence_number_given_twice_is_refused() -> None:
    held: InFlight[str] = InFlight()
    held.add(5, "a")
    held.add(6, "b")
    with pytest.raises(ValueError, match="sequence 6 already given"):
        held.add(6, "c")


@given(st.integers(2_000, 6_000))
def test_settled_slots_do_not_pile_up(n: int) -> None:
    """A long run settled from the front keeps the list near what is still held."""
    held: InFlight[int] = InFlight()
    settled = 0
    for seq in range(1, n + 1):
        held.add(seq, seq)
        if seq % 10 == 0:
            assert held.pop_range(1, seq - 5) == list(range(settled + 1, seq - 4))
            settled = seq - 5
    assert len(held) == n - settled
    assert len(held._items) < 2_100
