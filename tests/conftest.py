"""Airflow reads its configuration when first imported: point it at a throwaway home, with
SQLite and no example DAGs, before any test module imports it. The JVMs the tests start
(Spark's drivers, a standalone cluster) live for seconds to minutes: the client compiler alone
spends about 30% less CPU on them (docs/testing.md)."""

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer

if "PYTEST_XDIST_WORKER" in os.environ or "AIRFLOW_HOME" not in os.environ:
    # A worker of a run side by side inherits the home its controller made: one SQLite
    # database for all of them would see their migrations race.
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server on loopback, shared by the session (skips without one)."""
    with PostgresServer() as server:
        yield server


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests (marked ``spark``) first, in their order: run side by side, the long ones
    start at once and the short ones fill in around them, instead of one long test ending
    the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("spark") is None)
