"""A broker's master/slave role as an explicit state machine (a table, drawn in docs/ha.md).

::

    starting --wait--> slave --acquired--> master --lost-----> deposed --stop--> stopped
        |                |                    |
        +--acquired--> master                 +--stop--> handing-over --released--> stopped
        +--stop--> stopped   slave --stop--> stopped          (lost while handing over: stopped)

Only ``master`` serves clients. ``deposed`` means another broker took the lease over:
every store write of this broker is refused from then on (fencing), and the runtime
closes its connectors.
"""

from __future__ import annotations

import enum

from meshmq.errors import MeshmqError


class Role(enum.Enum):
    STARTING = "starting"
    SLAVE = "slave"
    MASTER = "master"
    HANDING_OVER = "handing-over"
    DEPOSED = "deposed"
    STOPPED = "stopped"


class RoleEvent(enum.Enum):
    WAIT = "wait"  # the lease is held by someone else
    ACQUIRED = "acquired"  # this broker took the lease (a new epoch)
    LOST = "lost"  # a renewal found another holder or epoch
    STOP = "stop"  # shutdown requested
    RELEASED = "released"  # the lease was handed back


TRANSITIONS: dict[tuple[Role, RoleEvent], Role] = {
    (Role.STARTING, RoleEvent.WAIT): Role.SLAVE,
    (Role.STARTING, RoleEvent.ACQUIRED): Role.MASTER,
    (Role.STARTING, RoleEvent.STOP): Role.STOPPED,
    (Role.SLAVE, RoleEvent.WAIT): Role.SLAVE,
    (Role.SLAVE, RoleEvent.ACQUIRED): Role.MASTER,
    (Role.SLAVE, RoleEvent.STOP): Role.STOPPED,
    (Role.MASTER, RoleEvent.LOST): Role.DEPOSED,
    (Role.MASTER, RoleEvent.STOP): Role.HANDING_OVER,
    (Role.HANDING_OVER, RoleEvent.RELEASED): Role.STOPPED,
    (Role.HANDING_OVER, RoleEvent.LOST): Role.STOPPED,
    (Role.DEPOSED, RoleEvent.LOST): Role.DEPOSED,
    (Role.DEPOSED, RoleEvent.STOP): Role.STOPPED,
    (Role.STOPPED, RoleEvent.STOP): Role.STOPPED,
}


class RoleError(MeshmqError):
    code = "ha-role-error"


class RoleMachine:
    def __init__(self) -> None:
        self.role = Role.STARTING
        self.history: list[Role] = [Role.STARTING]

    def fire(self, event: RoleEvent) -> Role:
        nxt = TRANSITIONS.get((self.role, event))
        if nxt is None:
            raise RoleError(f"event {event.value!r} is not possible in role "
                            f"{self.role.value!r}")
        if nxt is not self.role:
            self.history.append(nxt)
        self.role = nxt
        return nxt

    @property
    def serving(self) -> bool:
        """Whether client connectors may be open."""
        return self.role is Role.MASTER
