"""Drives the role machine with a lease backend: waits as a slave, keeps the lease alive as
master, notices a takeover, hands over on shutdown. Backend calls run on a thread of the
controller's own (they fsync or talk to a database), so the event loop never blocks on
them and a renewal never queues behind other work handed to the event loop's default
executor. That thread is a daemon, and the stop waits for the hand-over and the close
at most ``HANDOVER_WAIT_S`` each: a database that holds the lease row locked, or stopped
answering, holds neither the broker's stop nor the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from meshmq.config.model import HaConfig
from meshmq.errors import StoreError
from meshmq.ha.lease import LeaseKeeper, LeaseRecord, LeaseView, LeaseWatch, Verdict
from meshmq.ha.roles import Role, RoleEvent, RoleMachine
from meshmq.store.fence import WriteFence

log = logging.getLogger("meshmq.ha")

T = TypeVar("T")

# How long the stop waits for the lease's hand-over, and then for its close.
HANDOVER_WAIT_S = 5.0


class LeaseBackend(WriteFence, Protocol):
    """Where a lease lives: a file in a shared directory, a row in PostgreSQL. It is also
    the fence the store's writes pass (``begin_write`` / ``end_write``)."""

    holder: str

    def look(self) -> LeaseView: ...

    def try_acquire(self, seen: LeaseRecord | None) -> int | None: ...

    def renew(self) -> bool: ...

    def release(self) -> bool: ...

    def close(self) -> None: ...


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any],
             tuple[object, ...]]


