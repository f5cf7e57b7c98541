"""Airflow reads its configuration when first imported: point it at a throwaway home, with
SQLite and no example DAGs, before any test module imports it."""

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server on loopback, shared by the session (skips without one)."""
    with PostgresServer() as server:
        yield server
