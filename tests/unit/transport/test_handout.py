"""transport/handout.py: each outcome reaches its connection's session; a session that
fails on a delivery is closed and the others still get theirs."""

from __future__ import annotations

import logging

import pytest

from meshmq.core import destinations as dst
from meshmq.core.consumer import Consumer, ConsumerSpec
from meshmq.core.queue import BrowseEnd, Delivery
from meshmq.transport.handout import hand_out
from meshmq.transport.host import Session


class RecordingSession:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.got: list[Delivery | BrowseEnd] = []
        self.closed = 0
        self.conn = None

    def deliver(self, outcome: Delivery | BrowseEnd) -> None:
        if self.fail:
            raise RuntimeError("a bug in this connection's delivery")
        self.got.append(outcome)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1

    def close_by_admin(self) -> None:
        pass

    def check_timeouts(self, now: float) -> None:
        pass


def end_for(connection_id: str) -> BrowseEnd:
    spec = ConsumerSpec(destinations=(dst.queue("q"),))
    return BrowseEnd(Consumer(f"{connection_id}:s", connection_id, "s", spec, 10, None))


def test_outcomes_reach_the_sessions_of_their_connections_in_order() -> None:
    a, b = RecordingSession(), RecordingSession()
    sessions: dict[str, Session] = {"a": a, "b": b}
    outcomes = [end_for("a"), end_for("b"), end_for("gone"), end_for("a")]
    hand_out(sessions, list(outcomes))
    assert a.got == [outcomes[0], outcomes[3]]
    assert b.got == [outcomes[1]]
    assert a.closed == b.closed == 0


def test_a_failing_session_is_closed_and_the_others_still_get_theirs(
        caplog: pytest.LogCaptureFixture) -> None:
    bad, good = RecordingSession(fail=True), RecordingSession()
    sessions: dict[str, Session] = {"bad": bad, "good": good}
    outcomes = [end_for("bad"), end_for("good"), end_for("bad"), end_for("good")]
    with caplog.at_level(logging.ERROR, logger="meshmq.runtime"):
        hand_out(sessions, outcomes)
    assert good.got == [outcomes[1], outcomes[3]]
    assert bad.closed == 2  # each failed delivery closes it (closing twice is harmless)
    assert [r.getMessage() for r in caplog.records] == [
        "delivery to connection bad failed; closing it"] * 2
