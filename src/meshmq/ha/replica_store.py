"""The store a replicated master serves from (its own journal, every batch replicated),
and ``meshmq witness``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from meshmq.config.model import BrokerConfig
from meshmq.errors import StoreError
from meshmq.store.base import KeyInfo, Recovery, Store, StoredEntry, StoreOp
from meshmq.store.journal import JournalStore

if TYPE_CHECKING:
    from meshmq.ha.replication import ReplicatedHa

log = logging.getLogger("meshmq.ha")


class ReplicatedStore(Store):
    """The master's store: its own journal, every batch replicated (``sync`` waits for a
    majority in synchronous mode). Refuses writes once this node is not master.

    It implements the store contract (``meshmq.store.base.Store``) and passes its
    contract suite (tests/store/test_contract.py), so the runtime uses it like any other
    store."""

    keeps_dispatch_marks = True  # replicated to every member's journal

    def __init__(self, node: ReplicatedHa) -> None:
        self.node = node

    def _journal(self) -> JournalStore:
        if self.node.journal is None:
            raise StoreError("replicated store is not open")
        return self.node.journal

    def open(self) -> Recovery:
        return self.node.recovery()

    def write(self, ops: Sequence[StoreOp]) -> None:
        if ops:
            self.node.replicate(list(ops))

    async def sync(self) -> None:
        await self.node.sync()

    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        return self._journal().load(key, after_seq, max_count, max_bytes)

    def key_info(self, key: str) -> KeyInfo:
        return self._journal().key_info(key)

    def compact_step(self) -> bool:
        return self.node.journal is not None and self.node.journal.compact_step()

    # Space is the master's own journal's: its disk limits and full-disk state count.
    @property
    def space_listener(self) -> Callable[[], None] | None:
        return self.node.journal.space_listener if self.node.journal is not None else None

    @space_listener.setter
    def space_listener(self, listener: Callable[[], None] | None) -> None:
        if self.node.journal is not None:
            self.node.journal.space_listener = listener

    def persistent_refusal(self) -> str | None:
        journal = self.node.journal
        return journal.persistent_refusal() if journal is not None else None

    def stats(self) -> dict[str, int | float | str]:
        out = dict(self._journal().stats()) if self.node.journal is not None else {}
        out["kind"] = "replicated-journal"
        out["replication_term"] = self.node.term
        out["replication_index"] = self.node.last[1]
        out["replication_commit"] = self.node.commit
        return out

    async def close(self) -> None:
        if self.node.journal is not None:
            await self.node.journal.close()


async def run_witness(config: BrokerConfig) -> int:
    """``meshmq witness``: vote until SIGTERM/SIGINT; no broker, no store."""
    import signal

    from meshmq.ha.replication import ReplicatedHa

    node = ReplicatedHa(config, on_lost=lambda why: None)
    loop = asyncio.get_running_loop()
    stopping: set[asyncio.Task[None]] = set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, lambda: stopping.add(loop.create_task(node.stop())))
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, node.tls.reload)  # new TLS certificate
    await node.acquire()
    for task in stopping:
        await task
    log.info("witness %s stopped", node.node_id)
    return 0
