"""The HA controller's decisions around its backend: retrying an unreachable lease store,
stepping down when renewals fail or hang, handing over on stop. The backend is an
in-memory lease (the real ones are tested in test_file_lease / test_database_lease)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from meshmq.config.model import HaConfig
from meshmq.errors import StoreError
from meshmq.ha.controller import HaController
from meshmq.ha.lease import LeaseRecord, LeaseView, release, renewal, takeover
from meshmq.ha.roles import Role

FAST = HaConfig(mode="shared", lease_ms=1000, keepalive_ms=100, acquire_interval_ms=10)


class MemoryLease:
    """The lease record in a shared dict; ``fail``/``hang`` inject backend trouble."""

    def __init__(self, shared: dict[str, LeaseRecord | None], holder: str) -> None:
        self.shared = shared
        self.holder = holder
        self._epoch = 0
        self.fail: StoreError | None = None
        self.hang = threading.Event()  # set: renew blocks until released
        self.released = threading.Event()
        self.closed = False

    @property
    def epoch(self) -> int:
        return self._epoch

    def begin_write(self) -> None:
        pass

    def end_write(self) -> None:
        pass

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def look(self) -> LeaseView:
        self._check()
        return LeaseView(self.shared.get("lease"))

    def try_acquire(self, seen: LeaseRecord | None) -> int | None:
        self._check()
        if self.shared.get("lease") != seen:
            return None
        new = takeover(seen, self.holder)
        self.shared["lease"] = new
        self._epoch = new.epoch
        return new.epoch

    def renew(self) -> bool:
        if self.hang.is_set():
            self.released.wait(10)
        self._check()
        new = renewal(self.shared.get("lease"), self.holder, self._epoch)
        if new is None:
            return False
        self.shared["lease"] = new
        return True

    def release(self) -> bool:
        new = release(self.shared.get("lease"), self.holder, self._epoch)
        if new is not None:
            self.shared["lease"] = new
        return new is not None

    def close(self) -> None:
        self.closed = True


def controller(lease: MemoryLease, lost: list[str], config: HaConfig = FAST) -> HaController:
    return HaController(lease, config, mode="shared", on_lost=lost.append)


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not pred():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout)


def test_a_slave_keeps_trying_an_unreachable_lease_store() -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {}
        lease = MemoryLease(shared, "a")
        lease.fail = StoreError("database unreachable", retriable=True)
        ctl = controller(lease, [])
        task = asyncio.create_task(ctl.acquire())
        await asyncio.sleep(0.05)
        assert not task.done() and ctl.role is Role.STARTING
        lease.fail = None  # the database is back
        assert await asyncio.wait_for(task, 5)
        assert ctl.role is Role.MASTER and shared["lease"] == LeaseRecord(1, "a")
        await ctl.stop()
        assert shared["lease"] == LeaseRecord(1, None, shared["lease"].counter)  # type: ignore[union-attr]
        assert lease.closed

    asyncio.run(run())


def test_a_damaged_lease_stops_the_slave_with_the_reason() -> None:
    async def run() -> None:
        lease = MemoryLease({}, "a")
        lease.fail = StoreError("the lease file is damaged")
        with pytest.raises(StoreError, match="damaged"):
            await controller(lease, []).acquire()

    asyncio.run(run())


def test_master_steps_down_when_another_takes_the_lease() -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {}
        lost: list[str] = []
        ctl = controller(MemoryLease(shared, "a"), lost)
        assert await ctl.acquire()
        await until(lambda: ctl.renewals >= 2)
        shared["lease"] = takeover(shared["lease"], "b")  # b judged the lease expired
        await until(lambda: bool(lost))
        assert ctl.role is Role.DEPOSED
        assert lost == ["another broker took the lease over"]
        await ctl.stop()
        assert ctl.role is Role.STOPPED
        assert shared["lease"] == LeaseRecord(2, "b")  # nothing handed back: not ours

    asyncio.run(run())


@pytest.mark.parametrize("trouble", ["errors", "hang"])
def test_master_steps_down_when_it_cannot_renew_for_a_lease(trouble: str) -> None:
    async def run() -> None:
        lease = MemoryLease({}, "a")
        lost: list[str] = []
        ctl = controller(lease, lost)
        assert await ctl.acquire()
        if trouble == "errors":
            lease.fail = StoreError("I/O error", retriable=True)
        else:
            lease.hang.set()
        await until(lambda: bool(lost))
        assert ctl.role is Role.DEPOSED
        assert lost == ["could not renew the lease for 1000 ms"]
        lease.released.set()
        lease.fail = None
        await ctl.stop()

    asyncio.run(run())


def test_stop_while_waiting_as_a_slave() -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {"lease": LeaseRecord(4, "other", 9)}
        # A lease far from expiring, whatever the machine's speed.
        ctl = controller(MemoryLease(shared, "a"), [],
                         HaConfig(mode="shared", lease_ms=600_000, acquire_interval_ms=10))
        task = asyncio.create_task(ctl.acquire())
        await until(lambda: ctl.role is Role.SLAVE)
        assert ctl.status()["lease_holder"] == "other"
        await ctl.stop()
        assert await asyncio.wait_for(task, 5) is False
        assert ctl.role is Role.STOPPED
        assert shared["lease"] == LeaseRecord(4, "other", 9)

    asyncio.run(run())


def test_a_free_lease_makes_the_broker_master_at_once() -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {}
        ctl = controller(MemoryLease(shared, "a"), [],
                         HaConfig(mode="shared", lease_ms=600_000, acquire_interval_ms=10))
        assert await asyncio.wait_for(ctl.acquire(), 5)
        status = ctl.status()
        assert (status["role"], status["epoch"], status["lease_holder"],
                status["lease_epoch"]) == ("master", 1, "a", 1)
        assert ctl.machine.history == [Role.STARTING, Role.MASTER]
        await ctl.stop()

    asyncio.run(run())


def test_a_graceful_stop_hands_the_lease_back_for_the_next_broker() -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {}
        lease = MemoryLease(shared, "a")
        ctl = controller(lease, [])
        assert await ctl.acquire()
        await ctl.stop()
        assert ctl.machine.history == [Role.STARTING, Role.MASTER, Role.HANDING_OVER,
                                       Role.STOPPED]
        record = shared["lease"]
        assert record is not None and (record.epoch, record.holder) == (1, None)
        assert lease.closed
        nxt = controller(MemoryLease(shared, "b"), [])
        assert await asyncio.wait_for(nxt.acquire(), 5)  # no lease to wait out
        assert shared["lease"] == LeaseRecord(2, "b")
        await nxt.stop()

    asyncio.run(run())


def test_a_failed_hand_back_still_stops_and_leaves_the_lease_to_expire(
        caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        shared: dict[str, LeaseRecord | None] = {}
        lease = MemoryLease(shared, "a")
        ctl = controller(lease, [])
        assert await ctl.acquire()

        def broken() -> bool:
            raise OSError("disk gone")

        lease.release = broken  # type: ignore[method-assign]
        await ctl.stop()
        assert ctl.role is Role.STOPPED
        record = shared["lease"]
        assert record is not None and record.holder == "a"
        assert "a slave takes over once it expires" in caplog.text

    asyncio.run(run())


def test_the_takeover_log_says_why_the_lease_could_be_taken(
        caplog: pytest.LogCaptureFixture) -> None:
    class DeadHolder(MemoryLease):
        def look(self) -> LeaseView:
            return LeaseView(self.shared.get("lease"), holder_alive=False)

    async def run() -> None:
        caplog.set_level("INFO", "meshmq.ha")
        shared: dict[str, LeaseRecord | None] = {"lease": LeaseRecord(3, "crashed", 8)}
        ctl = controller(DeadHolder(shared, "a"), [],
                         HaConfig(mode="shared", lease_ms=600_000, acquire_interval_ms=10))
        assert await asyncio.wait_for(ctl.acquire(), 5)
        assert shared["lease"] == LeaseRecord(4, "a")
        assert "took the shared lease at epoch 4 (crashed is gone)" in caplog.text
        await ctl.stop()

    asyncio.run(run())


@pytest.mark.parametrize(("implicit", "logged"), [(True, False), (False, True)],
                         ids=["lone-kahadb", "configured-pair"])
def test_a_broker_alone_on_an_implied_lease_logs_no_master_line(
        caplog: pytest.LogCaptureFixture, implicit: bool, logged: bool) -> None:
    async def run() -> None:
        caplog.set_level("INFO", "meshmq.ha")
        config = HaConfig(mode="shared", lease_ms=600_000, implicit=implicit)
        ctl = controller(MemoryLease({}, "a"), [], config)
        assert await ctl.acquire()
        await ctl.stop()

    asyncio.run(run())
    assert ("master: took the shared lease" in caplog.text) is logged


def test_a_hand_over_that_hangs_does_not_hold_the_stop(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A lease backend that never answers the release (a database holding the lease row
    locked): the stop goes on after HANDOVER_WAIT_S, on a thread that does not keep the
    process alive, and says the lease is left to expire."""
    from meshmq.ha import controller as module

    monkeypatch.setattr(module, "HANDOVER_WAIT_S", 0.2)
    stuck = threading.Event()

    async def run() -> None:
        lease = MemoryLease({}, "a")
        ctl = controller(lease, [])
        assert await ctl.acquire()

        def hangs() -> bool:
            stuck.wait(30)
            return True

        lease.release = hangs  # type: ignore[method-assign]
        await asyncio.wait_for(ctl.stop(), 5)
        assert ctl.role is Role.STOPPED
        assert "could not hand the lease over within 0.2 s" in caplog.text
        assert all(t.daemon for t in threading.enumerate() if t.name == "meshmq-lease")

    try:
        asyncio.run(run())
    finally:
        stuck.set()


