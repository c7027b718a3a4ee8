"""Paging as a decision: the core asks for a page of stored messages; the edge loads it.

A queue deeper than its page size keeps only a window of persistent messages in memory;
the rest live in the store. When the window runs low the queue does not read the store
itself (with PostgreSQL that would be a blocking query on the event loop): it records a
``PageLoad`` -- which queue, which store key, the references after which seq, how many --
and the broker hands it out through ``Broker.take_page_loads``. The runtime reads the
page where reading cannot stall the loop and gives the result back with
``Broker.page_loaded`` (or ``Broker.page_failed``).

While a load is in flight the queue goes on dispatching only what comes before the
page (entries with a seq at or below ``after_seq``), so nothing overtakes it. What
happens to the paged-out references meanwhile is recorded here, so that a late page
cannot resurrect them: ``dropped`` (the management API removed or moved one of them),
``cancelled`` (the queue was purged or deleted) and ``more`` (a new persistent message
was left in the store only, so the queue keeps paging even if the page comes back short).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshmq.core.queue import Queue


class PageLoad:
    """Decision: read up to ``count`` live references of store key ``key`` with a seq
    above ``after_seq`` (``Store.load``), then call ``Broker.page_loaded`` with them."""

    __slots__ = ("after_seq", "cancelled", "count", "dropped", "key", "more", "queue")

    def __init__(self, queue: Queue, key: str, after_seq: int, count: int) -> None:
        self.queue = queue
        self.key = key
        self.after_seq = after_seq
        self.count = count
        self.dropped: set[int] = set()
        self.cancelled = False
        self.more = False

    def __repr__(self) -> str:
        return f"PageLoad({self.key!r}, after_seq={self.after_seq}, count={self.count})"
