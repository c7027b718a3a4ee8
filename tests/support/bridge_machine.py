"""Driving a bridge machine (``meshmq.network.bridge_state``) without sockets: a
machine over static endpoints with fast, seeded reconnects, the handshake frames it
reads, and what its actions say."""

from __future__ import annotations

import json
import random

from meshmq.config.model import NetworkConnectorConfig
from meshmq.connector_uri import Endpoint, parse_endpoint
from meshmq.network.bridge_state import (
    RETRY_TIMER,
    Action,
    BridgeMachine,
    BridgeState,
    Changed,
    StartTimer,
)
from meshmq.protocol.wire import FrameType, WireFrame

A = parse_endpoint("tcp://a:61616")
B = parse_endpoint("tcp://b:61616")
HELLO = b"hello"


def machine(*endpoints: Endpoint, **options: object) -> BridgeMachine:
    """A bridge machine over ``endpoints`` (A alone by default) with a 1 s first
    reconnect delay unless ``options`` (connector settings) say otherwise."""
    options.setdefault("initial_reconnect_delay_ms", 1000)
    config = NetworkConnectorConfig(uri="static:(tcp://a:61616)", **options)  # type: ignore[arg-type]
    return BridgeMachine(config, endpoints or (A,), hello=lambda: HELLO,
                         rng=random.Random(7))


def frame(ftype: FrameType, body: dict[str, object]) -> WireFrame:
    return WireFrame(ftype, json.dumps(body).encode())


def of(actions: list[Action], kind: type) -> list[object]:
    """The actions of type ``kind``."""
    return [a for a in actions if isinstance(a, kind)]


def states(actions: list[Action]) -> list[BridgeState]:
    """The states the machine moved to."""
    return [a.new for a in actions if isinstance(a, Changed)]


def retry_delays(actions: list[Action]) -> list[float]:
    """The delays of the retry timers started."""
    return [a.delay for a in actions if isinstance(a, StartTimer) and a.name == RETRY_TIMER]
