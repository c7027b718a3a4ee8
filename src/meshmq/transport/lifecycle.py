"""Components started in order and stopped in reverse, each once.

Why: the broker starts a dozen things (HA, store, trace, listeners, management,
housekeeping, network connectors, $SYS) and must stop them in the opposite order,
including when a later one fails to start. Each step is recorded only once it has
started (a step that fails undoes its own partial work), on a stdlib
``AsyncExitStack``, so the same code path unwinds a failed start and a normal stop.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("meshmq.runtime")


class Lifecycle:
    """The started steps of one broker run; ``stop`` unwinds them newest first."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.running: list[str] = []  # the steps started and not yet stopped, in order
        self.stopped: list[str] = []  # the steps stopped, in the order they stopped
        self.stopping: str | None = None  # the step whose stop is in progress

    def started(self, name: str, stop: Callable[[], Awaitable[None] | None]) -> None:
        """``name`` is up; ``stop()`` takes it down (sync or async)."""
        self.running.append(name)

        async def unwind() -> None:
            self.running.remove(name)
            self.stopped.append(name)
            log.debug("stopping %s", name)
            self.stopping = name
            try:
                result = stop()
                if inspect.isawaitable(result):
                    await result
            finally:
                self.stopping = None

        self._stack.push_async_callback(unwind)

    async def stop(self) -> None:
        """Stop every started step, newest first. A step that fails does not keep the
        older ones running: they stop too, then the (last) failure is raised."""
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        await stack.aclose()

    async def abort(self) -> None:
        """Stop everything after a failed start; the start's own error is the one that
        matters, so a failure here is only logged."""
        try:
            await self.stop()
        except Exception:
            log.exception("stopping after a failed start")
