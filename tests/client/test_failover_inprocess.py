"""Failover between in-process brokers (graceful stops) and against a scripted fake STOMP
peer (exact timing of a connection loss around BEGIN/COMMIT)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from meshmq.client import (
    ConnectionFailedError,
    Event,
    EventKind,
    FailoverClient,
    TransactionInDoubtError,
    TransactionRolledBackError,
)
from meshmq.protocol.stomp import Frame, StompParser, encode_frame
from tests.client.conftest import stomp_uri
from tests.client.test_client_features import run
from tests.support.brokers import ThreadBroker


async def wait_for_event(events: list[Event], kind: EventKind, count: int = 1,
                         timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while sum(e.kind is kind for e in events) < count:
            await asyncio.sleep(0.01)  # polled with a deadline


def test_subscription_restored_and_sends_continue_on_the_other_broker(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    a, b = meshmq_factory(), meshmq_factory()

    async def main() -> None:
        events: list[Event] = []
        uri = f"failover:({stomp_uri(a)},{stomp_uri(b)})?randomize=false"
        async with FailoverClient(uri, on_event=events.append) as c:
            sub = await c.subscribe("/topic/t", ack="client-individual")
            await c.send("/topic/t", "on a")
            assert (await sub.get(10)).text == "on a"
            assert c.endpoint is not None and c.endpoint.port == a.port
            await asyncio.to_thread(a.stop)
            await c.send("/topic/t", "on b")  # waits for the failover, then confirms
            msg = await sub.get(10)
            assert msg.text == "on b" and await c.ack(msg)
            assert c.endpoint is not None and c.endpoint.port == b.port
        assert [e.kind for e in events] == [EventKind.CONNECTED, EventKind.INTERRUPTED,
                                            EventKind.RESUMED]
    run(main())


def test_consumer_drops_a_copy_it_already_has_from_the_other_broker(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    a, b = meshmq_factory(), meshmq_factory()

    async def main() -> None:
        # A producer whose confirmation was lost re-sent the same message to B.
        for broker in (a, b):
            async with FailoverClient(stomp_uri(broker)) as p:
                await p.send("/queue/orders", "order 1", dedup_id="order-1")
        uri = f"failover:({stomp_uri(a)},{stomp_uri(b)})?randomize=false"
        async with FailoverClient(uri) as c:
            sub = await c.subscribe("/queue/orders", ack="client-individual")
            first = await sub.get(10)
            assert await c.ack(first)
            await asyncio.to_thread(a.stop)
            async with FailoverClient(stomp_uri(b)) as p:
                await p.send("/queue/orders", "order 2", dedup_id="order-2")
            second = await sub.get(10)
            assert second.text == "order 2"  # the copy of order 1 never reached the app
            assert sub.duplicates == 1 and c.stats["duplicates"] == 1
        # The dropped copy was acknowledged, so B does not keep it.
        from tests.support.brokers import poll
        poll(lambda: b.destination_stats("orders")["depth"] == 1, 10, "order 2 only")
    run(main())


def test_max_reconnect_attempts_zero_reports_the_loss(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    a, b = meshmq_factory(), meshmq_factory()

    async def main() -> None:
        events: list[Event] = []
        uri = f"failover:({stomp_uri(a)},{stomp_uri(b)})?randomize=false&maxReconnectAttempts=0"
        async with FailoverClient(uri, on_event=events.append) as c:
            await asyncio.to_thread(a.stop)
            await wait_for_event(events, EventKind.FAILED)
            with pytest.raises(ConnectionFailedError):
                await c.send("/queue/x", "y")
        assert [e.kind for e in events] == [EventKind.CONNECTED, EventKind.INTERRUPTED,
                                            EventKind.FAILED]
    run(main())


# ------------------------------------------------------------ a scripted STOMP peer

Script = Callable[[Frame, Callable[[bytes], None], asyncio.StreamWriter], Awaitable[None]]


class FakeStompBroker:
    """Answers CONNECT and receipts; ``script`` may break the connection at any frame."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.server: asyncio.Server | None = None
        self.connections = 0
        self.frames: list[str] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        parser = StompParser(version="1.2")

        def write(data: bytes) -> None:
            writer.write(data)
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for frame in parser.feed(data):
                    self.frames.append(frame.command)
                    if frame.command == "CONNECT":
                        write(encode_frame("CONNECTED", [("version", "1.2"),
                                                         ("heart-beat", "0,0")]))
                        continue
                    await self.script(frame, write, writer)
                    if writer.is_closing():
                        return
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def receipt(frame: Frame, write: Callable[[bytes], None]) -> None:
    r = frame.get("receipt")
    if r:
        write(encode_frame("RECEIPT", [("receipt-id", r)], version="1.2"))


