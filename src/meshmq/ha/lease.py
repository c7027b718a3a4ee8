"""Lease decisions as pure code: what a slave does with what it sees, when a master must
step down. No I/O and no clock: times are passed in (milliseconds of a monotonic clock).

A lease is a record ``(epoch, holder, counter)`` kept by a backend (a file next to a
shared journal, a row in PostgreSQL). The master bumps ``counter`` on every renewal;
taking the lease over bumps ``epoch``, the fencing token every store write is checked
against. A slave never compares clocks with the master: it measures, on its own
monotonic clock, how long the record has stayed unchanged (the file backend), or asks the
backend, which uses the database's clock (the PostgreSQL backend).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    epoch: int  # fencing token: grows by one on every takeover, never reused
    holder: str | None  # None: released (a graceful shutdown), free to take at once
    counter: int = 0  # bumped by every renewal, so observers see the master is alive


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One look at the lease, with what the backend could tell about its holder."""

    record: LeaseRecord | None  # None: no lease was ever written
    holder_alive: bool | None = None  # False: the holder's process is gone for sure
    expired: bool | None = None  # the backend's own verdict (database clock); None: unknown


class Verdict(enum.Enum):
    WAIT = "wait"
    TAKE = "take"


class LeaseWatch:
    """A slave's view of someone else's lease.

    The lease may be taken when nobody holds it, when its holder is known to be dead, when
    the backend says it expired, or (backends without a clock of their own) when the record
    has not changed for ``lease_ms`` of the observer's time since it was first seen in
    that state. Seeing a record for the first time always means waiting a full lease:
    a slave that starts next to a live master must not take over from it.
    """

    def __init__(self, lease_ms: int) -> None:
        if lease_ms <= 0:
            raise ValueError("lease_ms must be positive")
        self.lease_ms = lease_ms
        self._seen: LeaseRecord | None = None
        self._since = 0

    def observe(self, view: LeaseView, now_ms: int) -> Verdict:
        record = view.record
        if record is None or record.holder is None or view.holder_alive is False:
            return Verdict.TAKE
        if view.expired is not None:
            return Verdict.TAKE if view.expired else Verdict.WAIT
        if record != self._seen:
            self._seen = record
            self._since = now_ms
            return Verdict.WAIT
        return Verdict.TAKE if now_ms - self._since >= self.lease_ms else Verdict.WAIT

    def wait_left_ms(self, now_ms: int) -> int:
        """How much longer an unchanged record must stay unchanged before it may be taken."""
        if self._seen is None:
            return self.lease_ms
        return max(0, self.lease_ms - (now_ms - self._since))


class LeaseKeeper:
    """The master's side: when to renew, and when it can no longer be sure it is master.

    A master that has not renewed for ``lease_ms`` (I/O errors, a paused process) must
    assume a slave took over. Store fencing keeps the data safe either way; stepping down
    stops it from serving clients it can no longer serve correctly.
    """

    def __init__(self, lease_ms: int, keepalive_ms: int, now_ms: int) -> None:
        if not 0 < keepalive_ms < lease_ms:
            raise ValueError("keepalive_ms must be positive and below lease_ms")
        self.lease_ms = lease_ms
        self.keepalive_ms = keepalive_ms
        self.renewed_ms = now_ms

    def renewed(self, now_ms: int) -> None:
        self.renewed_ms = now_ms

    def next_renewal_ms(self) -> int:
        return self.renewed_ms + self.keepalive_ms

    def must_step_down(self, now_ms: int) -> bool:
        return now_ms - self.renewed_ms >= self.lease_ms


def takeover(record: LeaseRecord | None, holder: str) -> LeaseRecord:
    """The record a new master writes: the next epoch, its own name, a fresh counter."""
    return LeaseRecord(epoch=(record.epoch if record is not None else 0) + 1, holder=holder)


def renewal(record: LeaseRecord | None, holder: str, epoch: int) -> LeaseRecord | None:
    """The renewed record, or None when ``holder`` no longer holds ``epoch`` (deposed)."""
    if record is None or record.epoch != epoch or record.holder != holder:
        return None
    return LeaseRecord(epoch, holder, record.counter + 1)


def release(record: LeaseRecord | None, holder: str, epoch: int) -> LeaseRecord | None:
    """The record after a graceful handover (same epoch, nobody holds it), or None if
    ``holder`` is not the holder any more (then there is nothing to release)."""
    if record is None or record.epoch != epoch or record.holder != holder:
        return None
    return LeaseRecord(epoch, None, record.counter + 1)
