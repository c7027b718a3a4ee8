"""Reading the pages of stored messages the core asks for (core/paging.py).

The core decides *which* page a queue needs; this module reads it and hands it back.
A store that offers ``load_async`` (store.base.LoadsAsync: PostgreSQL, and the journal,
which reads its pinned segments on a reader thread) is read without blocking the event
loop, and the page reaches the core when the read completes; a store whose reads cost
nothing (memory) is read at once, inside the pump that asked, so paging costs no extra
loop turn.

A failed read is logged once per queue until one succeeds again, and handed back with
``Broker.page_failed``: the queue keeps its place and asks again on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from meshmq.core.broker import Broker
from meshmq.core.paging import PageLoad
from meshmq.errors import StoreError
from meshmq.store.base import LoadsAsync, Store

log = logging.getLogger("meshmq.runtime")


class PageReader:
    """Fulfils ``Broker.take_page_loads`` for the runtime."""

    def __init__(self, broker: Broker, store: Store, wake: Callable[[], None]) -> None:
        self._broker = broker
        self._store = store
        self._async: LoadsAsync | None = store if isinstance(store, LoadsAsync) else None
        self._wake = wake  # request a pump: a page arrived after the pump that asked
        self._tasks: set[asyncio.Task[None]] = set()
        self._failing: set[str] = set()  # store keys whose last read failed
        self.failures = 0

    def read(self, loads: list[PageLoad]) -> bool:
        """Start reading ``loads``; True when some page was handed to the core already
        (the caller dispatches again)."""
        if self._async is not None:
            loop = asyncio.get_running_loop()
            for load in loads:
                task = loop.create_task(self._read_async(self._async, load))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return False
        for load in loads:
            try:
                entries = self._store.load(load.key, load.after_seq, load.count)
            except (StoreError, OSError) as exc:
                self._failed(load, exc)
            else:
                self._loaded(load)
                self._broker.page_loaded(load, entries)
        return True

    async def _read_async(self, store: LoadsAsync, load: PageLoad) -> None:
        try:
            entries = await store.load_async(load.key, load.after_seq, load.count)
        except (StoreError, OSError) as exc:
            self._failed(load, exc)
            return
        self._loaded(load)
        self._broker.page_loaded(load, entries)
        self._wake()

    def _loaded(self, load: PageLoad) -> None:
        if self._failing and load.key in self._failing:
            self._failing.discard(load.key)
            log.info("reading stored messages of %s works again", load.queue.destination)

    def _failed(self, load: PageLoad, exc: Exception) -> None:
        self.failures += 1
        if load.key not in self._failing:
            self._failing.add(load.key)
            log.error("could not read stored messages of %s (retrying): %s",
                      load.queue.destination, exc)
        self._broker.page_failed(load)

    def cancel(self) -> None:
        """Stop the reads in flight (the runtime is stopping)."""
        for task in list(self._tasks):
            task.cancel()
