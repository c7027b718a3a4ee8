"""The replicated store under the store contract: a real replicated master.

The smallest cluster the replication code supports is one node with no other members:
its own vote is the majority, so it elects itself, and its lease never runs out (no
follower has to answer). Every write still goes through the replication path (the batch
is appended to the retained log and to the master's journal), so the contract suite
checks what the broker uses when ``ha.mode = "replicated"``.

The node's election and its listener live on a private event loop, run in a short-lived
thread for ``acquire`` and ``stop`` only: the contract tests then drive the store from
their own loop, as the runtime drives it from the broker's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from meshmq.config.model import BrokerConfig, HaConfig
from meshmq.ha.replica_store import ReplicatedStore
from meshmq.ha.replication import ReplicatedHa
from meshmq.store.base import Store

T = TypeVar("T")

# Short, so that a node that just (re)started waits little before it campaigns.
LEASE_MS = 100

_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` in a thread of its own (the caller may be inside a
    running loop, which cannot run another in the same thread)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def main() -> None:
        try:
            out.append(loop.run_until_complete(asyncio.wait_for(coro, 30)))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main, name="replicated-store-node")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def replicated_store(directory: Path) -> Store:
    """A replicated master's store on ``directory`` (elected before it is returned)."""
    config = BrokerConfig(data_directory=directory, ha=HaConfig(
        mode="replicated", listen="127.0.0.1:0", lease_ms=LEASE_MS, synchronous=True))
    loop = asyncio.new_event_loop()
    node = ReplicatedHa(config, on_lost=lambda why: None)
    if not _run(loop, node.acquire()):
        raise AssertionError("a one-node replicated cluster did not elect itself")
    _LOOPS[id(node.store)] = loop
    return node.store


def release(store: Store) -> None:
    """Stop the node behind ``store`` (after the store closed, as the runtime does)."""
    assert isinstance(store, ReplicatedStore)
    loop = _LOOPS.pop(id(store))
    try:
        _run(loop, store.node.stop())
        _run(loop, loop.shutdown_asyncgens())
    finally:
        loop.close()
