"""MulticastDiscoveryAgent on real UDP multicast sockets, loopback only.

Each test uses its own free port and group name, so parallel runs do not hear each
other. Waiting is polling with a deadline, never a fixed sleep.
"""

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from meshmq.network.discovery import (
    Beat,
    DiscoveryUriError,
    MulticastDiscoveryAgent,
    encode_beat,
)

GROUP_ADDRESS = "239.255.2.3"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def group_uri(port: int, group: str, interval_ms: int = 50) -> str:
    return f"multicast://{GROUP_ADDRESS}:{port}?group={group}&keepAliveInterval={interval_ms}"


async def until(predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Events:
    """Records one agent's callbacks."""

    def __init__(self) -> None:
        self.ups: list[tuple[str, str]] = []
        self.downs: list[str] = []

    def agent(self, uri: str, name: str, advertise: str | None) -> MulticastDiscoveryAgent:
        return MulticastDiscoveryAgent(uri, broker_name=name, advertise=advertise,
                                       on_up=lambda s, b: self.ups.append((s, b)),
                                       on_down=self.downs.append)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_two_brokers_find_each_other_and_see_a_clean_stop() -> None:
    async def scenario() -> None:
        # An interval longer than the deadline: a sees b only because b answers a's
        # first beat at once, and a down seen in time can only come from "dead".
        uri = group_uri(free_udp_port(), uuid.uuid4().hex, interval_ms=60_000)
        a_events, b_events = Events(), Events()
        a = a_events.agent(uri, "a", "tcp://127.0.0.1:61001")
        b = b_events.agent(uri, "b", "tcp://127.0.0.1:61002")
        await a.start()
        await b.start()
        try:
            await until(lambda: a_events.ups and b_events.ups, "both to see the other")
            assert a_events.ups == [("tcp://127.0.0.1:61002", "b")]
            assert b_events.ups == [("tcp://127.0.0.1:61001", "a")]
            assert a.services == {"tcp://127.0.0.1:61002": "b"}  # never itself
            await a.stop()
            await until(lambda: b_events.downs, "b to see a leave")
            assert b_events.downs == ["tcp://127.0.0.1:61001"]
            assert b.services == {}
            assert a_events.downs == []
        finally:
            await a.stop()
            await b.stop()

    run(scenario)


def test_a_listening_connector_hears_brokers_and_ages_out_a_crashed_one() -> None:
    async def scenario() -> None:
        port, group = free_udp_port(), uuid.uuid4().hex
        events = Events()
        # The listener's own interval is long: ageing follows the sender's 20 ms.
        listener = events.agent(group_uri(port, group, interval_ms=60_000), "connector", None)
        await listener.start()
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                              socket.inet_aton("127.0.0.1"))
            # One beat of a broker beating every 20 ms, then silence, as after SIGKILL.
            sender.sendto(encode_beat(Beat(group, "crashed", "tcp://127.0.0.1:61003",
                                           interval_ms=20, instance=b"k" * 8)),
                          (GROUP_ADDRESS, port))
            sent = time.monotonic()
            await until(lambda: events.downs, "the crashed broker to age out")
            assert time.monotonic() - sent >= 10 * 0.020
            assert events.ups == [("tcp://127.0.0.1:61003", "crashed")]
            assert events.downs == ["tcp://127.0.0.1:61003"]
        finally:
            sender.close()
            await listener.stop()

    run(scenario)


def test_other_groups_on_the_same_port_are_not_heard() -> None:
    async def scenario() -> None:
        port = free_udp_port()
        mine, theirs = uuid.uuid4().hex, uuid.uuid4().hex
        events, other_events = Events(), Events()
        stranger = other_events.agent(group_uri(port, theirs), "x", "tcp://127.0.0.1:61009")
        await stranger.start()
        a = events.agent(group_uri(port, mine), "a", "tcp://127.0.0.1:61004")
        b = Events().agent(group_uri(port, mine), "b", "tcp://127.0.0.1:61005")
        await a.start()
        await b.start()
        try:
            await until(lambda: events.ups, "a to see b")
            # Proof the stranger's beats did reach a, and were dropped for their group.
            await until(lambda: a.tracker.other_groups >= 3, "the stranger's beats to arrive")
            assert events.ups == [("tcp://127.0.0.1:61005", "b")]
            assert other_events.ups == []
            assert a.tracker.own >= 1  # its own beats loop back, and are ignored
        finally:
            for agent in (a, b, stranger):
                await agent.stop()

    run(scenario)


def test_a_failing_callback_is_logged_and_the_agent_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        uri = group_uri(free_udp_port(), uuid.uuid4().hex, interval_ms=2000)
        downs: list[str] = []

        def bad_up(service: str, broker: str) -> None:
            raise RuntimeError("callback bug")

        a = MulticastDiscoveryAgent(uri, broker_name="a", advertise=None, on_up=bad_up,
                                    on_down=downs.append)
        b = Events().agent(uri, "b", "tcp://127.0.0.1:61006")
        await a.start()
        await b.start()
        await a.start()  # a second start is a no-op
        try:
            await until(lambda: a.services, "a to see b")
            await b.stop()
            await until(lambda: downs, "a to see b leave")
            assert downs == ["tcp://127.0.0.1:61006"]
        finally:
            await a.stop()
            await a.stop()  # and so is a second stop

    caplog.set_level(logging.ERROR, "meshmq.network.discovery")
    run(scenario)
    assert any("callback for ServiceUp" in r.getMessage() and r.exc_info
               for r in caplog.records)


@pytest.mark.parametrize(("kwargs", "error", "reason"), [
    ({"uri": "multicast://default?keepAliveInterval=-1"}, DiscoveryUriError,
     "keepAliveInterval must be >= 1"),
    ({"uri": "tcp://127.0.0.1:61616"}, DiscoveryUriError, "not a multicast:// URI"),
    ({"broker_name": ""}, ValueError, "broker_name must not be empty"),
    ({"advertise": " "}, ValueError, "advertise must be a service URI"),
])
def test_bad_arguments_are_refused_up_front(kwargs: dict[str, str], error: type[Exception],
                                            reason: str) -> None:
    args: dict[str, Any] = {"uri": "multicast://default", "broker_name": "b",
                            "advertise": None, **kwargs}
    with pytest.raises(error, match=reason):
        MulticastDiscoveryAgent(args.pop("uri"), **args, on_up=lambda s, b: None,
                                on_down=lambda s: None)
