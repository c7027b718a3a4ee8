"""``MemoryStore``: the contract held purely in memory (``persistent = false`` brokers, tests).

Also the reference model the journal is checked against in the stateful tests, so it
favours obvious correctness; still O(log n) per operation so a non-persistent broker
with deep queues stays fast.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

from meshmq.core.message import Message
from meshmq.errors import StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    KeyInfo,
    MarkDispatched,
    PutDurableSubscription,
    Recovery,
    RemoveRef,
    SetDeliveryCount,
    StoredEntry,
    StoreOp,
)

_OP_TYPES = (AddMessage, RemoveRef, SetDeliveryCount, PutDurableSubscription, DropKey,
             MarkDispatched)


class _Ref:
    __slots__ = ("delivery_count", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.delivery_count = 0


class _Key:
    """Live refs of one key: ``entries`` by seq, plus ``seqs`` sorted with lazily
    dropped removals (``head`` skips the acknowledged prefix, usually all of them)."""

    __slots__ = ("bytes", "dispatched", "entries", "head", "last_seq", "seqs")

    def __init__(self) -> None:
        self.entries: dict[int, _Ref] = {}
        self.seqs: list[int] = []  # sorted from head on; may hold seqs no longer live
        self.head = 0
        self.last_seq = 0
        self.dispatched = 0
        self.bytes = 0

    def add(self, seq: int, message: Message) -> None:
        old = self.entries.get(seq)
        if old is not None:  # re-adding a live ref replaces it
            self.bytes -= len(old.message.body)
        else:
            seqs = self.seqs
            if len(seqs) == self.head or seq > seqs[-1]:
                seqs.append(seq)
            else:
                i = bisect_left(seqs, seq, self.head)
                if i == len(seqs) or seqs[i] != seq:  # else: reuse the dead slot
                    seqs.insert(i, seq)
        self.entries[seq] = _Ref(message)
        self.bytes += len(message.body)
        self.last_seq = max(self.last_seq, seq)

    def remove(self, seq: int) -> None:
        ref = self.entries.pop(seq, None)
        if ref is None:
            return
        self.bytes -= len(ref.message.body)
        seqs, entries = self.seqs, self.entries
        while self.head < len(seqs) and seqs[self.head] not in entries:
            self.head += 1
        # Drop dead slots once they dominate, so memory follows the live count.
        if len(seqs) > 2 * len(entries) + 64:
            self.seqs = [s for s in seqs[self.head:] if s in entries]
            self.head = 0

    def first_seq(self) -> int:
        return self.seqs[self.head] if self.entries else 0


class MemoryStore:
    """Everything in dictionaries; ``sync`` returns at once; nothing survives ``close``."""

    keeps_dispatch_marks = False  # nothing survives a restart

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self._subs: dict[str, DurableSubscription] = {}
        self._batches = 0
        self._opened = False
        self._closed = False

    def open(self) -> Recovery:
        if self._opened:
            raise StoreError("store already opened")
        self._opened = True
        return Recovery()

    def write(self, ops: Sequence[StoreOp]) -> None:
        if self._closed:
            raise StoreError("store is closed")
        for op in ops:  # reject a bad batch before applying any of it
            if not isinstance(op, _OP_TYPES):
                raise StoreError(f"unknown store operation {op!r}")
        self._batches += 1
        for op in ops:
            if isinstance(op, AddMessage):
                for key, seq in op.refs:
                    k = self._keys.get(key)
                    if k is None:
                        k = self._keys[key] = _Key()
                    k.add(seq, op.message)
            elif isinstance(op, RemoveRef):
                k = self._keys.get(op.key)
                if k is not None:
                    k.remove(op.seq)
            elif isinstance(op, SetDeliveryCount):
                k = self._keys.get(op.key)
                if k is not None:
                    ref = k.entries.get(op.seq)
                    if ref is not None:
                        ref.delivery_count = op.count
            elif isinstance(op, PutDurableSubscription):
                self._subs[op.subscription.key] = op.subscription
            elif isinstance(op, MarkDispatched):
                k = self._keys.get(op.key)
                if k is None:
                    k = self._keys[op.key] = _Key()
                k.dispatched = max(k.dispatched, op.seq)
            else:
                self._keys.pop(op.key, None)
                self._subs.pop(op.key, None)

    async def sync(self) -> None:
        if self._closed:
            raise StoreError("store is closed")

    def load(self, key: str, after_seq: int, max_count: int,
             max_bytes: int = 1 << 62) -> list[StoredEntry]:
        k = self._keys.get(key)
        out: list[StoredEntry] = []
        if k is None or max_count <= 0:
            return out
        seqs, entries = k.seqs, k.entries
        total = 0
        for i in range(bisect_right(seqs, after_seq, k.head), len(seqs)):
            ref = entries.get(seqs[i])
            if ref is None:
                continue
            out.append(StoredEntry(seqs[i], ref.message, ref.delivery_count))
            total += len(ref.message.body)
            if len(out) >= max_count or total >= max_bytes:
                break
        return out

    def key_info(self, key: str) -> KeyInfo:
        k = self._keys.get(key)
        if k is None:
            return KeyInfo()
        return KeyInfo(len(k.entries), k.bytes, k.first_seq(), k.last_seq, k.dispatched)

    def keys(self) -> dict[str, KeyInfo]:
        """Every known key (live refs or a last_seq), as ``Recovery.keys`` reports them."""
        return {key: self.key_info(key) for key in self._keys}

    def durable_subscriptions(self) -> list[DurableSubscription]:
        return list(self._subs.values())

    # Nothing to reclaim or run out of here (store.base.Store).
    space_listener: Callable[[], None] | None = None

    def compact_step(self) -> bool:
        return False

    def persistent_refusal(self) -> str | None:
        return None

    def stats(self) -> dict[str, int | float | str]:
        return {
            "kind": "memory",
            "keys": len(self._keys),
            "live_refs": sum(len(k.entries) for k in self._keys.values()),
            "batches": self._batches,
        }

    async def close(self) -> None:
        self._closed = True
