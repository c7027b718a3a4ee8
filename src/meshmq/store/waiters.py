"""Completing store-sync waiters from a writer thread (journal and PostgreSQL stores
commit on their own threads; each waiter belongs to some event loop)."""

from __future__ import annotations

import asyncio
import contextlib

from meshmq.errors import StoreError

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
