"""The payload of one replicated batch: store operations, self-contained.

A journal record names keys by ids defined per segment, so its raw bytes cannot be
applied by a node whose segments differ. A replicated batch therefore spells every key
out, and carries messages in the message codec's encoding (the exact bytes the journal
keeps), so a slave stores what the master stored. Layout (little-endian, like the
journal)::

    u32 op count | ops...
    ADD      u8 1 | u32 len | message (message codec) | u32 n | n * (str key, i64 seq)
    REMOVE   u8 2 | str key | i64 seq
    DELIVERY u8 3 | str key | i64 seq | u32 count
    SUB      u8 4 | str key | u8 flags | i64 created_ms | str client | str name | str dest
                  [| str selector]
    DROP     u8 5 | str key
    MARK     u8 6 | str key | i64 seq      (a key's last_seq is at least seq; snapshots)
    DISPATCH u8 7 | str key | i64 seq      (refs up to seq may have been delivered)

``str`` is ``u32 length | UTF-8``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from meshmq.core import message_codec as codec
from meshmq.errors import RemoteProtocolError, StoreError
from meshmq.store.base import (
    AddMessage,
    DropKey,
    DurableSubscription,
    MarkDispatched,
    PutDurableSubscription,
    RemoveRef,
    SetDeliveryCount,
    StoreOp,
)

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_SEQ_COUNT = struct.Struct("<qI")
_SUB_HEAD = struct.Struct("<Bq")

ADD, REMOVE, DELIVERY, SUB, DROP, MARK, DISPATCH = 1, 2, 3, 4, 5, 6, 7
_NO_LOCAL, _HAS_SELECTOR = 0x01, 0x02


def _str(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8")
    out.append(_U32.pack(len(raw)))
    out.append(raw)


def encode_ops(ops: Sequence[StoreOp], marks: Mapping[str, int] | None = None) -> bytes:
    out: list[bytes] = [_U32.pack(len(ops) + len(marks or {}))]
    for op in ops:
        if isinstance(op, AddMessage):
            data = codec.encoded(op.message)
            out.append(_U8.pack(ADD) + _U32.pack(len(data)))
            out.append(data)
            out.append(_U32.pack(len(op.refs)))
            for key, seq in op.refs:
                _str(out, key)
                out.append(_I64.pack(seq))
        elif isinstance(op, RemoveRef):
            out.append(_U8.pack(REMOVE))
            _str(out, op.key)
            out.append(_I64.pack(op.seq))
        elif isinstance(op, SetDeliveryCount):
            out.append(_U8.pack(DELIVERY))
            _str(out, op.key)
            out.append(_SEQ_COUNT.pack(op.seq, op.count))
        elif isinstance(op, PutDurableSubscription):
            sub = op.subscription
            flags = (_NO_LOCAL if sub.no_local else 0) | (
                _HAS_SELECTOR if sub.selector is not None else 0)
            out.append(_U8.pack(SUB))
            _str(out, sub.key)
            out.append(_SUB_HEAD.pack(flags, sub.created_ms))
            _str(out, sub.client_id)
            _str(out, sub.subscription_name)
            _str(out, sub.destination)
            if sub.selector is not None:
                _str(out, sub.selector)
        elif isinstance(op, DropKey):
            out.append(_U8.pack(DROP))
            _str(out, op.key)
        elif isinstance(op, MarkDispatched):
            out.append(_U8.pack(DISPATCH))
            _str(out, op.key)
            out.append(_I64.pack(op.seq))
        else:  # the store contract: a batch with an invalid operation is refused whole
            raise StoreError(f"unknown store operation {op!r}")
    for key, seq in (marks or {}).items():
        out.append(_U8.pack(MARK))
        _str(out, key)
        out.append(_I64.pack(seq))
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise RemoteProtocolError(f"replicated batch truncated at byte {self.pos}")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size))

    def text(self) -> str:
        (n,) = self.unpack(_U32)
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError(f"replicated batch: bad UTF-8 at byte {self.pos}: "
                                      f"{exc}") from None


def decode_ops(data: bytes) -> tuple[list[StoreOp], dict[str, int]]:
    """The operations and marks of one payload; RemoteProtocolError names what is wrong."""
    r = _Reader(data)
    (count,) = r.unpack(_U32)
    ops: list[StoreOp] = []
    marks: dict[str, int] = {}
    for _ in range(count):
        (code,) = r.unpack(_U8)
        if code == ADD:
            (n,) = r.unpack(_U32)
            raw = r.take(n)
            try:
                msg = codec.decode_message(raw)
            except Exception as exc:
                raise RemoteProtocolError(f"replicated batch: bad message: {exc}") from None
            # The slave's journal stores exactly these bytes: no re-encoding.
            msg.wire_cache = {codec.STORE_CACHE: raw}
            (nrefs,) = r.unpack(_U32)
            refs = []
            for _ in range(nrefs):
                key = r.text()
                refs.append((key, r.unpack(_I64)[0]))
            ops.append(AddMessage(msg, tuple(refs)))
        elif code == REMOVE:
            key = r.text()
            ops.append(RemoveRef(key, r.unpack(_I64)[0]))
        elif code == DELIVERY:
            key = r.text()
            seq, dc = r.unpack(_SEQ_COUNT)
            ops.append(SetDeliveryCount(key, seq, dc))
        elif code == SUB:
            key = r.text()
            flags, created = r.unpack(_SUB_HEAD)
            client, name, dest = r.text(), r.text(), r.text()
            selector = r.text() if flags & _HAS_SELECTOR else None
            ops.append(PutDurableSubscription(DurableSubscription(
                key, client, name, dest, selector, bool(flags & _NO_LOCAL), created)))
        elif code == DROP:
            ops.append(DropKey(r.text()))
        elif code == MARK:
            key = r.text()
            marks[key] = r.unpack(_I64)[0]
        elif code == DISPATCH:
            key = r.text()
            ops.append(MarkDispatched(key, r.unpack(_I64)[0]))
        else:
            raise RemoteProtocolError(f"replicated batch: unknown operation {code} at byte "
                                      f"{r.pos - 1}")
    if r.pos != len(data):
        raise RemoteProtocolError(f"replicated batch: {len(data) - r.pos} bytes after the "
                                  f"last operation")
    return ops, marks
