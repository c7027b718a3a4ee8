"""The embedded journal store: append-only segment files with group commit."""

from meshmq.store.journal.format import FORMAT_VERSION
from meshmq.store.journal.store import JournalStore

__all__ = ["FORMAT_VERSION", "JournalStore"]
