"""One local[2] Spark session for every Spark test of the run (JVM start-up is ~8 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from meshmq.pipeline.audit_job import spark_session

    session = spark_session("local[2]", app="meshmq-tests")
    try:
        yield session
    finally:
        session.stop()
