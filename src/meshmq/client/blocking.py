"""The blocking failover client, for scripts and threads: the asyncio client on a private
event loop thread, so both have exactly the same behaviour.

Every method may be called from any thread. Callbacks given to ``subscribe`` and
``on_event`` run on the client's loop thread: keep them short (hand work to a queue).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from .aio import EventCallback, FailoverClient, MessageCallback, Subscription, Transaction
from .errors import ClientClosedError, OperationTimeoutError
from .types import AckMode, Message

__all__ = ["BlockingClient", "BlockingSubscription"]

T = TypeVar("T")


class BlockingSubscription:
    def __init__(self, client: BlockingClient, sub: Subscription) -> None:
        self._client = client
        self.inner = sub

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def duplicates(self) -> int:
        return self.inner.duplicates

    def get(self, timeout: float | None = None) -> Message:
        """The next message; ``OperationTimeoutError`` after ``timeout`` seconds."""
        return self._client._call(self.inner.get(timeout))

    def poll(self, timeout: float) -> Message | None:
        """The next message, or None after ``timeout`` seconds."""
        try:
            return self.get(timeout)
        except OperationTimeoutError:
            return None

    def __iter__(self) -> Iterator[Message]:
        while self.inner.active:
            yield self.get()

    def unsubscribe(self, *, remove_durable: bool = False) -> None:
        self._client._call(self.inner.unsubscribe(remove_durable=remove_durable))


class BlockingClient:
    """Same arguments as :class:`~meshmq.client.aio.FailoverClient`."""

    def __init__(self, uri: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="meshmq-client")
        self._thread.start()
        self._closed = False

        async def build() -> FailoverClient:
            return FailoverClient(uri, **kwargs)

        try:
            self.client: FailoverClient = self._call(build())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise ClientClosedError("the client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise OperationTimeoutError(f"no answer within {timeout} s") from None

    # ------------------------------------------------------------------ api

    @property
    def connected(self) -> bool:
        return self.client.connected

    @property
    def endpoint(self) -> Any:
        return self.client.endpoint

    @property
    def stats(self) -> dict[str, int]:
        return dict(self.client.stats)

    def add_listener(self, callback: EventCallback) -> None:
        self._loop.call_soon_threadsafe(self.client.add_listener, callback)

    def connect(self, timeout: float | None = None) -> BlockingClient:
        self._call(self.client.connect(timeout))
        return self

    def send(self, destination: str, body: bytes | str, headers: dict[str, str] | None = None,
             **kwargs: Any) -> str:
        return self._call(self.client.send(destination, body, headers, **kwargs))

    def subscribe(self, destination: str, *, ack: str | AckMode = AckMode.AUTO,
                  callback: MessageCallback | None = None,
                  **kwargs: Any) -> BlockingSubscription:
        sub = self._call(self.client.subscribe(destination, ack=ack, callback=callback,
                                               **kwargs))
        return BlockingSubscription(self, sub)

    def ack(self, msg: Message, *, transaction: Transaction | None = None) -> bool:
        return self._call(self.client.ack(msg, transaction=transaction))

    def nack(self, msg: Message, *, transaction: Transaction | None = None) -> bool:
        return self._call(self.client.nack(msg, transaction=transaction))

    def begin(self) -> Transaction:
        return self._call(self.client.begin())

    def commit(self, tx: Transaction) -> None:
        self._call(self.client.commit(tx))

    def abort(self, tx: Transaction) -> None:
        self._call(self.client.abort(tx))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._call(self.client.close(), timeout=30)
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
