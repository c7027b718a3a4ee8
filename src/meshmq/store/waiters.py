"""Completing store-sync waiters from a writer thread (journal and PostgreSQL stores
commit on their own threads; each waiter belongs to some event loop), and waiting a
bounded time for a blocking call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from meshmq.errors import StoreError

log = logging.getLogger("meshmq.store")

Waiter = tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]


def notify(waiters: list[Waiter], error: StoreError | None,
           here: asyncio.AbstractEventLoop | None = None) -> None:
    """Resolve every waiter (with ``error`` if given), one call per loop; at once for
    those of ``here``, the loop running in this thread (a store that synced on it)."""
    if not waiters:
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for _, loop, fut in waiters:
        by_loop.setdefault(loop, []).append(fut)
    for loop, futs in by_loop.items():
        if loop is here:
            _complete(futs, error)
            continue
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_complete, futs, error)


def _complete(futs: list[asyncio.Future[None]], error: StoreError | None) -> None:
    for fut in futs:
        if fut.done():
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(StoreError(error.message))


async def finished_within(fn: Callable[[], object], seconds: float, name: str) -> bool:
    """Run ``fn`` on a daemon thread of its own and wait for it at most ``seconds``:
    True when it returned (or raised) in time. For a blocking call that a stop must not
    wait on for ever (a database that holds a lock or stopped answering): the thread is
    left behind, and, being a daemon and no executor's worker, it does not hold the
    process's exit either."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            fn()
        except Exception:  # the caller only asks whether it ended
            log.debug("%s failed", name, exc_info=True)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(finished)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        await asyncio.wait_for(done, seconds)
    except TimeoutError:
        return False
    return True
