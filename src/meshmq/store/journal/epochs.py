"""Journal directories per lease epoch, for brokers that share one store (HA ``shared``).

A master that takes the lease over at epoch E writes its journal in ``epoch-E/`` under
the store directory, never in the directory of the epoch before. An old master that was
paused (SIGSTOP, a VM freeze) may still append to its newest segment, create the next one,
or unlink one it compacted, at any moment after it wakes: its fence refuses to *confirm*
anything, but the bytes would still land. Here they land in the old epoch's directory,
which the new master no longer reads.

Taking an epoch over makes ``epoch-E/`` a snapshot of the newest complete epoch directory
(or of the segments in the store directory itself, the layout of a broker without HA):
sealed segments are hard-linked (a journal never writes into a sealed segment, so sharing
the inode is safe, and the snapshot costs no copy), the newest segment, the only one the
old master can still be writing, is copied into a new file. The snapshot is built under
``epoch-E.tmp/`` and renamed into place, so an interrupted takeover leaves nothing that
looks complete. Older epoch directories are removed once the new master has recovered.

A broker that runs without HA on a store that was used with HA moves the newest epoch's
segments back into the store directory (``leave_epochs``); it holds the store's lock
exclusively, so no HA broker runs beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from meshmq.store.fence import FencedError
from meshmq.store.journal import format as fmt

log = logging.getLogger("meshmq.store")

PREFIX = "epoch-"
TMP_SUFFIX = ".tmp"
_COPY_CHUNK = 1 << 20


def epoch_of(name: str) -> int | None:
    """The epoch a complete epoch directory's name stands for, or None."""
    if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
        return int(name[len(PREFIX):])
    return None


def epoch_directories(base: Path) -> list[tuple[int, Path]]:
    """The complete epoch directories under ``base``, oldest first."""
    found = [(n, p) for p in base.iterdir() if (n := epoch_of(p.name)) is not None
             and p.is_dir()]
    return sorted(found)


def highest_epoch(base: Path) -> int:
    """The highest epoch any directory here was made for, complete or not (0: none)."""
    if not base.is_dir():
        return 0
    names = (p.name.removesuffix(TMP_SUFFIX) for p in base.iterdir())
    return max((n for name in names if (n := epoch_of(name)) is not None), default=0)


def _segments(directory: Path) -> list[tuple[int, Path]]:
    return sorted((sid, p) for p in directory.iterdir()
                  if (sid := fmt.parse_segment_name(p.name)) is not None)


def _damaged(directory: Path) -> list[Path]:
    """Segments kept aside by an earlier recovery: carried along, never deleted."""
    return [p for p in directory.iterdir()
            if ".damaged" in p.name
            and fmt.parse_segment_name(p.name.split(".damaged", 1)[0]) is not None]


def _fsync_dir(path: Path, fsync: bool) -> None:
    if not fsync:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: Path, dst: Path, fsync: bool) -> bool:
    """Copy ``src`` into a new file ``dst``; False when ``src`` is gone."""
    try:
        rfd = os.open(src, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        wfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while chunk := os.read(rfd, _COPY_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(wfd, view):]
            if fsync:
                os.fsync(wfd)
        finally:
            os.close(wfd)
    finally:
        os.close(rfd)
    return True


def enter_epoch(base: Path, epoch: int, *, fsync: bool = True) -> Path:
    """The journal directory of ``epoch``, made as a snapshot of the previous epoch's on
    first use. Raises ``FencedError`` when a later epoch's directory already exists: a
    newer master has taken the store over."""
    if epoch <= 0:
        raise ValueError("epoch must be positive")
    target = base / f"{PREFIX}{epoch}"
    known = epoch_directories(base)
    newer = [n for n, _ in known if n > epoch]
    if newer:
        raise FencedError(f"store not opened: a master at epoch {max(newer)} already took "
                          f"over {base}, this broker's epoch is {epoch}")
    if target.exists():
        # Every takeover starts a new epoch above every directory here: this one was
        # made by another broker (a lease file removed while its master still ran).
        raise FencedError(f"store not opened: {target} already exists; another broker "
                          f"took over {base} at epoch {epoch}")
    older = [p for n, p in known if n < epoch]
    source = older[-1] if older else base
    tmp = base / f"{PREFIX}{epoch}{TMP_SUFFIX}"
    if tmp.exists():  # an interrupted takeover of this very epoch
        shutil.rmtree(tmp)
    tmp.mkdir()
    segments = _segments(source)
    newest = segments[-1][0] if segments else None
    linked = copied = 0
    for sid, path in segments:
        if sid == newest:
            copied += _copy(path, tmp / path.name, fsync)
            continue
        try:
            os.link(path, tmp / path.name)
            linked += 1
        except FileNotFoundError:
            # Unlinked by the previous master's compaction after it was listed: it held
            # nothing live by then (a compaction unlinks only after confirming the group
            # that made it dead, i.e. before this takeover).
            continue
    for path in _damaged(source):
        with contextlib.suppress(FileNotFoundError, FileExistsError):
            os.link(path, tmp / path.name)
    _fsync_dir(tmp, fsync)
    os.rename(tmp, target)
    _fsync_dir(base, fsync)
    log.debug("journal: epoch %d starts from %s (%d segments linked, %d copied)", epoch,
              source, linked, copied)
    return target


def remove_older(base: Path, epoch: int) -> None:
    """After the master of ``epoch`` recovered: drop what earlier epochs left behind
    (their directories, an interrupted snapshot, segments of the layout without HA)."""
    for entry in base.iterdir():
        name = entry.name
        stem = name[:-len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name
        n = epoch_of(stem)
        if n is not None and n < epoch and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif fmt.parse_segment_name(name) is not None:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def leave_epochs(base: Path, *, fsync: bool = True) -> None:
    """A broker without HA on a store that HA brokers used: bring the newest epoch's
    journal back into ``base``. The caller holds the store's exclusive lock."""
    known = epoch_directories(base)
    if not known:
        for entry in base.iterdir():
            if entry.name.startswith(PREFIX) and entry.name.endswith(TMP_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
        return
    epoch, newest = known[-1]
    for _, path in _segments(base):  # older than the epoch's snapshot of them
        path.unlink()
    moved = 0
    for path in [p for _, p in _segments(newest)] + _damaged(newest):
        if not (base / path.name).exists():
            os.replace(path, base / path.name)
            moved += 1
    _fsync_dir(base, fsync)
    for entry in base.iterdir():
        if entry.name.startswith(PREFIX) and entry.is_dir():
            shutil.rmtree(entry)
    _fsync_dir(base, fsync)
    log.warning("journal: %s was last written by a master/slave pair (epoch %d); moved its "
                "%d segment files back into the store directory", base, epoch, moved)
