"""A stop that cannot hang: a broker asked to stop (SIGTERM, SIGINT) exits within a
deadline whatever its parts are doing.

Why a thread and ``os._exit``: a stop step may wait on something outside the process
(a database that holds a row lock, a disk that does not answer), and the interpreter's
own exit joins every worker thread, one of which may be blocked in such a call; neither
the event loop (possibly blocked itself) nor an exception can end that. When the
deadline passes, a daemon timer thread logs which step was still running, writes every
thread's stack to stderr and ends the process with ``EXIT_STOP_OVERRAN``. What that
skips is what a crash skips: the store recovers its journal, an HA lease expires or its
holder's session ends (docs/ha.md), so nothing that was confirmed to a client is lost.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("meshmq.runtime")

STOP_DEADLINE_S = 15.0  # from the signal to the process's end
EXIT_STOP_OVERRAN = 4  # `meshmq broker` exit status when the deadline ended the process


class StopDeadline:
    """Armed once when a stop is asked for; fires at most once, from its own thread.

    ``stopping()`` names what the broker is still stopping (read from the timer thread:
    it must only read). ``exit`` ends the process; tests pass their own.
    """

    def __init__(self, stopping: Callable[[], str], seconds: float = STOP_DEADLINE_S,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.seconds = seconds
        self._stopping = stopping
        self._exit = exit
        self._timer: threading.Timer | None = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self) -> None:
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.seconds, self._expired)
        self._timer.name = "meshmq-stop-deadline"
        self._timer.daemon = True  # it must never keep a process that did stop alive
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        try:
            what = self._stopping()
        except Exception as exc:  # a read racing the loop: the exit matters more
            what = f"unknown ({exc!r})"
        log.error("the broker did not stop within %g s of the signal (still stopping: "
                  "%s); exiting now without finishing the stop (every thread's stack "
                  "follows on stderr)", self.seconds, what)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # a broken log must not keep the process
                handler.flush()
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):
            pass
        self._exit(EXIT_STOP_OVERRAN)
