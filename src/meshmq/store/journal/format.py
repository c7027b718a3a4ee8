"""The journal's on-disk format (see docs/store-format.md). Pure: bytes in, values out.

Segment file ``seg-<16 hex id>.log``::

    header (24 bytes): magic "MMQJRNL\\0" | u16 format version | u16 flags (0)
                       | u64 segment id | u32 crc32 of the previous 20 bytes
    records:           u32 length | u32 crc32(type + payload) | u8 type | payload
                       (length counts type + payload)

One ``Store.write`` batch is one BATCH record, a sequence of operations. Keys are
interned per segment: OP_KEY defines an id before its first use in that segment, so
every segment can be replayed without the ones before it.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from meshmq.core import message_codec as codec
from meshmq.errors import CorruptStoreError
from meshmq.store.base import DurableSubscription

# 1: the first format. 2: adds OP_DISPATCHED (a version-1 reader refuses version-2
# segments instead of meeting an operation it does not know); version-1 segments are
# still read, they simply hold no dispatch marks.
FORMAT_VERSION = 2
MAGIC = b"MMQJRNL\x00"

SEGMENT_HEADER = struct.Struct("<8sHHQ")
HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = SEGMENT_HEADER.size + HEADER_CRC.size  # 24
RECORD_HEADER = struct.Struct("<II")  # length, crc32
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 8
MAX_RECORD_LENGTH = (1 << 31) - 1

REC_BATCH = 1

# Operations inside a BATCH record. Codes are part of the format: never reuse one.
OP_KEY = 1  # u32 key id, str key
OP_ADD = 2  # u32 msg length, msg, u32 n, n * (u32 key id, i64 seq)
OP_REMOVE = 3  # u32 key id, i64 seq
OP_DELIVERY = 4  # u32 key id, i64 seq, u32 count
OP_SUB = 5  # u32 key id, u8 flags, i64 created_ms, str client, str name, str dest[, str sel]
OP_DROP = 6  # u32 key id
OP_COPY = 7  # u32 msg length, msg, u32 n, n * (u32 key id, i64 seq, u32 delivery count)
OP_LAST_SEQ = 8  # u32 key id, i64 seq: the key's last_seq is at least seq
OP_DISPATCHED = 9  # u32 key id, i64 seq: refs of the key up to seq may have been delivered

SUB_NO_LOCAL = 0x01
SUB_HAS_SELECTOR = 0x02

U8 = struct.Struct("<B")
U32 = struct.Struct("<I")
KEY_SEQ = struct.Struct("<Iq")
KEY_SEQ_DC = struct.Struct("<IqI")
OP_U32 = struct.Struct("<BI")
OP_KEY_SEQ = struct.Struct("<BIq")
OP_KEY_SEQ_DC = struct.Struct("<BIqI")
SUB_FIXED = struct.Struct("<BIBq")

_SEGMENT_NAME = re.compile(r"^seg-([0-9a-f]{16})\.log$")


def segment_name(segment_id: int) -> str:
    return f"seg-{segment_id:016x}.log"


def parse_segment_name(name: str) -> int | None:
    m = _SEGMENT_NAME.match(name)
    return int(m.group(1), 16) if m else None


def pack_segment_header(segment_id: int, version: int = FORMAT_VERSION) -> bytes:
    head = SEGMENT_HEADER.pack(MAGIC, version, 0, segment_id)
    return head + HEADER_CRC.pack(zlib.crc32(head))


def check_segment_header(data: bytes | memoryview, where: str, expect_id: int) -> None:
    """Validate a segment header; CorruptStoreError with a clear reason otherwise."""
    if len(data) < HEADER_SIZE:
        raise CorruptStoreError(f"{where}: segment header truncated ({len(data)} bytes)")
    magic, version, _flags, seg_id = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptStoreError(f"{where}: not a meshmq journal segment (bad magic {magic!r})")
    stored_crc = HEADER_CRC.unpack_from(data, SEGMENT_HEADER.size)[0]
    if zlib.crc32(data[:SEGMENT_HEADER.size]) != stored_crc:
        raise CorruptStoreError(f"{where}: segment header checksum mismatch")
    if version > FORMAT_VERSION:
        raise CorruptStoreError(
            f"{where}: journal format version {version} is newer than this broker supports "
            f"({FORMAT_VERSION}); run a newer meshmq or restore a backup")
    if version < 1:
        raise CorruptStoreError(f"{where}: invalid journal format version {version}")
    if seg_id != expect_id:
        raise CorruptStoreError(f"{where}: header names segment {seg_id:016x}, "
                                f"file name says {expect_id:016x}")


def header_damage(data: bytes | memoryview, where: str, expect_id: int) -> str | None:
    """Why the segment header is damaged (bad magic, checksum or version), or None.

    Raises CorruptStoreError for what is not damage: a header from a newer meshmq, or an
    intact header that names another segment (a misplaced file)."""
    try:
        check_segment_header(data, where, expect_id)
    except CorruptStoreError as exc:
        if len(data) < HEADER_SIZE or data[:8] != MAGIC or "checksum" in str(exc) \
                or "invalid journal format version" in str(exc):
            return str(exc).removeprefix(f"{where}: ")
        raise
    return None


def find_next_record(data: bytes, start: int) -> int | None:
    """The offset of the first intact record (plausible length, matching checksum) at or
    after ``start``, or None: tells a torn tail (nothing intact follows) from damage in
    the middle of a segment."""
    size = len(data)
    unpack = RECORD_HEADER.unpack_from
    view = memoryview(data)
    for pos in range(max(start, HEADER_SIZE), size - RECORD_HEADER_SIZE):
        length, crc = unpack(data, pos)
        if 1 <= length <= size - pos - RECORD_HEADER_SIZE and \
                data[pos + RECORD_HEADER_SIZE] == REC_BATCH and \
                zlib.crc32(view[pos + RECORD_HEADER_SIZE:pos + RECORD_HEADER_SIZE + length]) \
                == crc:
            return pos
    return None


def pack_record(rtype: int, payload: bytes) -> bytes:
    body = U8.pack(rtype) + payload
    return RECORD_HEADER.pack(len(body), zlib.crc32(body)) + body


@dataclass(slots=True)
class ScanResult:
    records: list[tuple[int, memoryview]]  # (file offset of the record, type + payload)
    good_end: int  # offset just past the last intact record
    problem: str | None  # why scanning stopped before the end of the data, if it did


def scan_records(data: bytes) -> ScanResult:
    """Split a segment (header already checked) into intact records. Stops at the first
    record that is short, has an impossible length or fails its checksum."""
    view = memoryview(data)
    size = len(data)
    pos = HEADER_SIZE
    records: list[tuple[int, memoryview]] = []
    unpack = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    while pos < size:
        if size - pos < RECORD_HEADER_SIZE:
            return ScanResult(records, pos, f"short record header at offset {pos}")
        length, crc = unpack(data, pos)
        if length < 1 or length > MAX_RECORD_LENGTH:
            return ScanResult(records, pos, f"bad record length {length} at offset {pos}")
        end = pos + RECORD_HEADER_SIZE + length
        if end > size:
            return ScanResult(records, pos, f"record at offset {pos} runs past the end "
                                            f"of the file ({length} bytes)")
        body = view[pos + RECORD_HEADER_SIZE:end]
        if crc32(body) != crc:
            return ScanResult(records, pos, f"record checksum mismatch at offset {pos}")
        records.append((pos, body))
        pos = end
    return ScanResult(records, pos, None)


# A decoded operation: (code, ...) with the fields listed next to the OP_ codes; for
# ADD/COPY: (code, message offset in the body, length, body size, [(key id, seq, dc)]).
Op = tuple[Any, ...]


def _get_str(body: memoryview, pos: int) -> tuple[str, int]:
    n = U32.unpack_from(body, pos)[0]
    pos += 4
    end = pos + n
    if end > len(body):
        raise CorruptStoreError("string runs past the end of the record")
    return str(body[pos:end], "utf-8"), end


def put_str(out: list[bytes], text: str) -> None:
    raw = text.encode("utf-8")
    out.append(U32.pack(len(raw)))
    out.append(raw)


def iter_batch_ops(body: memoryview) -> Iterator[Op]:
    """Decode the operations of a BATCH record body (type byte included)."""
    pos = 1
    size = len(body)
    while pos < size:
        op = body[pos]
        if op in (OP_ADD, OP_COPY):
            mlen = U32.unpack_from(body, pos + 1)[0]
            moff = pos + 5
            pos = moff + mlen
            if pos > size:
                raise CorruptStoreError("message runs past the end of the record")
            msize = codec.body_length(body, moff)
            n = U32.unpack_from(body, pos)[0]
            pos += 4
            refs: list[tuple[int, int, int]] = []
            if op == OP_ADD:
                for _ in range(n):
                    kid, seq = KEY_SEQ.unpack_from(body, pos)
                    pos += 12
                    refs.append((kid, seq, 0))
            else:
                for _ in range(n):
                    refs.append(KEY_SEQ_DC.unpack_from(body, pos))
                    pos += 16
            yield (op, moff, mlen, msize, refs)
        elif op in (OP_REMOVE, OP_LAST_SEQ, OP_DISPATCHED):
            _, kid, seq = OP_KEY_SEQ.unpack_from(body, pos)
            pos += OP_KEY_SEQ.size
            yield (op, kid, seq)
        elif op == OP_DELIVERY:
            _, kid, seq, count = OP_KEY_SEQ_DC.unpack_from(body, pos)
            pos += OP_KEY_SEQ_DC.size
            yield (op, kid, seq, count)
        elif op == OP_KEY:
            kid = U32.unpack_from(body, pos + 1)[0]
            key, pos = _get_str(body, pos + 5)
            yield (op, kid, key)
        elif op == OP_DROP:
            kid = U32.unpack_from(body, pos + 1)[0]
            pos += 5
            yield (op, kid, 0)
        elif op == OP_SUB:
            _, kid, flags, created = SUB_FIXED.unpack_from(body, pos)
            pos += SUB_FIXED.size
            client, pos = _get_str(body, pos)
            name, pos = _get_str(body, pos)
            dest, pos = _get_str(body, pos)
            selector = None
            if flags & SUB_HAS_SELECTOR:
                selector, pos = _get_str(body, pos)
            yield (op, kid, DurableSubscription("", client, name, dest, selector,
                                                bool(flags & SUB_NO_LOCAL), created))
        else:
            raise CorruptStoreError(f"unknown journal operation code {op}")
    if pos != size:
        raise CorruptStoreError("operation runs past the end of the record")
