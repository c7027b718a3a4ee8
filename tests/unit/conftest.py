"""Everything under tests/unit runs without network sockets.

An autouse fixture turns off internet sockets (pytest-socket) for each test here; Unix
socket pairs stay allowed because every asyncio event loop wakes itself through one. A
test that needs TCP, TLS or a real client library belongs in tests/interop or beside the
feature it proves, not here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_socket import disable_socket, enable_socket


@pytest.fixture(autouse=True)
def _no_network_sockets() -> Iterator[None]:
    disable_socket(allow_unix_socket=True)
    try:
        yield
    finally:
        enable_socket()
