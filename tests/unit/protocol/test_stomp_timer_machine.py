"""The STOMP connection machine's timers against a model, with Hypothesis: whatever the
negotiated heart-beats and however the client's beats, partial frames, complete frames,
the broker's writes and the clock interleave, ``timeouts(now)`` says exactly what is due:
an incomplete frame past the frame timeout (counted from the first byte of that frame,
not of an earlier one completed since) first, then a silent client past its interval
times the grace, then a heart-beat once nothing was written for half the send interval.
Time starts at 0, as any clock passed in may."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from meshmq.protocol.stomp import encode_frame
from meshmq.protocol.stomp.connection import (
    HEARTBEAT_DUE,
    Connected,
    ConnectionState,
    HeartBeat,
    PeerTimedOut,
    StompConnection,
)
from meshmq.protocol.stomp.frames import Send

FRAME_TIMEOUT = 2.0
GRACE = 1.5
SERVER_MS = 1000
PARTIAL = b"SEND\ndestination:/queue/a\n\nbo"
REST = b"dy\x00"


class TimerMachine(RuleBasedStateMachine):
    @initialize(cx=st.sampled_from([0, 500, 1000, 4000]),
                cy=st.sampled_from([0, 500, 1000, 4000]))
    def connect(self, cx: int, cy: int) -> None:
        self.now = 0.0
        self.m = StompConnection(0.0, max_frame_size=1 << 16, max_headers=50,
                                 max_header_size=4096, server_heartbeat_ms=SERVER_MS,
                                 heartbeat_grace=GRACE, connect_timeout_s=5.0,
                                 frame_timeout_s=FRAME_TIMEOUT)
        self.m.receive_data(encode_frame("CONNECT", [("accept-version", "1.2"),
                                                     ("heart-beat", f"{cx},{cy}")]), 0.0)
        self.m.send(Connected("s", "test"))
        assert self.m.state is ConnectionState.CONNECTED
        # STOMP 1.1: we send every max(sx, cy) when both ask; we expect every cx.
        self.send_s = max(SERVER_MS, cy) / 1000 if cy else 0.0
        self.recv_s = cx / 1000
        self.last_read = 0.0
        self.last_write = 0.0
        self.partial_since: float | None = None

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def client_beat(self) -> None:
        events = self.m.receive_data(b"\n", self.now)
        self.last_read = self.now
        if self.partial_since is None:
            assert [type(e) for e in events] == [HeartBeat]

    @precondition(lambda self: self.partial_since is None)
    @rule()
    def client_starts_a_frame(self) -> None:
        assert self.m.receive_data(PARTIAL, self.now) == []
        self.last_read = self.partial_since = self.now

    @precondition(lambda self: self.partial_since is not None)
    @rule()
    def client_sends_more_of_the_frame(self) -> None:
        assert self.m.receive_data(b"", self.now) == []
        self.last_read = self.now

    @precondition(lambda self: self.partial_since is not None)
    @rule()
    def client_completes_the_frame(self) -> None:
        events = self.m.receive_data(REST, self.now)
        assert [type(e) for e in events] == [Send]
        self.last_read = self.now
        self.partial_since = None

    @precondition(lambda self: self.partial_since is not None)
    @rule()
    def client_completes_the_frame_and_starts_another(self) -> None:
        events = self.m.receive_data(REST + PARTIAL, self.now)
        assert [type(e) for e in events] == [Send]
        self.last_read = self.partial_since = self.now

    @rule()
    def broker_writes(self) -> None:
        self.m.last_write = self.last_write = self.now  # as the adapter does

    @invariant()
    def timeouts_match_the_model(self) -> None:
        due = self.m.timeouts(self.now)
        if self.partial_since is not None and self.now - self.partial_since > FRAME_TIMEOUT:
            assert len(due) == 1 and isinstance(due[0], PeerTimedOut), due
            assert due[0].reason.startswith("incomplete frame")
        elif self.recv_s and self.now - self.last_read > self.recv_s * GRACE:
            assert len(due) == 1 and isinstance(due[0], PeerTimedOut), due
            assert due[0].reason.startswith("heart-beat timeout")
        elif self.send_s and self.now - self.last_write >= self.send_s * 0.5:
            assert due == [HEARTBEAT_DUE]
        else:
            assert due == []

    @invariant()
    def held_reading_stops_only_the_clients_deadlines(self) -> None:
        due = self.m.timeouts(self.now, reading_held=True)
        if self.send_s and self.now - self.last_write >= self.send_s * 0.5:
            assert due == [HEARTBEAT_DUE]
        else:
            assert due == []


TimerMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25)
test_timeouts_follow_the_clock_and_the_traffic = TimerMachine.TestCase


def _connected(now: float) -> StompConnection:
    m = StompConnection(now, max_frame_size=1 << 16, max_headers=50, max_header_size=4096,
                        frame_timeout_s=FRAME_TIMEOUT, connect_timeout_s=5.0)
    m.receive_data(encode_frame("CONNECT", [("accept-version", "1.2")]), now)
    m.send(Connected("s", "test"))
    return m


def test_a_frame_begun_at_clock_zero_times_out_from_zero() -> None:
    m = _connected(0.0)
    m.receive_data(PARTIAL, 0.0)
    m.receive_data(b"more body", 1.0)  # more of the same frame: its clock runs on
    assert m.timeouts(FRAME_TIMEOUT - 0.1) == []
    [due] = m.timeouts(FRAME_TIMEOUT + 0.1)
    assert isinstance(due, PeerTimedOut) and due.reason.startswith("incomplete frame")


def test_a_frame_begun_behind_a_completed_one_gets_its_own_frame_timeout() -> None:
    m = _connected(10.0)
    m.receive_data(PARTIAL, 10.0)
    m.receive_data(REST + PARTIAL, 11.5)  # the first frame ends, a second one begins
    assert m.timeouts(11.5 + FRAME_TIMEOUT - 0.1) == []
    [due] = m.timeouts(11.5 + FRAME_TIMEOUT + 0.1)
    assert isinstance(due, PeerTimedOut)