class _LeaseThread:
    """Runs the backend's calls one at a time, in order, on one daemon thread (an
    executor's workers are joined at the interpreter's exit, so one blocked in a call
    to a database that does not answer would keep the process alive)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="meshmq-lease",
                                            daemon=True)
            self._thread.start()
        self._jobs.put((loop, fut, fn, args))
        return fut

    def shutdown(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fut, fn, args = job
            if fut.done():  # given up before it started (a cancelled renewal): skipped
                continue
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as exc:  # handed to the waiting coroutine
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, fut, outcome)


def _settle(fut: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if fut.done():  # its waiter gave up (a deadline, a cancelled renewal)
        return
    ok, value = outcome
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class HaController:
    def __init__(self, backend: LeaseBackend, config: HaConfig, *, mode: str,
                 on_lost: Callable[[str], None],
                 clock: Callable[[], int] = _now_ms) -> None:
        self.backend = backend
        self.config = config
        self.mode = mode
        self.machine = RoleMachine()
        self._on_lost = on_lost
        self._clock = clock
        self._stop = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None
        self.became_master_ms: int | None = None
        self.last_seen: LeaseRecord | None = None
        # The holder this broker took the lease from (None: it was free), for the trace.
        self.took_over_from: str | None = None
        self.renewals = 0
        self._worker = _LeaseThread()

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await self._worker.call(fn, *args)

    @property
    def role(self) -> Role:
        return self.machine.role

    def status(self) -> dict[str, object]:
        seen = self.last_seen
        return {"mode": self.mode, "role": self.role.value, "holder_id": self.backend.holder,
                "epoch": self.backend.epoch,
                "lease_holder": seen.holder if seen is not None else None,
                "lease_epoch": seen.epoch if seen is not None else 0,
                "renewals": self.renewals, "lease_ms": self.config.lease_ms,
                "took_over_from": self.took_over_from}

    async def acquire(self) -> bool:
        """Wait until this broker holds the lease (True) or stop() was called (False)."""
        watch = LeaseWatch(self.config.lease_ms)
        interval = self.config.acquire_interval_ms / 1000
        announced = False
        while not self._stop.is_set():
            try:
                view = await self._call(self.backend.look)
            except StoreError as exc:
                if not exc.retriable:
                    raise  # e.g. a damaged lease file: an operator must decide
                # The database is unreachable: a slave just keeps trying.
                log.warning("slave: cannot read the %s lease: %s", self.mode, exc.message)
                await self._pause(max(interval, 1.0))
                continue
            self.last_seen = view.record
            if watch.observe(view, self._clock()) is Verdict.TAKE:
                try:
                    epoch = await self._call(self.backend.try_acquire, view.record)
                except StoreError as exc:
                    if not exc.retriable:
                        raise
                    log.warning("slave: taking the %s lease failed: %s", self.mode,
                                exc.message)
                    epoch = None
                if epoch is not None and not self._stop.is_set():
                    self.machine.fire(RoleEvent.ACQUIRED)
                    self.became_master_ms = self._clock()
                    self.took_over_from = None if view.record is None else view.record.holder
                    self.last_seen = LeaseRecord(epoch, self.backend.holder)
                    why = ("it was free" if view.record is None or view.record.holder is None
                           else f"{view.record.holder} is gone" if view.holder_alive is False
                           else f"{view.record.holder} let it expire")
                    # A broker whose HA is only implied (a lone <kahaDB>) is no pair
                    # until another broker shares its store: no role line for a free lease.
                    quiet = self.config.implicit and why == "it was free"
                    log.log(logging.DEBUG if quiet else logging.INFO,
                            "master: took the %s lease at epoch %d (%s)", self.mode, epoch,
                            why)
                    self._keepalive = asyncio.get_running_loop().create_task(
                        self._keep_alive())
                    return True
                if epoch is not None:  # stopped while acquiring: hand it straight back
                    await self._call(self.backend.release)
                    break
            elif not announced:
                announced = True
                self.machine.fire(RoleEvent.WAIT)
                holder = view.record.holder if view.record is not None else None
                log.info("slave: the %s lease is held by %s; no client connectors are "
                         "started until this broker is master", self.mode, holder)
            await self._pause(interval)
        if self.role in (Role.STARTING, Role.SLAVE):
            self.machine.fire(RoleEvent.STOP)
        return False

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _keeping(self) -> bool:
        """Whether the keep-alive goes on. It looks at the stop itself, not only at its
        cancellation: under Python 3.11 ``asyncio.wait_for`` returned a renewal that had
        just completed instead of raising the cancellation that landed meanwhile, and
        the keep-alive renewed for ever while the stop waited for it to end."""
        return self.machine.role is Role.MASTER and not self._stop.is_set()

    async def _keep_alive(self) -> None:
        keeper = LeaseKeeper(self.config.lease_ms, self.config.keepalive_ms, self._clock())
        while self._keeping():
            delay = max(0, keeper.next_renewal_ms() - self._clock()) / 1000
            await asyncio.sleep(delay)
            if not self._keeping():
                return
            try:
                # A renewal that hangs (a database that stopped answering) counts as
                # failed. (asyncio.timeout, unlike 3.11's wait_for, never swallows a
                # cancellation.)
                async with asyncio.timeout(self.config.lease_ms / 1000):
                    ok = await self._call(self.backend.renew)
            except Exception as exc:  # I/O trouble: keep trying until the lease runs out
                log.warning("master: lease renewal failed: %r", exc)
                if keeper.must_step_down(self._clock()):
                    self._lose(f"could not renew the lease for {self.config.lease_ms} ms")
                    return
                await asyncio.sleep(self.config.keepalive_ms / 4000)
                continue
            if not self._keeping():
                return
            if not ok:
                self._lose("another broker took the lease over")
                return
            if keeper.must_step_down(self._clock()):
                # Renewed, but so late that a slave may have judged the lease expired;
                # the renewal succeeding proves none took it, so carry on and say so.
                log.warning("master: lease renewed %d ms after the previous renewal "
                            "(lease %d ms); was the process paused?",
                            self._clock() - keeper.renewed_ms, self.config.lease_ms)
            keeper.renewed(self._clock())
            self.renewals += 1

    def _lose(self, why: str) -> None:
        self.machine.fire(RoleEvent.LOST)
        log.error("deposed: %s (this broker's epoch was %d); its store refuses writes and "
                  "all connectors close", why, self.backend.epoch)
        self._on_lost(why)

    async def stop(self) -> None:
        """Stop waiting (slave) or hand the lease over (master, after the store closed)."""
        self._stop.set()
        role = self.role
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.cancel()
            # It ends at its next look at the stop even if the cancellation were lost;
            # a renewal blocked in its thread does not hold this wait.
            await asyncio.wait([keepalive], timeout=HANDOVER_WAIT_S)
        if role is Role.MASTER:
            self.machine.fire(RoleEvent.STOP)
            try:
                async with asyncio.timeout(HANDOVER_WAIT_S):
                    released = await self._call(self.backend.release)
            except TimeoutError:
                log.warning("could not hand the lease over within %g s (the lease backend "
                            "does not answer); a slave takes over once it expires",
                            HANDOVER_WAIT_S)
                released = False
            except Exception as exc:
                log.warning("could not hand the lease over (%r); a slave takes over once it "
                            "expires", exc)
                released = False
            self.machine.fire(RoleEvent.RELEASED if released else RoleEvent.LOST)
            if released:
                log.info("handed the %s lease over (epoch %d)", self.mode, self.backend.epoch)
        elif role is Role.DEPOSED or role in (Role.STARTING, Role.SLAVE):
            self.machine.fire(RoleEvent.STOP)
        try:
            async with asyncio.timeout(HANDOVER_WAIT_S):
                await self._call(self.backend.close)
        except TimeoutError:
            log.warning("closing the %s lease took more than %g s; left to end with the "
                        "process", self.mode, HANDOVER_WAIT_S)
        finally:
            self._worker.shutdown()
