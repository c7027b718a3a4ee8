"""The master/slave role machine: every transition of its table, every event it refuses,
and brokers sharing one lease driven through acquire, renew, lose, fence and stop
(Hypothesis state machine) with the lease decisions of ``meshmq.ha.lease``."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from meshmq.ha.lease import (
    LeaseKeeper,
    LeaseRecord,
    LeaseView,
    LeaseWatch,
    Verdict,
    release,
    renewal,
    takeover,
)
from meshmq.ha.roles import TRANSITIONS, Role, RoleError, RoleEvent, RoleMachine

# How to reach each role from STARTING with allowed events only.
PATHS: dict[Role, tuple[RoleEvent, ...]] = {
    Role.STARTING: (),
    Role.SLAVE: (RoleEvent.WAIT,),
    Role.MASTER: (RoleEvent.ACQUIRED,),
    Role.HANDING_OVER: (RoleEvent.ACQUIRED, RoleEvent.STOP),
    Role.DEPOSED: (RoleEvent.ACQUIRED, RoleEvent.LOST),
    Role.STOPPED: (RoleEvent.STOP,),
}


def machine_in(role: Role) -> RoleMachine:
    machine = RoleMachine()
    for event in PATHS[role]:
        machine.fire(event)
    assert machine.role is role
    return machine


EXPECTED = [
    (Role.STARTING, RoleEvent.WAIT, Role.SLAVE),  # someone else holds the lease
    (Role.STARTING, RoleEvent.ACQUIRED, Role.MASTER),  # the lease was free
    (Role.STARTING, RoleEvent.STOP, Role.STOPPED),
    (Role.SLAVE, RoleEvent.WAIT, Role.SLAVE),  # still held: nothing changes
    (Role.SLAVE, RoleEvent.ACQUIRED, Role.MASTER),  # the takeover
    (Role.SLAVE, RoleEvent.STOP, Role.STOPPED),
    (Role.MASTER, RoleEvent.LOST, Role.DEPOSED),  # another broker took it over
    (Role.MASTER, RoleEvent.STOP, Role.HANDING_OVER),  # graceful shutdown begins
    (Role.HANDING_OVER, RoleEvent.RELEASED, Role.STOPPED),
    (Role.HANDING_OVER, RoleEvent.LOST, Role.STOPPED),  # it expired before the release
    (Role.DEPOSED, RoleEvent.LOST, Role.DEPOSED),  # a second failed renewal
    (Role.DEPOSED, RoleEvent.STOP, Role.STOPPED),
    (Role.STOPPED, RoleEvent.STOP, Role.STOPPED),  # a second stop is harmless
]


@pytest.mark.parametrize(("start", "event", "end"), EXPECTED)
def test_each_transition_of_the_table(start: Role, event: RoleEvent, end: Role) -> None:
    machine = machine_in(start)
    assert machine.fire(event) is end
    assert machine.role is end
    assert TRANSITIONS[(start, event)] is end


def test_the_table_holds_no_transition_beyond_the_drawn_ones() -> None:
    assert {(s, e): n for s, e, n in EXPECTED} == TRANSITIONS


REFUSED = sorted(((r, e) for r in Role for e in RoleEvent if (r, e) not in TRANSITIONS),
                 key=lambda p: (p[0].value, p[1].value))


@pytest.mark.parametrize(("role", "event"), REFUSED,
                         ids=[f"{r.value}-{e.value}" for r, e in REFUSED])
def test_an_event_the_role_does_not_expect_is_refused_and_changes_nothing(
        role: Role, event: RoleEvent) -> None:
    machine = machine_in(role)
    history = list(machine.history)
    with pytest.raises(RoleError) as info:
        machine.fire(event)
    assert str(info.value) == (f"event {event.value!r} is not possible in role "
                               f"{role.value!r}")
    assert info.value.code == "ha-role-error"
    assert machine.role is role and machine.history == history


def test_only_the_master_serves_clients() -> None:
    assert [r for r in Role if machine_in(r).serving] == [Role.MASTER]


def test_history_records_each_role_once_per_change() -> None:
    machine = RoleMachine()
    for event in (RoleEvent.WAIT, RoleEvent.WAIT, RoleEvent.WAIT, RoleEvent.ACQUIRED,
                  RoleEvent.LOST, RoleEvent.LOST, RoleEvent.STOP, RoleEvent.STOP):
        machine.fire(event)
    assert machine.history == [Role.STARTING, Role.SLAVE, Role.MASTER, Role.DEPOSED,
                               Role.STOPPED]


@pytest.mark.parametrize("role", [Role.DEPOSED, Role.HANDING_OVER, Role.STOPPED])
def test_a_broker_that_left_the_master_role_never_becomes_master_again(role: Role) -> None:
    """Only a new runtime (a new machine) starts over: a deposed master must not serve
    on the strength of a stale epoch."""
    machine = machine_in(role)
    with pytest.raises(RoleError):
        machine.fire(RoleEvent.ACQUIRED)


LEASE_MS = 1000
KEEPALIVE_MS = 250


class _Broker:
    def __init__(self, name: str, life: int) -> None:
        self.name = f"{name}/{life}"  # a restarted broker is a new holder
        self.machine = RoleMachine()
        self.watch = LeaseWatch(LEASE_MS)
        self.keeper: LeaseKeeper | None = None
        self.epoch = 0


class SharedLease(RuleBasedStateMachine):
    """Two brokers on one lease record, with the controller's rules: a slave takes the
    lease when its watch says so; a master renews, is deposed when a renewal finds
    another epoch or when it could not renew for a lease; stop hands it back."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.record: LeaseRecord | None = None
        self.brokers = {n: _Broker(n, 0) for n in ("a", "b")}
        self.lives = 0
        self.epochs_issued: list[int] = []
        # name -> when its record last changed (takeover or renewal), for the takeover rule
        self.changed_at = 0

    # ------------------------------------------------------------ events
    @rule(ms=st.sampled_from([1, 100, KEEPALIVE_MS, 999, LEASE_MS, 1500]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        for b in self.brokers.values():
            if b.machine.role is Role.MASTER and b.keeper is not None \
                    and b.keeper.must_step_down(self.now):
                b.machine.fire(RoleEvent.LOST)  # could not renew for a whole lease

    @rule(name=st.sampled_from(["a", "b"]))
    def look(self, name: str) -> None:
        b = self.brokers[name]
        if b.machine.role not in (Role.STARTING, Role.SLAVE):
            return
        previous = self.record
        # A stopped broker closed its backend: its alive lock is gone.
        gone = previous is not None and previous.holder is not None and not any(
            o.name == previous.holder and o.machine.role is not Role.STOPPED
            for o in self.brokers.values())
        view = LeaseView(previous, holder_alive=False if gone else None)
        if b.watch.observe(view, self.now) is Verdict.TAKE:
            if previous is not None and previous.holder is not None and not gone:
                # Taken from a live holder: only after a full lease without any change.
                assert self.now - self.changed_at >= LEASE_MS
            self.record = takeover(previous, b.name)
            self.changed_at = self.now
            b.epoch = self.record.epoch
            self.epochs_issued.append(b.epoch)
            b.machine.fire(RoleEvent.ACQUIRED)
            b.keeper = LeaseKeeper(LEASE_MS, KEEPALIVE_MS, self.now)
        else:
            b.machine.fire(RoleEvent.WAIT)

    @rule(name=st.sampled_from(["a", "b"]))
    def renew(self, name: str) -> None:
        b = self.brokers[name]
        if b.machine.role is not Role.MASTER or b.keeper is None:
            return
        new = renewal(self.record, b.name, b.epoch)
        if new is None:
            b.machine.fire(RoleEvent.LOST)
        else:
            self.record = new
            self.changed_at = self.now
            b.keeper.renewed(self.now)

    @rule(name=st.sampled_from(["a", "b"]))
    def stop(self, name: str) -> None:
        b = self.brokers[name]
        if b.machine.role is Role.MASTER:
            b.machine.fire(RoleEvent.STOP)
            new = release(self.record, b.name, b.epoch)
            if new is not None:
                self.record = new
                self.changed_at = self.now
            b.machine.fire(RoleEvent.RELEASED if new is not None else RoleEvent.LOST)
        else:
            b.machine.fire(RoleEvent.STOP)
        assert b.machine.role is Role.STOPPED

    @rule(name=st.sampled_from(["a", "b"]))
    def restart(self, name: str) -> None:
        """A stopped broker comes back as a new process: a new machine, a new watch."""
        if self.brokers[name].machine.role is not Role.STOPPED:
            return
        self.lives += 1
        self.brokers[name] = _Broker(name, self.lives)

    # ------------------------------------------------------------ fence
    def passes_fence(self, b: _Broker) -> bool:
        rec = self.record
        return b.epoch > 0 and rec is not None and rec.epoch == b.epoch \
            and rec.holder == b.name

    @invariant()
    def at_most_one_broker_may_write(self) -> None:
        writers = [b for b in self.brokers.values()
                   if self.passes_fence(b) and b.machine.role is not Role.STOPPED]
        assert len(writers) <= 1
        for b in writers:
            # A master that could not renew steps down but still holds the record until
            # a slave takes it; then the runtime has closed its connectors and store.
            assert b.machine.role in (Role.MASTER, Role.HANDING_OVER, Role.DEPOSED)
            assert b.epoch == max(self.epochs_issued)

    @invariant()
    def epochs_only_grow(self) -> None:
        assert self.epochs_issued == sorted(set(self.epochs_issued))

    @invariant()
    def serving_means_master_role(self) -> None:
        for b in self.brokers.values():
            assert b.machine.serving == (b.machine.role is Role.MASTER)
            assert b.machine.history.count(Role.MASTER) <= 1


SharedLease.TestCase.settings = settings(max_examples=60, stateful_step_count=25)
test_brokers_sharing_a_lease = SharedLease.TestCase


def test_a_released_lease_is_taken_at_once_by_the_waiting_slave() -> None:
    a, b = RoleMachine(), RoleMachine()
    watch = LeaseWatch(LEASE_MS)
    record = takeover(None, "a")
    a.fire(RoleEvent.ACQUIRED)
    assert watch.observe(LeaseView(record), 0) is Verdict.WAIT
    b.fire(RoleEvent.WAIT)
    a.fire(RoleEvent.STOP)
    released = release(record, "a", record.epoch)
    assert released is not None
    a.fire(RoleEvent.RELEASED)
    # One millisecond later, no lease to wait out.
    assert watch.observe(LeaseView(released), 1) is Verdict.TAKE
    assert b.fire(RoleEvent.ACQUIRED) is Role.MASTER
    assert takeover(released, "b").epoch == record.epoch + 1
