"""STOMP heart-beats and deadlines through the real STOMP session of a broker driven in
memory, with the clock passed in: the session's timer check (``check_timeouts(now)``)
is called with a chosen ``now``, so each deadline is tested just before and just after
it, without waiting. The intervals are long (seconds), so the session's own timers never
fire while a test runs."""

from __future__ import annotations

import time

import pytest
from tests.support.raw_stomp import MemoryRawClient, frame_bytes

from meshmq.config.model import StompConfig

INTERVAL_S = 10.0
INTERVAL_MS = int(INTERVAL_S * 1000)
GRACE = 1.5


@pytest.fixture
def clocked(broker_factory):
    return broker_factory(stomp=StompConfig(
        server_heartbeat_ms=INTERVAL_MS, heartbeat_grace=GRACE, connect_timeout_ms=5000,
        frame_timeout_ms=5000))


def check(r: MemoryRawClient, now: float) -> None:
    """The session's periodic timer check, run at ``now``, as the runtime runs it."""
    session = r.protocol.session
    r.broker.call(lambda: session.check_timeouts(now))


def written(r: MemoryRawClient) -> bytes:
    r.take()
    data, r.buf = bytes(r.buf), bytearray()
    return data


def connected(broker, heartbeat: str, version: str | None = "1.2") -> tuple[MemoryRawClient,
                                                                            float]:
    r = MemoryRawClient(broker)
    r.connect(version, heartbeat=heartbeat)
    return r, time.monotonic()


# ---------------------------------------------------------------------------- beats out


def test_broker_beats_after_half_an_interval_without_output(clocked):
    r, t0 = connected(clocked, f"0,{INTERVAL_MS}")
    check(r, t0 + INTERVAL_S * 0.4)
    assert written(r) == b""
    check(r, t0 + INTERVAL_S * 0.6)
    assert written(r) == b"\n"


def test_output_postpones_the_next_beat(clocked):
    r, _ = connected(clocked, f"0,{INTERVAL_MS}")
    r.receipt_roundtrip()  # a RECEIPT is written now
    t1 = time.monotonic()
    check(r, t1 + INTERVAL_S * 0.4)
    assert written(r) == b""


@pytest.mark.parametrize(("heartbeat", "version"), [("0,0", "1.2"), (f"{INTERVAL_MS},0", "1.2"),
                                                     (f"0,{INTERVAL_MS}", None)])
def test_no_beats_unless_the_client_asks_for_them_in_11_or_later(clocked, heartbeat, version):
    r, t0 = connected(clocked, heartbeat, version)
    check(r, t0 + INTERVAL_S * 1.2)  # a beat would have been due at half the interval
    assert written(r) == b""
    assert not r.transport.closed


# ---------------------------------------------------------------------------- beats in


def test_a_silent_client_is_closed_after_interval_times_grace(clocked):
    r, t0 = connected(clocked, f"{INTERVAL_MS},0")
    check(r, t0 + INTERVAL_S * (GRACE - 0.1))
    assert not r.transport.closed
    check(r, t0 + INTERVAL_S * (GRACE + 0.1))
    err = r.expect_error_and_close()
    assert err["message"].startswith("heart-beat timeout: no data received from the client")


@pytest.mark.parametrize("traffic", [b"\n", b"\r\n",
                                     frame_bytes("BEGIN", [("transaction", "t")])])
def test_anything_from_the_client_restarts_its_clock(clocked, traffic):
    r, _ = connected(clocked, f"{INTERVAL_MS},0")
    r.send_bytes(traffic)
    t1 = time.monotonic()
    check(r, t1 + INTERVAL_S * (GRACE - 0.1))
    assert not r.transport.closed
    check(r, t1 + INTERVAL_S * (GRACE + 0.1))
    assert "heart-beat timeout" in r.expect_error_and_close()["message"]


def test_a_client_without_beats_is_never_timed_out(clocked):
    r, t0 = connected(clocked, "0,0")
    check(r, t0 + 10**6)
    assert not r.transport.closed
    r.receipt_roundtrip()


def test_the_cap_bounds_the_silence_a_client_may_ask_for(broker_factory):
    b = broker_factory(stomp=StompConfig(max_heartbeat_ms=INTERVAL_MS, heartbeat_grace=GRACE))
    r, t0 = connected(b, f"{INTERVAL_MS * 6},0")
    check(r, t0 + INTERVAL_S * (GRACE - 0.1))
    assert not r.transport.closed
    check(r, t0 + INTERVAL_S * (GRACE + 0.1))
    assert "heart-beat timeout" in r.expect_error_and_close()["message"]


# ---------------------------------------------------------------------------- deadlines


def test_a_connection_without_connect_is_closed_after_the_connect_timeout(clocked):
    r = MemoryRawClient(clocked)
    t0 = time.monotonic()
    check(r, t0 + 4.9)
    assert not r.transport.closed
    check(r, t0 + 5.2)
    assert r.expect_error_and_close()["message"] == "no CONNECT frame received in time"


def test_a_partial_connect_does_not_extend_the_connect_timeout(clocked):
    r = MemoryRawClient(clocked)
    t0 = time.monotonic()
    r.send_bytes(b"CONNECT\naccept-version:1.2\n")
    check(r, t0 + 5.2)
    assert "no CONNECT frame received in time" in r.expect_error_and_close()["message"]


def test_a_frame_left_incomplete_is_closed_after_the_frame_timeout(clocked):
    r, _ = connected(clocked, "0,0")
    r.send_bytes(b"SEND\ndestination:/queue/slow\n\nhalf a bo")
    t1 = time.monotonic()
    check(r, t1 + 4.9)
    assert not r.transport.closed
    check(r, t1 + 5.2)
    assert "incomplete frame" in r.expect_error_and_close()["message"]


def test_a_frame_completed_in_time_stops_the_frame_clock(clocked):
    r, _ = connected(clocked, "0,0")
    r.send_bytes(b"SEND\ndestination:/queue/slow\n\nhalf a bo")
    r.send_bytes(b"dy\x00")
    check(r, time.monotonic() + 60)
    assert not r.transport.closed
    r.receipt_roundtrip()


def test_the_frame_clock_starts_with_the_first_byte_of_the_frame(clocked):
    r, _ = connected(clocked, "0,0")
    r.send_bytes(b"SE")
    t1 = time.monotonic()
    r.send_bytes(b"ND\ndestination:/queue/slow\n")  # more bytes, same frame
    check(r, t1 + 5.2)
    assert "incomplete frame" in r.expect_error_and_close()["message"]
