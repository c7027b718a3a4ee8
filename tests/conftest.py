from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.brokers import ProcessBroker, ThreadBroker, make_config

# Hypothesis' per-example deadline (200 ms) and its "data generation is too slow" health
# check measure the machine's load, not the code: on a busy CI machine running tests in
# parallel they fail examples that are merely slow.
settings.register_profile("meshmq", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("meshmq")


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



# Test files that run no module the mypyc build compiles (pyproject's
# [tool.meshmq.compile]) and start no broker: the audit's Spark logic over rows or trace
# files made in-process (writing those through a compiled Message is tests/unit/test_trace.py's
# part, in both passes), and its report. The compiled pass of ./dev/test deselects them
# (`-m "not compile_neutral"`); every test that drives a broker runs in both passes.
COMPILE_NEUTRAL = frozenset({
    "tests/pipeline/test_audit_cluster.py",
    "tests/pipeline/test_audit_crash_verdicts.py",
    "tests/pipeline/test_audit_follow.py",
    "tests/pipeline/test_audit_report.py",
    "tests/pipeline/test_audit_transforms.py",
})

# The files whose tests take longest (a Spark standalone cluster, broker subprocesses
# killed mid-stream, HA failovers), longest first: under pytest-xdist they start first,
# so that no worker begins a minute-long test when the others are nearly done.
START_FIRST = (
    "tests/pipeline/test_audit_cluster.py",
    "tests/pipeline/test_audit_crash_matrix.py",
    "tests/ha/test_replicated_failover.py",
    "tests/ha/test_pure_master_slave_xml.py",
    "tests/ha/test_witness_state.py",
    "tests/network/test_failures.py",
    "tests/client/test_client_tls.py",
    "tests/ha/test_database_lease.py",
    "tests/ha/test_replicated_tls.py",
    "tests/network/test_link_security.py",
    "tests/ha/test_shared_store_failover.py",
    "tests/interop/test_mqtt_retain_will.py",
)

# Under `--dist loadgroup` the tests of one xdist_group run on one worker, in order: a
# module-scoped fixture is then set up once, not once per worker. The Spark files go to
# two groups: Spark is CPU-bound, and a JVM on every worker starved the brokers those
# tests kill and wait for (on two cores) instead of finishing sooner.
GROUP_BY_FILE = {
    "tests/client/test_cross_broker.py": "cross-broker",
    "tests/pipeline/test_audit_crash_matrix.py": "spark-a",
    "tests/pipeline/test_audit_crash_verdicts.py": "spark-a",
    "tests/pipeline/test_audit_transforms.py": "spark-a",
    "tests/pipeline/test_audit_cluster.py": "spark-b",
    "tests/pipeline/test_audit_end_to_end.py": "spark-b",
    "tests/pipeline/test_audit_follow.py": "spark-b",
    "tests/pipeline/test_datasource.py": "spark-b",
    "tests/pipeline/test_datasource_failover.py": "spark-b",
}


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # the marker stays known without it
        config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's grouping")
    config.addinivalue_line(
        "markers", "compile_neutral: runs no compiled module and no broker; the compiled "
                   "pass of ./dev/test skips it (tests/conftest.py COMPILE_NEUTRAL)")


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After a failed test: its traceback, kept in ``sys.last_traceback`` for post-mortem
    debugging until the next test runs, holds the test's frames and so whatever they had
    open. Freed there, those objects would be collected during some later test, and a
    socket the failure left open would fail that one with a ResourceWarning. Collected
    here (before pytest gathers this teardown's unraisable exceptions), they stay with
    the test that failed."""
    if getattr(sys, "last_traceback", None) is not None:
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                delattr(sys, name)
        gc.collect()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath

    def path(item: pytest.Item) -> str:
        return item.path.relative_to(root).as_posix()

    for item in items:
        if path(item) in COMPILE_NEUTRAL:
            item.add_marker(pytest.mark.compile_neutral)
        group = GROUP_BY_FILE.get(path(item))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Every worker sorts alike (a stable sort), as xdist requires.
        rank = {f: i for i, f in enumerate(START_FIRST)}
        items.sort(key=lambda item: rank.get(path(item), len(rank)))
