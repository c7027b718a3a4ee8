"""In-memory index of the journal: per key, its live references in seq order.

Each key keeps parallel ``array`` columns (seq, segment, offset, length, body size,
delivery count): 32 bytes per reference instead of ~200 for a tuple in a dict. The
broker appends seqs in ascending order and acknowledges mostly in order, so removal
is usually "advance ``head``"; a removal elsewhere zeroes the slot's length (a
tombstone) and the columns are rebuilt once dead slots dominate. References that
arrive out of seq order (only when replaying records that compaction copied forward)
go to a small ``extra`` dict, merged into the columns before the next ordered read.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

# (seq, segment, offset, length, body size, delivery count)
Entry = tuple[int, int, int, int, int, int]

_REBUILD_MIN = 256


class KeyIndex:
    __slots__ = ("bytes", "dcs", "dead", "dispatched", "extra", "head", "last_seq", "lens",
                 "live", "offs", "segs", "seqs", "sizes")

    def __init__(self) -> None:
        self._reset()
        self.last_seq = 0
        self.dispatched = 0  # MarkDispatched: refs up to this seq may have been delivered

    def _reset(self) -> None:
        self.seqs = array("q")
        self.segs = array("I")
        self.offs = array("q")
        self.lens = array("I")  # 0 marks a removed slot
        self.sizes = array("I")
        self.dcs = array("I")
        self.head = 0  # slots before head are all removed
        self.dead = 0  # removed slots at or after head
        self.live = 0
        self.bytes = 0
        self.extra: dict[int, list[int]] = {}  # seq -> [seg, off, len, size, dc]

    # -- lookups -------------------------------------------------------------------

    def _find(self, seq: int) -> int:
        seqs = self.seqs
        i = bisect_left(seqs, seq, self.head)
        if i < len(seqs) and seqs[i] == seq and self.lens[i]:
            return i
        return -1

    def get(self, seq: int) -> Entry | None:
        i = self._find(seq)
        if i >= 0:
            return (seq, self.segs[i], self.offs[i], self.lens[i], self.sizes[i], self.dcs[i])
        e = self.extra.get(seq)
        if e is not None:
            return (seq, e[0], e[1], e[2], e[3], e[4])
        return None

    def first_seq(self) -> int:
        if not self.live:
            return 0
        first = self.seqs[self.head] if self.head < len(self.seqs) else None
        if self.extra:
            low = min(self.extra)
            return low if first is None or low < first else first
        assert first is not None
        return first

    # -- mutations (each returns the replaced/removed entry for space accounting) ---

    def add(self, seq: int, seg: int, off: int, length: int, size: int,
            dc: int = 0) -> Entry | None:
        """Add (or replace in place) the ref ``seq``; returns the entry it replaced."""
        old: Entry | None = None
        i = self._find(seq) if self.live else -1
        if i >= 0:
            old = (seq, self.segs[i], self.offs[i], self.lens[i], self.sizes[i], self.dcs[i])
            self.segs[i] = seg
            self.offs[i] = off
            self.lens[i] = length
            self.sizes[i] = size
            self.dcs[i] = dc
            self.bytes += size - old[4]
            return old
        e = self.extra.get(seq)
        if e is not None:
            old = (seq, e[0], e[1], e[2], e[3], e[4])
            self.extra[seq] = [seg, off, length, size, dc]
            self.bytes += size - old[4]
            return old
        seqs = self.seqs
        n = len(seqs)
        if n == self.head or seq > seqs[n - 1]:
            if n == self.head and n:  # every slot is dead: start the columns afresh
                self._reset_columns()
            self.seqs.append(seq)
            self.segs.append(seg)
            self.offs.append(off)
            self.lens.append(length)
            self.sizes.append(size)
            self.dcs.append(dc)
        else:
            i = bisect_left(seqs, seq, self.head)
            if seqs[i] == seq:  # reuse the tombstone slot
                self.segs[i] = seg
                self.offs[i] = off
                self.lens[i] = length
                self.sizes[i] = size
                self.dcs[i] = dc
                self.dead -= 1
            else:
                self.extra[seq] = [seg, off, length, size, dc]
        self.live += 1
        self.bytes += size
        self.last_seq = max(self.last_seq, seq)
        return None

    def _reset_columns(self) -> None:
        last_seq, extra = self.last_seq, self.extra
        live, nbytes = self.live, self.bytes
        self._reset()
        self.last_seq, self.extra, self.live, self.bytes = last_seq, extra, live, nbytes

    def remove(self, seq: int) -> Entry | None:
        i = self._find(seq)
        if i < 0:
            e = self.extra.pop(seq, None)
            if e is None:
                return None
            self.live -= 1
            self.bytes -= e[3]
            return (seq, e[0], e[1], e[2], e[3], e[4])
        entry = (seq, self.segs[i], self.offs[i], self.lens[i], self.sizes[i], self.dcs[i])
        self.lens[i] = 0
        self.live -= 1
        self.bytes -= entry[4]
        lens = self.lens
        n = len(lens)
        if i == self.head:
            head = i + 1
            while head < n and not lens[head]:
                head += 1
                self.dead -= 1
            self.head = head
        else:
            self.dead += 1
        if self.head + self.dead > _REBUILD_MIN and (self.head + self.dead) * 2 > n:
            self._rebuild()
        return entry

    def set_delivery_count(self, seq: int, dc: int) -> bool:
        i = self._find(seq)
        if i >= 0:
            self.dcs[i] = dc
            return True
        e = self.extra.get(seq)
        if e is not None:
            e[4] = dc
            return True
        return False

    def relocate(self, seq: int, expect_seg: int, expect_off: int, seg: int, off: int) -> bool:
        """Point a live ref at a copy of its message, if it still points at the original."""
        i = self._find(seq)
        if i >= 0:
            if self.segs[i] == expect_seg and self.offs[i] == expect_off:
                self.segs[i] = seg
                self.offs[i] = off
                return True
            return False
        e = self.extra.get(seq)
        if e is not None and e[0] == expect_seg and e[1] == expect_off:
            e[0] = seg
            e[1] = off
            return True
        return False

    # -- ordered access ------------------------------------------------------------

    def normalize(self) -> None:
        """Merge out-of-order refs into the columns (sorted) and drop dead slots."""
        if self.extra or self.dead or self.head:
            self._rebuild()

    def _rebuild(self) -> None:
        entries = list(self._column_entries(self.head))
        if self.extra:
            entries.extend((s, e[0], e[1], e[2], e[3], e[4]) for s, e in self.extra.items())
            entries.sort()
        last_seq, live, nbytes = self.last_seq, self.live, self.bytes
        self._reset()
        self.last_seq, self.live, self.bytes = last_seq, live, nbytes
        for seq, seg, off, length, size, dc in entries:
            self.seqs.append(seq)
            self.segs.append(seg)
            self.offs.append(off)
            self.lens.append(length)
            self.sizes.append(size)
            self.dcs.append(dc)

    def _column_entries(self, start: int) -> Iterator[Entry]:
        seqs, segs, offs, lens, sizes, dcs = (self.seqs, self.segs, self.offs, self.lens,
                                              self.sizes, self.dcs)
        for i in range(start, len(seqs)):
            if lens[i]:
                yield (seqs[i], segs[i], offs[i], lens[i], sizes[i], dcs[i])

    def iter_after(self, after_seq: int) -> Iterator[Entry]:
        """Live entries with seq > after_seq, ascending."""
        if self.extra:
            self.normalize()
        start = bisect_right(self.seqs, after_seq, self.head)
        return self._column_entries(start)

    def entries(self) -> Iterator[Entry]:
        yield from self._column_entries(self.head)
        for s, e in self.extra.items():
            yield (s, e[0], e[1], e[2], e[3], e[4])

    def memory_bytes(self) -> int:
        """Approximate bytes held by the columns (for stats and the 1M-ref budget)."""
        cols = (self.seqs, self.segs, self.offs, self.lens, self.sizes, self.dcs)
        return sum(c.buffer_info()[1] * c.itemsize for c in cols) + 200 * len(self.extra)
