"""The bridge as a sans-I/O state machine: events in, actions out.

Why: the bridge's lifecycle (dial the target list, handshake, wait for the remote's
interest, forward, back off and dial again) is where a network either heals or dies
silently. Here it is plain data: no sockets, no asyncio, no clock reads; time comes in
as ``now`` arguments. The driver (``bridge.py``) performs the actions and feeds back
what happened. The property the tests check for every event sequence: from any state
but STOPPED, every failure leads to BACKING_OFF and every backoff ends in CONNECTING,
unless the attempt budget is spent (then STOPPED, with a GiveUp action).

Events: ``start``, ``connect_failed`` / ``transport_up`` (the dial's outcome),
``handshake_frame`` (WELCOME or REFUSE), ``handshake_failed`` (the link died before
WELCOME), ``synced`` (the remote's first interest sync), ``link_lost``, ``timer_fired``,
``refused`` (a REFUSE after the handshake), ``stop``.

Actions: ``Connect`` (dial this endpoint now), ``StartTimer`` / ``CancelTimer``,
``Send`` (the HELLO frame), ``CloseLink``, ``StartHalves`` (the forwarder and receiver),
``Teardown``, ``Changed`` (a transition, with the error it records as ``last_error``),
``GiveUp``.

The reconnect delays and the attempt budget are ``meshmq.backoff.ReconnectSchedule``'s,
the one schedule of meshmq: a *pass* tries every target in order; ``max_reconnect_
attempts`` -1 = for ever, 0 = no reconnect (one pass at startup, give up when an
established link is lost), N = N passes.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshmq.backoff import ReconnectPolicy, ReconnectSchedule
from meshmq.network.endpoint import BYE_CAUSE, client_uris_of, management_url_of
from meshmq.protocol.wire import (
    FEATURE_ACK_RANGES,
    FEATURE_HOLDS,
    FEATURE_MESSAGES_AGAIN,
    FEATURE_REFUSALS,
    WIRE_VERSION,
    FrameType,
    WireFrame,
    decode_json,
)

if TYPE_CHECKING:
    from meshmq.config.model import NetworkConnectorConfig
    from meshmq.connector_uri import Endpoint

#: Bridges spread their retries by +/- this fraction, so a restarted hub is not stormed.
BRIDGE_JITTER = 0.1
RETRY_TIMER = "retry"
HANDSHAKE_TIMER = "handshake"
#: Handshake failures after which the next target of the list is tried at once (the
#: rest end the pass: bad credentials or versions hold for the whole list).
NEXT_TARGET_KINDS = frozenset({"remote-is-slave", "connection-lost"})


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


# ------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class Connect:
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class StartTimer:
    name: str
    delay: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    name: str


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class CloseLink:
    reason: str
    bye: bool = False  # say goodbye first (an orderly stop, not a failure)


@dataclass(frozen=True, slots=True)
class StartHalves:
    remote: str
    client_uris: tuple[str, ...]
    management_url: str | None
    again: bool  # the remote takes MESSAGES_AGAIN
    refusals: bool  # the remote understands REFUSED
    ranges: bool  # the remote takes ACK_RANGES
    holds: bool  # the remote takes INTEREST hold/release notes


@dataclass(frozen=True, slots=True)
class Teardown:
    pass


@dataclass(frozen=True, slots=True)
class Changed:
    old: BridgeState
    event: BridgeEvent
    new: BridgeState
    error: tuple[str, str] | None  # (kind, message), now last_error


@dataclass(frozen=True, slots=True)
class GiveUp:
    attempts: int


Action = (Connect | StartTimer | CancelTimer | Send | CloseLink | StartHalves | Teardown
          | Changed | GiveUp)


def reconnect_policy(config: NetworkConnectorConfig) -> ReconnectPolicy:
    """A connector's static:-style options as the one reconnect schedule's policy."""
    return ReconnectPolicy(
        initial_delay=config.initial_reconnect_delay_ms / 1000,
        max_delay=config.max_reconnect_delay_ms / 1000,
        exponential=config.use_exponential_backoff, multiplier=config.backoff_multiplier,
        max_attempts=config.max_reconnect_attempts,
        startup_max_attempts=config.max_reconnect_attempts,
        randomize=False, jitter=BRIDGE_JITTER,
        reset_after=config.min_connect_time_ms / 1000)


class BridgeMachine:
    """One bridge's lifecycle over its target list. Every event method returns the
    actions to perform, in order; an event that does not apply in the current state
    (a late callback) returns no actions."""

    def __init__(self, config: NetworkConnectorConfig, endpoints: tuple[Endpoint, ...], *,
                 hello: Callable[[], bytes], rng: random.Random | None = None) -> None:
        self.config = config
        self.schedule: ReconnectSchedule[Endpoint] = ReconnectSchedule(
            endpoints, reconnect_policy(config), rng=rng)
        self._hello = hello
        self.handshake_timeout_s = config.handshake_timeout_ms / 1000
        self.state = BridgeState.STOPPED
        self.last_error: dict[str, Any] | None = None
        # Why the last established link ended (kept while retries fail for other reasons).
        self.link_ended: dict[str, Any] | None = None
        self.connected_to: Endpoint | None = None  # the target of the last link
        self.remote: str | None = None  # the remote broker's name
        self.attempts = 0
        self.connects = 0
        self._trying: Endpoint | None = None
        self._next: Endpoint | None = None  # dialled when the retry timer fires
        self._pass = 0  # the schedule's pass being walked (0: none since the last link)

    # ------------------------------------------------------------ events
    def start(self, now: float) -> list[Action]:
        if self.state is not BridgeState.STOPPED:
            return []
        out: list[Action] = []
        self.schedule.restart()
        self._pass = 0
        self._to(out, BridgeEvent.START, now)
        self._advance(out, None, now)
        return out

    def connect_failed(self, kind: str, message: str, now: float) -> list[Action]:
        """The dial failed (``kind`` "self": the target is this broker; not counted)."""
        if self.state is not BridgeState.CONNECTING:
            return []
        if kind != "self":
            self.attempts += 1
        out: list[Action] = []
        self._advance(out, (kind, message), now)
        return out

    def transport_up(self, now: float) -> list[Action]:
        if self.state is not BridgeState.CONNECTING or self._trying is None:
            return []
        self.attempts += 1
        self.connected_to = self._trying
        out: list[Action] = []
        self._to(out, BridgeEvent.CONNECTED, now)
        out.append(Send(self._hello()))
        out.append(StartTimer(HANDSHAKE_TIMER, self.handshake_timeout_s))
        return out

    def handshake_frame(self, frame: WireFrame, now: float) -> list[Action]:
        """A frame while HANDSHAKING: WELCOME admits the bridge, anything else fails it.
        Raises RemoteProtocolError on a malformed WELCOME (the link then closes)."""
        if self.state is not BridgeState.HANDSHAKING:
            return []
        if frame.type is FrameType.WELCOME:
            body = decode_json(frame)
            if body.get("version") != WIRE_VERSION:
                return self.handshake_failed(
                    "version-mismatch", f"remote speaks wire version {body.get('version')}",
                    now)
            remote = str(body.get("broker", "?"))
            features = body.get("features")
            offered = features if isinstance(features, list) else []
            halves = StartHalves(remote, client_uris_of(body), management_url_of(body),
                                 FEATURE_MESSAGES_AGAIN in offered, FEATURE_REFUSALS in offered,
                                 FEATURE_ACK_RANGES in offered, FEATURE_HOLDS in offered)
            self.remote = remote
            out: list[Action] = [CancelTimer(HANDSHAKE_TIMER), halves]
            assert self.connected_to is not None
            self.schedule.connected(self.connected_to, now)
            self._pass = 0
            self._to(out, BridgeEvent.WELCOMED, now)
            if self.config.static_bridge:  # static demand needs no interest: forward now
                self._synced(out, now)
            return out
        if frame.type is FrameType.REFUSE:
            body = decode_json(frame)
            return self.handshake_failed(str(body.get("code", "refused")),
                                         f"{self.connected_to}: {body.get('message', '')}",
                                         now)
        return self.handshake_failed("protocol-error",
                                     f"expected WELCOME, got {frame.type.name}", now)

    def handshake_failed(self, kind: str, message: str, now: float) -> list[Action]:
        if self.state is not BridgeState.HANDSHAKING:
            return []
        out: list[Action] = [CancelTimer(HANDSHAKE_TIMER), CloseLink(message)]
        if kind not in NEXT_TARGET_KINDS:
            self.schedule.abandon_pass()
        self._advance(out, (kind, message), now)
        return out

    def synced(self, now: float) -> list[Action]:
        if self.state is not BridgeState.SYNCING:
            return []
        out: list[Action] = []
        self._synced(out, now)
        return out

    def link_lost(self, cause: str, now: float) -> list[Action]:
        """The established link ended (after WELCOME)."""
        if self.state not in (BridgeState.SYNCING, BridgeState.FORWARDING):
            return []
        out: list[Action] = [Teardown()]
        self.schedule.lost(now)
        # A BYE is a clean shutdown of the remote broker, not a crash.
        kind = "remote-shutdown" if cause.startswith(BYE_CAUSE) else "link-lost"
        message = f"{self.connected_to}: {cause}"
        self.link_ended = {"kind": kind, "message": message, "at": now}
        self._advance(out, (kind, message), now)
        return out

    def timer_fired(self, name: str, now: float) -> list[Action]:
        if name == HANDSHAKE_TIMER and self.state is BridgeState.HANDSHAKING:
            return self.handshake_failed(
                "handshake-timeout",
                f"{self.connected_to}: no handshake within {self.handshake_timeout_s:g}s", now)
        if name == RETRY_TIMER and self.state is BridgeState.BACKING_OFF \
                and self._next is not None:
            out: list[Action] = []
            self._to(out, BridgeEvent.RETRY, now)
            endpoint, self._next = self._next, None
            self._dial(out, endpoint)
            return out
        return []

    def refused(self, code: str, message: str, now: float) -> None:
        """The remote explained why it closes an established link (the loss follows)."""
        self.last_error = {"kind": code, "message": message, "at": now}

    def stop(self, now: float) -> list[Action]:
        out: list[Action] = [CancelTimer(RETRY_TIMER), CancelTimer(HANDSHAKE_TIMER)]
        if self.state in (BridgeState.HANDSHAKING, BridgeState.SYNCING,
                          BridgeState.FORWARDING):
            out.append(CloseLink("bridge stopped", bye=True))
        out.append(Teardown())
        self._next = self._trying = None
        self._to(out, BridgeEvent.STOP, now)
        return out

    # ------------------------------------------------------------ internals
    def _synced(self, out: list[Action], now: float) -> None:
        self.connects += 1
        self._to(out, BridgeEvent.SYNCED, now)

    def _advance(self, out: list[Action], error: tuple[str, str] | None, now: float) -> None:
        """Dial the next target: at once within a pass, after the backoff delay when a
        pass failed (or a link was lost); give up when the schedule says so."""
        attempt = self.schedule.next_attempt()
        if attempt is None:
            self._to(out, BridgeEvent.FAILED, now,
                     error or ("no-target", "no broker to connect to"))
            out.append(GiveUp(self.attempts))
            self._to(out, BridgeEvent.GIVE_UP, now)
            return
        same_pass = attempt.pass_number == self._pass
        self._pass = attempt.pass_number
        if error is None or same_pass:
            if self.state is BridgeState.HANDSHAKING:
                self._to(out, BridgeEvent.NEXT_TARGET, now)
            self._dial(out, attempt.endpoint)
            return
        self._to(out, BridgeEvent.FAILED, now, error)
        self._next = attempt.endpoint
        out.append(StartTimer(RETRY_TIMER, attempt.delay))

    def _dial(self, out: list[Action], endpoint: Endpoint) -> None:
        self._trying = endpoint
        out.append(Connect(endpoint))

    def _to(self, out: list[Action], event: BridgeEvent, now: float,
            error: tuple[str, str] | None = None) -> None:
        old = self.state
        self.state = transition(old, event)
        if error is not None:
            self.last_error = {"kind": error[0], "message": error[1], "at": now}
        out.append(Changed(old, event, self.state, error))
