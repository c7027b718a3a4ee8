"""A tiny TCP proxy a test controls, to cut a network link between two brokers.

``cut()`` makes it a black hole, as a partition is: bytes in either direction are
dropped, connections stay open and new ones are accepted but lead nowhere, so the ends
notice only by their own timeouts. ``heal()`` aborts the connections that lost bytes
(their streams are broken mid-frame) and forwards again. Runs its own asyncio loop in
a daemon thread; loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.support.loop_teardown import drain_loop
from tests.support.ports import free_port


class TcpProxy:
    def __init__(self, target_port: int, listen_port: int | None = None) -> None:
        self.target_port = target_port
        self.port = listen_port or free_port()
        self._loop = asyncio.new_event_loop()
        self._open = True
        self._links: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"proxy-{self.port}")
        self.accepted = 0

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        # Tracked from the first moment: close() aborts it even while it is still
        # connecting upstream (the handler is then cancelled, and closes it here too).
        self._links.add(writer)
        try:
            if not self._open:
                with contextlib.suppress(OSError, ConnectionError):
                    while await reader.read(65536):
                        pass  # swallowed by the black hole
                return
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return
            self.accepted += 1
            self._links.add(up_w)
            try:
                await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
            finally:
                up_w.close()
                self._links.discard(up_w)
        finally:
            writer.close()
            self._links.discard(writer)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy until ``src`` ends; closing ``dst`` then ends the other direction too."""
        try:
            while data := await src.read(65536):
                if self._open:
                    dst.write(data)
                    await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            dst.close()

    def _run(self, fn: object) -> None:
        async def call() -> None:
            assert callable(fn)
            fn()

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def cut(self) -> None:
        def do() -> None:
            self._open = False

        self._run(do)

    def heal(self) -> None:
        def do() -> None:
            for w in list(self._links):
                w.transport.abort()
            self._links.clear()
            self._open = True

        self._run(do)

    def close(self) -> None:
        def do() -> None:
            self._open = False
            for w in list(self._links):
                w.transport.abort()
            self._links.clear()

        self._run(do)

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
                with contextlib.suppress(Exception):
                    await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(drain_loop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
