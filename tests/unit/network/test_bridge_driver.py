"""The bridge driver (``network.bridge.Bridge``) over fake services and a fake dialer,
no broker and no socket: it performs the machine's actions (dial, write HELLO, close
the link, retry on a timer) and its status says what GET /api/network shows."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from tests.support.memory_broker import MemoryTransport

from meshmq.config.model import NetworkConnectorConfig
from meshmq.connector_uri import Endpoint, parse_endpoint
from meshmq.network.bridge import Bridge
from meshmq.network.link import WireLink
from meshmq.protocol.wire import WIRE_VERSION, FrameType, WireDecoder, decode_json, encode_json


class FakeServices:
    """What a bridge needs from its manager; ``answer`` decides each dial's outcome."""

    def __init__(self, answer: Callable[[WireLink, Endpoint], None]) -> None:
        self.host = SimpleNamespace(broker=SimpleNamespace(name="A"))
        self.routes: Any = None
        self.answer = answer
        self.dials: list[Endpoint] = []
        self.transports: list[MemoryTransport] = []
        self.changes: list[str] = []

    def client_uris(self) -> list[str]:
        return ["stomp://a:61613"]

    def management_url(self) -> str | None:
        return None

    def track(self, link: WireLink) -> WireLink:
        return link

    def is_self(self, endpoint: Endpoint) -> bool:
        return False

    def client_tls(self, config: NetworkConnectorConfig,
                   verify_hostname: bool | None = None) -> ssl.SSLContext:
        raise AssertionError("no TLS here")

    async def dial(self, link: WireLink, endpoint: Endpoint, ctx: ssl.SSLContext | None,
                   timeout: float) -> None:
        self.dials.append(endpoint)
        self.answer(link, endpoint)

    def bridge_changed(self, bridge: Bridge) -> None:
        self.changes.append(bridge.state.value)

    def connect(self, link: WireLink) -> MemoryTransport:
        """The dial succeeds: the link gets a transport that keeps what it writes."""
        transport = MemoryTransport(asyncio.get_running_loop(), link)
        self.transports.append(transport)
        link.connection_made(transport)  # type: ignore[arg-type]
        return transport


def later(fn: Callable[..., Any], *args: Any) -> None:
    """The peer answers once the bridge has the link and waits for the answer."""
    async def answer() -> None:
        await until(lambda: any(b.state.value == "handshaking" for b in BRIDGES),
                    "the bridge handshaking")
        fn(*args)
    TASKS.append(asyncio.get_running_loop().create_task(answer()))


BRIDGES: list[Bridge] = []
TASKS: list[asyncio.Task[None]] = []


def refused(link: WireLink, endpoint: Endpoint) -> None:
    raise ConnectionRefusedError


def config(**kw: Any) -> NetworkConnectorConfig:
    kw.setdefault("initial_reconnect_delay_ms", 10)
    kw.setdefault("max_reconnect_delay_ms", 20)
    return NetworkConnectorConfig(uri="static:(tcp://b:61616)", username="link",
                                  password="pw", **kw)


async def until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def run(test: Callable[[], Any]) -> None:
    asyncio.run(test())


def make(services: FakeServices, **kw: Any) -> Bridge:
    BRIDGES.clear()
    BRIDGES.append(Bridge(services, config(**kw), (parse_endpoint("tcp://b:61616"),)))
    return BRIDGES[0]



def frames_written(transport: MemoryTransport) -> list[Any]:
    return WireDecoder(expect_magic=True).feed(bytes(transport.written))


def test_a_refused_dial_backs_off_and_retries_with_the_cause_in_the_status() -> None:
    async def scenario() -> None:
        services = FakeServices(refused)
        bridge = make(services)
        bridge.start()
        await until(lambda: len(services.dials) >= 3, "three dials")
        status = bridge.status()
        assert status["state"] in ("backing-off", "connecting")
        assert status["last_error"]["kind"] == "connection-refused"
        assert "tcp://b:61616: connection refused" in status["last_error"]["message"]
        assert status["attempts"] >= 3 and status["connects"] == 0
        assert "backing-off" in services.changes
        await bridge.stop()
        assert bridge.status()["state"] == "stopped"
    run(scenario)


