"""The composition root's lifecycle: components start in order, stop in reverse, a
failure half-way through start stops what had started, and a second stop does nothing.
No sockets: a MemoryStore root with no listeners and no management endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.support.memory_broker import memory_broker, memory_config

from meshmq.config.model import ListenerConfig, TraceConfig
from meshmq.errors import ConfigError, StoreError
from meshmq.store.base import Recovery
from meshmq.store.memory import MemoryStore
from meshmq.transport.runtime import BrokerRuntime

SERVING = ["store", "trace", "listeners", "housekeeping", "network"]


class RecordingStore(MemoryStore):
    """A MemoryStore that notes when it opens and closes, and what else was still up."""

    def __init__(self, fail_open: Exception | None = None) -> None:
        super().__init__()
        self.fail_open = fail_open
        self.events: list[str] = []
        self.runtime: BrokerRuntime | None = None

    def open(self) -> Recovery:
        self.events.append("open")
        if self.fail_open is not None:
            raise self.fail_open
        return super().open()

    async def close(self) -> None:
        runtime = self.runtime
        assert runtime is not None
        # What must already be down when the store closes.
        self.events.append(f"close (trace open: {runtime.trace.sink is not None}, "
                           f"sessions: {len(runtime.engine.all_sessions)})")
        await super().close()


def _runtime(store: RecordingStore, **config: object) -> BrokerRuntime:
    runtime = BrokerRuntime(memory_config(**config), store=store)
    store.runtime = runtime
    return runtime


def test_start_brings_components_up_in_dependency_order(tmp_path: Path) -> None:
    store = RecordingStore()
    runtime = _runtime(store, data_directory=tmp_path,
                       trace=TraceConfig(enabled=True, directory=tmp_path / "trace"))

    async def run() -> None:
        await runtime.start()
        assert runtime.started
        assert runtime.lifecycle.running == SERVING
        assert runtime.trace.sink is not None  # opened after the store recovered
        await runtime.stop()

    asyncio.run(run())
    assert store.events[0] == "open"


def test_stop_runs_in_reverse_and_a_second_stop_is_harmless(tmp_path: Path) -> None:
    store = RecordingStore()
    runtime = _runtime(store, data_directory=tmp_path,
                       trace=TraceConfig(enabled=True, directory=tmp_path / "trace"))

    async def run() -> None:
        await runtime.start()
        await runtime.stop()
        assert runtime.lifecycle.stopped == list(reversed(SERVING))
        assert runtime.lifecycle.running == []
        await asyncio.wait_for(runtime.wait_stopped(), 1)
        await runtime.stop()

    asyncio.run(run())
    # The trace closed and the sessions drained before the store; it closed once.
    assert store.events == ["open", "close (trace open: False, sessions: 0)"]
    assert not runtime.started


def test_stop_drains_open_sessions_before_the_store_closes() -> None:
    store = RecordingStore()
    with memory_broker(memory_config(), store=store) as broker:
        store.runtime = broker.runtime
        client = broker.stomp()
        client.connect()
        assert broker.runtime.engine.all_sessions
    assert client.closed
    assert store.events == ["open", "close (trace open: False, sessions: 0)"]


def test_a_failing_listener_stops_what_had_started(tmp_path: Path) -> None:
    # A TLS listener whose certificate file is missing fails before anything is bound.
    listener = ListenerConfig(name="secure", protocol="stomp+ssl", port=0,
                              ssl_certfile=tmp_path / "missing.pem")
    store = RecordingStore()
    runtime = _runtime(store, data_directory=tmp_path, listeners=(listener,),
                       trace=TraceConfig(enabled=True, directory=tmp_path / "trace"))

    async def run() -> None:
        with pytest.raises(ConfigError):
            await runtime.start()
        await asyncio.wait_for(runtime.wait_stopped(), 1)

    asyncio.run(run())
    assert runtime.lifecycle.stopped == ["trace", "store"]
    assert runtime.lifecycle.running == []
    assert store.events == ["open", "close (trace open: False, sessions: 0)"]
    assert not runtime.started
    assert runtime.addresses == {}


def test_a_store_that_fails_to_open_is_closed_and_nothing_starts() -> None:
    store = RecordingStore(fail_open=StoreError("locked by another broker",
                                                code="store-locked"))
    runtime = _runtime(store)

    async def run() -> None:
        with pytest.raises(StoreError, match="give each broker its own data directory"):
            await runtime.start()
        await asyncio.wait_for(runtime.wait_stopped(), 1)

    asyncio.run(run())
    assert runtime.lifecycle.stopped == []
    assert store.events == ["open", "close (trace open: False, sessions: 0)"]
    assert not runtime.started


@pytest.mark.parametrize("listener", [None, "stomp"])
def test_a_connection_made_after_the_sessions_were_closed_is_closed_too(
        listener: str | None) -> None:
    # The listener accepted it just before it closed; asyncio makes the connection a
    # loop turn later, after the stop closed every session it knew.
    with memory_broker(memory_config()) as broker:
        early = broker.stomp()
        early.connect()
        broker.call(broker.runtime.engine.close_sessions)
        assert early.closed
        late = broker.stomp(listener=listener)
        broker.wait_for(lambda: late.closed, what="the late connection to be closed")
        assert not broker.runtime.engine.all_sessions
