"""Files of a replicated node: its journal generations and the small state files,
each replaced atomically (write, fsync, rename, fsync the directory)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from meshmq.errors import StoreError
from meshmq.store.journal import format as fmt

log = logging.getLogger("meshmq.ha")

CURRENT_FILE = "CURRENT"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class Generations:
    """Journal directories ``gen-<n>`` under the store directory; ``CURRENT`` names the
    one in use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def current(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        pointer = self.directory / CURRENT_FILE
        if not pointer.exists():
            self._adopt_plain_journal()
        name = pointer.read_text().strip() if pointer.exists() else "gen-1"
        if not name.startswith("gen-") or not name[4:].isdigit():
            raise StoreError(f"{pointer}: not a journal generation name: {name!r}")
        return self.directory / name

    def _adopt_plain_journal(self) -> None:
        """A broker switched to replicated mode keeps its data: the segments of the
        journal it ran on before move into the first generation."""
        segments = [p for p in self.directory.iterdir()
                    if fmt.parse_segment_name(p.name) is not None]
        if not segments:
            return
        first = self.directory / "gen-1"
        first.mkdir(exist_ok=True)
        for seg in segments:
            os.replace(seg, first / seg.name)
        fsync_dir(first)
        fsync_dir(self.directory)
        write_atomic(self.directory / CURRENT_FILE, first.name.encode())
        log.warning("replication: moved the %d journal segments of %s into %s (this "
                    "broker ran without replication before)", len(segments),
                    self.directory, first)

    def fresh(self) -> Path:
        n = int(self.current().name[4:]) + 1
        path = self.directory / f"gen-{n}"
        if path.exists():  # left by a copy that was interrupted
            shutil.rmtree(path)
        return path

    def switch(self, path: Path) -> None:
        old = self.current()
        write_atomic(self.directory / CURRENT_FILE, path.name.encode())
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
