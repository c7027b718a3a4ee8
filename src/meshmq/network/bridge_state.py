"""The bridge lifecycle as an explicit state machine, and its reconnect delays.

Pure: no sockets, no clock reads. The driver (``bridge.py``) feeds events and sleeps
for the delays this module computes. The property that matters, and that the tests
check for every event sequence: from any state but STOPPED, every failure leads to
BACKING_OFF and every backoff ends in CONNECTING — a bridge never dies silently.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class BridgeState(enum.StrEnum):
    STOPPED = "stopped"
    CONNECTING = "connecting"
    HANDSHAKING = "handshaking"
    SYNCING = "syncing-demand"
    FORWARDING = "forwarding"
    BACKING_OFF = "backing-off"


class BridgeEvent(enum.StrEnum):
    START = "start"
    CONNECTED = "connected"  # TCP up, HELLO sent
    WELCOMED = "welcomed"  # the remote accepted the handshake
    SYNCED = "synced"  # the remote's first full interest sync arrived
    FAILED = "failed"  # any error: refused, timeout, auth, slave, link lost, protocol
    RETRY = "retry"  # the backoff delay is over
    NEXT_TARGET = "next-target"  # this broker of the list would not do; try the next
    GIVE_UP = "give-up"  # max_reconnect_attempts reached
    STOP = "stop"


_S, _E = BridgeState, BridgeEvent
TRANSITIONS: dict[tuple[BridgeState, BridgeEvent], BridgeState] = {
    (_S.STOPPED, _E.START): _S.CONNECTING,
    (_S.CONNECTING, _E.CONNECTED): _S.HANDSHAKING,
    (_S.HANDSHAKING, _E.WELCOMED): _S.SYNCING,
    (_S.SYNCING, _E.SYNCED): _S.FORWARDING,
    (_S.BACKING_OFF, _E.RETRY): _S.CONNECTING,
    (_S.BACKING_OFF, _E.GIVE_UP): _S.STOPPED,
    (_S.CONNECTING, _E.NEXT_TARGET): _S.CONNECTING,
    (_S.HANDSHAKING, _E.NEXT_TARGET): _S.CONNECTING,
}
for _state in (_S.CONNECTING, _S.HANDSHAKING, _S.SYNCING, _S.FORWARDING):
    TRANSITIONS[(_state, _E.FAILED)] = _S.BACKING_OFF
for _state in BridgeState:
    TRANSITIONS[(_state, _E.STOP)] = _S.STOPPED


class InvalidTransitionError(Exception):
    pass


def transition(state: BridgeState, event: BridgeEvent) -> BridgeState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransitionError(f"{event} is not valid in state {state}") from None


@dataclass
class ReconnectPolicy:
    """ActiveMQ's static: discovery agent knobs. ``max_attempts`` <= 0: for ever.

    Not ``meshmq.backoff.ReconnectSchedule`` (the failover client's): a bridge walks its
    list in order every attempt and counts whole attempts, with static:'s meaning of 0
    (for ever) and a reset after a link that lived ``min_connect_time_s``."""

    initial_delay_s: float = 1.0
    max_delay_s: float = 30.0
    exponential: bool = True
    multiplier: float = 2.0
    max_attempts: int = 0
    min_connect_time_s: float = 5.0
    jitter: float = 0.1  # +/- this fraction, so a restarted hub is not stormed in step

    def __post_init__(self) -> None:
        self.failures = 0

    def connected_for(self, seconds: float) -> None:
        """A link that stayed up long enough counts as a success: start afresh."""
        if seconds >= self.min_connect_time_s:
            self.failures = 0

    def next_delay(self, rng: random.Random | None = None) -> float | None:
        """Delay before the next attempt after one more failure; None: give up."""
        self.failures += 1
        if self.max_attempts > 0 and self.failures >= self.max_attempts:
            return None
        delay = self.initial_delay_s
        if self.exponential:
            delay = min(self.max_delay_s,
                        self.initial_delay_s * self.multiplier ** (self.failures - 1))
        delay = min(delay, self.max_delay_s)
        if self.jitter > 0 and delay > 0:
            r = (rng or random).uniform(-self.jitter, self.jitter)
            delay = max(0.0, delay * (1 + r))
        return delay
