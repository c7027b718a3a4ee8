"""Brokers for the failover client's tests: a ``MemoryNetwork`` (real brokers on one
loop, not linked to each other) and a ``ClientDialer`` that reaches them by host name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.memory_failover import ClientDialer
from tests.support.memory_network import MemoryNetwork, memory_network


@pytest.fixture
def network() -> Iterator[MemoryNetwork]:
    with memory_network() as n:
        yield n


@pytest.fixture
def dialer(network: MemoryNetwork) -> ClientDialer:
    return ClientDialer(network)


@pytest.fixture
def ab(network: MemoryNetwork) -> MemoryNetwork:
    """Two started brokers, ``a`` and ``b``."""
    network.add("a")
    network.add("b")
    network.start()
    return network
