"""Trace files: where the core's trace events (core/trace.py) are written.

The core records events into a ``Tracer``, which is data in memory; writing them is
I/O, so it happens here, at the edge. The runtime hands the tracer's events to a sink
once per pump and on its trace timer (``BrokerRuntime._write_trace``), and the sinks
write rolling files in the versioned schema of ``docs/pipeline.md``:

* ``JsonLinesSink``: one JSON object per line; flushed to the OS every
  ``flush_interval_ms``, so a crash loses at most that much trace.
* ``ParquetSink``: one Parquet file per roll (needs pyarrow, i.e. the ``spark``
  extra); a crash loses the file being collected.
* ``HeartbeatFile``: the last heartbeat of a run, replaced at every heartbeat, so the
  next start can name it in ``broker_started`` even when the crashed run's file was lost.

A file is written under a name ending in ``.open`` and renamed to its final name
when it is rolled or closed, so a reader following the directory (Spark's file
source) never sees a half-written file. Files left ``.open`` by a crash are sealed
by the next start of the same broker; the batch audit reads them too.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from meshmq.core.trace import (
    COLUMNS,
    DEDUP_HEADER,
    SCHEMA_VERSION,
    Event,
    JsonEncoder,
)

if TYPE_CHECKING:
    from meshmq.core.destinations import Destination

log = logging.getLogger("meshmq.trace")


class TraceSink(Protocol):
    def write(self, events: Sequence[Event]) -> None: ...
    def tick(self) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class HeartbeatFile:
    """The last heartbeat of this broker's run (``<boot> <ts in µs>``), replaced
    atomically at every heartbeat, so the next start can say when the previous run
    was last alive even when that run's trace file did not survive it."""

    def __init__(self, directory: Path, broker: str) -> None:
        self.path = directory / f"heartbeat-{file_stem(broker)}"
        self._tmp = self.path.with_name(self.path.name + ".tmp")

    def read(self) -> tuple[str, int] | None:
        try:
            boot, ts = self.path.read_text(encoding="ascii").split()
            return boot, int(ts)
        except (OSError, ValueError):
            return None

    def write(self, boot: str, ts_us: int) -> None:
        self._tmp.write_text(f"{boot} {ts_us}\n", encoding="ascii")
        os.replace(self._tmp, self.path)


OPEN_SUFFIX = ".open"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def file_stem(broker: str) -> str:
    """The file-name-safe form of a broker name used in trace file names."""
    return _UNSAFE_NAME.sub("_", broker) or "broker"


