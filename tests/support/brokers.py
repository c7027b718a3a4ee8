"""Brokers for tests: in-process on a background event loop, or a real subprocess.

Every port comes from the OS (port 0); subprocess brokers report theirs in their log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import faulthandler
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from meshmq.config.model import BrokerConfig, ListenerConfig, ManagementConfig, StoreConfig
from meshmq.store.base import Store
from meshmq.transport.runtime import BrokerRuntime
from tests.support.loop_teardown import drain_loop

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Return the first truthy value of ``predicate()``; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # a short back-off inside a deadline poll, not a fixed wait
        delay = min(delay * 2, 0.05)


def make_config(data_dir: Path, **changes: Any) -> BrokerConfig:
    config = BrokerConfig(
        broker_name="test",
        data_directory=data_dir,
        listeners=(ListenerConfig(name="stomp", protocol="stomp", host="127.0.0.1", port=0),),
        management=ManagementConfig(enabled=True, host="127.0.0.1", port=0),
        store=StoreConfig(fsync=False),
    )
    return dataclasses.replace(config, **changes)


class ThreadBroker:
    """A broker running on its own event loop in a daemon thread."""

    def __init__(self, config: BrokerConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runtime: BrokerRuntime | None = None

    def start(self) -> ThreadBroker:
        self.thread.start()
        self.runtime = BrokerRuntime(self.config, self.store)
        self.call(self.runtime.start())
        return self

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def run(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the broker's loop (to inspect state safely)."""
        async def wrapper() -> T:
            return fn()
        result: T = self.call(wrapper(), timeout)
        return result

    @property
    def port(self) -> int:
        assert self.runtime is not None
        return self.runtime.addresses["stomp"][1]

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def management_port(self) -> int:
        assert self.runtime is not None
        return self.runtime.addresses["management"][1]

    def stats(self) -> dict[str, Any]:
        assert self.runtime is not None
        rt = self.runtime
        return self.run(rt.broker.statistics)

    def destination_stats(self, name: str) -> dict[str, Any]:
        for d in self.stats()["destinations"]:
            if d["name"] == name:
                return d  # type: ignore[no-any-return]
        raise KeyError(name)

    def stop(self, timeout: float = 30.0) -> None:
        if self.runtime is not None and self.runtime.started:
            try:
                self.call(self.runtime.stop(), timeout)
            except TimeoutError:
                # Where it waits: every thread's stack (the broker's loop among them).
                faulthandler.dump_traceback(all_threads=True)
                raise AssertionError(f"the in-process broker did not stop within "
                                     f"{timeout}s; its threads' stacks are on stderr"
                                     ) from None
        # Tear the loop down as asyncio.run does: tasks still pending are cancelled and
        # awaited, and callbacks already scheduled (a closed transport's connection_lost,
        # which releases its socket) get loop turns before the loop closes.
        self.call(drain_loop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


_LISTEN_RE = re.compile(r"listening for (\S+) on \S+://([\d.]+):(\d+)")


class ProcessBroker:
    """``meshmq broker`` as a real subprocess (for kill -9 tests).

    Every started broker is tracked in ``running`` until it is killed or terminated;
    the autouse fixture in tests/conftest.py kills leftovers when a test fails midway.
    """

    running: ClassVar[set[ProcessBroker]] = set()
    # What `python -m` runs (a subclass may run another entry point with the same log).
    module: ClassVar[str] = "meshmq.cli.main"

    def __init__(self, config_path: Path, log_path: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.extra_args = extra_args  # appended to `meshmq broker --config PATH`
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 30.0) -> ProcessBroker:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "broker", "--config",
             str(self.config_path), *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        ProcessBroker.running.add(self)
        start_len = 0

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited with {self.proc.returncode}:\n"
                                     + self.log_path.read_text(errors="replace"))
            text = self.log_path.read_text(errors="replace")[start_len:]
            for name, _host, port in _LISTEN_RE.findall(text):
                self.ports[name] = int(port)
            return "started" in text and "stomp" in self.ports

        start_len = len(self.log_path.read_text(errors="replace")) if self.log_path.exists() \
            else 0
        poll(ready, timeout, "the broker subprocess to start")
        return self

    @property
    def port(self) -> int:
        return self.ports["stomp"]

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()
        ProcessBroker.running.discard(self)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM, and the exit status. A broker still running after ``timeout`` is
        asked for its threads' stacks (SIGUSR1, see ``dump_stacks``), then killed, and
        the test fails with those stacks."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        stacks = ""
        try:
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                stacks = dump_stacks(self.proc.pid, self.log_path)
                raise AssertionError(
                    f"{self.log_path.name}: the broker did not stop within {timeout}s of "
                    f"SIGTERM; its threads' stacks:\n{stacks}") from None
        finally:
            ProcessBroker.running.discard(self)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._log.close()
        return code


def dump_stacks(pid: int, log_path: Path, settle_s: float = 3.0) -> str:
    """Ask a broker process and its children (a node's shards) to write every thread's
    stack to stderr (SIGUSR1: ``faulthandler``, registered by ``meshmq broker``), and
    return what their log gained, once it stopped growing (at most ``settle_s``)."""
    import psutil

    start = log_path.stat().st_size if log_path.exists() else 0
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return "(the process is gone)"
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + settle_s
    size = -1
    while time.monotonic() < deadline:
        now = log_path.stat().st_size if log_path.exists() else 0
        if now == size and now > start:
            break
        size = now
        time.sleep(0.2)  # the dumps are written by the processes themselves
    with open(log_path, "rb") as f:
        f.seek(start)
        return f.read().decode("utf-8", "replace")


def write_broker_toml(path: Path, *, name: str, data: Path, extra: str = "",
                      management: bool = False) -> Path:
    """A meshmq.toml for a subprocess broker: one STOMP listener on a port the OS picks,
    the management endpoint off (or on a port the OS picks), plus ``extra`` TOML."""
    mgmt = ('[management]\nhost = "127.0.0.1"\nport = 0\n' if management
            else "[management]\nenabled = false\n")
    path.write_text(f'[broker]\nname = "{name}"\ndata_directory = "{data}"\n\n'
                    f'[[listeners]]\nname = "stomp"\nurl = "stomp://127.0.0.1:0"\n\n'
                    f"{extra}\n{mgmt}")
    return path