@pytest.mark.parametrize(("error", "kind"), [(TimeoutError, "connect-timeout"),
                                             (OSError(113, "No route to host"), "unreachable")])
def test_dial_errors_are_classified(error: BaseException | type[BaseException],
                                    kind: str) -> None:
    def fail(link: WireLink, endpoint: Endpoint) -> None:
        raise error

    async def scenario() -> None:
        bridge = make(FakeServices(fail))
        bridge.start()
        await until(lambda: bridge.last_error is not None, "a failure")
        assert bridge.status()["last_error"]["kind"] == kind
        await bridge.stop()
    run(scenario)


def test_a_successful_dial_sends_hello_and_waits_for_the_answer() -> None:
    async def scenario() -> None:
        services = FakeServices(lambda link, _: None)

        def answer(link: WireLink, endpoint: Endpoint) -> None:
            services.connect(link)
        services.answer = answer
        bridge = make(services, name="orders")
        bridge.start()
        await until(lambda: bridge.status()["state"] == "handshaking", "the handshake")
        await until(lambda: bool(frames_written(services.transports[0])), "HELLO written")
        hello = frames_written(services.transports[0])[0]
        assert hello.type is FrameType.HELLO
        body = decode_json(hello)
        assert body["broker"] == "A" and body["connector"] == "orders"
        assert body["username"] == "link" and body["password"] == "pw"
        assert body["versions"] == [WIRE_VERSION]
        assert body["client_uris"] == ["stomp://a:61613"]
        assert bridge.status()["connected_to"] == "tcp://b:61616"
        await bridge.stop()
    run(scenario)


def test_a_refused_handshake_closes_the_link_and_reports_the_remote_reason() -> None:
    async def scenario() -> None:
        services = FakeServices(lambda link, _: None)

        def answer(link: WireLink, endpoint: Endpoint) -> None:
            services.connect(link)
            later(link.data_received, encode_json(FrameType.REFUSE, {
                "code": "authentication-failed",
                "message": "refused by broker 'B': authentication failed for user 'link'"}))
        services.answer = answer
        bridge = make(services)
        bridge.start()
        await until(lambda: bridge.last_error is not None, "the refusal")
        status = bridge.status()
        assert status["last_error"]["kind"] == "authentication-failed"
        assert "authentication failed for user 'link'" in status["last_error"]["message"]
        assert status["connects"] == 0 and status["remote_broker"] is None
        await until(lambda: services.transports[0].closed, "the link closed")
        await until(lambda: len(services.dials) >= 2, "a retry")
        await bridge.stop()
    run(scenario)


def test_a_link_lost_before_the_answer_is_a_handshake_failure() -> None:
    async def scenario() -> None:
        services = FakeServices(lambda link, _: None)

        def answer(link: WireLink, endpoint: Endpoint) -> None:
            later(services.connect(link).drop)
        services.answer = answer
        bridge = make(services)
        bridge.start()
        await until(lambda: bridge.last_error is not None, "the failure")
        error = bridge.status()["last_error"]
        assert error["kind"] == "connection-lost", error
        assert "before answering" in error["message"]
        await until(lambda: len(services.dials) >= 2, "a retry")
        await bridge.stop()
    run(scenario)


def test_a_welcome_of_another_wire_version_is_refused_here() -> None:
    async def scenario() -> None:
        services = FakeServices(lambda link, _: None)

        def answer(link: WireLink, endpoint: Endpoint) -> None:
            services.connect(link)
            later(link.data_received, encode_json(FrameType.WELCOME,
                                           {"version": WIRE_VERSION + 1, "broker": "B"}))
        services.answer = answer
        bridge = make(services)
        bridge.start()
        await until(lambda: bridge.last_error is not None, "the failure")
        assert bridge.status()["last_error"]["kind"] == "version-mismatch"
        assert bridge.status()["connects"] == 0
        await bridge.stop()
    run(scenario)
