"""Small shared types of a replication node: its Raft role and what the master knows of
each member."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from meshmq.ha.replication_policy import Position

REPL_KEY = "\x00meshmq:replication"  # journal key whose last_seq is the log position


class Kind(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


def split_address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


@dataclass(slots=True)
class Peer:
    addr: str
    match: int = 0  # highest index known on its disk and agreeing with ours
    acked_sent_ms: int | None = None  # send time of the newest message it answered
    last: Position | None = None  # its position, from its newest answer
    witness: bool = False
    mismatch: bool = False
    closed: bool = False
    unreachable: bool = False  # the newest attempt to connect failed
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class DrivenRole:
    """A shard of a node in replicated mode (ha/replica_node.py): its node's supervisor
    runs the elections and tells it the term and whether it leads its stream (shard k
    of the master node) or follows it (shard k of every other node)."""

    term: int
    lead: bool
