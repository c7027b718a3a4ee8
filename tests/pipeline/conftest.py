"""One local[2] Spark session for every Spark test of the run (JVM start-up is ~8 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.spark_cluster import use_test_jvm_options

# Every Spark JVM of these tests, in this process and in the jobs they start.
use_test_jvm_options()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from meshmq.pipeline.audit_job import spark_session

    session = spark_session("local[2]", app="meshmq-tests")
    try:
        yield session
    finally:
        session.stop()
