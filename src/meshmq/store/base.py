"""The store contract every persistence implementation satisfies.

The broker keeps *references* to messages under *keys*. A key is a string the
broker chooses: ``"queue://orders"`` for a queue, ``"durable://client:sub"`` for
a durable topic subscription. One message can be referenced by several keys
(a topic message kept for three offline durable subscribers is stored once).
Each reference has a per-key sequence number chosen by the broker; within a
key, sequence numbers only grow, and recovery returns references in that order.

Writes are grouped into atomic batches (``write``): after a crash either the
whole batch is visible or none of it (transactions rely on this). ``write`` is
cheap and non-blocking (it only queues the batch); ``sync`` completes once every
batch written before the call is durable. Many writers share one fsync (group
commit). Data written and not yet synced must be visible to ``load`` at once.

Every implementation passes ``tests/store/test_contract.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from meshmq.core.message import Message


@dataclass(frozen=True, slots=True)
class AddMessage:
    """Store ``message`` once and reference it as ``(key, seq)`` for every ref."""

    message: Message
    refs: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class RemoveRef:
    """Drop one reference (an acknowledgement). Unknown refs are ignored."""

    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class SetDeliveryCount:
    """Record how often a reference was delivered, so ``redelivered`` survives restarts."""

    key: str
    seq: int
    count: int


@dataclass(frozen=True, slots=True)
class MarkDispatched:
    """References of ``key`` with a seq up to ``seq`` may have been handed to a consumer.

    The broker writes this (and waits for it to be durable) before it dispatches a
    reference beyond the previous mark, advancing it a window ahead, so one small record
    covers many deliveries. A store keeps the highest mark per key (a lower one never
    lowers it) and reports it as ``KeyInfo.dispatched``; ``DropKey`` forgets it. After a
    crash the broker flags references at or below it redelivered: a delivery whose
    ``SetDeliveryCount`` or acknowledgement did not reach the disk still says so."""

    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class DurableSubscription:
    """A durable topic subscription as the broker needs it back after a restart."""

    key: str  # the store key of the subscription's references
    client_id: str
    subscription_name: str
    destination: str  # Destination URI, e.g. "topic://a.b.>"
    selector: str | None = None
    no_local: bool = False
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class PutDurableSubscription:
    subscription: DurableSubscription


@dataclass(frozen=True, slots=True)
class DropKey:
    """Forget a key: all its references and, if it is a durable subscription, the record."""

    key: str


StoreOp = (AddMessage | RemoveRef | SetDeliveryCount | PutDurableSubscription | DropKey
           | MarkDispatched)


@dataclass(frozen=True, slots=True)
class StoredEntry:
    seq: int
    message: Message
    delivery_count: int = 0


@dataclass(slots=True)
class KeyInfo:
    count: int = 0  # live references
    bytes: int = 0  # sum of the referenced messages' body sizes
    first_seq: int = 0  # smallest live seq (0 when count == 0)
    last_seq: int = 0  # largest seq ever written for the key (live or not)
    dispatched: int = 0  # highest MarkDispatched seq (refs up to it may have been delivered)


@dataclass(slots=True)
class Recovery:
    keys: dict[str, KeyInfo] = field(default_factory=dict)
    durable_subscriptions: list[DurableSubscription] = field(default_factory=list)


@runtime_checkable
class SyncsAtOnce(Protocol):
    """A store that completes syncs from its own writer thread also offers ``sync`` as a
    call that takes its target at once and returns a future, not a coroutine: the
    runtime's confirmations (one sync per event-loop turn that wants any, so one per
    message for a producer at a confirmation window of 1) then cost no task."""

    def sync_at_once(self) -> Awaitable[None]:
        """Done once every batch written before this call is durable."""
        ...


@runtime_checkable
class LoadsAsync(Protocol):
    """A store whose reads can block (a database over the network, files on a slow
    disk) also offers ``load`` as a coroutine that keeps the event loop free while it
    waits. The runtime reads pages of paged-out messages (core/paging.py) through it
    where a store has it (PostgreSQL, the journal); the memory store is read with
    ``load``."""

    async def load_async(self, key: str, after_seq: int,
                         max_count: int) -> list[StoredEntry]:
        """What ``load(key, after_seq, max_count)`` returns, without blocking the loop."""
        ...


@runtime_checkable
class Store(Protocol):
    # Whether dispatch marks (``MarkDispatched``) survive a restart here, so that the
    # broker writes them; a store that forgets everything on restart says False.
    keeps_dispatch_marks: bool
    # Set by the runtime: called, from any thread, when the store runs out of room or has
    # room again, so that the broker asks ``persistent_refusal`` at once.
    space_listener: Callable[[], None] | None

    def open(self) -> Recovery:
        """Open (or create) the store and return what it holds. Called once."""
        ...

    def write(self, ops: Sequence[StoreOp]) -> None:
        """Queue one atomic batch. Never blocks on disk."""
        ...

    async def sync(self) -> None:
        """Return once every batch written before this call is durable."""
        ...

    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        """Live references of ``key`` with seq > ``after_seq``, ascending, at most
        ``max_count`` of them; stops early once ``max_bytes`` of bodies were
        returned (always returns at least one entry when one exists)."""
        ...

    def key_info(self, key: str) -> KeyInfo:
        ...

    def stats(self) -> dict[str, int | float | str]:
        """Implementation figures for ``meshmq stat`` (files, bytes, syncs, ...)."""
        ...

    def compact_step(self) -> bool:
        """Reclaim space in a bounded slice of work (the broker calls it while idle too);
        True while more is pending. Stores that need no reclaiming return False."""
        ...

    def persistent_refusal(self) -> str | None:
        """Why new persistent messages must be refused now (a full disk, a size limit),
        or None."""
        ...

    async def close(self) -> None:
        """Flush, sync and release files. The store cannot be used afterwards."""
        ...