def test_connection_lost_after_commit_sent_is_in_doubt() -> None:
    async def script(frame: Frame, write: Callable[[bytes], None],
                     writer: asyncio.StreamWriter) -> None:
        if frame.command == "COMMIT":
            writer.transport.abort()  # the answer never comes
            return
        receipt(frame, write)

    async def main() -> None:
        fake = FakeStompBroker(script)
        port = await fake.start()
        async with FailoverClient(f"stomp://127.0.0.1:{port}") as c:
            tx = await c.begin()
            await c.send("/queue/x", "in tx", transaction=tx)
            with pytest.raises(TransactionInDoubtError, match="may or may not"):
                await c.commit(tx)
            # The client reconnects and carries on.
            await c.send("/queue/x", "after")
        await fake.stop()
        assert fake.connections == 2
    run(main())


def test_connection_lost_before_commit_is_rolled_back() -> None:
    sends = 0

    async def script(frame: Frame, write: Callable[[bytes], None],
                     writer: asyncio.StreamWriter) -> None:
        nonlocal sends
        if frame.command == "SEND" and frame.get("transaction"):
            sends += 1
            if sends == 2:
                writer.transport.abort()
                return
        receipt(frame, write)

    async def main() -> None:
        fake = FakeStompBroker(script)
        port = await fake.start()
        async with FailoverClient(f"stomp://127.0.0.1:{port}") as c:
            tx = await c.begin()
            await c.send("/queue/x", "one", transaction=tx)
            with pytest.raises(TransactionRolledBackError, match="redo it"):
                await c.send("/queue/x", "two", transaction=tx)
            with pytest.raises(TransactionRolledBackError):
                await c.commit(tx)
            await c.abort(tx)  # harmless
            tx2 = await c.begin()
            await c.send("/queue/x", "again", transaction=tx2)
            await c.commit(tx2)
        await fake.stop()
    run(main())


def test_unconfirmed_send_is_resent_with_the_same_dedup_id() -> None:
    seen: list[str] = []

    async def script(frame: Frame, write: Callable[[bytes], None],
                     writer: asyncio.StreamWriter) -> None:
        if frame.command == "SEND":
            seen.append(frame.get("dedup-id") or "")
            if len(seen) == 1:
                writer.transport.abort()  # stored, perhaps, but never confirmed
                return
        receipt(frame, write)

    async def main() -> Any:
        fake = FakeStompBroker(script)
        port = await fake.start()
        async with FailoverClient(f"stomp://127.0.0.1:{port}") as c:
            dedup = await c.send("/queue/x", "once")
            assert c.stats["resent"] == 1
        await fake.stop()
        assert seen == [dedup, dedup]
    run(main())


def test_backup_pool_keeps_a_hot_standby_and_fails_over_to_it(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    a, b, c = meshmq_factory(), meshmq_factory(), meshmq_factory()

    async def main() -> None:
        uri = (f"failover:({stomp_uri(a)},{stomp_uri(b)},{stomp_uri(c)})?randomize=false"
               "&backup=true&backupPoolSize=1")
        async with FailoverClient(uri) as client:
            async with asyncio.timeout(20):
                while not client.backup_endpoints:
                    await asyncio.sleep(0.01)  # polled with a deadline
            assert [e.port for e in client.backup_endpoints] == [b.port]  # list order
            sub = await client.subscribe("/queue/bk")
            await asyncio.to_thread(a.stop)
            await client.send("/queue/bk", "after")
            assert (await sub.get(10)).text == "after"
            assert client.stats["backup_used"] == 1
            assert client.endpoint is not None and client.endpoint.port == b.port
            async with asyncio.timeout(20):  # the pool is refilled from what is left
                while [e.port for e in client.backup_endpoints] != [c.port]:
                    await asyncio.sleep(0.01)  # polled with a deadline
    run(main())


def test_reply_timeout_fails_over_from_a_broker_that_stopped_answering() -> None:
    async def script(frame: Frame, write: Callable[[bytes], None],
                     writer: asyncio.StreamWriter) -> None:
        if frame.command == "SEND" and fake.connections == 1:
            return  # hung: the socket stays open, no receipt ever comes
        receipt(frame, write)

    fake = FakeStompBroker(script)

    async def main() -> None:
        port = await fake.start()
        events: list[Event] = []
        async with FailoverClient(f"failover:(stomp://127.0.0.1:{port})?replyTimeout=200",
                                  on_event=events.append) as c:
            loop = asyncio.get_running_loop()
            start = loop.time()
            await c.send("/queue/x", "eventually")
            assert loop.time() - start < 5
            assert c.stats["resent"] == 1
        assert [e.kind for e in events][:3] == [EventKind.CONNECTED, EventKind.INTERRUPTED,
                                                EventKind.RESUMED]
        await fake.stop()
        assert fake.frames.count("SEND") == 2
    run(main())


def test_connection_timeout_skips_a_broker_that_accepts_but_never_answers(
        meshmq_factory: Callable[..., ThreadBroker]) -> None:
    real = meshmq_factory()

    async def main() -> None:
        held: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # accept, read nothing, answer nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        uri = (f"failover:(stomp://127.0.0.1:{port}?connectionTimeout=200,"
               f"{stomp_uri(real)})?randomize=false")
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with FailoverClient(uri) as c:
            assert c.endpoint is not None and c.endpoint.port == real.port
        assert loop.time() - start < 5
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
    run(main())
