"""The message trace at the broker's edge: where the core's trace events are written.

Why its own component: the pump writes the events of each turn, the durability path
needs a barrier (in exact mode nothing is confirmed before its events reach the OS),
and the lifecycle opens the sink after recovery and closes it before the store. Keeping
the sink, the heartbeat file and the flush timer here means the pump and the
composition root each hold one object with four calls instead of the trace's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from meshmq.config.model import BrokerConfig

if TYPE_CHECKING:
    from meshmq.core.broker import Broker
    from meshmq.transport.trace_files import HeartbeatFile, TraceSink

log = logging.getLogger("meshmq.runtime")


class TraceRecorder:
    """Owns the trace sink of one broker run (``[trace]`` in the config)."""

    def __init__(self, config: BrokerConfig, broker: Broker) -> None:
        self.config = config
        self.broker = broker
        self.sink: TraceSink | None = None
        # Only exact JSON lines can be relied on to hold everything confirmed.
        self.exact = False
        # Read by GET /metrics (management/metrics.py) at scrape time.
        self.events_written = 0
        self.events_dropped = 0
        self._flush_at = 0.0
        self._heartbeat_at = 0.0
        self._boot = ""
        self._unflushed = False  # events in the sink's buffer, not yet at the OS
        self._heartbeat_file: HeartbeatFile | None = None
        # A master/slave pair's broker: its lease holder id and the holder it took the
        # lease from, set by the runtime before ``start``.
        self.lease: tuple[str, str | None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Open the sink, then record the start and every recovered message."""
        cfg = self.config.trace
        if not cfg.enabled:
            return
        from meshmq.core.trace import BROKER_STARTED, Tracer, start_reason
        from meshmq.transport.trace_files import HeartbeatFile, JsonLinesSink, open_sink

        boot = format(time.time_ns() // 1_000_000, "x")
        self.sink = open_sink(self.config.trace_directory, self.config.broker_name, boot,
                              fmt=cfg.format, max_file_bytes=cfg.max_file_bytes,
                              roll_interval_ms=cfg.roll_interval_ms, max_files=cfg.max_files)
        if cfg.exact and cfg.format != "jsonl":
            log.warning("trace.exact needs trace.format = \"jsonl\": an unfinished Parquet "
                        "file is lost with a crash whatever is flushed")
        self._boot = boot
        self._heartbeat_file = HeartbeatFile(self.config.trace_directory,
                                             self.config.broker_name)
        self.exact = cfg.exact and isinstance(self.sink, JsonLinesSink)
        tracer = Tracer(self.config.broker_name, sample_rate=cfg.sample_rate)
        self.broker.tracer = tracer
        tracer.broker_event(BROKER_STARTED, start_reason(
            heartbeat_ms=cfg.heartbeat_interval_ms, exact=self.exact,
            previous=self._heartbeat_file.read(), lease=self.lease))
        recovered = self.broker.trace_recovered()
        log.info("tracing messages to %s (%s, sample rate %s); %d stored messages recorded",
                 self.config.trace_directory, cfg.format, cfg.sample_rate, recovered)
        self.write()
        self.sink.tick()
        self._heartbeat(time.monotonic())

    def start_timer(self, loop: asyncio.AbstractEventLoop, housekeeping_s: float) -> None:
        """Flush and beat on the trace's own timer when its intervals are shorter than
        the housekeeping timer's (which would stretch them to its own)."""
        if self.sink is not None and self._interval() < housekeeping_s:
            self._timer = loop.call_later(self._interval(), self._on_timer, loop)

    def write(self) -> None:
        """Hand the events recorded so far to the sink (buffered)."""
        tracer = self.broker.tracer
        if tracer is not None and tracer.events and self.sink is not None:
            events = tracer.take()
            try:
                self.sink.write(events)
            except OSError as exc:  # a full disk must not stop message traffic
                self.events_dropped += len(events)
                log.error("trace write failed (events dropped): %s", exc)
            else:
                self.events_written += len(events)
                self._unflushed = True

    def barrier(self) -> None:
        """In exact trace mode: every event recorded so far reaches the OS before the
        caller confirms anything (so a crash cannot lose what a client was told). Events
        written to the sink's buffer earlier, without a flush, count too."""
        if self.exact and self.sink is not None:
            self.write()
            if self._unflushed:
                self._unflushed = False
                try:
                    self.sink.flush()
                except OSError as exc:
                    log.error("trace flush failed: %s", exc)

    def tick(self, now: float) -> None:
        """Housekeeping: a heartbeat and a flush when they are due."""
        if self.sink is None:
            return
        if now >= self._heartbeat_at:
            self._heartbeat(now)
        if now >= self._flush_at:
            self._flush_at = now + self.config.trace.flush_interval_ms / 1000
            try:
                self.sink.tick()
                self._unflushed = False
            except OSError as exc:
                log.error("trace flush failed: %s", exc)

    def stop(self) -> None:
        """Record the stop and close the sink (before the store closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.sink is None:
            return
        from meshmq.core.trace import BROKER_STOPPED

        assert self.broker.tracer is not None
        self.broker.tracer.broker_event(BROKER_STOPPED)
        ts_us = self.broker.tracer.events[-1][0] // 1000
        self.write()
        self.sink.close()
        if self._heartbeat_file is not None:
            with contextlib.suppress(OSError):
                self._heartbeat_file.write(self._boot, ts_us)
        self.sink = None
        self.broker.tracer = None

    def _heartbeat(self, now: float) -> None:
        """Record a flushed ``heartbeat`` (and keep it in the heartbeat file): the audit
        bounds a crash of this run by the last one."""
        from meshmq.core.trace import HEARTBEAT

        interval = self.config.trace.heartbeat_interval_ms
        tracer = self.broker.tracer
        if interval <= 0 or tracer is None or self.sink is None:
            return
        self._heartbeat_at = now + interval / 1000
        tracer.broker_event(HEARTBEAT)
        ts_us = tracer.events[-1][0] // 1000
        self.write()
        try:
            self.sink.flush()
            self._unflushed = False
            if self._heartbeat_file is not None:
                self._heartbeat_file.write(self._boot, ts_us)
        except OSError as exc:
            log.error("trace heartbeat failed: %s", exc)

    def _interval(self) -> float:
        """How often (s) the trace needs a flush or a heartbeat."""
        cfg = self.config.trace
        wanted = [cfg.flush_interval_ms] + ([cfg.heartbeat_interval_ms]
                                            if cfg.heartbeat_interval_ms > 0 else [])
        return min(wanted) / 1000

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(self._interval(), self._on_timer, loop)
        self.write()
        self.tick(time.monotonic())
