"""Whether a STOMP or MQTT connection's socket is still open, as the holder of a client id
answers its owning shard (transport/adapter.py ``socket_open``): a peer that
closed or reset it is seen before the event loop reads that end; data waiting to be
read, or nothing at all, is an open connection. Unix socket pairs, on the standard
loop and on uvloop (the shards' loop)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from meshmq.transport.adapter import socket_open


class _Protocol(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


def _on(loop_kind: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        loop.run_until_complete(body())
    finally:
        loop.close()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("end", ["close", "reset", "data", "none"])
def test_the_peers_end_is_seen_before_the_loop_reads_it(loop_kind: str, end: str) -> None:
    async def body() -> None:
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_accepted_socket(_Protocol, ours)
        transport.pause_reading()  # the loop reads nothing: only the peek sees
        try:
            if end == "reset":  # closed with what we wrote unread: a reset here
                transport.write(b"MESSAGE\n\n\0")
                await asyncio.sleep(0)
            if end == "data":
                theirs.sendall(b"SEND\n\n\0")
            if end != "none":
                theirs.close()
            # Data before the end: the connection counts as open until it is read.
            assert socket_open(transport) is (end in ("data", "none"))
        finally:
            theirs.close()
            transport.close()
        await asyncio.sleep(0)
        assert not socket_open(transport)  # closed here: no descriptor left
    _on(loop_kind, body)


def test_a_transport_without_a_socket_counts_as_open() -> None:
    class Memory(asyncio.Transport):
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return default

    assert socket_open(Memory())