class RenewThenCall(MemoryLease):
    """Calls ``after_renew`` on the controller's loop as the next renewal completes."""

    def __init__(self, shared: dict[str, LeaseRecord | None], holder: str) -> None:
        super().__init__(shared, holder)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.after_renew: Callable[[], None] | None = None

    def renew(self) -> bool:
        ok = super().renew()
        callback, self.after_renew = self.after_renew, None
        if callback is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(callback)
        return ok


def test_a_stop_that_lands_as_a_renewal_completes_still_ends() -> None:
    """The stop cancels the keep-alive task. A cancellation that landed just after a
    renewal completed, before the task resumed, was swallowed (Python 3.11's
    ``wait_for`` returns the finished renewal instead), so the keep-alive went on
    renewing and the stop, waiting for it, never ended: a master that logged "received
    SIGTERM" and nothing more. The stop is started 0 to 11 loop turns after a renewal
    completes, to land in that window whatever the number of turns in between."""

    async def one(turns: int) -> None:
        shared: dict[str, LeaseRecord | None] = {}
        lease = RenewThenCall(shared, "a")
        lease.loop = asyncio.get_running_loop()
        ctl = controller(lease, [])
        assert await ctl.acquire()
        stopping: list[asyncio.Task[None]] = []

        def later(n: int) -> None:
            if n:
                asyncio.get_running_loop().call_soon(later, n - 1)
            else:
                stopping.append(asyncio.get_running_loop().create_task(ctl.stop()))

        lease.after_renew = lambda: later(turns)
        await until(lambda: bool(stopping))
        done, _ = await asyncio.wait(stopping, timeout=5)
        if not done:  # end the keep-alive another way, so this run can finish
            shared["lease"] = takeover(shared["lease"], "b")
            await asyncio.wait(stopping, timeout=5)
        assert done, f"the stop started {turns} turns after a renewal never ended"
        assert ctl.role is Role.STOPPED

    for turns in range(12):
        asyncio.run(one(turns))
