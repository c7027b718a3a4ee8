from __future__ import annotations

import pytest

from tests.support.postgres import cluster


@pytest.fixture
def postgres_dsn() -> str:
    """A DSN of a fresh, empty database on the session's private PostgreSQL cluster."""
    return cluster().create_database()
