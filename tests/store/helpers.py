"""Shared helpers for the store tests: message factories, comparisons, store kinds."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

from hypothesis import strategies as st

from meshmq.core.destinations import Destination, DestKind, queue, topic
from meshmq.core.message import Message
from meshmq.store.base import DurableSubscription, Store, StoredEntry
from meshmq.store.journal import JournalStore
from meshmq.store.memory import MemoryStore

P = ParamSpec("P")


def run_async(fn: Callable[P, Awaitable[None]]) -> Callable[P, None]:
    """Run an async test body on a fresh event loop (no pytest-asyncio needed)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        async def main() -> None:
            await fn(*args, **kwargs)

        asyncio.run(main())

    return wrapper


MESSAGE_FIELDS = tuple(f for f in Message.__dataclass_fields__ if f != "wire_cache")


def fields(msg: Message) -> tuple[Any, ...]:
    """Everything a store must preserve (Message compares by identity)."""
    return tuple(getattr(msg, f) for f in MESSAGE_FIELDS)


def entry_view(entries: list[StoredEntry]) -> list[tuple[int, tuple[Any, ...], int]]:
    return [(e.seq, fields(e.message), e.delivery_count) for e in entries]


def msg(n: int, body: bytes | None = None, dest: Destination | None = None,
        **changes: Any) -> Message:
    m = Message(message_id=f"ID:test-{n}", destination=dest or queue("orders"),
                body=body if body is not None else f"body {n}".encode(),
                properties={"n": n, "s": "text", "f": 1.5, "b": True, "z": None},
                persistent=True, timestamp=1_700_000_000_000 + n)
    for k, v in changes.items():
        setattr(m, k, v)
    return m


def full_msg(n: int) -> Message:
    """A message with every field set to a non-default value."""
    return Message(
        message_id=f"ID:full-{n}", destination=topic("prices.eu"), body=bytes(range(256)) * 3,
        properties={"str": "välue", "int": -(2**63), "big": 2**70, "float": -0.0,
                    "t": True, "f": False, "none": None, "": "empty-name"},
        persistent=True, priority=9, timestamp=1_700_000_000_123, expiration=1_800_000_000_000,
        correlation_id="corr", reply_to=Destination(DestKind.TEMP_QUEUE, "tmp.1"),
        type="order", group_id="g1", group_seq=7, producer_id="ID:producer-1",
        broker_path=("brokerA", "brokerB"), original_destination=queue("orig"),
        user_id="alice", content_type="application/json",
    )


def sub(key: str, name: str = "s", selector: str | None = "n > 3") -> DurableSubscription:
    return DurableSubscription(key=key, client_id="client-1", subscription_name=name,
                               destination="topic://prices.>", selector=selector,
                               no_local=True, created_ms=1234)


@dataclass(frozen=True)
class StoreKind:
    """One store implementation under the contract suite. A new store (e.g. PostgreSQL)
    adds itself to STORE_KINDS; ``survives_reopen`` says whether close + open keeps data."""

    name: str
    make: Callable[[Path], Store]
    survives_reopen: bool
    # Called after the store closed, for stores that hold more than the store itself
    # (the replicated store's node: its election, its listener).
    release: Callable[[Store], None] | None = None


STORE_KINDS = [
    StoreKind("memory", lambda d: MemoryStore(), survives_reopen=False),
    StoreKind("journal", lambda d: JournalStore(d / "journal", segment_size=64 * 1024),
              survives_reopen=True),
]


def text_strategy() -> st.SearchStrategy[str]:
    return st.text(max_size=300)


destinations = st.builds(
    Destination, st.sampled_from(list(DestKind)), st.text(min_size=1, max_size=40))
property_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text_strategy())
messages = st.builds(
    Message,
    message_id=text_strategy(), destination=destinations, body=st.binary(max_size=2000),
    properties=st.dictionaries(text_strategy(), property_values, max_size=8),
    persistent=st.booleans(), priority=st.integers(0, 255),
    timestamp=st.integers(-(2**63), 2**63 - 1), expiration=st.integers(-(2**63), 2**63 - 1),
    correlation_id=st.none() | text_strategy(), reply_to=st.none() | destinations,
    type=st.none() | text_strategy(), group_id=st.none() | text_strategy(),
    group_seq=st.integers(-(2**63), 2**63 - 1), producer_id=text_strategy(),
    broker_path=st.lists(text_strategy(), max_size=4).map(tuple),
    original_destination=st.none() | destinations, user_id=st.none() | text_strategy(),
    content_type=st.none() | text_strategy(),
)
