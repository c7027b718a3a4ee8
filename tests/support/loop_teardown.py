"""Closing a test's background event loop the way ``asyncio.run`` closes its own."""

from __future__ import annotations

import asyncio


async def drain_loop() -> None:
    """Cancel and await every task still pending, give callbacks already scheduled (a
    closed transport's ``connection_lost``, which releases its socket) loop turns, and
    finish async generators. Run it on the loop just before stopping and closing it."""
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)
    await asyncio.get_running_loop().shutdown_asyncgens()
