"""Handing a pump's deliveries to their sessions: the loop that runs once per delivery.

A module of its own so that the compiled build compiles it (pyproject.toml,
``[tool.meshmq.compile]``): the pump around it (transport/pump.py) holds asyncio tasks,
timers and the store's sync, and stays interpreted, but this loop runs for every message
a broker delivers, and interpreted it costs about as much as a session's look-up and
call themselves.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshmq.core.queue import Outcome
    from meshmq.transport.host import Session

log = logging.getLogger("meshmq.runtime")


def hand_out(sessions: dict[str, Session], outcomes: list[Outcome]) -> None:
    """Give each outcome to the session of its consumer's connection. A connection
    with no session is being closed: its outcome is skipped, and closing it in the core
    puts back what was dispatched to it."""
    for outcome in outcomes:
        session = sessions.get(outcome.consumer.connection_id)
        if session is None:
            continue
        try:
            session.deliver(outcome)
        except Exception:
            # One connection's bug must not stall everyone's deliveries.
            log.exception("delivery to connection %s failed; closing it",
                          outcome.consumer.connection_id)
            session.close()
