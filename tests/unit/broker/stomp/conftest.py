"""Fixtures for STOMP behaviour tests without sockets.

``broker`` is a ``MemoryBroker`` (a real runtime on the test's loop, in-memory store);
``broker_factory(**config_changes)`` makes more with other settings. ``raw()`` gives a
byte-level client, ``client(version, ...)`` a library-shaped one; both on ``broker``
unless ``on=`` names another. Everything is closed at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.memory_broker import MemoryBroker
from tests.support.memory_stomp_client import MemoryClient, StompTestBroker, make_broker
from tests.support.raw_stomp import MemoryRawClient


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., StompTestBroker]]:
    started: list[StompTestBroker] = []

    def make(**changes: Any) -> StompTestBroker:
        b = make_broker(tmp_path / f"data{len(started)}", **changes)
        started.append(b)
        return b

    try:
        yield make
    finally:
        for b in reversed(started):
            b.close()


@pytest.fixture
def broker(broker_factory: Callable[..., StompTestBroker]) -> StompTestBroker:
    return broker_factory()


@pytest.fixture
def raw(request: pytest.FixtureRequest) -> Callable[..., MemoryRawClient]:
    def make(*, on: MemoryBroker | None = None) -> MemoryRawClient:
        return MemoryRawClient(on or request.getfixturevalue("broker"))
    return make


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Callable[..., MemoryClient]:
    def make(version: str = "1.2", *, on: MemoryBroker | None = None,
             **kw: Any) -> MemoryClient:
        return MemoryClient(on or request.getfixturevalue("broker"), version, **kw)
    return make