class _Rolling:
    """Naming, rolling, sealing and retention shared by both sinks."""

    suffix = ""

    def __init__(self, directory: Path, broker: str, boot: str, *, max_file_bytes: int,
                 roll_interval_ms: int, max_files: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.broker = broker
        self.boot = boot
        self.max_file_bytes = max_file_bytes
        self.roll_interval_s = roll_interval_ms / 1000.0
        self.max_files = max_files
        self._clock = clock
        self._seq = 0
        self._opened_at = 0.0
        self._bytes = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._prefix = f"trace-{file_stem(broker)}-"
        self.seal_leftovers()

    def seal_leftovers(self) -> None:
        """Rename this broker's files left ``.open`` by a crash to their final names."""
        for path in sorted(self.directory.glob(f"{self._prefix}*{OPEN_SUFFIX}")):
            final = path.with_name(path.name[: -len(OPEN_SUFFIX)])
            if final.suffix == self.suffix:
                os.replace(path, final)
                log.info("sealed trace file %s left open by an earlier run", final.name)

    def _next_path(self) -> Path:
        self._seq += 1
        return self.directory / f"{self._prefix}{self.boot}-{self._seq:06d}{self.suffix}"

    def _due(self) -> bool:
        return self._bytes >= self.max_file_bytes or (
            self.roll_interval_s > 0 and self._clock() - self._opened_at >= self.roll_interval_s)

    def _retain(self) -> None:
        if self.max_files <= 0:
            return
        sealed = sorted((p for p in self.directory.glob(f"{self._prefix}*{self.suffix}")),
                        key=lambda p: p.stat().st_mtime_ns)
        for old in sealed[: max(0, len(sealed) - self.max_files)]:
            old.unlink(missing_ok=True)


class JsonLinesSink(_Rolling):
    suffix = ".jsonl"

    def __init__(self, directory: Path, broker: str, boot: str, *,
                 max_file_bytes: int = 64 << 20, roll_interval_ms: int = 60_000,
                 max_files: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(directory, broker, boot, max_file_bytes=max_file_bytes,
                         roll_interval_ms=roll_interval_ms, max_files=max_files, clock=clock)
        self._file: Any = None
        self._path: Path | None = None
        self._encoder = JsonEncoder(broker, boot)

    def _open(self) -> None:
        self._path = self._next_path()
        self._file = open(f"{self._path}{OPEN_SUFFIX}", "w", encoding="utf-8",  # noqa: SIM115
                          buffering=1 << 20)
        self._opened_at = self._clock()
        self._bytes = 0

    def write(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._file is None:
            self._open()
        text = self._encoder.encode(events)
        self._file.write(text)
        self._bytes += len(text)
        if self._bytes >= self.max_file_bytes:
            self._seal()

    def tick(self) -> None:
        """Periodic: hand buffered lines to the OS; roll a file that is old enough."""
        if self._file is None:
            return
        if self._due():
            self._seal()
        else:
            self._file.flush()

    def flush(self) -> None:
        """Hand everything written so far to the OS (it survives a SIGKILL)."""
        if self._file is not None:
            self._file.flush()

    def _seal(self) -> None:
        assert self._file is not None and self._path is not None
        self._file.close()
        os.replace(f"{self._path}{OPEN_SUFFIX}", self._path)
        self._file = None
        self._retain()

    def close(self) -> None:
        if self._file is not None:
            self._seal()


class ParquetSink(_Rolling):
    """Writes Parquet files: events are converted to a row group every ``ROW_GROUP``
    events (bounding memory and event-loop pauses); the file gets its footer, and its
    final name, when it rolls. A crash leaves an unreadable ``.open`` file behind: the
    next start renames it ``.parquet.lost`` (the trace of that interval is gone)."""

    suffix = ".parquet"
    ROW_GROUP = 32_768

    def __init__(self, directory: Path, broker: str, boot: str, *,
                 max_file_bytes: int = 64 << 20, roll_interval_ms: int = 60_000,
                 max_files: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        import pyarrow
        import pyarrow.parquet

        self._pa = pyarrow
        self._pq = pyarrow.parquet
        self.schema = arrow_schema()
        self._pending: list[Event] = []
        self._writer: Any = None
        self._path: Path | None = None
        super().__init__(directory, broker, boot, max_file_bytes=max_file_bytes,
                         roll_interval_ms=roll_interval_ms, max_files=max_files, clock=clock)

    def seal_leftovers(self) -> None:
        for path in sorted(self.directory.glob(f"{self._prefix}*.parquet{OPEN_SUFFIX}")):
            os.replace(path, path.with_name(path.name[: -len(OPEN_SUFFIX)] + ".lost"))
            log.warning("trace file %s was left unfinished by a crash; renamed .lost",
                        path.name)

    def write(self, events: Sequence[Event]) -> None:
        if not events:
            return
        if self._writer is None and not self._pending:
            self._opened_at = self._clock()
        self._pending.extend(events)
        if len(self._pending) >= self.ROW_GROUP:
            self._write_group()
            if self._bytes >= self.max_file_bytes:
                self._seal()

    def tick(self) -> None:
        if (self._pending or self._writer is not None) and self._due():
            self._seal()

    def flush(self) -> None:
        """Nothing to do: an unfinished Parquet file is unreadable after a crash anyway
        (``exact`` needs JSON lines)."""

    def table(self, events: Sequence[Event]) -> Any:
        """``events`` as a ``pyarrow.Table`` in the trace schema."""
        pa = self._pa
        n = len(events)
        msgs = [e[2] for e in events]
        dedup = [None if m is None or not m.properties else m.properties.get(DEDUP_HEADER)
                 for m in msgs]
        names: dict[Destination | None, str] = {None: ""}
        for e in events:
            d = e[3] if e[3] is not None or e[2] is None else e[2].destination
            if d not in names:
                names[d] = str(d)
        cols = [
            [SCHEMA_VERSION] * n, [e[0] // 1000 for e in events], [e[1] for e in events],
            [self.broker] * n, [self.boot] * n,
            [m.message_id if m is not None else "" for m in msgs],
            [None if d is None else str(d) for d in dedup],
            [names[e[3] if e[3] is not None or e[2] is None else e[2].destination]
             for e in events],
            [m.timestamp if m is not None else None for m in msgs],
            [len(m.body) if m is not None else None for m in msgs],
            [m.persistent if m is not None else None for m in msgs],
            [m.broker_path if m is not None else () for m in msgs],
            [e[4] or None for e in events], [e[5] for e in events], [e[6] for e in events],
            [e[7] for e in events], [e[8] for e in events],
        ]
        return pa.Table.from_arrays([pa.array(c, type=f.type)
                                     for c, f in zip(cols, self.schema, strict=True)],
                                    schema=self.schema)

    def _write_group(self) -> None:
        events, self._pending = self._pending, []
        table = self.table(events)
        if self._writer is None:
            self._path = self._next_path()
            self._writer = self._pq.ParquetWriter(f"{self._path}{OPEN_SUFFIX}", self.schema,
                                                  compression="zstd")
        self._writer.write_table(table)
        self._bytes += table.nbytes

    def _seal(self) -> None:
        if self._pending:
            self._write_group()
        if self._writer is None:
            return
        assert self._path is not None
        self._writer.close()
        os.replace(f"{self._path}{OPEN_SUFFIX}", self._path)
        self._writer = None
        self._bytes = 0
        self._retain()

    def close(self) -> None:
        self._seal()


def parquet_available() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def open_sink(directory: Path, broker: str, boot: str, *, fmt: str, max_file_bytes: int,
              roll_interval_ms: int, max_files: int) -> TraceSink:
    """The sink for ``fmt`` ("jsonl" or "parquet"); Parquet falls back to JSON lines,
    with a warning, when pyarrow is not installed (it comes with the spark extra)."""
    kwargs: dict[str, Any] = {"max_file_bytes": max_file_bytes,
                              "roll_interval_ms": roll_interval_ms, "max_files": max_files}
    if fmt == "parquet":
        if parquet_available():
            return ParquetSink(directory, broker, boot, **kwargs)
        log.warning("trace.format = \"parquet\" needs pyarrow (pip install 'meshmq[spark]'); "
                    "writing JSON lines instead")
    return JsonLinesSink(directory, broker, boot, **kwargs)


def arrow_schema() -> Any:
    """The trace schema as a ``pyarrow.Schema`` (needs pyarrow)."""
    import pyarrow as pa

    types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(),
             "bool": pa.bool_(), "list<string>": pa.list_(pa.string())}
    return pa.schema([(name, types[arrow]) for name, _, arrow, _ in COLUMNS])
