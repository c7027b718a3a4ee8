from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.brokers import ProcessBroker, ThreadBroker, make_config


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadBroker]:
    """A fresh in-process broker with a journal store in tmp_path, STOMP on port 0."""
    b = ThreadBroker(make_config(tmp_path / "data")).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with custom config changes: ``broker_factory(usage=...)``."""
    started: list[ThreadBroker] = []

    def make(**changes: object) -> ThreadBroker:
        b = ThreadBroker(make_config(tmp_path / f"data{len(started)}", **changes)).start()
        started.append(b)
        return b

    try:
        yield make
    finally:
        for b in started:
            b.stop()


@pytest.fixture(autouse=True)
def _no_leftover_broker_processes() -> Iterator[None]:
    """A test that fails midway must not leave subprocess brokers running."""
    yield
    for leftover in list(ProcessBroker.running):
        if leftover.proc is not None and leftover.proc.poll() is None:
            leftover.kill9()
        ProcessBroker.running.discard(leftover)


@pytest.fixture(scope="session", autouse=True)
def _stop_private_postgres() -> Iterator[None]:
    """The PostgreSQL cluster some tests start (tests/support/postgres.py) ends with them."""
    yield
    from tests.support.postgres import stop_cluster

    stop_cluster()


@pytest.fixture
def pki(tmp_path: Path) -> object:
    """Certificates made with examples/tls/make-certs.sh (tests/support/pki.py)."""
    from tests.support.pki import make_pki

    return make_pki(tmp_path / "pki")
